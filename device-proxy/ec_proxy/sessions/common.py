"""What every provider's upload sessions share: the answers and gathered
uploads the book hands out, the record of one session, and the shelf that
holds the sessions within their bounds (count, bytes, idle time).

A provider module (`dropbox`, `graph`, `drive`, `webdav`) subclasses
`ProviderSessions`: it answers its own session steps in its own format and
keeps its sessions on the shared `Shelf` under keys with its own prefix.
Nothing here knows a provider.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional, Union
from urllib.parse import urlsplit

import ec_protocol as ecp
from ec_protocol import DocKey

from ..recognise import AppRequest, Kind, Recognised, is_office_content, is_office_name
from ..recognise.common import Header

#: The mark of every session id the device issues.
DEVICE_MARK = "ec-"
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


@dataclass(frozen=True)
class Attempt:
    """A SAVE of a collapsed upload whose outcome is not known (sent, and
    no definite answer came back): the app's retry of its final request is
    this very SAVE again, with its request id, so that the EPS answers from
    its outcome record and never uploads the file a second time (protocol
    spec §5.4), as the provider's own session, once used, would not take it
    twice either."""

    request_id: bytes
    procedure: int
    requests: tuple[ecp.ProviderRequest, ...]
    items: tuple[ecp.SaveItem, ...]
    #: Book keys of the sessions the SAVE completes, in the order of `items`
    #: (a Dropbox batch's retry may name only some of them, or others too).
    keys: tuple[str, ...] = ()


Outcome = Union[Answer, GatheredUpload, None]
#: One session step: the recognised request -> what to do with it.
Handler = Callable[[Recognised], Outcome]


@dataclass
class Session:
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
    #: The SAVE of the upload this session is part of while its outcome is unknown.
    attempt: Optional[Attempt] = None
    #: Dropbox batch: the provider committed this session's file in a SAVE
    #: whose answer the app did not get for it (its outcome was unknown, and
    #: the app's retry named other entries): (the entry as that SAVE sent it,
    #: the provider's result entry), for the app's retry of this entry.
    answered: Optional[tuple[object, dict]] = None
    #: Drive: the upload completed, and this is the provider's answer the
    #: app was given (a status query gets it again, as Google answers one).
    done: Optional[Answer] = None

    @property
    def size(self) -> int:
        return len(self.data) + sum(len(c) for c in self.chunks.values()) + (len(self.done.body) if self.done else 0)


def json_answer(status: int, reason: str, value: object, extra: tuple[Header, ...] = ()) -> Answer:
    return Answer(status, reason, (("Content-Type", "application/json"),) + extra, json.dumps(value).encode())


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + ".000Z"


def origin(url: str, host: str) -> str:
    """`scheme://host[:port]` with the port of `url`, so a lab client that
    reached a provider on a test port is answered with URLs on that port."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def empty_body(req: AppRequest) -> AppRequest:
    return AppRequest(req.method, req.url, req.headers, b"")


class SerialIds:
    """Session ids that are cheap on the device link: a random prefix drawn
    once per proxy process (96 bits, so ids never repeat across restarts)
    and a counter. A Dropbox session id travels in each finish head (coded
    against the context: a new random id would cost its whole length in
    every head delta) and as the item's binding (spec §6.2). Another app of
    the same device can guess the next id, but a Dropbox session is only
    found by the account that started it (its own token), so guessing
    gains nothing; ids that no account check guards (Graph's
    pre-authenticated uploadUrl, Drive's session URI) stay fully random,
    and they never travel to the EPS."""

    def __init__(self, prefix: Optional[str] = None) -> None:
        self.prefix = prefix if prefix is not None else secrets.token_urlsafe(12)
        self._next = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}{next(self._next):x}"


class Shelf:
    """The sessions of every provider, least recently used first, within
    the bounds of the package doc; the clocks and the id source.

    Not thread-safe: the addon calls it from mitmproxy's event loop.
    """

    def __init__(
        self,
        *,
        max_sessions: int,
        max_bytes: int,
        idle_ttl: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        new_id: Callable[[], str],
        serial_id: Optional[Callable[[], str]] = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.idle_ttl = idle_ttl
        self._clock = clock
        #: Wall-clock seconds (for expiry times the app is told).
        self.wall_clock = wall_clock
        #: A fresh random id (the part after DEVICE_MARK).
        self.new_id = new_id
        #: A fresh id that differs from the last one in a few characters
        #: (`SerialIds`): for ids that travel to the EPS in every save.
        self.serial_id = serial_id or SerialIds()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def gathered_bytes(self) -> int:
        return sum(s.size for s in self._sessions.values())

    #: Completed sessions kept for a status query (`Session.done`): at most
    #: this many, each for at most `DONE_TTL` seconds, the oldest going
    #: first, so that they never push out a session still gathering (an app
    #: asks for the status seconds after its answer was lost).
    MAX_DONE = 64
    DONE_TTL = 3600.0

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._sessions.items()
                    if now - s.touched > (min(self.idle_ttl, self.DONE_TTL) if s.done is not None else self.idle_ttl)]:
            del self._sessions[key]

    def keep_done(self, s: Session, answer: Answer) -> None:
        """Keeps a completed session for its status queries: its answer
        instead of its bytes, within `MAX_DONE`."""
        s.done, s.attempt, s.data, s.chunks = answer, None, bytearray(), {}
        done = [k for k, x in self._sessions.items() if x.done is not None]
        for key in done[:max(0, len(done) - self.MAX_DONE)]:
            del self._sessions[key]

    def get(self, key: str) -> Optional[Session]:
        self._expire()
        s = self._sessions.get(key)
        if s is not None:
            s.touched = self._clock()
            self._sessions.move_to_end(key)
        return s

    def add(self, s: Session) -> None:
        self._expire()
        s.touched = self._clock()
        self._sessions[s.key] = s
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def grew(self, s: Session) -> bool:
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

    def drop(self, key: str) -> None:
        """Forgets a session (cancelled, or completed and accepted)."""
        self._sessions.pop(key, None)


class ProviderSessions:
    """One provider's session steps, its sessions kept on `shelf`."""

    #: Kinds answered from the request head alone (the others wait for the body).
    head_only: frozenset[Kind] = frozenset()

    def __init__(self, shelf: Shelf) -> None:
        self.shelf = shelf

    def handlers(self) -> dict[Kind, Handler]:
        """The Kinds this provider answers, each with its step."""
        raise NotImplementedError
