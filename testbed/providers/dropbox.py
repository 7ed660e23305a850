"""Dropbox API v2 test server: the file routes a sync client uses.

Follows https://www.dropbox.com/developers/documentation/http/documentation
(files/upload, files/upload_session/start, append_v2, finish,
finish_batch_v2, files/download, files/get_metadata, files/list_folder,
files/list_folder/continue, files/delete_v2) and the error rules in its "Errors" section:

- 400 with a plain-text body for malformed input (bad `Dropbox-API-Arg`);
- 401 `{"error_summary": "invalid_access_token/..", "error": {".tag": ...}}`;
- 409 endpoint errors `{"error_summary": "path/conflict/file/..", "error": {...}}`
  shaped exactly like the route's error union (UploadError, UploadSessionFinishError, ...);
- 429 `{"error_summary": "too_many_requests/..", "error": {"reason": {".tag":
  "too_many_requests"}, "retry_after": N}}` with `Retry-After`;
- 5xx plain text.

Write modes: `add`, `overwrite`, `{".tag": "update", "update": rev}`, with
`autorename` (`name (1).ext`) and `strict_conflict`. As documented, a write
whose content equals the existing file is not a conflict (unless strict) and
creates no new revision. Paths compare case-insensitively. Upload sessions
check offsets (`incorrect_offset` with `correct_offset`), `closed`,
`not_closed` (batch), `not_found`; sessions live in memory.

`content_hash` is per call, as the argument types document it ("a hash of
the file content uploaded in this call"): on `upload`, `start`, `append_v2`
and `finish` it describes that request's own body (the Dropbox Python SDK
12.x sends one on every call by default, `finish` included), so a finish
carrying the last bytes, or none, is checked against those bytes only;
`content_hash_mismatch` otherwise. (`finish_batch_v2` uploads nothing in its
call; an entry's `content_hash` is checked against the whole session.)
`files/download` honours `Range: bytes=a-b` / `a-` / `-n` (206 with
`Content-Range`, 416 when unsatisfiable), which the SDK's parallel download
helper sends.

Not implemented: `ns:` paths, `Dropbox-API-Path-Root` semantics (accepted,
ignored), concurrent sessions, the async `finish_batch` (v1), properties,
file locks, folders as
objects (they are implied by file paths), recursive listings; list cursors
page through the current folder (no change feed after the last page).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .common import bearer_auth, iso8601
from .hashes import dropbox_content_hash
from .store import FileRecord, Namespace, Revision, Store, random_token

CONTENT_HOST = "content.dropboxapi.com"
API_HOST = "api.dropboxapi.com"
MAX_REQUEST_BYTES = 150 * 1024 * 1024
PATH_PATTERN = re.compile(r"^(/(.|[\r\n])*|id:.*|rev:.*)$", re.S)


_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")


def byte_range(value: str, size: int) -> tuple[int, int] | tuple[()] | None:
    """A single `Range: bytes=` spec (RFC 9110 §14.1.2) against `size`:
    (first, last) inclusive, () when unsatisfiable, None when it is not a
    single bytes range (then the whole body is sent)."""
    m = _RANGE.match(value)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None
    a, b = m.groups()
    if a == "":  # suffix: the last n bytes
        n = int(b)
        return (size - min(n, size), size - 1) if n > 0 and size > 0 else ()
    first = int(a)
    last = size - 1 if b == "" else min(int(b), size - 1)
    if b != "" and int(b) < first:
        return None
    if first >= size:
        return ()
    return first, last


class DropboxApiError(Exception):
    """A 409 endpoint error: `summary_tags` build error_summary, `error` is the union value."""

    def __init__(self, error: dict[str, Any], summary: str) -> None:
        super().__init__(summary)
        self.error = error
        self.summary = summary


class BadInput(Exception):
    """A 400: Dropbox answers these with plain text."""


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(data).encode(), content_type="application/json", headers=headers
    )


def _conflict(route_error_tag: str, nested: bool) -> DropboxApiError:
    write_error = {".tag": "conflict", "conflict": {".tag": "file"}}
    if nested:  # files/upload: UploadError.path is UploadWriteFailed {reason, upload_session_id}
        err = {".tag": "path", "reason": write_error, "upload_session_id": "pid_upload_session:" + random_token()}
    else:  # finish: UploadSessionFinishError.path is a WriteError
        err = {".tag": "path", "path": write_error}
    return DropboxApiError(err, "path/conflict/file/")


@dataclass
class UploadSession:
    id: str
    account: str
    data: bytearray = field(default_factory=bytearray)
    closed: bool = False
    created: float = field(default_factory=time.time)


class DropboxProvider:
    name = "dropbox"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sessions: dict[str, UploadSession] = {}
        self.cursors: dict[str, tuple[str, str, int, int]] = {}  # cursor -> (account, folder, offset, limit)
        self.routes = {
            (CONTENT_HOST, "/2/files/upload"): ("upload", self.upload),
            (CONTENT_HOST, "/2/files/upload_session/start"): ("upload_session/start", self.session_start),
            (CONTENT_HOST, "/2/files/upload_session/append_v2"): ("upload_session/append_v2", self.session_append_v2),
            (CONTENT_HOST, "/2/files/upload_session/append"): ("upload_session/append", self.session_append_v1),
            (CONTENT_HOST, "/2/files/upload_session/finish"): ("upload_session/finish", self.session_finish),
            (API_HOST, "/2/files/upload_session/finish_batch_v2"): ("upload_session/finish_batch_v2", self.finish_batch_v2),
            (CONTENT_HOST, "/2/files/download"): ("download", self.download),
            (API_HOST, "/2/files/get_metadata"): ("get_metadata", self.get_metadata),
            (API_HOST, "/2/files/list_folder"): ("list_folder", self.list_folder),
            (API_HOST, "/2/files/list_folder/continue"): ("list_folder/continue", self.list_folder_continue),
            (API_HOST, "/2/files/delete_v2"): ("delete_v2", self.delete_v2),
        }

    def serves(self, host: str) -> bool:
        return host in (CONTENT_HOST, API_HOST)

    def route_names(self) -> list[str]:
        return [name for name, _ in self.routes.values()]

    def resolve(self, host: str, request: web.Request):
        found = self.routes.get((host, request.path))
        if found is None:
            return None
        name, handler = found

        async def run(req: web.Request, body: bytes) -> web.Response:
            return await self._guarded(name, handler, req, body)

        return name, run

    def not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text=f"Unknown API function: {request.path!r}")

    def fault_response(self, status: int, retry_after: int) -> web.Response:
        if status == 429:
            return _json(
                {
                    "error_summary": "too_many_requests/",
                    "error": {"reason": {".tag": "too_many_requests"}, "retry_after": retry_after},
                },
                status=429,
                headers={"Retry-After": str(retry_after)},
            )
        headers = {"Retry-After": str(retry_after)} if status == 503 else None
        return web.Response(status=status, text="Internal server error (injected by the testbed)", headers=headers)

    # -- plumbing ------------------------------------------------------------

    async def _guarded(self, name: str, handler, request: web.Request, body: bytes) -> web.Response:
        function = name.replace("upload_session", "upload_session")
        auth = bearer_auth(request)
        if auth.problem == "missing":
            return web.Response(
                status=400,
                text=f'Error in call to API function "files/{function}": Must provide HTTP header "Authorization" or URL parameter "authorization".',
            )
        if auth.account is None:
            tag = "expired_access_token" if auth.problem == "expired" else "invalid_access_token"
            return _json({"error_summary": f"{tag}/", "error": {".tag": tag}}, status=401)
        ns = self.store.namespace(self.name, auth.account)
        try:
            return await handler(request, body, ns)
        except DropboxApiError as e:
            return _json({"error_summary": e.summary + ".", "error": e.error}, status=409)
        except BadInput as e:
            return web.Response(status=400, text=f'Error in call to API function "files/{function}": {e}')

    def _arg(self, request: web.Request, body: bytes, on_content_host: bool) -> dict[str, Any]:
        if on_content_host:
            raw = request.headers.get("Dropbox-API-Arg") or request.query.get("arg")
            if raw is None:
                raise BadInput('Must provide HTTP header "Dropbox-API-Arg" or URL parameter "arg".')
            # aiohttp decodes header bytes as UTF-8 with surrogateescape; Dropbox
            # accepts raw UTF-8 in the header, so undo that before parsing.
            try:
                raw = raw.encode("utf-8", "surrogateescape").decode("utf-8")
                arg = json.loads(raw)
            except (UnicodeError, ValueError) as e:
                raise BadInput(f'HTTP header "Dropbox-API-Arg": could not decode input as JSON ({e})') from e
        else:
            ctype = request.headers.get("Content-Type", "")
            if not ctype.startswith("application/json"):
                raise BadInput(f'Bad HTTP "Content-Type" header: "{ctype}".  Expecting one of "application/json".')
            try:
                arg = json.loads(body or b"null")
            except ValueError as e:
                raise BadInput(f"request body: could not decode input as JSON ({e})") from e
        if not isinstance(arg, dict):
            raise BadInput("request body: expected an object")
        return arg

    @staticmethod
    def _path(arg: dict[str, Any], key: str = "path") -> str:
        path = arg.get(key)
        if not isinstance(path, str) or not PATH_PATTERN.match(path):
            raise BadInput(f"{key}: {path!r} did not match pattern '(/(.|[\\r\\n])*)|(ns:[0-9]+(/.*)?)|(id:.*)'")
        return path

    # -- metadata ------------------------------------------------------------

    @staticmethod
    def metadata(rec: FileRecord, tagged: bool, rev: Revision | None = None) -> dict[str, Any]:
        rev = rev or rec.head
        meta: dict[str, Any] = {}
        if tagged:
            meta[".tag"] = "file"
        assert rec.path is not None
        meta.update(
            name=rec.name,
            path_lower=rec.path.lower(),
            path_display=rec.path,
            id=rec.id,
            client_modified=rec.extra.get("client_modified", {}).get(rev.rev) or iso8601(rev.modified),
            server_modified=iso8601(rev.modified),
            rev=rev.rev,
            size=rev.size,
            is_downloadable=True,
            content_hash=rec.extra["content_hash"][rev.rev],
        )
        return meta

    def _lookup(self, ns: Namespace, path: str) -> tuple[FileRecord, Revision] | None:
        if path.startswith("id:"):
            rec = ns.files.get(path)
            return (rec, rec.head) if rec else None
        if path.startswith("rev:"):
            want = path[4:]
            for rec in ns.files.values():
                for rev in rec.revisions:
                    if rev.rev == want:
                        return rec, rev
            return None
        rec = ns.by_path(path)
        return (rec, rec.head) if rec else None

    # -- writing ------------------------------------------------------------

    def _commit(self, ns: Namespace, data: bytes, commit: dict[str, Any], nested: bool) -> FileRecord:
        """Apply a CommitInfo (path, mode, autorename, strict_conflict, client_modified)."""
        path = self._path(commit)
        if path.startswith("rev:"):
            raise BadInput("path: rev: paths cannot be written")
        mode = commit.get("mode", "add")
        if isinstance(mode, dict):
            tag, update_rev = mode.get(".tag"), mode.get("update")
        else:
            tag, update_rev = mode, None
        if tag not in ("add", "overwrite", "update"):
            raise BadInput(f"mode: unknown tag {tag!r}")
        if tag == "update" and not isinstance(update_rev, str):
            raise BadInput("mode: update needs a rev")
        autorename = bool(commit.get("autorename", False))
        strict = bool(commit.get("strict_conflict", False))
        content_hash = dropbox_content_hash(data)

        existing = ns.files.get(path) if path.startswith("id:") else ns.by_path(path)
        if path.startswith("id:") and existing is None:
            raise DropboxApiError(
                {".tag": "path", "path": {".tag": "not_found"}} if not nested else
                {".tag": "path", "reason": {".tag": "not_found"}, "upload_session_id": ""},
                "path/not_found/",
            )
        if existing is not None:
            same = existing.extra["content_hash"][existing.head.rev] == content_hash
            if tag == "overwrite" or (tag == "update" and existing.head.rev == update_rev):
                if same:
                    return existing
                return self._write(ns, data, existing, existing.path, commit, content_hash)
            if same and not strict:
                return existing
            if not autorename:
                raise _conflict("path", nested)
            return self._write(ns, data, None, self._free_name(ns, existing.path or path), commit, content_hash)
        if tag == "update" and strict:
            raise _conflict("path", nested)
        return self._write(ns, data, None, path, commit, content_hash)

    @staticmethod
    def _free_name(ns: Namespace, path: str) -> str:
        folder, _, name = path.rpartition("/")
        stem, dot, ext = name.rpartition(".")
        if not dot or not stem:
            stem, ext = name, ""
        for n in range(1, 10000):
            candidate = f"{folder}/{stem} ({n}){'.' + ext if ext else ''}"
            if ns.by_path(candidate) is None:
                return candidate
        raise DropboxApiError({".tag": "path", "path": {".tag": "too_many_write_operations"}}, "path/too_many_write_operations/")

    def _write(self, ns, data, record, path, commit, content_hash) -> FileRecord:
        rec, _ = ns.put(
            data,
            record=record,
            path=path if record is None else None,
            name=(path or "").rsplit("/", 1)[-1],
            new_id=lambda n: f"id:tb{n:020d}",
            new_rev=lambda n: f"015{n:09x}",
        )
        rec.extra.setdefault("content_hash", {})[rec.head.rev] = content_hash
        if isinstance(commit.get("client_modified"), str):
            rec.extra.setdefault("client_modified", {})[rec.head.rev] = commit["client_modified"]
        ns.save()
        return rec

    def _check_content_hash(self, arg: dict[str, Any], data: bytes) -> None:
        want = arg.get("content_hash")
        if want is not None and want != dropbox_content_hash(data):
            raise DropboxApiError({".tag": "content_hash_mismatch"}, "content_hash_mismatch/")

    # -- routes ------------------------------------------------------------

    async def upload(self, request, body, ns):
        arg = self._arg(request, body, True)
        if len(body) > MAX_REQUEST_BYTES:
            raise DropboxApiError({".tag": "payload_too_large"}, "payload_too_large/")
        self._check_content_hash(arg, body)
        rec = self._commit(ns, body, arg, nested=True)
        return _json(self.metadata(rec, tagged=False))

    async def session_start(self, request, body, ns):
        arg = self._arg(request, body, True)
        if len(body) > MAX_REQUEST_BYTES:
            raise DropboxApiError({".tag": "payload_too_large"}, "payload_too_large/")
        self._check_content_hash(arg, body)
        session = UploadSession(id="pid_upload_session:" + random_token(24), account=ns.account)
        session.data += body
        session.closed = bool(arg.get("close", False))
        self.sessions[session.id] = session
        return _json({"session_id": session.id})

    def _session(self, ns: Namespace, cursor: Any, lookup_wrap: str | None) -> UploadSession:
        def fail(tag: str, extra: dict[str, Any] | None = None):
            inner = {".tag": tag, **(extra or {})}
            if lookup_wrap:
                return DropboxApiError({".tag": lookup_wrap, lookup_wrap: inner}, f"{lookup_wrap}/{tag}/")
            return DropboxApiError(inner, f"{tag}/")

        if not isinstance(cursor, dict) or not isinstance(cursor.get("session_id"), str) or not isinstance(cursor.get("offset"), int):
            raise BadInput("cursor: expected an object with session_id (string) and offset (integer)")
        session = self.sessions.get(cursor["session_id"])
        if session is None or session.account != ns.account:
            raise fail("not_found")
        if cursor["offset"] != len(session.data):
            raise fail("incorrect_offset", {"correct_offset": len(session.data)})
        return session

    async def _append(self, body, ns, cursor, close, arg):
        session = self._session(ns, cursor, None)
        if session.closed:
            raise DropboxApiError({".tag": "closed"}, "closed/")
        if len(body) > MAX_REQUEST_BYTES:
            raise DropboxApiError({".tag": "payload_too_large"}, "payload_too_large/")
        self._check_content_hash(arg, body)
        session.data += body
        session.closed = close
        return _json(None)

    async def session_append_v2(self, request, body, ns):
        arg = self._arg(request, body, True)
        return await self._append(body, ns, arg.get("cursor"), bool(arg.get("close", False)), arg)

    async def session_append_v1(self, request, body, ns):
        arg = self._arg(request, body, True)  # v1: the argument is the cursor itself
        return await self._append(body, ns, arg, False, {})

    async def session_finish(self, request, body, ns):
        arg = self._arg(request, body, True)
        cursor = arg.get("cursor")
        if not isinstance(cursor, dict):
            raise BadInput("cursor: missing")
        # finish may carry the last bytes itself; the offset names where they start.
        session = self._session(ns, cursor, "lookup_failed")
        if session.closed and body:
            raise DropboxApiError({".tag": "lookup_failed", "lookup_failed": {".tag": "closed"}}, "lookup_failed/closed/")
        data = bytes(session.data) + body
        commit = arg.get("commit")
        if not isinstance(commit, dict):
            raise BadInput("commit: missing")
        # UploadSessionFinishArg.content_hash: "a hash of the file content
        # uploaded in this call": the finish's own body, not the session.
        self._check_content_hash(arg, body)
        rec = self._commit(ns, data, commit, nested=False)
        del self.sessions[session.id]
        return _json(self.metadata(rec, tagged=False))

    async def finish_batch_v2(self, request, body, ns):
        arg = self._arg(request, body, False)
        entries = arg.get("entries")
        if not isinstance(entries, list) or len(entries) > 1000:
            raise BadInput("entries: expected a list of at most 1000 UploadSessionFinishArg")
        results = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("commit"), dict):
                raise BadInput("entries: each entry needs cursor and commit")
            try:
                session = self._session(ns, entry.get("cursor"), "lookup_failed")
                if not session.closed:
                    raise DropboxApiError({".tag": "lookup_failed", "lookup_failed": {".tag": "not_closed"}}, "lookup_failed/not_closed/")
                data = bytes(session.data)
                self._check_content_hash(entry, data)
                rec = self._commit(ns, data, entry["commit"], nested=False)
                del self.sessions[session.id]
                results.append({".tag": "success", **self.metadata(rec, tagged=False)})
            except DropboxApiError as e:
                results.append({".tag": "failure", "failure": e.error})
        return _json({"entries": results})

    async def download(self, request, body, ns):
        arg = self._arg(request, body, True)
        path = self._path(arg)
        found = self._lookup(ns, path)
        if found is None:
            raise DropboxApiError({".tag": "path", "path": {".tag": "not_found"}}, "path/not_found/")
        rec, rev = found
        data = ns.read(rev)
        # HTTP headers must be ASCII: Dropbox escapes non-ASCII in the result as \\uXXXX.
        result = json.dumps(self.metadata(rec, tagged=False, rev=rev), ensure_ascii=True)
        headers = {"Dropbox-API-Result": result, "ETag": f'W/"{rev.rev}"', "Accept-Ranges": "bytes"}
        wanted = request.headers.get("Range")
        if wanted is not None:
            span = byte_range(wanted, len(data))
            if span is None:  # not a single bytes range: served whole (RFC 9110 allows ignoring it)
                pass
            elif span == ():
                return web.Response(status=416, text="Requested range not satisfiable",
                                    headers={"Content-Range": f"bytes */{len(data)}"})
            else:
                first, last = span
                headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
                return web.Response(status=206, body=data[first:last + 1], content_type="application/octet-stream",
                                    headers=headers)
        return web.Response(body=data, content_type="application/octet-stream", headers=headers)

    async def get_metadata(self, request, body, ns):
        arg = self._arg(request, body, False)
        path = self._path(arg)
        found = self._lookup(ns, path)
        if found is None:
            if not path.startswith(("id:", "rev:")) and ns.folder_exists(path):
                key = ns.key(path)
                return _json({".tag": "folder", "name": key.rsplit("/", 1)[-1], "path_lower": key, "path_display": path, "id": "id:folder" + key})
            raise DropboxApiError({".tag": "path", "path": {".tag": "not_found"}}, "path/not_found/")
        rec, rev = found
        return _json(self.metadata(rec, tagged=True, rev=rev))

    async def list_folder(self, request, body, ns):
        """files/list_folder: `limit` (1-2000) pages the entries; `has_more` says
        to call list_folder/continue with the returned `cursor`."""
        arg = self._arg(request, body, False)
        path = arg.get("path", "")
        if not isinstance(path, str) or (path and not path.startswith(("/", "id:"))):
            raise BadInput("Error in call to API function \"files/list_folder\": request body: path: 'path' did not match pattern")
        limit = arg.get("limit", 2000)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 2000:
            raise BadInput("Error in call to API function \"files/list_folder\": request body: limit: value must be 1-2000")
        if arg.get("recursive"):
            raise BadInput("This test server does not list recursively")
        if path and not ns.folder_exists(path):
            raise DropboxApiError({".tag": "path", "path": {".tag": "not_found"}}, "path/not_found/")
        cursor = "tb-cursor-" + random_token()
        self.cursors[cursor] = (ns.account, path or "/", 0, limit)
        return self._list_page(ns, cursor)

    async def list_folder_continue(self, request, body, ns):
        arg = self._arg(request, body, False)
        cursor = arg.get("cursor")
        if not isinstance(cursor, str) or not cursor:
            raise BadInput("Error in call to API function \"files/list_folder/continue\": request body: missing cursor")
        found = self.cursors.get(cursor)
        if found is None or found[0] != ns.account:
            # ListFolderContinueError.reset: the cursor is no longer valid; list again.
            raise DropboxApiError({".tag": "reset"}, "reset/")
        return self._list_page(ns, cursor)

    def _list_page(self, ns: Namespace, cursor: str) -> web.Response:
        # Cursors live in memory (like sessions); each page re-reads the folder,
        # so changes between pages show up, which a sync client must tolerate anyway.
        account, path, offset, limit = self.cursors.pop(cursor)
        files, folders = ns.children(path)
        display = ns.all_folders()
        entries = [{".tag": "folder", "name": display.get(f, f).rsplit("/", 1)[-1], "path_lower": f,
                    "path_display": display.get(f, f), "id": "id:folder" + f} for f in folders]
        entries += [self.metadata(r, tagged=True) for r in files]
        entries.sort(key=lambda e: e["path_lower"])
        page = entries[offset : offset + limit]
        nxt = "tb-cursor-" + random_token()
        self.cursors[nxt] = (account, path, offset + len(page), limit)
        return _json({"entries": page, "cursor": nxt, "has_more": offset + len(page) < len(entries)})

    async def delete_v2(self, request, body, ns):
        arg = self._arg(request, body, False)
        found = self._lookup(ns, self._path(arg))
        if found is None:
            raise DropboxApiError({".tag": "path_lookup", "path_lookup": {".tag": "not_found"}}, "path_lookup/not_found/")
        rec, _ = found
        meta = self.metadata(rec, tagged=True)
        ns.delete(rec)
        return _json({"metadata": meta})
