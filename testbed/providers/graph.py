"""Microsoft Graph / OneDrive test server: simple upload, upload sessions,
download by redirect, item metadata.

Follows:
- https://learn.microsoft.com/en-us/graph/api/driveitem-put-content (simple
  upload `PUT /me/drive/root:/{path}:/content`, `/items/{parent-id}:/{name}:/content`,
  `/items/{id}/content`; `@microsoft.graph.conflictBehavior` query parameter,
  default `replace`);
- https://learn.microsoft.com/en-us/graph/api/driveitem-createuploadsession
  (`POST ...:/createUploadSession`, body `{"item": {"@microsoft.graph.conflictBehavior": ...}}`,
  `If-Match`; fragments `PUT uploadUrl` with `Content-Range`, sizes a multiple
  of 320 KiB except the last, at most 60 MiB; 202 with `nextExpectedRanges`
  while incomplete, 201 (created) or 200 (replaced) with the driveItem at the
  end; no `Authorization` on the uploadUrl: answered 401 as the page warns;
  `DELETE uploadUrl` cancels, `GET uploadUrl` reports the session);
- https://learn.microsoft.com/en-us/graph/api/driveitem-get-content (`GET
  .../content` answers 302 to a pre-authenticated URL on `*.files.1drv.com`);
- https://learn.microsoft.com/en-us/onedrive/developer/rest-api/concepts/errors
  (`{"error": {"code", "message", "innerError"}}`; codes nameAlreadyExists,
  itemNotFound, resourceModified, invalidRange, invalidRequest,
  activityLimitReached with `Retry-After`, serviceNotAvailable).

Revisions: `eTag` `"{id},N"` and `cTag` `"c:{id},N"` change with every
content version; `If-Match` accepts either. `file.hashes.quickXorHash` is
always present. Paths compare case-insensitively; folders are implied by paths.

Deliberately not implemented: folder items and `/children` listings, item ids
of folders other than `root`, `deferCommit`, out-of-order fragments (real
Graph tolerates them; we require contiguous ranges, which is what the EPS
sends), session expiry, `Range` downloads, thumbnails, sharing, delta.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from .common import bearer_auth, iso8601, public_base
from .hashes import quickxor_base64
from .store import FileRecord, Namespace, Store, random_token

GRAPH_HOST = "graph.microsoft.com"
FRAGMENT_UNIT = 320 * 1024
MAX_FRAGMENT = 60 * 1024 * 1024
ITEM_PATH = re.compile(
    r"^/(?:v1\.0|beta)/(?P<drive>me/drive|drives/(?P<drive_id>[^/]+)|users/[^/]+/drive)"
    r"(?:/(?:root|items/(?P<item>[^/:]+))(?::(?P<rel>/[^:]*):?)?)?(?P<action>/content|/createUploadSession)?/?$"
)
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


class GraphError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {
        "error": {
            "code": code,
            "message": message,
            "innerError": {"date": iso8601(time.time()), "request-id": str(uuid.uuid4()), "client-request-id": str(uuid.uuid4())},
        }
    }
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json", headers=headers)


@dataclass
class Target:
    """Where an upload goes: an existing item, or a path (existing or not)."""

    path: str | None
    record: FileRecord | None


@dataclass
class UploadSession:
    token: str
    account: str
    path: str
    record_id: str | None
    conflict: str
    if_match: str | None
    total: int | None = None
    data: bytearray = field(default_factory=bytearray)
    expires: float = field(default_factory=lambda: time.time() + 7 * 24 * 3600)


class GraphProvider:
    name = "graph"

    def __init__(self, store: Store, upload_host: str, download_host: str) -> None:
        self.store = store
        self.upload_host = upload_host
        self.download_host = download_host
        self.sessions: dict[str, UploadSession] = {}
        self.downloads: dict[str, tuple[str, str, str]] = {}  # token -> (account, item id, sha256)

    def serves(self, host: str) -> bool:
        return host in (GRAPH_HOST, self.upload_host, "api.onedrive.com") or host.endswith((".sharepoint.com", ".files.1drv.com"))

    def route_names(self) -> list[str]:
        return ["get_drive", "get_item", "delete_item", "simple_upload", "download", "create_upload_session",
                "upload_fragment", "upload_session_status", "cancel_upload_session", "download_content"]

    def resolve(self, host: str, request: web.Request):
        method = request.method
        if host.endswith(".files.1drv.com"):
            if method in ("GET", "HEAD") and request.path.startswith("/dl/"):
                return "download_content", self._wrap(self.download_content, auth=False)
            return None
        if host != GRAPH_HOST:  # upload-session host
            if not request.path.startswith("/rup/"):
                return None
            table = {"PUT": ("upload_fragment", self.upload_fragment), "GET": ("upload_session_status", self.session_status),
                     "DELETE": ("cancel_upload_session", self.cancel_session)}
            if method not in table:
                return None
            name, fn = table[method]
            return name, self._wrap(fn, auth=False)
        m = ITEM_PATH.match(request.rel_url.raw_path)
        if not m:
            return None
        action = m.group("action")
        addressed = m.group("item") is not None or m.group("rel") is not None or "/root" in request.rel_url.raw_path
        key = (method, action, addressed)
        table = {
            ("GET", None, False): ("get_drive", self.get_drive),
            ("GET", None, True): ("get_item", self.get_item),
            ("DELETE", None, True): ("delete_item", self.delete_item),
            ("PUT", "/content", True): ("simple_upload", self.simple_upload),
            ("GET", "/content", True): ("download", self.download),
            ("POST", "/createUploadSession", True): ("create_upload_session", self.create_session),
        }
        if key not in table:
            return None
        name, fn = table[key]

        async def run(req: web.Request, body: bytes) -> web.Response:
            return await self._guarded(fn, req, body, m, auth=True)

        return name, run

    def _wrap(self, fn, auth: bool):
        async def run(req: web.Request, body: bytes) -> web.Response:
            return await self._guarded(fn, req, body, None, auth=auth)

        return run

    def not_found(self, request: web.Request) -> web.Response:
        return error_response(400 if request.host.startswith(GRAPH_HOST) else 404, "invalidRequest",
                              f"Invalid request: {request.method} {request.path} is not a route this server knows")

    def fault_response(self, status: int, retry_after: int) -> web.Response:
        codes = {429: "activityLimitReached", 503: "serviceNotAvailable", 504: "gatewayTimeout", 507: "quotaLimitReached"}
        code = codes.get(status, "generalException")
        headers = {"Retry-After": str(retry_after)} if status in (429, 503) else None
        return error_response(status, code, f"Injected by the testbed ({status})", headers)

    async def _guarded(self, fn, request, body, match, auth: bool) -> web.Response:
        ns = None
        if auth:
            a = bearer_auth(request)
            if a.account is None:
                msg = "Access token is empty." if a.problem == "missing" else "Access token validation failure. Invalid audience."
                return error_response(401, "InvalidAuthenticationToken", msg)
            ns = self.store.namespace(self.name, a.account)
        try:
            if match is not None:
                return await fn(request, body, ns, match)
            return await fn(request, body)
        except GraphError as e:
            return error_response(e.status, e.code, e.message, e.headers)

    # -- items -------------------------------------------------------------

    @staticmethod
    def drive_id(account: str) -> str:
        return hashlib.sha256(account.encode()).hexdigest()[:16]

    def _target(self, ns: Namespace, m: re.Match) -> Target:
        if m.group("drive_id") is not None and m.group("drive_id").lower() != self.drive_id(ns.account):
            raise GraphError(404, "itemNotFound", "The drive could not be found.")
        item, rel = m.group("item"), m.group("rel")
        rel = unquote(rel) if rel is not None else None
        if item is None or item.lower() == "root":
            if rel is None:
                return Target("/", None)
            return Target(rel, ns.by_path(rel))
        rec = ns.files.get(unquote(item))
        if rec is None:
            raise GraphError(404, "itemNotFound", "Item does not exist")
        if rel is None:
            return Target(rec.path, rec)
        # items/{id}:/{name}: the id must be a folder; only root is a folder item here.
        raise GraphError(400, "invalidRequest", "Only the drive root can be addressed as a parent item by this test server")

    def drive_item(self, ns: Namespace, rec: FileRecord, base: str | None = None) -> dict[str, Any]:
        head = rec.head
        assert rec.path is not None
        parent = rec.path.rsplit("/", 1)[0]
        item = {
            "id": rec.id,
            "name": rec.name,
            "size": head.size,
            "eTag": f'"{{{rec.id}}},{rec.version}"',
            "cTag": f'"c:{{{rec.id}}},{rec.version}"',
            "createdDateTime": iso8601(rec.created),
            "lastModifiedDateTime": iso8601(head.modified),
            "parentReference": {"driveType": "personal", "driveId": self.drive_id(ns.account), "path": "/drive/root:" + parent},
            "file": {"mimeType": rec.extra.get("mime", "application/octet-stream"), "hashes": {"quickXorHash": rec.extra["qxh"][head.rev]}},
            "fileSystemInfo": {"createdDateTime": iso8601(rec.created), "lastModifiedDateTime": iso8601(head.modified)},
        }
        return item

    @staticmethod
    def _check_if_match(rec: FileRecord | None, if_match: str | None) -> None:
        if not if_match or if_match.strip() == "*":
            return
        if rec is None:
            raise GraphError(412, "resourceModified", "ETag does not match current item's value")
        wanted = {f'"{{{rec.id}}},{rec.version}"', f'"c:{{{rec.id}}},{rec.version}"'}
        given = {v.strip().removeprefix("W/") for v in if_match.split(",")}
        # An eTag is itself a quoted string with a comma inside; accept it whole too.
        if if_match.strip().removeprefix("W/") not in wanted and not (given & wanted):
            raise GraphError(412, "resourceModified", "ETag does not match current item's value")

    def _resolve_conflict(self, ns: Namespace, path: str, record: FileRecord | None, behavior: str) -> tuple[str, FileRecord | None]:
        if behavior not in ("fail", "replace", "rename"):
            raise GraphError(400, "invalidRequest", f"Invalid conflictBehavior {behavior!r}; use fail, replace or rename")
        existing = record or ns.by_path(path)
        if existing is None or behavior == "replace":
            return path, existing
        if behavior == "fail":
            raise GraphError(409, "nameAlreadyExists", f"The specified item name already exists. Name: {existing.name}")
        folder, _, name = path.rpartition("/")
        stem, dot, ext = name.rpartition(".")
        if not dot or not stem:
            stem, ext = name, ""
        for n in range(1, 10000):
            candidate = f"{folder}/{stem} {n}{'.' + ext if ext else ''}"
            if ns.by_path(candidate) is None:
                return candidate, None
        raise GraphError(409, "nameAlreadyExists", "No free name")

    def _commit(self, ns: Namespace, path: str, record: FileRecord | None, data: bytes) -> tuple[FileRecord, bool]:
        if record is None:
            record = ns.by_path(path)
        rec, created = ns.put(
            data,
            record=record,
            path=path if record is None else None,
            name=path.rsplit("/", 1)[-1],
            new_id=lambda n: f"{n:X}TB!{n}",
            new_rev=lambda n: str(n),
        )
        rec.extra.setdefault("qxh", {})[rec.head.rev] = quickxor_base64(data)
        ns.save()
        return rec, created

    # -- routes ------------------------------------------------------------

    async def get_drive(self, request, body, ns, m):
        return web.json_response({"id": self.drive_id(ns.account), "driveType": "personal", "owner": {"user": {"displayName": ns.account}},
                                  "quota": {"total": 1 << 40, "used": sum(r.head.size for r in ns.files.values()), "state": "normal"}})

    async def get_item(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.record is None:
            if t.path and ns.folder_exists(t.path):
                return web.json_response({"id": "root" if t.path == "/" else "folder:" + ns.key(t.path), "name": t.path.rsplit("/", 1)[-1] or "root", "folder": {"childCount": len(ns.children(t.path)[0])}})
            raise GraphError(404, "itemNotFound", "Item does not exist")
        return web.json_response(self.drive_item(ns, t.record), headers={"ETag": self.drive_item(ns, t.record)["eTag"]})

    async def delete_item(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.record is None:
            raise GraphError(404, "itemNotFound", "Item does not exist")
        self._check_if_match(t.record, request.headers.get("If-Match"))
        ns.delete(t.record)
        return web.Response(status=204)

    async def simple_upload(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.path is None or t.path == "/":
            raise GraphError(400, "invalidRequest", "Cannot upload content to the drive root")
        if len(body) > 250 * 1024 * 1024:
            raise GraphError(413, "requestTooLarge", "Simple upload is limited to 250 MB; use an upload session")
        self._check_if_match(t.record, request.headers.get("If-Match"))
        behavior = request.query.get("@microsoft.graph.conflictBehavior", "replace")
        path, record = self._resolve_conflict(ns, t.path, t.record, behavior)
        rec, created = self._commit(ns, path, record, body)
        item = self.drive_item(ns, rec)
        return web.json_response(item, status=201 if created else 200, headers={"ETag": item["eTag"]})

    async def download(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.record is None:
            raise GraphError(404, "itemNotFound", "Item does not exist")
        token = "y4m" + random_token(24)
        self.downloads[token] = (ns.account, t.record.id, t.record.head.sha256)
        location = f"{public_base(request, self.download_host)}/dl/{token}"
        return web.Response(status=302, headers={"Location": location})

    async def download_content(self, request: web.Request, body: bytes) -> web.Response:
        found = self.downloads.get(request.path[len("/dl/"):])
        if found is None:
            raise GraphError(404, "itemNotFound", "The download URL is not valid or has expired")
        account, item_id, sha256 = found
        ns = self.store.namespace(self.name, account)
        rec = ns.files.get(item_id)
        rev = next((r for r in (rec.revisions if rec else []) if r.sha256 == sha256), None)
        if rec is None or rev is None:
            raise GraphError(404, "itemNotFound", "Item does not exist")
        return web.Response(body=ns.read(rev), content_type="application/octet-stream",
                            headers={"ETag": f'"{{{rec.id}}},{rec.version}"'})

    async def create_session(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.path is None or t.path == "/":
            raise GraphError(400, "invalidRequest", "Cannot create an upload session for the drive root")
        behavior = "replace"
        if body.strip():
            try:
                doc = json.loads(body)
            except ValueError as e:
                raise GraphError(400, "invalidRequest", f"Request body is not JSON: {e}") from e
            item = doc.get("item", {}) if isinstance(doc, dict) else {}
            behavior = item.get("@microsoft.graph.conflictBehavior", behavior) if isinstance(item, dict) else behavior
        if_match = request.headers.get("If-Match")
        self._check_if_match(t.record, if_match)
        path, record = self._resolve_conflict(ns, t.path, t.record, behavior)
        token = random_token(24)
        session = UploadSession(token=token, account=ns.account, path=path, record_id=record.id if record else None,
                                conflict=behavior if record is None or behavior != "rename" else "replace", if_match=if_match)
        self.sessions[token] = session
        return web.json_response({
            "uploadUrl": f"{public_base(request, self.upload_host)}/rup/{token}",
            "expirationDateTime": iso8601(session.expires, millis=True),
            "nextExpectedRanges": ["0-"],
        })

    def _session(self, request: web.Request) -> UploadSession:
        session = self.sessions.get(request.path[len("/rup/"):])
        if session is None:
            raise GraphError(404, "itemNotFound", "The upload session was not found or has expired")
        return session

    def _status(self, session: UploadSession) -> dict[str, Any]:
        return {"expirationDateTime": iso8601(session.expires, millis=True),
                "nextExpectedRanges": [f"{len(session.data)}-{'' if session.total is None else session.total - 1}"]}

    async def session_status(self, request, body):
        return web.json_response(self._status(self._session(request)))

    async def cancel_session(self, request, body):
        session = self._session(request)
        del self.sessions[session.token]
        return web.Response(status=204)

    async def upload_fragment(self, request: web.Request, body: bytes) -> web.Response:
        if "Authorization" in request.headers:
            raise GraphError(401, "unauthenticated", "The uploadUrl is pre-authenticated; do not send an Authorization header")
        session = self._session(request)
        m = CONTENT_RANGE.match(request.headers.get("Content-Range", "").strip())
        if not m:
            raise GraphError(400, "invalidRequest", "Missing or invalid Content-Range header; expected 'bytes a-b/total'")
        start, end, total = (int(x) for x in m.groups())
        if end < start or end >= total:
            raise GraphError(416, "invalidRange", f"Content-Range {start}-{end}/{total} is not a valid range")
        if session.total is not None and total != session.total:
            raise GraphError(400, "invalidRequest", f"Declared total {total} differs from the session's {session.total}")
        if len(body) != end - start + 1:
            raise GraphError(400, "invalidRequest", f"Content-Range covers {end - start + 1} bytes but the body has {len(body)}")
        if len(body) > MAX_FRAGMENT:
            raise GraphError(413, "requestTooLarge", "A fragment must be at most 60 MiB")
        if start != len(session.data):
            raise GraphError(416, "invalidRange", f"The uploaded fragment overlaps or skips data; next expected range is {len(session.data)}-",)
        last = end + 1 == total
        if not last and len(body) % FRAGMENT_UNIT != 0:
            raise GraphError(400, "invalidRequest", f"Fragment size {len(body)} is not a multiple of 320 KiB (327680 bytes)")
        session.total = total
        session.data += body
        if not last:
            return web.json_response(self._status(session), status=202)
        ns = self.store.namespace(self.name, session.account)
        del self.sessions[session.token]
        record = ns.files.get(session.record_id) if session.record_id else ns.by_path(session.path)
        if session.if_match:
            self._check_if_match(record, session.if_match)
        path, record = self._resolve_conflict(ns, session.path, record, session.conflict)
        rec, created = self._commit(ns, path, record, bytes(session.data))
        item = self.drive_item(ns, rec)
        return web.json_response(item, status=201 if created else 200, headers={"ETag": item["eTag"]})
