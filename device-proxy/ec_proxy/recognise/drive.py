"""Google Drive v3: media, multipart and resumable uploads; media downloads.

Follows https://developers.google.com/drive/api/guides/manage-uploads.
Drive has no paths: a file is its id. An update (`PATCH
/upload/drive/v3/files/{id}`) has the reference `id:{id}`; a create has no
id yet, so its reference is `new:{name}` (the name from the metadata, or
`untitled`). A create has no last-synced base anyway; the addon re-keys the
document by the id the response returns.

A multipart upload (`multipart/related`: metadata JSON part, media part) is
split byte-exactly here, as RFC 2046 frames it: the media part is what lies
between the blank line after its headers and the CRLF before the next
delimiter. Its span lets the SAVE carry the body WRAPPED (spec §4.3.3).
"""

from __future__ import annotations

import re
from typing import Optional

from ec_protocol import DRIVE, DocKey

from .common import AppRequest, Download, Kind, Recognised, bearer_token, content_range, json_object, token_account

HOST = "www.googleapis.com"
_FILE = re.compile(r"^/upload/drive/v3/files(?:/(?P<id>[A-Za-z0-9_-]+))?/?$")
_MEDIA = re.compile(r"^/drive/v3/files/(?P<id>[A-Za-z0-9_-]+)/?$")
_BOUNDARY = re.compile(r'boundary\s*=\s*(?:"([^"]+)"|([^;\s]+))', re.I)


def multipart_parts(body: bytes, content_type: str) -> Optional[list[tuple[bytes, tuple[int, int]]]]:
    """The parts of a multipart body: (header block, (start, end) of the
    content in `body`). None when it is not a well-formed multipart body.

    Lines end in CRLF, or in LF as Google's Python client writes them (its
    `email` generator; Drive accepts it): the opening delimiter line says
    which. The header block is returned as sent (it may hold folded lines).
    """
    m = _BOUNDARY.search(content_type or "")
    if not m or not content_type.lower().lstrip().startswith("multipart/"):
        return None
    delim = b"--" + (m.group(1) or m.group(2)).encode("latin-1")
    if body.startswith(delim):
        pos = 0
    else:
        pos = body.find(b"\n" + delim)
        if pos < 0:
            return None
        pos += 1
    eol = b"\r\n" if body.startswith(b"\r\n", pos + len(delim)) else b"\n"
    parts = []
    while True:
        after = pos + len(delim)
        if body.startswith(b"--", after):
            return parts  # closing delimiter
        line_end = body.find(eol, after)
        if line_end < 0 or body[after:line_end].strip(b" \t"):
            return None
        if body.startswith(eol, line_end + len(eol)):  # no header fields: the blank line follows at once
            head, start = b"", line_end + 2 * len(eol)
        else:
            head_end = body.find(eol + eol, line_end)
            if head_end < 0:
                return None
            head = body[line_end + len(eol) : head_end]
            start = head_end + 2 * len(eol)
        nxt = body.find(eol + delim, start)
        if nxt < 0:
            return None
        parts.append((head, (start, nxt)))
        pos = nxt + len(eol)


def aliases(doc: DocKey, resource: object) -> list[DocKey]:
    """The file's id key, from the file resource a create returns (`id` is
    in every response, whatever `fields` asked): a created document
    (`new:{name}`) is re-keyed by it, so its first update (`PATCH
    …/files/{id}`) finds its base."""
    if isinstance(resource, dict) and isinstance(resource.get("id"), str) and resource["id"]:
        key = DocKey(DRIVE, doc.account, b"id:" + resource["id"].encode("utf-8", "surrogateescape"))
        return [key] if key != doc else []
    return []


def _metadata_name(meta: Optional[dict]) -> Optional[str]:
    name = meta.get("name") if meta else None
    return name if isinstance(name, str) and name else None


def recognise(req: AppRequest) -> Optional[Recognised]:
    if req.host != HOST:
        return None
    q = req.query()
    acct = token_account(bearer_token(req))
    m = _MEDIA.match(req.path)
    if m and req.method == "GET" and q.get("alt") == "media":
        if acct is None:
            return Recognised(DRIVE, Kind.OTHER, req, note="no credentials")
        doc = DocKey(DRIVE, acct, b"id:" + m.group("id").encode())
        return Recognised(DRIVE, Kind.DOWNLOAD, req, doc=doc, account=acct, download=Download())
    m = _FILE.match(req.path)
    if not m:
        return Recognised(DRIVE, Kind.OTHER, req)
    file_id = m.group("id")
    if req.method == "PUT" and "upload_id" in q:
        return Recognised(DRIVE, Kind.DRIVE_RESUMABLE_CHUNK, req, account=acct, session=q["upload_id"],
                          content_range=content_range(req.header("content-range")))
    if (req.method, file_id is None) not in (("POST", True), ("PATCH", False)):
        return Recognised(DRIVE, Kind.OTHER, req)
    if acct is None:
        return Recognised(DRIVE, Kind.OTHER, req, note="no credentials")
    upload_type = q.get("uploadType")
    name: Optional[str] = None
    span: Optional[tuple[int, int]] = None
    if upload_type == "media":
        kind = Kind.UPLOAD_SINGLE
    elif upload_type == "multipart":
        kind = Kind.UPLOAD_SINGLE
        if req.body is not None:
            parts = multipart_parts(req.body, req.header("content-type") or "")
            if parts is None or len(parts) != 2:
                return Recognised(DRIVE, Kind.OTHER, req, account=acct, note="multipart body without exactly two parts")
            (_, (ms, me)), (_, span) = parts
            name = _metadata_name(json_object(req.body[ms:me]))
    elif upload_type == "resumable":
        kind = Kind.DRIVE_RESUMABLE_INIT
        name = _metadata_name(json_object(req.body)) if req.body else None
    else:
        return Recognised(DRIVE, Kind.OTHER, req, account=acct, note=f"uploadType {upload_type!r}")
    ref = f"id:{file_id}" if file_id else f"new:{name or 'untitled'}"
    doc = DocKey(DRIVE, acct, ref.encode("utf-8", "surrogateescape"))
    return Recognised(DRIVE, kind, req, doc=doc, name=name, account=acct, file_span=span)
