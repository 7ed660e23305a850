"""Gathering upload sessions on the device (spec §6.0 "collapse").

When an app splits one upload into several requests, the device answers
every request that creates or feeds an upload session itself, in the
provider's own format, and sends the EPS one SAVE when the app sends the
request that completes the upload. `SessionBook.feed(recognised)` does the
answering and the gathering; it returns

- an `Answer` (status, reason, headers, body) to give the app in place of
  the provider: a Dropbox session id, a Graph `uploadUrl` of the device's
  own, a Drive session URI, `202` / `308` / `201` for chunks, and the
  provider's error shapes for wrong offsets, ranges and unknown sessions;
- a `GatheredUpload` for the request that completes an upload: the
  procedure number, the app requests the EPS must perform (spec §6.2-§6.6),
  the whole file(s) and their document keys. The addon sends it as one
  SAVE, or replays it with `ec_proxy.direct` on the direct path; then it
  calls `settle()` so a successful session is forgotten and a failed one
  stays for the app's retry of its final request;
- None: not a session the device runs (a provider-issued session id, an
  upload folder the device did not answer): pass the request through.

Ids the device issues start with a recognisable mark (`ec-`), so an
unknown id with the mark is one the device forgot (expired, evicted,
restarted) and gets the provider's not-found shape, while any other id is
the provider's own and passes through.

Bounds: at most `max_sessions` sessions and `max_bytes` gathered bytes;
the least recently used sessions are evicted first, and sessions idle for
`idle_ttl` seconds expire. A session that alone exceeds `max_bytes` is
dropped, and the app sees the provider's not-found answer on its next
request (the default of 1 GiB is above what office documents reach).
Checks follow the testbed servers (testbed/providers), which follow the
providers' documentation: Dropbox offsets (`incorrect_offset` with
`correct_offset`), Graph contiguous ranges in multiples of 320 KiB, Drive
chunks in multiples of 256 KiB, Nextcloud `Destination` and
`OC-Total-Length`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional, Union
from urllib.parse import urlsplit

import ec_protocol as ecp
from ec_protocol import DocKey

from .recognise import AppRequest, Kind, Recognised, is_office_content, is_office_name
from .recognise.common import Header
from .recognise.dropbox import content_hash as dropbox_content_hash
from .recognise.drive import HOST as DRIVE_HOST
from .recognise.graph import ONEDRIVE_HOST

#: The mark of every session id the device issues.
DEVICE_MARK = "ec-"
DROPBOX_ID_PREFIX = "pid_upload_session:" + DEVICE_MARK
GRAPH_FRAGMENT_UNIT = 320 * 1024
GRAPH_MAX_FRAGMENT = 60 * 1024 * 1024
DRIVE_CHUNK_UNIT = 256 * 1024
#: The forbidden head fields of spec §4.3.1: never part of a replayed request.
HOP_FIELDS = frozenset(
    "host content-length transfer-encoding connection keep-alive proxy-connection "
    "proxy-authorization te trailer upgrade expect".split()
)


@dataclass(frozen=True)
class Answer:
    """A response the device gives the app itself, in the provider's format."""

    status: int
    reason: str
    headers: tuple[Header, ...]
    body: bytes


@dataclass(frozen=True)
class GatheredFile:
    data: bytes = field(repr=False)
    doc: Optional[DocKey]
    name: Optional[str]
    #: The session id the device issued for this file (Dropbox), else b"".
    binding: bytes = b""

    @property
    def office(self) -> bool:
        return is_office_name(self.name) or is_office_content(self.data)


@dataclass(frozen=True)
class GatheredUpload:
    """Everything a SAVE (or the direct replay) of a collapsed upload needs."""

    provider: int
    procedure: int  # ec_protocol.DROPBOX_SESSION, DROPBOX_BATCH, GRAPH_SESSION, ...
    #: The app requests the EPS performs, in the order of spec §6.2-§6.6:
    #: Dropbox finish (body empty) or finish_batch_v2 (its JSON); Graph
    #: createUploadSession (its body); Drive initiation (its body);
    #: Nextcloud MKCOL then MOVE (bodies empty).
    requests: tuple[AppRequest, ...]
    files: tuple[GatheredFile, ...]
    #: Book keys of the sessions this upload completes (for `settle`).
    keys: tuple[str, ...] = ()

    def provider_requests(self) -> list[ecp.ProviderRequest]:
        """The requests as `ec_protocol.ProviderRequest`s for `EpsClient.save`
        (body BYTES where the procedure carries one, else EMPTY)."""
        out = []
        for r in self.requests:
            body = r.body or b""
            kind = ecp.BODY_BYTES if (body or self.procedure in (ecp.DROPBOX_BATCH, ecp.GRAPH_SESSION, ecp.DRIVE_RESUMABLE)) else ecp.BODY_EMPTY
            heads = [(n, v) for n, v in r.headers if n.lower() not in HOP_FIELDS]
            out.append(ecp.ProviderRequest(r.method, r.url, heads, body_kind=kind, body=body if kind == ecp.BODY_BYTES else b""))
        return out


Outcome = Union[Answer, GatheredUpload, None]


@dataclass
class _Session:
    key: str
    provider: int
    account: Optional[bytes]
    opener: Optional[AppRequest] = None  # Graph create, Drive init, Nextcloud MKCOL
    doc: Optional[DocKey] = None
    name: Optional[str] = None
    data: bytearray = field(default_factory=bytearray)
    chunks: dict[int, bytes] = field(default_factory=dict)  # Nextcloud
    closed: bool = False
    total: Optional[int] = None
    expires_at: str = ""  # Graph expirationDateTime
    touched: float = 0.0

    @property
    def size(self) -> int:
        return len(self.data) + sum(len(c) for c in self.chunks.values())


def _json(status: int, reason: str, value: object, extra: tuple[Header, ...] = ()) -> Answer:
    return Answer(status, reason, (("Content-Type", "application/json"),) + extra, json.dumps(value).encode())


def _dropbox_error(tag: str, extra: Optional[dict] = None, wrap: Optional[str] = None) -> Answer:
    inner = {".tag": tag, **(extra or {})}
    if wrap:
        return _json(409, "Conflict", {"error_summary": f"{wrap}/{tag}/..", "error": {".tag": wrap, wrap: inner}})
    return _json(409, "Conflict", {"error_summary": f"{tag}/..", "error": inner})


def _per_call_hash_mismatch(rec: Recognised) -> Optional[Answer]:
    """Dropbox `content_hash` on start / append_v2 / finish is "a hash of the
    file content uploaded in this call" (the Dropbox SDK 12.x sends one on
    every call): checked against this request's body, as Dropbox does."""
    want = (rec.args or {}).get("content_hash")
    if want is None:
        return None
    if not isinstance(want, str) or want.lower() != dropbox_content_hash(rec.request.body or b""):
        return _dropbox_error("content_hash_mismatch")
    return None


def _graph_error(status: int, reason: str, code: str, message: str) -> Answer:
    return _json(status, reason, {"error": {"code": code, "message": message}})


def _drive_error(status: int, reason: str, why: str, message: str) -> Answer:
    return _json(status, reason, {"error": {"code": status, "message": message,
                                            "errors": [{"message": message, "domain": "global", "reason": why}]}})


def _dav_error(status: int, reason: str, exception: str, message: str) -> Answer:
    body = ('<?xml version="1.0" encoding="utf-8"?>\n<d:error xmlns:d="DAV:" xmlns:s="http://sabredav.org/ns">\n'
            f"  <s:exception>Sabre\\DAV\\Exception\\{exception}</s:exception>\n  <s:message>{message}</s:message>\n</d:error>\n")
    return Answer(status, reason, (("Content-Type", "application/xml; charset=utf-8"),), body.encode())


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + ".000Z"


def _origin(url: str, host: str) -> str:
    """`scheme://host[:port]` with the port of `url`, so a lab client that
    reached a provider on a test port is answered with URLs on that port."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def _empty_body(req: AppRequest) -> AppRequest:
    return AppRequest(req.method, req.url, req.headers, b"")


class SessionBook:
    """The upload sessions the device runs for the apps (see the module doc).

    Not thread-safe: the addon calls it from mitmproxy's event loop.
    """

    def __init__(
        self,
        *,
        max_sessions: int = 256,
        max_bytes: int = 1 << 30,
        idle_ttl: float = 24 * 3600,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = lambda: secrets.token_urlsafe(24),
        graph_fragment_auth: str = "reject",
    ) -> None:
        #: Graph fragments carrying `Authorization`: "reject" answers 401 as
        #: OneDrive does (its documentation warns of it, and the Graph SDK's
        #: large-file task sends one); "accept" as OneDrive did for rclone 1.60.
        if graph_fragment_auth not in ("reject", "accept"):
            raise ValueError("graph_fragment_auth is reject or accept")
        self.graph_fragment_auth = graph_fragment_auth
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.idle_ttl = idle_ttl
        self._clock = clock
        self._wall = wall_clock
        self._new_id = new_id
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    # -- book-keeping ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def gathered_bytes(self) -> int:
        return sum(s.size for s in self._sessions.values())

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if now - s.touched > self.idle_ttl]:
            del self._sessions[key]

    def _get(self, key: str) -> Optional[_Session]:
        self._expire()
        s = self._sessions.get(key)
        if s is not None:
            s.touched = self._clock()
            self._sessions.move_to_end(key)
        return s

    def _add(self, s: _Session) -> None:
        self._expire()
        s.touched = self._clock()
        self._sessions[s.key] = s
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def _grew(self, s: _Session) -> bool:
        """Evicts the least recently used others while over the byte bound;
        False (and `s` dropped) if `s` alone is over it."""
        if s.size > self.max_bytes:
            self._sessions.pop(s.key, None)
            return False
        total = self.gathered_bytes
        for key in list(self._sessions):
            if total <= self.max_bytes:
                break
            if key != s.key:
                total -= self._sessions.pop(key).size
        return True

    def settle(self, gathered: GatheredUpload, succeeded: bool) -> None:
        """After the final request's answer: a provider-accepted upload's
        sessions are forgotten; a failed one keeps them, so the app's retry
        of its final request (after a 429, a 5xx, a conflict) finds them."""
        if succeeded:
            for key in gathered.keys:
                self._sessions.pop(key, None)

    # -- entry point -----------------------------------------------------------

    def feed(self, rec: Recognised) -> Outcome:
        """Answers or gathers one session request; None: pass it through."""
        handler = {
            Kind.SESSION_START: self._dropbox_start,
            Kind.SESSION_APPEND: self._dropbox_append,
            Kind.SESSION_FINISH: self._dropbox_finish,
            Kind.BATCH_FINISH: self._dropbox_batch,
            Kind.GRAPH_CREATE_SESSION: self._graph_create,
            Kind.GRAPH_FRAGMENT: self._graph_fragment,
            Kind.GRAPH_SESSION_STATUS: self._graph_status,
            Kind.GRAPH_SESSION_CANCEL: self._graph_cancel,
            Kind.DRIVE_RESUMABLE_INIT: self._drive_init,
            Kind.DRIVE_RESUMABLE_CHUNK: self._drive_chunk,
            Kind.NC_MKCOL: self._nc_mkcol,
            Kind.NC_CHUNK: self._nc_chunk,
            Kind.NC_MOVE: self._nc_move,
            Kind.NC_CANCEL: self._nc_cancel,
        }.get(rec.kind)
        if handler is None or rec.request.body is None and rec.kind not in (Kind.GRAPH_SESSION_STATUS, Kind.GRAPH_SESSION_CANCEL, Kind.NC_CANCEL):
            return None
        return handler(rec)

    # -- Dropbox (spec §6.2, §6.3) ------------------------------------------------

    def _dropbox_session(self, rec: Recognised, sid: str, wrap: Optional[str]) -> Union[_Session, Answer, None]:
        if not sid.startswith(DROPBOX_ID_PREFIX):
            return None
        s = self._get("dbx:" + sid)
        if s is None or s.account != rec.account:
            return _dropbox_error("not_found", wrap=wrap)
        return s

    def _dropbox_start(self, rec: Recognised) -> Outcome:
        bad = _per_call_hash_mismatch(rec)
        if bad is not None:
            return bad
        sid = DROPBOX_ID_PREFIX + self._new_id()
        s = _Session("dbx:" + sid, ecp.DROPBOX, rec.account, data=bytearray(rec.request.body or b""), closed=rec.close)
        self._add(s)
        if not self._grew(s):
            return _dropbox_error("payload_too_large")
        return _json(200, "OK", {"session_id": sid})

    def _dropbox_append(self, rec: Recognised) -> Outcome:
        found = self._dropbox_session(rec, rec.session or "", None)
        if not isinstance(found, _Session):
            return found
        if rec.offset != len(found.data):
            return _dropbox_error("incorrect_offset", {"correct_offset": len(found.data)})
        if found.closed:
            return _dropbox_error("closed")
        bad = _per_call_hash_mismatch(rec)
        if bad is not None:
            return bad
        found.data += rec.request.body or b""
        found.closed = rec.close
        if not self._grew(found):
            return _dropbox_error("not_found")
        return _json(200, "OK", None)

    def _dropbox_finish(self, rec: Recognised) -> Outcome:
        found = self._dropbox_session(rec, rec.session or "", "lookup_failed")
        if not isinstance(found, _Session):
            return found
        if rec.offset != len(found.data):
            return _dropbox_error("incorrect_offset", {"correct_offset": len(found.data)}, wrap="lookup_failed")
        body = rec.request.body or b""
        if found.closed and body:
            return _dropbox_error("closed", wrap="lookup_failed")
        bad = _per_call_hash_mismatch(rec)
        if bad is not None:
            return bad
        if rec.doc is None:
            return None  # a commit the device cannot key: let Dropbox judge it (it will not know the id)
        sid = (rec.session or "").encode()
        file = GatheredFile(bytes(found.data) + body, rec.doc, rec.name, binding=sid)
        return GatheredUpload(ecp.DROPBOX, ecp.DROPBOX_SESSION, (_empty_body(rec.request),), (file,), (found.key,))

    def _dropbox_batch(self, rec: Recognised) -> Outcome:
        entries = (rec.args or {}).get("entries")
        if not isinstance(entries, list):
            return None
        ids = [e.get("cursor", {}).get("session_id") if isinstance(e, dict) and isinstance(e.get("cursor"), dict) else None for e in entries]
        if not any(isinstance(i, str) and i.startswith(DROPBOX_ID_PREFIX) for i in ids):
            return None  # the provider's own sessions
        from .recognise.dropbox import _doc  # one normalisation for every Dropbox path

        files, keys, failures = [], [], []
        for entry, sid in zip(entries, ids):
            commit = entry.get("commit") if isinstance(entry, dict) else None
            offset = entry["cursor"].get("offset") if sid is not None else None
            s = self._get("dbx:" + sid) if isinstance(sid, str) and sid.startswith(DROPBOX_ID_PREFIX) else None
            if s is None or s.account != rec.account:
                failures.append({".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}})
            elif offset != len(s.data):
                failures.append({".tag": "lookup_failed", "lookup_failed": {".tag": "incorrect_offset", "correct_offset": len(s.data)}})
            elif not s.closed:
                failures.append({".tag": "lookup_failed", "lookup_failed": {".tag": "not_closed"}})
            else:
                doc, name = _doc(rec.account, commit.get("path") if isinstance(commit, dict) else None)
                if doc is None:
                    failures.append({".tag": "path", "path": {".tag": "malformed_path"}})
                else:
                    failures.append(None)
                    files.append(GatheredFile(bytes(s.data), doc, name, binding=sid.encode()))
                    keys.append(s.key)
        if any(f is not None for f in failures):
            # One bad entry: answer the batch here. The good entries fail with
            # Dropbox's retryable too_many_write_operations and keep their
            # sessions, so the app's retry can commit them.
            results = [{".tag": "failure", "failure": f or {".tag": "too_many_write_operations"}} for f in failures]
            return _json(200, "OK", {"entries": results})
        return GatheredUpload(ecp.DROPBOX, ecp.DROPBOX_BATCH, (rec.request,), tuple(files), tuple(keys))

    # -- Graph (spec §6.4) ---------------------------------------------------------

    def _graph_create(self, rec: Recognised) -> Outcome:
        host = rec.request.host if rec.request.host.endswith(".sharepoint.com") else ONEDRIVE_HOST
        token = DEVICE_MARK + self._new_id()
        s = _Session("graph:" + token, ecp.GRAPH, rec.account, opener=rec.request, doc=rec.doc, name=rec.name,
                     expires_at=_iso(self._wall() + self.idle_ttl))
        self._add(s)
        url = f"{_origin(rec.request.url, host)}/rup/{token}"
        return _json(200, "OK", {"uploadUrl": url, "expirationDateTime": s.expires_at, "nextExpectedRanges": ["0-"]})

    def _graph_lookup(self, rec: Recognised) -> Union[_Session, Answer, None]:
        token = rec.session or ""
        if not token.startswith(DEVICE_MARK):
            return None
        s = self._get("graph:" + token)
        if s is None:
            return _graph_error(404, "Not Found", "itemNotFound", "The upload session was not found or has expired")
        return s

    def _graph_status_body(self, s: _Session) -> dict:
        end = "" if s.total is None else str(s.total - 1)
        return {"expirationDateTime": s.expires_at, "nextExpectedRanges": [f"{len(s.data)}-{end}"]}

    def _graph_fragment(self, rec: Recognised) -> Outcome:
        found = self._graph_lookup(rec)
        if not isinstance(found, _Session):
            return found
        s, body = found, rec.request.body or b""
        # The uploadUrl is pre-authenticated: "including the Authorization
        # header when issuing the PUT call may result in an HTTP 401", and
        # OneDrive does answer 401 to the Graph SDK's large-file task. The
        # device answers what the provider would (the session stays, as at
        # OneDrive); `graph_fragment_auth="accept"` for a provider that takes it.
        if self.graph_fragment_auth == "reject" and rec.request.header("authorization") is not None:
            return _graph_error(401, "Unauthorized", "unauthenticated",
                                "The uploadUrl is pre-authenticated; do not send an Authorization header")
        cr = rec.content_range
        if cr is None or cr[0] is None or cr[2] is None:
            return _graph_error(400, "Bad Request", "invalidRequest", "Missing or invalid Content-Range header; expected 'bytes a-b/total'")
        start, end, total = cr
        if end < start or end >= total:
            return _graph_error(416, "Requested Range Not Satisfiable", "invalidRange", f"Content-Range {start}-{end}/{total} is not a valid range")
        if s.total is not None and total != s.total:
            return _graph_error(400, "Bad Request", "invalidRequest", f"Declared total {total} differs from the session's {s.total}")
        if len(body) != end - start + 1:
            return _graph_error(400, "Bad Request", "invalidRequest", f"Content-Range covers {end - start + 1} bytes but the body has {len(body)}")
        if len(body) > GRAPH_MAX_FRAGMENT:
            return _graph_error(413, "Request Entity Too Large", "requestTooLarge", "A fragment must be at most 60 MiB")
        if start != len(s.data):
            return _graph_error(416, "Requested Range Not Satisfiable", "invalidRange",
                                f"The uploaded fragment overlaps or skips data; next expected range is {len(s.data)}-")
        last = end + 1 == total
        if not last and len(body) % GRAPH_FRAGMENT_UNIT:
            return _graph_error(400, "Bad Request", "invalidRequest", f"Fragment size {len(body)} is not a multiple of 320 KiB (327680 bytes)")
        if last:
            assert s.opener is not None
            file = GatheredFile(bytes(s.data) + body, s.doc, s.name)
            return GatheredUpload(ecp.GRAPH, ecp.GRAPH_SESSION, (s.opener,), (file,), (s.key,))
        s.total = total
        s.data += body
        if not self._grew(s):
            return _graph_error(404, "Not Found", "itemNotFound", "The upload session was not found or has expired")
        return _json(202, "Accepted", {"expirationDateTime": s.expires_at, "nextExpectedRanges": [f"{len(s.data)}-"]})

    def _graph_status(self, rec: Recognised) -> Outcome:
        found = self._graph_lookup(rec)
        return _json(200, "OK", self._graph_status_body(found)) if isinstance(found, _Session) else found

    def _graph_cancel(self, rec: Recognised) -> Outcome:
        found = self._graph_lookup(rec)
        if not isinstance(found, _Session):
            return found
        self._sessions.pop(found.key, None)
        return Answer(204, "No Content", (), b"")

    # -- Drive (spec §6.5) ---------------------------------------------------------

    def _drive_init(self, rec: Recognised) -> Outcome:
        upload_id = DEVICE_MARK + self._new_id()
        declared = (rec.request.header("x-upload-content-length") or "").strip()
        s = _Session("drive:" + upload_id, ecp.DRIVE, rec.account, opener=rec.request, doc=rec.doc, name=rec.name,
                     total=int(declared) if declared.isdigit() else None)
        self._add(s)
        path = rec.request.path.rstrip("/")
        location = f"{_origin(rec.request.url, DRIVE_HOST)}{path}?uploadType=resumable&upload_id={upload_id}"
        return Answer(200, "OK", (("Location", location), ("X-GUploader-UploadID", upload_id)), b"")

    def _drive_chunk(self, rec: Recognised) -> Outcome:
        upload_id = rec.session or ""
        if not upload_id.startswith(DEVICE_MARK):
            return None
        s = self._get("drive:" + upload_id)
        if s is None or s.account != rec.account or s.opener is None or s.opener.path.rstrip("/") != rec.request.path.rstrip("/"):
            return _drive_error(404, "Not Found", "notFound", "The upload session was not found or has expired")
        body = rec.request.body or b""
        received = len(s.data)
        if rec.request.header("content-range") is None:
            start, end, total = 0, len(body) - 1, len(body)
        else:
            cr = rec.content_range
            if cr is None:
                return _drive_error(400, "Bad Request", "badRequest", f"Invalid Content-Range {rec.request.header('content-range')!r}")
            start, end, total = cr
            if start is None:  # bytes */total: a status query, or the end of an empty file
                if body:
                    return _drive_error(400, "Bad Request", "badRequest", "Content-Range bytes */N must have an empty body")
                if total is not None and total == received and (s.total is None or s.total == total):
                    return self._drive_done(s, b"")
                return self._drive_incomplete(received)
        if len(body) != end - start + 1:
            return _drive_error(400, "Bad Request", "badRequest", f"Content-Range covers {end - start + 1} bytes but the body has {len(body)}")
        if s.total is not None and total is not None and total != s.total:
            return _drive_error(400, "Bad Request", "badRequest", f"Total {total} differs from X-Upload-Content-Length {s.total}")
        if start != received:
            return _drive_error(400, "Bad Request", "badRequest",
                                f"Chunk starts at {start} but the server has {received} bytes; query the status with Content-Range: bytes */{total or '*'}")
        last = total is not None and end + 1 == total
        if not last and len(body) % DRIVE_CHUNK_UNIT:
            return _drive_error(400, "Bad Request", "badRequest", f"Chunk size {len(body)} is not a multiple of 256 KiB (262144 bytes)")
        if last:
            return self._drive_done(s, body)
        s.data += body
        if not self._grew(s):
            return _drive_error(404, "Not Found", "notFound", "The upload session was not found or has expired")
        return self._drive_incomplete(len(s.data))

    @staticmethod
    def _drive_incomplete(received: int) -> Answer:
        headers = (("Range", f"bytes=0-{received - 1}"),) if received else ()
        return Answer(308, "Resume Incomplete", headers + (("Content-Length", "0"),), b"")

    @staticmethod
    def _drive_done(s: _Session, tail: bytes) -> GatheredUpload:
        assert s.opener is not None
        file = GatheredFile(bytes(s.data) + tail, s.doc, s.name)
        return GatheredUpload(ecp.DRIVE, ecp.DRIVE_RESUMABLE, (s.opener,), (file,), (s.key,))

    # -- Nextcloud chunking v2 (spec §6.6) -----------------------------------------

    def _nc_mkcol(self, rec: Recognised) -> Outcome:
        key = "nc:" + (rec.session or "")
        if self._get(key) is not None:
            return _dav_error(405, "Method Not Allowed", "MethodNotAllowed", "The resource you tried to create already exists")
        self._add(_Session(key, ecp.WEBDAV, rec.account, opener=_empty_body(rec.request), doc=rec.doc, name=rec.name))
        return Answer(201, "Created", (("Content-Length", "0"),), b"")

    def _nc_lookup(self, rec: Recognised) -> Union[_Session, Answer, None]:
        s = self._get("nc:" + (rec.session or ""))
        if s is None or s.account != rec.account:
            return None  # not an upload folder the device answered: the server's
        assert s.opener is not None
        if rec.request.header("destination") != s.opener.header("destination"):
            return _dav_error(400, "Bad Request", "BadRequest",
                              "Destination differs from the one given at MKCOL, or is missing")
        return s

    def _nc_chunk(self, rec: Recognised) -> Outcome:
        found = self._nc_lookup(rec)
        if not isinstance(found, _Session):
            return found
        chunk = rec.chunk or ""
        if not chunk.isdigit() or not 1 <= int(chunk) <= 10000:
            return _dav_error(400, "Bad Request", "BadRequest", f"Chunk name {chunk!r}: chunks are numbered 1 to 10000")
        total = rec.request.header("oc-total-length")
        if total is not None:
            if not total.strip().isdigit() or (found.total is not None and int(total) != found.total):
                return _dav_error(400, "Bad Request", "BadRequest", f"OC-Total-Length {total!r} is invalid or differs from earlier chunks")
            found.total = int(total)
        existed = int(chunk) in found.chunks
        found.chunks[int(chunk)] = rec.request.body or b""
        if not self._grew(found):
            return _dav_error(507, "Insufficient Storage", "InsufficientStorage", "The upload is too large for the device's buffer")
        return Answer(204 if existed else 201, "No Content" if existed else "Created", (("Content-Length", "0"),), b"")

    def _nc_move(self, rec: Recognised) -> Outcome:
        found = self._nc_lookup(rec)
        if not isinstance(found, _Session):
            return found
        data = b"".join(found.chunks[k] for k in sorted(found.chunks))
        total = rec.request.header("oc-total-length")
        if total is not None and (not total.strip().isdigit() or int(total) != len(data)):
            return _dav_error(400, "Bad Request", "BadRequest", f"Chunks on server do not sum up to {total} but to {len(data)} bytes")
        assert found.opener is not None
        file = GatheredFile(data, rec.doc or found.doc, rec.name or found.name)
        return GatheredUpload(ecp.WEBDAV, ecp.NEXTCLOUD_CHUNKED, (found.opener, _empty_body(rec.request)), (file,), (found.key,))

    def _nc_cancel(self, rec: Recognised) -> Outcome:
        s = self._get("nc:" + (rec.session or ""))
        if s is None or s.account != rec.account:
            return None
        self._sessions.pop(s.key, None)
        return Answer(204, "No Content", (), b"")
