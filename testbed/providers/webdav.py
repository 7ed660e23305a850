"""WebDAV / Nextcloud test server: the file operations a sync client uses and
Nextcloud's chunked upload v2.

Follows:
- RFC 4918 (PUT, GET, HEAD, DELETE, MKCOL, MOVE, PROPFIND with Depth 0/1;
  207 multistatus; 409 when the parent collection is missing; `If-Match`,
  `If-None-Match: *` and `Overwrite` preconditions answered 412);
- https://docs.nextcloud.com/server/latest/developer_manual/client_apis/WebDAV/basic.html
  (`/remote.php/dav/files/{user}/...`, `oc:fileid`, `oc:checksums`,
  `OC-ETag`, `OC-FileId`, `X-OC-MTime` answered `accepted`, `OC-Checksum`
  checked on upload and reported back on GET);
- https://docs.nextcloud.com/server/latest/developer_manual/client_apis/WebDAV/chunking.html
  (v2: `MKCOL /remote.php/dav/uploads/{user}/{transfer}` with `Destination`;
  `PUT .../{n}` numbered 1..10000 with `Destination` and `OC-Total-Length`;
  chunks of at least 5 MiB except the last; assembled in the order of their
  numbers by `MOVE .../.file` with `Destination`; a total that differs from
  `OC-Total-Length` is refused; `DELETE` of the transfer folder aborts);
- Sabre/DAV error bodies: `<d:error>` with `<s:exception>` and `<s:message>`.

The legacy `/remote.php/webdav/...` root is served too (same files). ETags
are new for every content version; `OC-FileId` is `%08d` + an instance id.

Not implemented: COPY, PROPPATCH, LOCK, chunking v1 (`-chunking-` names),
PROPFIND on upload folders (resuming), quotas, shares, trash, versions
endpoints, `Depth: infinity` (answered as Depth 1).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit
from xml.sax.saxutils import escape

from aiohttp import web

from .common import bearer_auth, http_date
from .hashes import OcChecksumError, oc_checksum, parse_oc_checksum
from .store import FileRecord, Namespace, Store

INSTANCE_ID = "octestbed01"
FILES_PREFIX = re.compile(r"^/remote\.php/dav/files/(?P<user>[^/]+)(?P<path>/.*)?$")
LEGACY_PREFIX = re.compile(r"^/remote\.php/webdav(?P<path>/.*)?$")
UPLOADS_PREFIX = re.compile(r"^/remote\.php/dav/uploads/(?P<user>[^/]+)/(?P<transfer>[^/]+)(?:/(?P<chunk>[^/]+))?/?$")


class DavError(Exception):
    def __init__(self, status: int, exception: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.exception, self.message, self.headers = status, exception, message, headers or {}


def error_response(status: int, exception: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<d:error xmlns:d="DAV:" xmlns:s="http://sabredav.org/ns">\n'
        f"  <s:exception>{escape(exception)}</s:exception>\n"
        f"  <s:message>{escape(message)}</s:message>\n"
        "</d:error>\n"
    )
    return web.Response(status=status, body=body.encode(), content_type="application/xml", charset="utf-8", headers=headers)


def _not_found(what: str) -> DavError:
    return DavError(404, "Sabre\\DAV\\Exception\\NotFound", f"File with name {what} could not be located")


@dataclass
class ChunkedUpload:
    account: str
    transfer: str
    destination: str | None
    chunks: dict[int, bytes] = field(default_factory=dict)
    total_length: int | None = None


OCS_PATH = re.compile(r"^/ocs/v(?P<v>[12])\.php/cloud/(?P<what>capabilities|user)/?$")
#: What a Nextcloud 28 server reports that sync clients read: the WebDAV
#: root, chunking v2 ("bigfilechunking", dav "chunking": "1.0"), the
#: checksum types it verifies (OC-Checksum SHA1 / MD5 / ADLER32), the poll interval.
OCS_CAPABILITIES = {
    "core": {"pollinterval": 60, "webdav-root": "remote.php/webdav", "reference-api": True},
    "bruteforce": {"delay": 0, "allow-listed": False},
    "dav": {"chunking": "1.0"},  # no "bulkupload": POST /remote.php/dav/bulk is not served
    "files": {"bigfilechunking": True, "blacklisted_files": [".htaccess"], "versioning": True, "undelete": True,
              "comments": False},
    "checksums": {"supportedTypes": ["SHA1", "MD5", "ADLER32"], "preferredUploadType": "SHA1"},
}


class WebDavProvider:
    name = "webdav"

    def __init__(self, store: Store, hosts: list[str], min_chunk: int) -> None:
        self.store = store
        self.hosts = set(hosts)
        self.min_chunk = min_chunk
        self.uploads: dict[tuple[str, str], ChunkedUpload] = {}

    def serves(self, host: str) -> bool:
        return host in self.hosts

    def route_names(self) -> list[str]:
        return ["status", "ocs_capabilities", "ocs_user", "get", "put", "delete", "mkcol", "move", "propfind",
                "chunk_mkcol", "chunk_put", "chunk_assemble", "chunk_delete"]

    def resolve(self, host: str, request: web.Request):
        path, method = request.path, request.method
        if path == "/status.php" and method == "GET":
            return "status", self.status
        m = OCS_PATH.match(path)
        if m and method == "GET":
            version, what = m.group("v"), m.group("what")
            name = "ocs_capabilities" if what == "capabilities" else "ocs_user"
            return name, self._wrap_ocs(what, int(version))
        m = UPLOADS_PREFIX.match(path)
        if m:
            chunk = m.group("chunk")
            table = {
                ("MKCOL", False): ("chunk_mkcol", self.chunk_mkcol),
                ("PUT", True): ("chunk_put", self.chunk_put),
                ("MOVE", True): ("chunk_assemble", self.chunk_assemble),
                ("DELETE", False): ("chunk_delete", self.chunk_delete),
            }
            found = table.get((method, chunk is not None))
            if found is None or (method == "MOVE" and chunk != ".file"):
                return None
            name, fn = found
            return name, self._wrap(fn, m.group("user"), (m.group("transfer"), chunk))
        m = FILES_PREFIX.match(path) or LEGACY_PREFIX.match(path)
        if not m:
            return None
        user = m.groupdict().get("user")
        rel = m.group("path") or "/"
        table = {"GET": "get", "HEAD": "get", "PUT": "put", "DELETE": "delete", "MKCOL": "mkcol", "MOVE": "move", "PROPFIND": "propfind"}
        if method not in table:
            return None
        name = table[method]
        return name, self._wrap(getattr(self, name), user, rel)

    def _wrap_ocs(self, what: str, version: int):
        """The OCS API (https://docs.nextcloud.com/server/latest/developer_manual/client_apis/OCS/ocs-api-overview.html):
        `GET /ocs/v{1,2}.php/cloud/capabilities` (what a desktop client asks
        right after status.php) and `cloud/user`; JSON with `?format=json`
        (or `Accept: application/json`), XML otherwise; v1 says status code
        100 in the body, v2 200; 401 without credentials."""

        async def run(request: web.Request, body: bytes) -> web.Response:
            as_json = request.query.get("format") == "json" or "application/json" in request.headers.get("Accept", "")
            a = bearer_auth(request, allow_basic=True)
            if a.account is None:
                return self._ocs(version, as_json, 997, "Current user is not logged in", None, status=401,
                                 headers={"WWW-Authenticate": 'Basic realm="Nextcloud", charset="UTF-8"'})
            if what == "capabilities":
                data = {"version": {"major": 28, "minor": 0, "micro": 0, "string": "28.0.0", "edition": "", "extendedSupport": False},
                        "capabilities": OCS_CAPABILITIES}
            else:
                data = {"enabled": True, "id": a.account, "display-name": a.account, "displayname": a.account, "email": None,
                        "quota": {"free": 1 << 40, "used": 0, "total": 1 << 40, "relative": 0, "quota": -3}}
            return self._ocs(version, as_json, 100 if version == 1 else 200, "OK", data)

        return run

    @staticmethod
    def _ocs(version: int, as_json: bool, code: int, message: str, data: Any, status: int = 200,
             headers: dict[str, str] | None = None) -> web.Response:
        meta = {"status": "ok" if code in (100, 200) else "failure", "statuscode": code, "message": message}
        if as_json:
            return web.json_response({"ocs": {"meta": meta, "data": data if data is not None else []}}, status=status, headers=headers)

        def xml(value: Any) -> str:
            if isinstance(value, dict):
                return "".join(f"<{k}>{xml(v)}</{k}>" for k, v in value.items())
            if isinstance(value, list):
                return "".join(f"<element>{xml(v)}</element>" for v in value)
            if isinstance(value, bool):
                return "1" if value else ""
            return "" if value is None else escape(str(value))

        text = f'<?xml version="1.0"?>\n<ocs><meta>{xml(meta)}</meta><data>{xml(data or {})}</data></ocs>\n'
        return web.Response(text=text, status=status, content_type="text/xml", headers=headers)

    def _wrap(self, fn, user: str | None, where: Any):
        async def run(request: web.Request, body: bytes) -> web.Response:
            a = bearer_auth(request, allow_basic=True)
            if a.account is None:
                return error_response(401, "Sabre\\DAV\\Exception\\NotAuthenticated",
                                      "No public access to this resource., Username or password was incorrect",
                                      headers={"WWW-Authenticate": 'Basic realm="Nextcloud", charset="UTF-8"'})
            if user is not None and unquote(user) != a.account:
                return error_response(403, "Sabre\\DAV\\Exception\\Forbidden", f"User {a.account!r} cannot access the files of {unquote(user)!r}")
            ns = self.store.namespace(self.name, a.account)
            try:
                return await fn(request, body, ns, where)
            except DavError as e:
                return error_response(e.status, e.exception, e.message, e.headers)

        return run

    def not_found(self, request: web.Request) -> web.Response:
        return error_response(405 if request.path.startswith("/remote.php") else 404,
                              "Sabre\\DAV\\Exception\\MethodNotAllowed" if request.path.startswith("/remote.php") else "Sabre\\DAV\\Exception\\NotFound",
                              f"{request.method} is not supported on {request.path} by this test server")

    def fault_response(self, status: int, retry_after: int) -> web.Response:
        exc = {503: "Sabre\\DAV\\Exception\\ServiceUnavailable", 429: "Sabre\\DAV\\Exception\\TooManyRequests",
               507: "Sabre\\DAV\\Exception\\InsufficientStorage"}.get(status, "Sabre\\DAV\\Exception")
        headers = {"Retry-After": str(retry_after)} if status in (429, 503) else None
        return error_response(status, exc, f"Injected by the testbed ({status})", headers)

    # -- helpers -------------------------------------------------------------

    @staticmethod
    def etag(rec: FileRecord) -> str:
        return rec.head.rev

    @staticmethod
    def file_id_header(rec: FileRecord) -> str:
        return f"{int(rec.id):08d}{INSTANCE_ID}"

    def _headers(self, rec: FileRecord) -> dict[str, str]:
        return {"ETag": f'"{self.etag(rec)}"', "OC-ETag": f'"{self.etag(rec)}"', "OC-FileId": self.file_id_header(rec)}

    @staticmethod
    def _check_preconditions(request: web.Request, rec: FileRecord | None) -> None:
        if_match = request.headers.get("If-Match")
        if if_match is not None:
            tags = {t.strip().removeprefix("W/").strip('"') for t in if_match.split(",")}
            if rec is None or ("*" not in tags and rec.head.rev not in tags):
                raise DavError(412, "Sabre\\DAV\\Exception\\PreconditionFailed", "An If-Match header was specified, but none of the specified ETags matched.")
        if_none = request.headers.get("If-None-Match")
        if if_none is not None and rec is not None:
            tags = {t.strip().removeprefix("W/").strip('"') for t in if_none.split(",")}
            if "*" in tags or rec.head.rev in tags:
                raise DavError(412, "Sabre\\DAV\\Exception\\PreconditionFailed", "An If-None-Match header was specified, but the ETag matched (or * was specified).")

    @staticmethod
    def _verify_checksum(request: web.Request, data: bytes) -> str | None:
        value = request.headers.get("OC-Checksum")
        if value is None:
            return None
        try:
            want = parse_oc_checksum(value)
        except OcChecksumError as e:
            raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", str(e)) from e
        got = oc_checksum(want.algorithm, data)
        if got != want:
            raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", "The computed checksum does not match the one received from the client.")
        return str(want)

    def _write(self, request: web.Request, ns: Namespace, path: str, data: bytes) -> web.Response:
        norm = ns.key(path)
        if norm in ns.folders:
            raise DavError(409, "Sabre\\DAV\\Exception\\Conflict", f"{path} is a collection")
        parent = norm.rsplit("/", 1)[0] or "/"
        if not ns.folder_exists(parent):
            raise DavError(409, "Sabre\\DAV\\Exception\\Conflict", "Files cannot be created in non-existent collections")
        rec = ns.by_path(norm)
        self._check_preconditions(request, rec)
        checksum = self._verify_checksum(request, data)
        mtime = request.headers.get("X-OC-MTime")
        modified = float(mtime) if mtime and re.fullmatch(r"\d+(\.\d+)?", mtime) else None
        rec, created = ns.put(data, record=rec, path=norm if rec is None else None, name=norm.rsplit("/", 1)[-1],
                              new_id=lambda n: str(n), new_rev=lambda n: hashlib.md5(f"{ns.account}/{n}".encode()).hexdigest()[:13],
                              modified=modified)
        checksums = rec.extra.setdefault("checksum", {})
        if checksum:
            checksums[rec.head.rev] = checksum
        ns.save()
        headers = self._headers(rec)
        if modified is not None:
            headers["X-OC-MTime"] = "accepted"
        return web.Response(status=201 if created else 204, headers=headers)

    def _destination(self, request: web.Request) -> tuple[str | None, str]:
        """(user, path) named by a Destination header (a URL or an absolute path)."""
        dest = request.headers.get("Destination")
        if not dest:
            raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", "The Destination header was not supplied")
        path = unquote(urlsplit(dest).path)
        m = FILES_PREFIX.match(path) or LEGACY_PREFIX.match(path)
        if not m:
            raise DavError(502, "Sabre\\DAV\\Exception\\BadGateway", f"The destination {dest!r} is not on this server's files tree")
        return m.groupdict().get("user"), m.group("path") or "/"

    # -- plain WebDAV ---------------------------------------------------------

    async def status(self, request: web.Request, body: bytes) -> web.Response:
        return web.json_response({"installed": True, "maintenance": False, "needsDbUpgrade": False, "version": "28.0.0.0",
                                  "versionstring": "28.0.0", "edition": "", "productname": "Nextcloud (testbed)", "extendedSupport": False})

    async def get(self, request, body, ns, path):
        rec = ns.by_path(path)
        if rec is None:
            if ns.folder_exists(path):
                raise DavError(405, "Sabre\\DAV\\Exception\\MethodNotAllowed", "GET of a collection is not supported")
            raise _not_found(path)
        headers = {**self._headers(rec), "Last-Modified": http_date(rec.head.modified)}
        checksum = rec.extra.get("checksum", {}).get(rec.head.rev)
        if checksum:
            headers["OC-Checksum"] = checksum
        data = ns.read(rec.head)
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(status=200, headers=headers, content_type="application/octet-stream")
        return web.Response(body=data, headers=headers, content_type="application/octet-stream")

    async def put(self, request, body, ns, path):
        return self._write(request, ns, path, body)

    async def mkcol(self, request, body, ns, path):
        key = ns.key(path)
        if ns.folder_exists(key) or ns.by_path(key):
            raise DavError(405, "Sabre\\DAV\\Exception\\MethodNotAllowed", "The resource you tried to create already exists")
        parent = key.rsplit("/", 1)[0] or "/"
        if not ns.folder_exists(parent):
            raise DavError(409, "Sabre\\DAV\\Exception\\Conflict", "Parent node does not exist")
        ns.folders.add(key)
        ns.save()
        return web.Response(status=201)

    async def delete(self, request, body, ns, path):
        key = ns.key(path)
        rec = ns.by_path(key)
        if rec is not None:
            self._check_preconditions(request, rec)
            ns.delete(rec)
            return web.Response(status=204)
        if key != "/" and ns.folder_exists(key):
            for r in [r for r in ns.files.values() if r.path and ns.key(r.path).startswith(key + "/")]:
                ns.files.pop(r.id)
            ns.folders = {f for f in ns.folders if f != key and not f.startswith(key + "/")}
            ns.save()
            return web.Response(status=204)
        raise _not_found(path)

    async def move(self, request, body, ns, path):
        user, dest = self._destination(request)
        if user is not None and user != ns.account:
            raise DavError(403, "Sabre\\DAV\\Exception\\Forbidden", "Cannot move into another user's files")
        src, dst = ns.key(path), ns.key(dest)
        overwrite = request.headers.get("Overwrite", "T").upper() != "F"
        if not ns.folder_exists(dst.rsplit("/", 1)[0] or "/"):
            raise DavError(409, "Sabre\\DAV\\Exception\\Conflict", "The destination node is not found")
        existing = ns.by_path(dst)
        if (existing or (dst in ns.folders)) and not overwrite:
            raise DavError(412, "Sabre\\DAV\\Exception\\PreconditionFailed", "The destination node already exists, and the overwrite header is set to false")
        rec = ns.by_path(src)
        if rec is not None:
            if existing is not None and existing is not rec:
                ns.files.pop(existing.id)
            rec.path, rec.name = dst, dst.rsplit("/", 1)[-1]
        elif src != "/" and ns.folder_exists(src):
            for r in ns.files.values():
                if r.path and ns.key(r.path).startswith(src + "/"):
                    r.path = dst + ns.key(r.path)[len(src):]
            ns.folders = {dst + f[len(src):] if f == src or f.startswith(src + "/") else f for f in ns.folders}
        else:
            raise _not_found(path)
        ns.save()
        return web.Response(status=204 if existing else 201)

    async def propfind(self, request, body, ns, path):
        key = ns.key(path)
        depth = request.headers.get("Depth", "1")
        base = request.path[: len(request.path) - len(path)] if path != "/" else request.path.rstrip("/")
        responses = []
        rec = ns.by_path(key) if key != "/" else None
        if rec is not None:
            responses.append(self._file_props(base, rec))
        elif ns.folder_exists(key):
            files, folders = ns.children(key)
            responses.append(self._folder_props(base, key, ns))
            if depth != "0":
                responses += [self._folder_props(base, f, ns) for f in folders]
                responses += [self._file_props(base, r) for r in files]
        else:
            raise _not_found(path)
        xml = (
            '<?xml version="1.0"?>\n<d:multistatus xmlns:d="DAV:" xmlns:s="http://sabredav.org/ns" '
            'xmlns:oc="http://owncloud.org/ns" xmlns:nc="http://nextcloud.org/ns">' + "".join(responses) + "</d:multistatus>\n"
        )
        return web.Response(status=207, body=xml.encode(), content_type="application/xml", charset="utf-8")

    @staticmethod
    def _href(base: str, key: str, folder: bool) -> str:
        href = base + quote(key, safe="/")
        return href.rstrip("/") + "/" if folder else href

    def _file_props(self, base: str, rec: FileRecord) -> str:
        checksum = rec.extra.get("checksum", {}).get(rec.head.rev)
        checksums = f"<oc:checksums><oc:checksum>{escape(checksum)}</oc:checksum></oc:checksums>" if checksum else "<oc:checksums/>"
        assert rec.path is not None
        return (
            f"<d:response><d:href>{escape(self._href(base, rec.path, False))}</d:href><d:propstat><d:prop>"
            f"<d:getlastmodified>{http_date(rec.head.modified)}</d:getlastmodified>"
            f"<d:getcontentlength>{rec.head.size}</d:getcontentlength>"
            "<d:resourcetype/>"
            f"<d:getetag>&quot;{self.etag(rec)}&quot;</d:getetag>"
            "<d:getcontenttype>application/octet-stream</d:getcontenttype>"
            f"<oc:fileid>{int(rec.id)}</oc:fileid><oc:id>{self.file_id_header(rec)}</oc:id>"
            f"<oc:size>{rec.head.size}</oc:size><oc:permissions>RGDNVW</oc:permissions>{checksums}"
            "</d:prop><d:status>HTTP/1.1 200 OK</d:status></d:propstat></d:response>"
        )

    def _folder_props(self, base: str, key: str, ns: Namespace) -> str:
        inside = [r for r in ns.files.values() if r.path and (key == "/" or ns.key(r.path).startswith(key.rstrip("/") + "/"))]
        etag = hashlib.md5("|".join(sorted(r.head.rev for r in inside)).encode() + key.encode()).hexdigest()[:13]
        modified = max([r.head.modified for r in inside], default=time.time())
        return (
            f"<d:response><d:href>{escape(self._href(base, key, True))}</d:href><d:propstat><d:prop>"
            f"<d:getlastmodified>{http_date(modified)}</d:getlastmodified>"
            "<d:resourcetype><d:collection/></d:resourcetype>"
            f"<d:getetag>&quot;{etag}&quot;</d:getetag>"
            f"<oc:size>{sum(r.head.size for r in inside)}</oc:size><oc:permissions>RGDNVCK</oc:permissions>"
            "</d:prop><d:status>HTTP/1.1 200 OK</d:status></d:propstat></d:response>"
        )

    # -- chunking v2 ---------------------------------------------------------

    def _upload(self, ns: Namespace, transfer: str) -> ChunkedUpload:
        up = self.uploads.get((ns.account, transfer))
        if up is None:
            raise DavError(404, "Sabre\\DAV\\Exception\\NotFound", f"Upload folder {transfer} does not exist")
        return up

    def _check_destination(self, request: web.Request, up: ChunkedUpload) -> None:
        dest = request.headers.get("Destination")
        if up.destination is not None and dest is None:
            raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", "Chunked upload v2: every request needs a Destination header")
        if up.destination is not None and dest != up.destination:
            raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", f"Destination {dest!r} differs from the one given at MKCOL ({up.destination!r})")

    async def chunk_mkcol(self, request, body, ns, where):
        transfer, _ = where
        if (ns.account, transfer) in self.uploads:
            raise DavError(405, "Sabre\\DAV\\Exception\\MethodNotAllowed", "The resource you tried to create already exists")
        dest = request.headers.get("Destination")
        if dest is not None:
            user, _ = self._destination(request)
            if user is not None and user != ns.account:
                raise DavError(403, "Sabre\\DAV\\Exception\\Forbidden", "The destination is another user's")
        self.uploads[(ns.account, transfer)] = ChunkedUpload(ns.account, transfer, dest)
        return web.Response(status=201)

    async def chunk_put(self, request, body, ns, where):
        transfer, chunk = where
        up = self._upload(ns, transfer)
        self._check_destination(request, up)
        if up.destination is not None:
            if not chunk.isdigit() or not 1 <= int(chunk) <= 10000:
                raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", f"Chunk name {chunk!r}: chunks are numbered 1 to 10000")
            if len(body) > 5 * 1024**3:
                raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", "A chunk must be at most 5 GiB")
        total = request.headers.get("OC-Total-Length")
        if total is not None:
            if not total.isdigit() or (up.total_length is not None and int(total) != up.total_length):
                raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", f"OC-Total-Length {total!r} is invalid or differs from earlier chunks")
            up.total_length = int(total)
        key = int(chunk) if chunk.isdigit() else chunk
        existed = key in up.chunks
        up.chunks[key] = body
        return web.Response(status=204 if existed else 201)

    async def chunk_assemble(self, request, body, ns, where):
        transfer, _ = where
        up = self._upload(ns, transfer)
        self._check_destination(request, up)
        user, dest = self._destination(request)
        if user is not None and user != ns.account:
            raise DavError(403, "Sabre\\DAV\\Exception\\Forbidden", "The destination is another user's")
        order = sorted(up.chunks, key=lambda k: (isinstance(k, str), k))
        sizes = [len(up.chunks[k]) for k in order]
        if self.min_chunk and up.destination is not None:
            small = [str(k) for k, s in zip(order[:-1], sizes[:-1]) if s < self.min_chunk]
            if small:
                raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest",
                               f"Chunks {', '.join(small)} are smaller than {self.min_chunk} bytes; only the last chunk may be smaller")
        total = request.headers.get("OC-Total-Length")
        size = sum(sizes)
        if total is not None and (not total.isdigit() or int(total) != size):
            raise DavError(400, "Sabre\\DAV\\Exception\\BadRequest", f"Chunks on server do not sum up to {total} but to {size} bytes")
        data = b"".join(up.chunks[k] for k in order)
        response = self._write(request, ns, dest, data)
        del self.uploads[(ns.account, transfer)]
        return response

    async def chunk_delete(self, request, body, ns, where):
        transfer, _ = where
        self._upload(ns, transfer)
        del self.uploads[(ns.account, transfer)]
        return web.Response(status=204)
