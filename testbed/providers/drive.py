"""Google Drive API v3 test server: uploads (media, multipart, resumable),
updates, metadata and `alt=media` downloads.

Follows:
- https://developers.google.com/drive/api/guides/manage-uploads (uploadType
  media / multipart / resumable; the resumable initiation answers 200 with the
  session URI in `Location`; chunks `PUT` with `Content-Range: bytes a-b/total`,
  multiples of 256 KiB except the last; `308 Resume Incomplete` with
  `Range: bytes=0-N` (no `Range` before the first byte); `Content-Range:
  bytes */total` with an empty body asks for the status; the last chunk
  answers 200 with the file resource, and so does a status query once the
  upload is complete; other chunks to a completed session find none);
- https://developers.google.com/drive/api/reference/rest/v3/files (create
  `POST /upload/drive/v3/files`, update `PATCH /upload/drive/v3/files/{id}`,
  get `GET /drive/v3/files/{id}` and `?alt=media`; the default response
  holds `kind, id, name, mimeType`; `fields=` selects others, e.g.
  `md5Checksum, size, version, headRevisionId`);
- https://developers.google.com/drive/api/guides/handle-errors (`{"error":
  {"code", "message", "errors": [{"domain", "reason", "message"}], "status"}}`).

Revisions: `version` (a string of an int64) grows with every change,
`headRevisionId` names the current content. Drive has no paths and no
conflicts: names may repeat, files are addressed by id.

Not implemented: nested `fields` selectors beyond top-level names (e.g.
`files(id)`), `files.list` queries, shared drives, trash, `keepRevisionForever`,
session URIs outliving a restart, `X-Goog-Upload-*` (the "new" protocol).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .common import bearer_auth, iso8601, public_base
from .hashes import md5_hex
from .store import FileRecord, Namespace, Store, random_token

HOST = "www.googleapis.com"
CHUNK_UNIT = 256 * 1024
DEFAULT_FIELDS = ("kind", "id", "name", "mimeType")
CONTENT_RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")
FILE_ID = r"[A-Za-z0-9_-]+"


class DriveError(Exception):
    def __init__(self, code: int, message: str, reason: str, domain: str = "global", location: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.reason, self.domain, self.location = code, message, reason, domain, location


STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def error_response(code: int, message: str, reason: str, domain: str = "global", location: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    err: dict[str, Any] = {"message": message, "domain": domain, "reason": reason}
    if location:
        err.update(location=location, locationType="parameter" if location != "Authorization" else "header")
    body = {"error": {"code": code, "message": message, "errors": [err]}}
    if code in STATUS_NAMES:
        body["error"]["status"] = STATUS_NAMES[code]
    return web.Response(status=code, body=json.dumps(body).encode(), content_type="application/json", headers=headers)


@dataclass
class ResumableSession:
    id: str
    account: str
    file_id: str | None  # None: create
    metadata: dict[str, Any]
    fields: str | None
    content_type: str
    declared_length: int | None
    data: bytearray = field(default_factory=bytearray)
    #: The file resource the completed upload answered (a status query gets it again).
    done: dict[str, Any] | None = None


def split_multipart(body: bytes, content_type: str) -> tuple[dict[str, Any], bytes, str]:
    """The two parts of a multipart/related upload: metadata JSON, media bytes, media type.

    Parsed by hand, byte-exact: the media part is everything between the blank
    line after its headers and the line break before the next delimiter (RFC
    2046). Lines end in CRLF, or in LF as Google's own Python client writes
    them (`email`'s generator), which Drive accepts: the opening delimiter
    line says which. Part header fields may be folded (`Content-Type:` then
    the value on a continuation line, as that generator folds a long office
    media type).
    """
    m = re.search(r'boundary\s*=\s*(?:"([^"]+)"|([^;\s]+))', content_type, re.I)
    if not content_type.lower().lstrip().startswith("multipart/related") or not m:
        raise DriveError(400, "Multipart upload needs Content-Type multipart/related with a boundary", "badContent")
    delim = b"--" + (m.group(1) or m.group(2)).encode("latin-1")
    if body.startswith(delim):
        pos = 0
    else:
        pos = body.find(b"\n" + delim)
        if pos < 0:
            raise DriveError(400, "Multipart body has no opening boundary", "badContent")
        pos += 1
    eol = b"\r\n" if body.startswith(b"\r\n", pos + len(delim)) else b"\n"
    parts = []
    while True:
        after = pos + len(delim)
        if body.startswith(b"--", after):
            break
        line_end = body.find(eol, after)
        if line_end < 0 or body[after:line_end].strip(b" \t"):
            raise DriveError(400, "Multipart body: a delimiter line is malformed", "badContent")
        if body.startswith(eol, line_end + len(eol)):  # no header fields
            head, start = b"", line_end + 2 * len(eol)
        else:
            head_end = body.find(eol + eol, line_end)
            if head_end < 0:
                raise DriveError(400, "Multipart body: a part has no blank line after its headers", "badContent")
            head, start = body[line_end + len(eol) : head_end], head_end + 2 * len(eol)
        nxt = body.find(eol + delim, start)
        if nxt < 0:
            raise DriveError(400, "Multipart body has no closing boundary", "badContent")
        unfolded = re.sub(rb"\r?\n[ \t]+", b" ", head)
        headers = {}
        for line in re.split(rb"\r?\n", unfolded):
            k, _, v = line.decode("latin-1").partition(":")
            if k.strip():
                headers[k.strip().lower()] = v.strip()
        parts.append((headers, body[start:nxt]))
        pos = nxt + len(eol)
    if len(parts) != 2:
        raise DriveError(400, f"Multipart upload needs exactly 2 parts (metadata, media); got {len(parts)}", "badContent")
    try:
        meta = json.loads(parts[0][1] or b"{}")
    except ValueError as e:
        raise DriveError(400, f"Metadata part is not JSON: {e}", "parseError") from e
    return meta, parts[1][1], parts[1][0].get("content-type", "application/octet-stream")


class DriveProvider:
    name = "drive"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sessions: dict[str, ResumableSession] = {}

    def serves(self, host: str) -> bool:
        return host == HOST

    def route_names(self) -> list[str]:
        return ["create", "update", "resumable_chunk", "get", "get_media", "delete", "about"]

    def resolve(self, host: str, request: web.Request):
        p, method = request.path, request.method
        q = request.query
        if p == "/upload/drive/v3/files" and method == "PUT" and "upload_id" in q:
            return "resumable_chunk", self._wrap(self.resumable_chunk, None)
        if p == "/upload/drive/v3/files" and method == "POST":
            return "create", self._wrap(self.upload, None)
        m = re.fullmatch(rf"/upload/drive/v3/files/({FILE_ID})", p)
        if m and method == "PUT" and "upload_id" in q:
            return "resumable_chunk", self._wrap(self.resumable_chunk, m.group(1))
        if m and method == "PATCH":
            return "update", self._wrap(self.upload, m.group(1))
        m = re.fullmatch(rf"/drive/v3/files/({FILE_ID})", p)
        if m and method == "GET":
            if q.get("alt") == "media":
                return "get_media", self._wrap(self.get_media, m.group(1))
            return "get", self._wrap(self.get, m.group(1))
        if m and method == "DELETE":
            return "delete", self._wrap(self.delete, m.group(1))
        if p == "/drive/v3/about" and method == "GET":
            return "about", self._wrap(self.about, None)
        return None

    def _wrap(self, fn, file_id):
        async def run(request: web.Request, body: bytes) -> web.Response:
            a = bearer_auth(request)
            if a.account is None:
                return error_response(401, "Request had invalid authentication credentials. Expected OAuth 2 access token.",
                                      "authError", location="Authorization",
                                      headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'})
            ns = self.store.namespace(self.name, a.account)
            try:
                return await fn(request, body, ns, file_id)
            except DriveError as e:
                return error_response(e.code, e.message, e.reason, e.domain, e.location)

        return run

    def not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="Not Found")

    def fault_response(self, status: int, retry_after: int) -> web.Response:
        if status == 429:
            return error_response(429, "Rate Limit Exceeded", "rateLimitExceeded", "usageLimits", headers={"Retry-After": str(retry_after)})
        if status == 403:
            return error_response(403, "User Rate Limit Exceeded", "userRateLimitExceeded", "usageLimits")
        if status >= 500:
            headers = {"Retry-After": str(retry_after)} if status == 503 else None
            return error_response(status, "Backend Error" if status != 503 else "Service Unavailable", "backendError", headers=headers)
        return error_response(status, f"Injected by the testbed ({status})", "badRequest")

    # -- resources -----------------------------------------------------------

    def resource(self, rec: FileRecord, fields: str | None) -> dict[str, Any]:
        head = rec.head
        full = {
            "kind": "drive#file",
            "id": rec.id,
            "name": rec.name,
            "mimeType": rec.extra.get("mimeType", "application/octet-stream"),
            "parents": rec.extra.get("parents", ["root"]),
            "version": str(rec.extra.get("version", rec.version)),
            "headRevisionId": head.rev,
            "md5Checksum": rec.extra["md5"][head.rev],
            "sha256Checksum": head.sha256,
            "size": str(head.size),
            "createdTime": iso8601(rec.created, millis=True),
            "modifiedTime": iso8601(head.modified, millis=True),
            "trashed": False,
        }
        if fields is None:
            return {k: full[k] for k in DEFAULT_FIELDS}
        if fields.strip() == "*":
            return full
        wanted = [f.strip() for f in fields.split(",") if f.strip()]
        return {k: full[k] for k in wanted if k in full}

    def _record(self, ns: Namespace, file_id: str) -> FileRecord:
        rec = ns.files.get(file_id)
        if rec is None:
            raise DriveError(404, f"File not found: {file_id}.", "notFound", location="fileId")
        return rec

    def _write(self, ns: Namespace, file_id: str | None, metadata: dict[str, Any], data: bytes, media_type: str | None) -> FileRecord:
        record = self._record(ns, file_id) if file_id else None
        name = metadata.get("name") or (record.name if record else "Untitled")
        rec, _ = ns.put(data, record=record, path=None, name=name,
                        new_id=lambda n: f"1tb{n:030d}", new_rev=lambda n: f"0Btb{n:020d}")
        rec.extra.setdefault("md5", {})[rec.head.rev] = md5_hex(data)
        if "mimeType" in metadata:
            rec.extra["mimeType"] = metadata["mimeType"]
        elif media_type and (record is None or "mimeType" not in rec.extra):
            rec.extra["mimeType"] = media_type
        if "parents" in metadata and record is None:
            rec.extra["parents"] = list(metadata["parents"])
        # version counts every change (content or metadata); here every write changes content.
        rec.extra["version"] = int(rec.extra.get("version", 0)) + 1
        ns.save()
        return rec

    # -- routes ------------------------------------------------------------

    async def upload(self, request: web.Request, body: bytes, ns: Namespace, file_id: str | None) -> web.Response:
        upload_type = request.query.get("uploadType")
        fields = request.query.get("fields")
        if file_id:
            self._record(ns, file_id)
        if upload_type == "media":
            rec = self._write(ns, file_id, {}, body, request.headers.get("Content-Type"))
            return web.json_response(self.resource(rec, fields))
        if upload_type == "multipart":
            meta, media, media_type = split_multipart(body, request.headers.get("Content-Type", ""))
            rec = self._write(ns, file_id, meta, media, media_type)
            return web.json_response(self.resource(rec, fields))
        if upload_type == "resumable":
            meta: dict[str, Any] = {}
            if body.strip():
                try:
                    meta = json.loads(body)
                except ValueError as e:
                    raise DriveError(400, f"Metadata is not JSON: {e}", "parseError") from e
            length = request.headers.get("X-Upload-Content-Length")
            session = ResumableSession(
                id=random_token(32), account=ns.account, file_id=file_id, metadata=meta if isinstance(meta, dict) else {},
                fields=fields, content_type=request.headers.get("X-Upload-Content-Type", "application/octet-stream"),
                declared_length=int(length) if length and length.isdigit() else None,
            )
            self.sessions[session.id] = session
            path = "/upload/drive/v3/files" + (f"/{file_id}" if file_id else "")
            location = f"{public_base(request, HOST)}{path}?uploadType=resumable&upload_id={session.id}"
            return web.Response(status=200, headers={"Location": location, "X-GUploader-UploadID": session.id})
        raise DriveError(400, f"Invalid value for uploadType: {upload_type!r}; use media, multipart or resumable", "invalidParameter", location="uploadType")

    async def resumable_chunk(self, request: web.Request, body: bytes, ns: Namespace, file_id: str | None) -> web.Response:
        session = self.sessions.get(request.query["upload_id"])
        if session is None or session.account != ns.account or session.file_id != file_id:
            raise DriveError(404, "The upload session was not found or has expired", "notFound", location="upload_id")
        header = request.headers.get("Content-Range")
        if session.done is not None:
            # Completed: a status query gets the file resource again, as Google answers it; anything else finds no session.
            m = CONTENT_RANGE.match((header or "").strip())
            if m and m.group(1) is None and not body:
                return web.json_response(session.done)
            raise DriveError(404, "The upload session was not found or has expired", "notFound", location="upload_id")
        received = len(session.data)
        if header is None:  # one PUT with the whole file
            start, end, total = 0, len(body) - 1, len(body)
        else:
            m = CONTENT_RANGE.match(header.strip())
            if not m:
                raise DriveError(400, f"Invalid Content-Range {header!r}", "badRequest")
            total = None if m.group(3) == "*" else int(m.group(3))
            if m.group(1) is None:  # "bytes */total": status query, or an empty file
                if body:
                    raise DriveError(400, "Content-Range bytes */N must have an empty body", "badRequest")
                if total is not None and total == received == (session.declared_length or total):
                    return self._finish(session, ns)
                return self._incomplete(received)
            start, end = int(m.group(1)), int(m.group(2))
        if len(body) != end - start + 1:
            raise DriveError(400, f"Content-Range covers {end - start + 1} bytes but the body has {len(body)}", "badRequest")
        if session.declared_length is not None and total is not None and total != session.declared_length:
            raise DriveError(400, f"Total {total} differs from X-Upload-Content-Length {session.declared_length}", "badRequest")
        if start != received:
            raise DriveError(400, f"Chunk starts at {start} but the server has {received} bytes; query the status with Content-Range: bytes */{total or '*'}", "badRequest")
        last = total is not None and end + 1 == total
        if not last and len(body) % CHUNK_UNIT != 0:
            raise DriveError(400, f"Chunk size {len(body)} is not a multiple of 256 KiB (262144 bytes)", "badRequest")
        session.data += body
        if last:
            return self._finish(session, ns)
        return self._incomplete(len(session.data))

    @staticmethod
    def _incomplete(received: int) -> web.Response:
        headers = {"Range": f"bytes=0-{received - 1}"} if received else {}
        # aiohttp knows no reason phrase for 308 in this role; Google sends "Resume Incomplete".
        return web.Response(status=308, reason="Resume Incomplete", headers=headers)

    def _finish(self, session: ResumableSession, ns: Namespace) -> web.Response:
        rec = self._write(ns, session.file_id, session.metadata, bytes(session.data), session.content_type)
        session.done, session.data = self.resource(rec, session.fields), bytearray()
        return web.json_response(session.done)

    async def get(self, request, body, ns, file_id):
        return web.json_response(self.resource(self._record(ns, file_id), request.query.get("fields")))

    async def get_media(self, request, body, ns, file_id):
        rec = self._record(ns, file_id)
        return web.Response(body=ns.read(rec.head), content_type=rec.extra.get("mimeType", "application/octet-stream"),
                            headers={"X-Goog-Hash": "md5=" + base64.b64encode(bytes.fromhex(rec.extra["md5"][rec.head.rev])).decode()})

    async def delete(self, request, body, ns, file_id):
        ns.delete(self._record(ns, file_id))
        return web.Response(status=204)

    async def about(self, request, body, ns, file_id):
        return web.json_response({"kind": "drive#about", "user": {"displayName": ns.account},
                                  "storageQuota": {"limit": str(1 << 40), "usage": str(sum(r.head.size for r in ns.files.values()))}})
