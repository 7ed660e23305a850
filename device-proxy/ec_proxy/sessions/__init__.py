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

Layout, as `ec_proxy.recognise`: `common` holds what the providers share
(`Answer`, `GatheredUpload`, the `Session` record, the `Shelf` that keeps
all sessions within the bounds above, the `ProviderSessions` base); one
module per provider (`dropbox`, `graph`, `drive`, `webdav` for Nextcloud)
holds its session steps, error shapes and constants in a
`ProviderSessions` subclass whose `handlers()` maps each `Kind` it answers
to a step. `SessionBook` here is the shelf plus the table of every
provider's handlers, dispatched by `Kind`. Provider modules import only
`common` and the recognisers, never each other.
"""

from __future__ import annotations

import json
import secrets
import urllib.parse
import time
from typing import Callable, Optional, Sequence, Union

import ec_protocol as ecp

from ..recognise import Kind, Recognised
from . import dropbox, drive, graph, webdav
from .common import (
    DEVICE_MARK,
    HOP_FIELDS,
    Answer,
    Attempt,
    GatheredFile,
    GatheredUpload,
    Handler,
    Outcome,
    ProviderSessions,
    Shelf,
)
from .dropbox import DROPBOX_ID_PREFIX
from .drive import DRIVE_CHUNK_UNIT
from .graph import GRAPH_FRAGMENT_UNIT, GRAPH_MAX_FRAGMENT

__all__ = [
    "DEVICE_MARK",
    "DRIVE_CHUNK_UNIT",
    "DROPBOX_ID_PREFIX",
    "GRAPH_FRAGMENT_UNIT",
    "GRAPH_MAX_FRAGMENT",
    "HOP_FIELDS",
    "Answer",
    "Attempt",
    "GatheredFile",
    "GatheredUpload",
    "Outcome",
    "SessionBook",
    "accepted_files",
    "same_operation",
    "used_up",
]


def accepted_files(gathered: GatheredUpload, status: int, body: bytes) -> tuple[bool, ...]:
    """Per file of `gathered`, in order, whether the provider accepted it,
    from its answer to the upload's final request (spec §4.7): a 2xx, and
    for a Dropbox finish_batch_v2 the entry's own result (§6.3: Dropbox
    answers 200 and fails entries one by one)."""
    if not 200 <= status < 300:
        return (False,) * len(gathered.files)
    if gathered.procedure == ecp.DROPBOX_BATCH:
        return dropbox.batch_accepted(body, len(gathered.files))
    return (True,) * len(gathered.files)


#: Head fields the provider acts on when it completes an upload (besides
#: Dropbox's own `Dropbox-API-*` fields: the argument, and the user, admin and
#: path root it acts as): the ranges of Graph's and Drive's chunks, and
#: Nextcloud's destination, preconditions, size, times and checksum. A retry
#: of the same final request may differ in any other field (a refreshed token
#: or cookie, a new User-Agent, trace or request id, another Accept-Encoding)
#: and still asks for the same operation; judging it another would tell the
#: app its committed file is not there, and the app would upload it again.
OPERATIVE_FIELDS = frozenset(
    "content-range destination overwrite if if-match if-none-match if-unmodified-since "
    "oc-total-length x-oc-mtime x-oc-ctime oc-checksum".split())


def _operative(name: str) -> bool:
    n = name.lower()
    return n in OPERATIVE_FIELDS or n.startswith("dropbox-api-")


def _dropbox_json(value: object) -> object:
    """Dropbox's finish argument or batch body as the provider reads it: each
    commit with Dropbox's defaults filled in (`dropbox._commit`), without the
    per-call `content_hash` (it describes the call's own body, compared as
    the file's bytes)."""
    if isinstance(value, dict):
        out = {k: v for k, v in value.items() if k != "content_hash"}
        if "commit" in out:
            out["commit"] = dropbox._commit(out["commit"])
        if isinstance(out.get("entries"), list):
            out["entries"] = [_dropbox_json(e) for e in out["entries"]]
        return out
    return value


def _as_json(text: Union[str, bytes]) -> object:
    try:
        return ("json", json.dumps(_dropbox_json(json.loads(text)), sort_keys=True))
    except ValueError:
        return ("raw", text)


def _comparable(r: ecp.ProviderRequest, dropbox_procedure: bool) -> tuple:
    """A provider request as compared with its retry: method, path, query
    (Dropbox's `arg` read as JSON), the operative head fields, the body
    (Dropbox's JSON read as JSON)."""
    parts = urllib.parse.urlsplit(r.url)
    query = sorted((k, _as_json(v) if dropbox_procedure and k == "arg" else v)
                   for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    heads = sorted((n.lower(), _as_json(v) if n.lower() == "dropbox-api-arg" else v) for n, v in r.headers if _operative(n))
    body = bytes(r.body or b"")
    if dropbox_procedure and r.body_kind == ecp.BODY_BYTES and body:
        body = _as_json(body)
    return (r.method.upper(), parts.scheme, parts.netloc.lower(), parts.path, query, r.body_kind, body, heads)


def same_operation(gathered: GatheredUpload, attempt: Attempt) -> bool:
    """Whether the app's final request (`gathered`) asks the provider for
    what the earlier SAVE (`attempt`) asked: the same procedure, the same
    requests (method, URL, body and the head fields the provider acts on,
    `_comparable`) and the same files under the same
    document keys and bindings. A retry that differs in anything else (a
    Dropbox commit to another path or mode, another last fragment or chunk,
    a MOVE with another precondition) is another operation: the provider,
    whose session the earlier one may have used up, would judge it on its
    own, and so must the device (`EdgeCourier._gathered_again`)."""
    if gathered.procedure != attempt.procedure or len(gathered.files) != len(attempt.items):
        return False
    mine = gathered.provider_requests()
    if len(mine) != len(attempt.requests):
        return False
    dbx = gathered.procedure in (ecp.DROPBOX_SESSION, ecp.DROPBOX_BATCH)
    if any(_comparable(a, dbx) != _comparable(b, dbx) for a, b in zip(mine, attempt.requests)):
        return False
    return all(f.data == i.target and f.doc == i.doc and f.binding == i.binding for f, i in zip(gathered.files, attempt.items))


def used_up(gathered: GatheredUpload) -> Answer:
    """The provider's answer to the final request of an upload session it
    completed already (the session is used up and gone): Dropbox
    `lookup_failed/not_found` (409), Graph `itemNotFound` (404), Drive
    `notFound` (404), Nextcloud's 404 for an upload folder that no longer
    exists (the MOVE removed it). As the testbed servers answer."""
    if gathered.procedure in (ecp.DROPBOX_SESSION, ecp.DROPBOX_BATCH):
        return dropbox._dropbox_error("not_found", wrap="lookup_failed")
    if gathered.procedure == ecp.GRAPH_SESSION:
        return graph._graph_error(404, "Not Found", "itemNotFound", "The upload session was not found or has expired")
    if gathered.procedure == ecp.DRIVE_RESUMABLE:
        return drive._drive_error(404, "Not Found", "notFound", "The upload session was not found or has expired")
    folder = gathered.keys[0].rsplit("/", 1)[-1] if gathered.keys else ""  # nc:{host}/{user}/{transfer}
    return webdav._dav_error(404, "Not Found", "NotFound", f"Upload folder {folder} does not exist")


#: Book key prefixes of the sessions whose provider answers a status query
#: on a completed upload with the upload's final answer (Google Drive:
#: `bytes */N` gets 200 and the file resource), so that they outlive it.
ANSWERS_AGAIN = (drive.KEY,)


class SessionBook(Shelf):
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
        serial_id: Optional[Callable[[], str]] = None,
        graph_fragment_auth: str = "reject",
    ) -> None:
        super().__init__(max_sessions=max_sessions, max_bytes=max_bytes, idle_ttl=idle_ttl,
                         clock=clock, wall_clock=wall_clock, new_id=new_id, serial_id=serial_id)
        self._graph = graph.GraphSessions(self, graph_fragment_auth)  # raises ValueError for a bad value
        providers: tuple[ProviderSessions, ...] = (
            dropbox.DropboxSessions(self), self._graph, drive.DriveSessions(self), webdav.NextcloudSessions(self))
        self._handlers: dict[Kind, Handler] = {}
        for p in providers:
            self._handlers.update(p.handlers())
        #: Steps answered from the request head alone; the others need the body.
        self._head_only = frozenset().union(*(p.head_only for p in providers))

    @property
    def graph_fragment_auth(self) -> str:
        """Graph fragments carrying `Authorization`: "reject" (401, as
        OneDrive answers) or "accept" (see `graph.GraphSessions`)."""
        return self._graph.fragment_auth

    @graph_fragment_auth.setter
    def graph_fragment_auth(self, value: str) -> None:
        self._graph.fragment_auth = value

    def settle(self, gathered: GatheredUpload, succeeded: Union[bool, Sequence[bool]],
               answer: Optional[Answer] = None) -> None:
        """After the final request's definite answer: a provider-accepted
        upload's sessions are forgotten; a failed one keeps them, so the app's
        retry of its final request (after a 429, a 5xx, a conflict) finds
        them, and is a new attempt. `succeeded` per file (`accepted_files`):
        a batch's accepted files' sessions go, its failed ones' stay.
        `answer`: the provider's answer to the final request; a session
        whose provider answers a status query on a completed upload with
        it (`ANSWERS_AGAIN`: Drive) keeps it instead of its bytes."""
        if isinstance(succeeded, bool):
            each = [succeeded] * len(gathered.keys)
        elif len(succeeded) == len(gathered.keys):
            each = list(succeeded)
        else:
            each = [all(succeeded)] * len(gathered.keys)
        for key, ok in zip(gathered.keys, each):
            s = self._sessions.get(key)
            if ok and answer is not None and s is not None and key.startswith(ANSWERS_AGAIN):
                self.keep_done(s, answer)
            elif ok:
                self.drop(key)
            elif s is not None:
                s.attempt = None

    def attempt(self, gathered: GatheredUpload) -> Optional[Attempt]:
        """The SAVE of this upload whose outcome is still unknown, if any."""
        found = {id(s.attempt): s.attempt for k in gathered.keys if (s := self._sessions.get(k)) is not None}
        return next(iter(found.values())) if len(found) == 1 else None

    def earlier(self, gathered: GatheredUpload) -> list[Union[Attempt, tuple[object, dict], None]]:
        """Per file of `gathered` (a Dropbox batch), what an earlier SAVE
        left of its session: that SAVE while its outcome is unknown
        (`Attempt`), the provider's result for it when a SAVE answered for
        it without the app being told (`Session.answered`), or None (a
        session no SAVE has taken yet)."""
        out: list[Union[Attempt, tuple[object, dict], None]] = []
        for key in gathered.keys:
            s = self._sessions.get(key)
            out.append(None if s is None else s.attempt or s.answered)
        return out

    def settle_entry(self, key: str, how: str, answered: Optional[tuple[object, dict]] = None) -> None:
        """One session of a Dropbox batch after a definite answer: "drop"
        (committed, and the app told), "retry" (not committed: the app's
        retry is a new attempt), "answered" (committed, the app not told
        yet: `answered` is kept for its retry)."""
        s = self._sessions.get(key)
        if s is None:
            return
        if how == "drop":
            self.drop(key)
        elif how == "retry":
            s.attempt, s.answered = None, None
        elif how == "answered":
            s.attempt, s.answered = None, answered
        else:
            raise ValueError(f"settle_entry: {how!r}")

    def attempting(self, gathered: GatheredUpload, attempt: Attempt) -> None:
        """Marks the upload's sessions with the SAVE about to be sent: until a
        definite answer settles them, a retry of the final request sends it again."""
        for key in gathered.keys:
            if (s := self._sessions.get(key)) is not None:
                s.attempt = attempt

    def feed(self, rec: Recognised) -> Outcome:
        """Answers or gathers one session request; None: pass it through."""
        handler = self._handlers.get(rec.kind)
        if handler is None or rec.request.body is None and rec.kind not in self._head_only:
            return None
        return handler(rec)

