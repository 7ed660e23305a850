"""Dropbox API v2: uploads, upload sessions, batch finishes, downloads.

Follows https://www.dropbox.com/developers/documentation/http/documentation.
Content routes take their argument as JSON in `Dropbox-API-Arg` (raw UTF-8
allowed) or in the `?arg=` URL parameter, and the token in `Authorization`
or `?authorization=`; `finish_batch_v2` lives on the API host and takes a
JSON body. Dropbox compares paths case-insensitively, so path references
are lower-cased; `id:` references are kept as they are (ids are
case-sensitive). `Dropbox-API-Path-Root` changes what a path means, so it
becomes part of the account.
"""

from __future__ import annotations

import hashlib
from typing import Optional

from ec_protocol import DROPBOX, DocKey

from .common import AppRequest, Download, Kind, Recognised, bearer_token, header_text, json_object, token_account

CONTENT_HOST = "content.dropboxapi.com"
API_HOST = "api.dropboxapi.com"
HOSTS = frozenset({CONTENT_HOST, API_HOST})

_CONTENT_ROUTES = {
    "/2/files/upload": Kind.UPLOAD_SINGLE,
    "/2/files/upload_session/start": Kind.SESSION_START,
    "/2/files/upload_session/append_v2": Kind.SESSION_APPEND,
    "/2/files/upload_session/append": Kind.SESSION_APPEND,
    "/2/files/upload_session/finish": Kind.SESSION_FINISH,
    "/2/files/download": Kind.DOWNLOAD,
}
_API_ROUTES = {"/2/files/upload_session/finish_batch_v2": Kind.BATCH_FINISH}


def content_hash(data: bytes) -> str:
    """Dropbox's content_hash: SHA-256 of the SHA-256s of each 4 MiB block
    (https://www.dropbox.com/developers/reference/content-hash)."""
    blocks = b"".join(hashlib.sha256(data[i : i + 4194304]).digest() for i in range(0, len(data), 4194304))
    return hashlib.sha256(blocks).hexdigest()


def account(req: AppRequest) -> Optional[bytes]:
    """The account part of a Dropbox document key (see common's docstring)."""
    selected = req.header("dropbox-api-select-user")
    base = b"user:" + selected.strip().encode() if selected else token_account(bearer_token(req))
    if base is None:
        return None
    root = req.header("dropbox-api-path-root")
    if root:
        compact = json_object(header_text(root))
        text = root if compact is None else repr(sorted(compact.items()))
        base += b"|root:" + text.encode("utf-8", "surrogateescape")
    return base


def normalise_path(path: str) -> str:
    """Paths compare case-insensitively at Dropbox; ids and revs do not."""
    if path.startswith(("id:", "rev:", "ns:")):
        return path
    return path.lower()


def arg(req: AppRequest) -> Optional[dict]:
    """The route's JSON argument: header first, then `?arg=`."""
    raw = req.header("dropbox-api-arg")
    if raw is None:
        raw = req.query().get("arg")
    return json_object(header_text(raw)) if raw is not None else None


def _doc(acct: Optional[bytes], path: object) -> tuple[Optional[DocKey], Optional[str]]:
    if acct is None or not isinstance(path, str) or not path:
        return None, None
    return DocKey(DROPBOX, acct, normalise_path(path).encode("utf-8", "surrogateescape")), path


def _cursor(value: object) -> tuple[Optional[str], Optional[int]]:
    if not isinstance(value, dict):
        return None, None
    sid, off = value.get("session_id"), value.get("offset")
    return (sid if isinstance(sid, str) else None), (off if isinstance(off, int) and not isinstance(off, bool) else None)


def recognise(req: AppRequest) -> Optional[Recognised]:
    if req.host not in HOSTS:
        return None
    routes = _CONTENT_ROUTES if req.host == CONTENT_HOST else _API_ROUTES
    kind = routes.get(req.path)
    other = Recognised(DROPBOX, Kind.OTHER, req)
    if kind is None or req.method != "POST":
        return other
    acct = account(req)
    if acct is None:
        # No credentials: Dropbox answers 400 itself, the device has no key.
        return Recognised(DROPBOX, Kind.OTHER, req, note="no credentials")

    if kind is Kind.BATCH_FINISH:
        body = json_object(req.body) if req.body is not None else None
        if req.body is not None and (body is None or not isinstance(body.get("entries"), list)):
            return Recognised(DROPBOX, Kind.OTHER, req, account=acct, note="finish_batch_v2 body is not an entries object")
        return Recognised(DROPBOX, kind, req, account=acct, args=body)

    a = arg(req)
    if a is None:
        return Recognised(DROPBOX, Kind.OTHER, req, account=acct, note="Dropbox-API-Arg missing or not a JSON object")

    if kind is Kind.UPLOAD_SINGLE:
        doc, name = _doc(acct, a.get("path"))
        if doc is None:
            return Recognised(DROPBOX, Kind.OTHER, req, account=acct, note="upload without a path")
        return Recognised(DROPBOX, kind, req, doc=doc, name=name, account=acct, args=a)
    if kind is Kind.DOWNLOAD:
        doc, name = _doc(acct, a.get("path"))
        return Recognised(DROPBOX, kind, req, doc=doc, name=name, account=acct, args=a,
                          download=Download(metadata_header="Dropbox-API-Result"))
    if kind is Kind.SESSION_START:
        return Recognised(DROPBOX, kind, req, account=acct, close=a.get("close") is True, offset=0, args=a)
    if kind is Kind.SESSION_APPEND:
        v1 = req.path.endswith("/append")
        sid, off = _cursor(a if v1 else a.get("cursor"))
        if sid is None or off is None:
            return Recognised(DROPBOX, Kind.OTHER, req, account=acct, note="append without a cursor")
        return Recognised(DROPBOX, kind, req, account=acct, session=sid, offset=off,
                          close=(not v1) and a.get("close") is True, args=a)
    # finish
    sid, off = _cursor(a.get("cursor"))
    commit = a.get("commit")
    if sid is None or off is None or not isinstance(commit, dict):
        return Recognised(DROPBOX, Kind.OTHER, req, account=acct, note="finish without cursor or commit")
    doc, name = _doc(acct, commit.get("path"))
    return Recognised(DROPBOX, kind, req, doc=doc, name=name, account=acct, session=sid, offset=off, args=a)
