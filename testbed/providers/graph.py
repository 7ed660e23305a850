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

- https://learn.microsoft.com/en-us/graph/api/driveitem-post-children (folders:
  `POST …/children` with `{"name", "folder": {}}`, conflictBehavior default
  `fail`), driveitem-list-children (`GET …/children`, `$top`, continued by
  `@odata.nextLink`), driveitem-get, driveitem-delete (a folder with what it
  holds) and driveitem-update (`PATCH`, `fileSystemInfo` only).

Revisions: `eTag` `"{id},N"` and `cTag` `"c:{id},N"` change with every
content version; `If-Match` accepts either. `file.hashes` carries
`quickXorHash` and `sha1Hash` (OneDrive Personal reported it; rclone 1.60 uses
it for drive_type personal). Paths compare case-insensitively. Folders are
explicit (created) or implied by file paths; their ids derive from the path,
the root's is `ROOT!0` (`root` works as an alias).

An `Authorization` header on an uploadUrl fragment gets 401 unless the server
runs with `--graph-fragment-auth accept` (the page says it "may result in" a
401; rclone 1.60 sends one).

Deliberately not implemented: renaming or moving items, folder metadata
updates, `deferCommit`, out-of-order fragments (real Graph tolerates them; we
require contiguous ranges, which is what the EPS sends), session expiry,
`Range` downloads, thumbnails, sharing, delta.
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
    r"(?:/(?:root|items/(?P<item>[^/:]+))(?::(?P<rel>/[^:]*):?)?)?(?P<action>/content|/createUploadSession|/children)?/?$"
)
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_SLASHES = re.compile(r"/{2,}")
_ESCAPED = re.compile(r"%(3[Aa]|2[Ff])")


def normalise_path(raw: str) -> str:
    """Graph takes an address however the client spells it: the Graph SDK's
    base URL ends in a slash (`/v1.0//me/drive/...`) and it expands an item
    id such as `root:/Docs/A.docx:` percent-encoded
    (`items/root%3A%2FDocs%2FA.docx%3A`); both name the same item as
    `root:/Docs/A.docx:`."""
    raw = _ESCAPED.sub(lambda m: ":" if m.group(1).lower() == "3a" else "/", raw)
    return _SLASHES.sub("/", raw)


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


def _file_system_info(doc: Any) -> dict[str, str]:
    """The writable part of a fileSystemInfo facet (ISO 8601 strings kept as sent)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise GraphError(400, "invalidRequest", "fileSystemInfo must be an object")
    out = {}
    for k in ("createdDateTime", "lastModifiedDateTime"):
        v = doc.get(k)
        if v is None:
            continue
        if not isinstance(v, str) or not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$", v):
            raise GraphError(400, "invalidRequest", f"fileSystemInfo.{k} is not an ISO 8601 date-time: {v!r}")
        out[k] = v
    return out


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError as e:
        raise GraphError(400, "invalidRequest", f"Request body is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise GraphError(400, "invalidRequest", "Request body must be a JSON object")
    return doc


@dataclass
class Target:
    """What a URL addresses: an existing file (`record`), or a path (a folder,
    or a file that does not exist yet)."""

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
    file_system_info: dict[str, Any] | None = None
    total: int | None = None
    data: bytearray = field(default_factory=bytearray)
    expires: float = field(default_factory=lambda: time.time() + 7 * 24 * 3600)


class GraphProvider:
    name = "graph"

    def __init__(self, store: Store, upload_host: str, download_host: str, fragment_auth_accepted: bool = False) -> None:
        self.store = store
        self.fragment_auth_accepted = fragment_auth_accepted
        self.upload_host = upload_host
        self.download_host = download_host
        self.sessions: dict[str, UploadSession] = {}
        self.downloads: dict[str, tuple[str, str, str]] = {}  # token -> (account, item id, sha256)

    def serves(self, host: str) -> bool:
        return host in (GRAPH_HOST, self.upload_host, "api.onedrive.com") or host.endswith((".sharepoint.com", ".files.1drv.com"))

    def route_names(self) -> list[str]:
        return ["get_drive", "get_item", "update_item", "delete_item", "list_children", "create_folder", "simple_upload", "download", "create_upload_session",
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
        path = normalise_path(request.rel_url.raw_path)
        m = ITEM_PATH.match(path)
        if not m:
            return None
        action = m.group("action")
        addressed = m.group("item") is not None or m.group("rel") is not None or "/root" in path
        key = (method, action, addressed)
        table = {
            ("GET", None, False): ("get_drive", self.get_drive),
            ("GET", None, True): ("get_item", self.get_item),
            ("PATCH", None, True): ("update_item", self.update_item),
            ("DELETE", None, True): ("delete_item", self.delete_item),
            ("GET", "/children", True): ("list_children", self.list_children),
            ("POST", "/children", True): ("create_folder", self.create_folder),
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
        base = "/"
        if item is not None and item.lower() != "root":
            item = unquote(item)
            rec = ns.files.get(item)
            if rec is not None:
                if rel is None:
                    return Target(rec.path, rec)
                raise GraphError(400, "invalidRequest", "A file cannot be the parent of an item")
            base = self.folder_path(ns, item)
            if base is None:
                raise GraphError(404, "itemNotFound", "Item does not exist")
        if rel is None:
            return Target(base, None)
        path = base.rstrip("/") + "/" + "/".join(p for p in rel.split("/") if p)
        return Target(path, ns.by_path(path))

    # Folders have no record in the store (they are explicit keys or implied by
    # file paths); their ids are derived from the case-folded path, so they are
    # stable across restarts and never collide with file ids ("{n:X}TB!{n}").
    @staticmethod
    def folder_id(ns: Namespace, path: str) -> str:
        key = ns.key(path)
        return "ROOT!0" if key == "/" else hashlib.sha256(key.encode()).hexdigest()[:16].upper() + "!F"

    def folder_path(self, ns: Namespace, item_id: str) -> str | None:
        for key, display in ns.all_folders().items():
            if self.folder_id(ns, key) == item_id.upper():
                return display
        return None

    def _parent_reference(self, ns: Namespace, path: str) -> dict[str, Any]:
        parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
        return {"driveType": "personal", "driveId": self.drive_id(ns.account), "id": self.folder_id(ns, parent),
                "path": "/drive/root:" + ("" if parent == "/" else parent)}

    def folder_item(self, ns: Namespace, path: str) -> dict[str, Any]:
        files, folders = ns.children(path)
        created = min((r.created for r in files), default=time.time())
        item = {
            "id": self.folder_id(ns, path),
            "name": "root" if path == "/" else path.rstrip("/").rsplit("/", 1)[-1],
            "size": sum(r.head.size for r in files),
            "folder": {"childCount": len(files) + len(folders)},
            "createdDateTime": iso8601(created),
            "lastModifiedDateTime": iso8601(created),
            "fileSystemInfo": {"createdDateTime": iso8601(created), "lastModifiedDateTime": iso8601(created)},
        }
        if path == "/":
            item["root"] = {}
        else:
            item["parentReference"] = self._parent_reference(ns, path)
        return item

    def drive_item(self, ns: Namespace, rec: FileRecord, base: str | None = None) -> dict[str, Any]:
        head = rec.head
        assert rec.path is not None
        hashes = {"quickXorHash": rec.extra["qxh"][head.rev]}
        # OneDrive Personal also reported sha1Hash (upper-case hex) in the hashes facet.
        if head.rev in rec.extra.get("sha1", {}):
            hashes["sha1Hash"] = rec.extra["sha1"][head.rev]
        fsi = {"createdDateTime": iso8601(rec.created), "lastModifiedDateTime": iso8601(head.modified)}
        fsi.update(rec.extra.get("fsi", {}))
        item = {
            "id": rec.id,
            "name": rec.name,
            "size": head.size,
            "eTag": f'"{{{rec.id}}},{rec.version}"',
            "cTag": f'"c:{{{rec.id}}},{rec.version}"',
            "createdDateTime": iso8601(rec.created),
            "lastModifiedDateTime": iso8601(head.modified),
            "parentReference": self._parent_reference(ns, rec.path),
            "file": {"mimeType": rec.extra.get("mime", "application/octet-stream"), "hashes": hashes},
            "fileSystemInfo": fsi,
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

    def _commit(self, ns: Namespace, path: str, record: FileRecord | None, data: bytes,
                file_system_info: dict[str, Any] | None = None) -> tuple[FileRecord, bool]:
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
        rec.extra.setdefault("sha1", {})[rec.head.rev] = hashlib.sha1(data).hexdigest().upper()
        # fileSystemInfo is the client's own timestamps: a new version without them
        # takes the server's time, one with them (upload session item) keeps them.
        rec.extra["fsi"] = _file_system_info(file_system_info)
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
                return web.json_response(self.folder_item(ns, t.path))
            raise GraphError(404, "itemNotFound", "Item does not exist")
        item = self.drive_item(ns, t.record)
        return web.json_response(item, headers={"ETag": item["eTag"]})

    async def update_item(self, request, body, ns, m):
        """PATCH a driveItem (driveitem-update): only fileSystemInfo is writable here."""
        t = self._target(ns, m)
        if t.record is None:
            if t.path and ns.folder_exists(t.path):
                raise GraphError(400, "invalidRequest", "This test server cannot update folders")
            raise GraphError(404, "itemNotFound", "Item does not exist")
        self._check_if_match(t.record, request.headers.get("If-Match"))
        doc = _json_body(body)
        unsupported = set(doc) - {"fileSystemInfo", "@microsoft.graph.conflictBehavior"}
        if unsupported:
            raise GraphError(400, "invalidRequest", f"This test server can only update fileSystemInfo, not {sorted(unsupported)}")
        t.record.extra.setdefault("fsi", {}).update(_file_system_info(doc.get("fileSystemInfo")))
        ns.save()
        item = self.drive_item(ns, t.record)
        return web.json_response(item, headers={"ETag": item["eTag"]})

    async def delete_item(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.record is None:
            if t.path and t.path != "/" and ns.folder_exists(t.path):
                # Deleting a folder deletes what it holds (driveitem-delete).
                key = ns.key(t.path)
                for rec in [r for r in ns.files.values() if r.path and ns.key(r.path).startswith(key + "/")]:
                    ns.files.pop(rec.id, None)
                ns.folders = {f for f in ns.folders if f != key and not f.startswith(key + "/")}
                ns.save()
                return web.Response(status=204)
            raise GraphError(404, "itemNotFound", "Item does not exist")
        self._check_if_match(t.record, request.headers.get("If-Match"))
        ns.delete(t.record)
        return web.Response(status=204)

    async def list_children(self, request, body, ns, m):
        """GET …/children (driveitem-list-children): `$top` pages, `@odata.nextLink` to continue."""
        t = self._target(ns, m)
        if t.record is not None:
            raise GraphError(400, "invalidRequest", "A file has no children")
        if not (t.path and ns.folder_exists(t.path)):
            raise GraphError(404, "itemNotFound", "Item does not exist")
        try:
            top = int(request.query.get("$top", "200"))
            skip = int(request.query.get("$skiptoken", "0"))
        except ValueError as e:
            raise GraphError(400, "invalidRequest", f"Invalid $top or $skiptoken: {e}") from e
        if not 1 <= top <= 1000 or skip < 0:
            raise GraphError(400, "invalidRequest", "$top must be 1-1000")
        files, folders = ns.children(t.path)
        display = ns.all_folders()
        items = [self.folder_item(ns, display.get(f, f)) for f in folders] + [self.drive_item(ns, r) for r in files]
        items.sort(key=lambda i: i["name"].lower())
        page = items[skip : skip + top]
        out: dict[str, Any] = {"value": page}
        if skip + top < len(items):
            query = dict(request.query)
            query.update({"$top": str(top), "$skiptoken": str(skip + top)})
            out["@odata.nextLink"] = str(request.url.with_query(query).with_scheme(request.scheme))
        return web.json_response(out)

    async def create_folder(self, request, body, ns, m):
        """POST …/children with `{"name", "folder": {}}` (driveitem-post-children)."""
        t = self._target(ns, m)
        if t.record is not None:
            raise GraphError(400, "invalidRequest", "A file cannot hold children")
        if not (t.path and ns.folder_exists(t.path)):
            raise GraphError(404, "itemNotFound", "The parent item does not exist")
        doc = _json_body(body)
        name = doc.get("name")
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise GraphError(400, "invalidRequest", "A folder needs a valid name")
        if "folder" not in doc:
            raise GraphError(400, "invalidRequest", "This test server creates folders only (the folder facet is required)")
        behavior = doc.get("@microsoft.graph.conflictBehavior", "fail")
        path = t.path.rstrip("/") + "/" + name
        if ns.by_path(path) is not None or ns.folder_exists(path):
            if behavior == "fail":
                raise GraphError(409, "nameAlreadyExists", f"The specified item name already exists. Name: {name}")
            if behavior == "rename":
                n = 1
                while ns.by_path(f"{path} {n}") is not None or ns.folder_exists(f"{path} {n}"):
                    n += 1
                path = f"{path} {n}"
            elif ns.by_path(path) is not None:
                raise GraphError(409, "nameAlreadyExists", f"A file named {name} exists")
            elif behavior != "replace":
                raise GraphError(400, "invalidRequest", f"Invalid conflictBehavior {behavior!r}")
        key = ns.key(path)
        ns.folders.add(key)
        ns.folder_display[key] = path
        ns.save()
        return web.json_response(self.folder_item(ns, path), status=201)

    async def simple_upload(self, request, body, ns, m):
        t = self._target(ns, m)
        if t.path is None or (t.record is None and ns.folder_exists(t.path)):
            raise GraphError(400, "invalidRequest", "Cannot upload content to a folder")
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
        if t.path is None or (t.record is None and ns.folder_exists(t.path)):
            raise GraphError(400, "invalidRequest", "Cannot create an upload session for a folder")
        behavior = "replace"
        fsi: dict[str, str] = {}
        if body.strip():
            try:
                doc = json.loads(body)
            except ValueError as e:
                raise GraphError(400, "invalidRequest", f"Request body is not JSON: {e}") from e
            item = doc.get("item", {}) if isinstance(doc, dict) else {}
            behavior = item.get("@microsoft.graph.conflictBehavior", behavior) if isinstance(item, dict) else behavior
            fsi = _file_system_info(item.get("fileSystemInfo")) if isinstance(item, dict) else {}
        if_match = request.headers.get("If-Match")
        self._check_if_match(t.record, if_match)
        path, record = self._resolve_conflict(ns, t.path, t.record, behavior)
        token = random_token(24)
        session = UploadSession(token=token, account=ns.account, path=path, record_id=record.id if record else None,
                                conflict=behavior if record is None or behavior != "rename" else "replace", if_match=if_match,
                                file_system_info=fsi)
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
        if "Authorization" in request.headers and not self.fragment_auth_accepted:
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
        rec, created = self._commit(ns, path, record, bytes(session.data), session.file_system_info)
        item = self.drive_item(ns, rec)
        return web.json_response(item, status=201 if created else 200, headers={"ETag": item["eTag"]})
