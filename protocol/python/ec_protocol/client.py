"""The device's client for its EPS: HELLO, SAVE and FETCH with the resend and
fallback rules of spec §7.

`EpsClient` turns an app's upload or download into one protocol request and
returns one of three outcomes, never raising for anything the EPS or the
network does:

- `ProviderResponse` / `FetchResponse`: what the provider answered (for a
  fetch, with the rebuilt file, its size and SHA-256 checked);
- `Fallback`: take the direct path (let the app's request go to the provider);
- `AppError`: answer the app 502 or 504 with an empty body (a stage-1
  failure, or a save whose outcome stayed unknown, where the provider may
  already have the upload, so the direct path would risk a stale second
  upload, §7).

A save whose transmission may have reached the EPS without an answer (the
connection failed after sending, or the answer could not be trusted) has an
unknown outcome: the client then asks the EPS again with the same
`request_id`, on new connections and in a new session when needed, with
backoff, for up to `retry_window` seconds (§7.1, default 30 s). It never
takes the direct path for such a save, whatever the retries meet
(connection refused included: a dead EPS may have reached the provider
before it died); if no answer comes within the window, the app gets 504.

It keeps the session (id, sequence counter, negotiated caps and limits), the
context definitions it sent, so an unchanged head travels as SAME and a
changed one as a small DELTA, and the last response per document for
`resp_ref` when both sides have that capability.

Concurrency: one client holds one connection and one session; its methods
are thread-safe but serialised by a lock (a save waits for the one before
it). A proxy that wants concurrent saves creates one client per worker
(each opens its own session; the EPS keeps `max_sessions`, default 8).

Transport: `http.client` from the standard library (HTTP/1.1 keep-alive,
one connection, reopened after a failure). TLS uses no CA validation: the
only check is the SHA-256 pin of the certificate's SubjectPublicKeyInfo
(§2.3), read with `cryptography` before any byte of a request is sent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http.client
import os
import select
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, NamedTuple, Optional, Union
from urllib.parse import urlsplit

from .cb import CB
from .errors import ProtocolError
from .heads import Text, canonical_head, parse_head, parse_response_head
from .limits import Cap, Limits
from .messages import (
    BODY_BYTES,
    BODY_EMPTY,
    BODY_FILE,
    BODY_WRAPPED,
    FETCH_PATH,
    FULL,
    HELLO_PATH,
    INLINE,
    PART_PATCH,
    PATCH,
    PROTOCOL_VERSION,
    SAVE_PATH,
    SINGLE,
    ContextDef,
    DocKey,
    Error,
    Fetch,
    FetchResult,
    Hello,
    HelloOk,
    Item,
    RequestSpec,
    Save,
    SaveResult,
    decode_message,
    response_digest,
)

# §4.3.2: a context is never redefined for a delta of at most this many bytes.
REDEFINE_DELTA_BYTES = 64
#: ... and is redefined for a change that persists only past this many: below
#: it, the delta costs less on every save than the definition would on one
#: (see `_redefine`), so no save carries a whole head it could do without.
PERSISTENT_REDEFINE_BYTES = 192
#: A request whose context key has no context yet is coded against another
#: context of the session (same credential) when that costs at most this
#: and less than half a definition (see `_borrow`).
BORROW_BYTES = 384
AUTH_FAILED_PAUSE_S = 300.0
#: Downloads (FETCH): resends after a transport failure before the direct path.
TRANSPORT_RETRIES = 2
TRANSPORT_RETRY_WINDOW_S = 30.0
#: Uploads (SAVE), spec §7.1: how long the device keeps asking the EPS about
#: a save whose outcome is unknown before it answers the app 504.
OUTCOME_RETRY_WINDOW_S = 30.0
#: The pauses between those attempts: the first retry at once, then 0.1 s,
#: doubling up to this.
OUTCOME_RETRY_BACKOFF_MAX_S = 2.0
IDLE_REOPEN_S = 100.0
#: Responses the client keeps for `resp_ref` (§4.6.2; the EPS keeps `resp_cache` per session).
RESPONSES_KEPT = 256


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class EnrolmentBundle:
    """What the edge-manager gives a device (§3.1). `url` is the EPS base URL
    (``https://host:port`` or, in lab mode, ``http://host:port``);
    `spki_sha256` the 32-byte pin of its certificate's SubjectPublicKeyInfo."""

    url: str
    key_id: int
    secret: bytes = field(repr=False)
    plain_http: bool = False
    spki_sha256: Optional[bytes] = None

    def __post_init__(self) -> None:
        if len(self.secret) != 32:
            raise ValueError("the instance secret is 32 bytes")
        scheme = urlsplit(self.url).scheme
        if scheme == "http" and not self.plain_http:
            raise ValueError("plain HTTP is not allowed by this bundle")
        if scheme == "https" and (self.spki_sha256 is None or len(self.spki_sha256) != 32):
            raise ValueError("TLS needs a 32-byte SHA-256 pin of the EPS certificate's SubjectPublicKeyInfo")
        if scheme not in ("http", "https"):
            raise ValueError(f"EPS URL scheme must be https (or http in lab mode), not {scheme!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "EnrolmentBundle":
        """From JSON-friendly fields: `secret` and `spki_sha256` in hex."""
        pin = d.get("spki_sha256")
        return cls(
            url=d["url"],
            key_id=int(d["key_id"]),
            secret=bytes.fromhex(d["secret"]),
            plain_http=bool(d.get("plain_http", False)),
            spki_sha256=bytes.fromhex(pin) if pin else None,
        )


def spki_sha256_of_der_certificate(der: bytes) -> bytes:
    """The pin of §2.3: SHA-256 of the certificate's DER SubjectPublicKeyInfo."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    cert = x509.load_der_x509_certificate(der)
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()


# ---------------------------------------------------------------- outcomes


@dataclass
class ProviderResponse:
    """A provider response to hand to the app. `headers` are as the provider
    sent them (lower-case names, hop-by-hop fields removed) plus the
    Content-Length of `body` (§4.6.1)."""

    status: int
    reason: str
    headers: list[tuple[str, bytes]]
    body: bytes = field(repr=False)
    replayed: bool = False
    hash_disagreement: bool = False

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class FetchResponse:
    """A download: `parts` is the provider response (two parts when a redirect
    was followed: the redirect, then the final response whose body is the
    rebuilt file)."""

    parts: list[ProviderResponse]
    file_sha256: Optional[bytes] = None
    hash_disagreement: bool = False

    @property
    def final(self) -> ProviderResponse:
        return self.parts[-1]


@dataclass
class Fallback:
    """Take the direct path (§7). `reason` is a short stable word; `error`
    the EPS's ERROR when there was one."""

    reason: str
    error: Optional[ProtocolError] = None


@dataclass
class AppError:
    """Answer the app with `status` (502 or 504) and an empty body: the
    provider may have received requests (stage 1), so no direct path.
    `reason` is the EPS's error code, or "outcome_unknown" when the EPS
    could not be asked about a save within the retry window (§7.1)."""

    status: int
    reason: str
    error: Optional[ProtocolError] = None


SaveOutcome = Union[ProviderResponse, Fallback, AppError]
FetchOutcome = Union[FetchResponse, Fallback, AppError]


# ---------------------------------------------------------------- inputs


@dataclass
class ProviderRequest:
    """An app request as the device saw it. Headers are the app's, in order
    (forbidden fields are removed when the head is made). `body_kind` says
    where the body comes from: FILE (item `item`), BYTES (`body`), WRAPPED
    (`body`[:split] + file + `body`[split:]) or EMPTY. `context_key` groups
    saves that share a context; by default (document, credential, method)."""

    method: Text
    url: Text
    headers: list[tuple[Text, Text]]
    body_kind: int = BODY_FILE
    item: int = 0
    body: bytes = b""
    split: int = 0
    context_key: Optional[Hashable] = None


@dataclass
class SaveItem:
    """One file of a save: the bytes the app uploaded, its document key, and
    the edit patch against the last-synced copy when the device has one."""

    target: bytes = field(repr=False)
    doc: DocKey
    patch: Optional[bytes] = field(default=None, repr=False)
    binding: bytes = b""
    #: The base the patch was made against (make_item keeps it): a patch of a
    #: newer edit-patch version than the session's is made again from it at
    #: the session's newest, instead of the file going FULL.
    base: Optional[bytes] = field(default=None, repr=False, compare=False)

    @property
    def target_sha256(self) -> bytes:
        return hashlib.sha256(self.target).digest()


def make_item(
    target: bytes, doc: DocKey, base: Optional[bytes], binding: bytes = b"", max_version: Optional[int] = None
) -> SaveItem:
    """A SaveItem with an edit patch against `base` when one can be made and
    is smaller than the file; otherwise the item goes FULL. `max_version`:
    the newest edit-patch version to write (default: the newest this build
    writes; a session that reads only older ones gets the patch made again,
    see SaveItem.base)."""
    return SaveItem(target, doc, _patch_of(base, target, max_version), binding, base)


def _patch_of(base: Optional[bytes], target: bytes, max_version: Optional[int]) -> Optional[bytes]:
    if base is None:
        return None
    import ec_patch

    try:
        candidate = bytes(ec_patch.diff(base, target, max_version=max_version))
    except ec_patch.PatchError:
        return None
    return candidate if len(candidate) < len(target) else None


def _readable_patch(it: SaveItem, versions: tuple[int, ...]) -> Optional[bytes]:
    """`it`'s patch if the session reads its version; else the patch made
    again from its base at the newest version both sides know (an encoder
    allowed version 2 writes version 2 even for a patch that needs nothing
    else of it: edit-patch-v2.md §1.2), or None (the item goes FULL)."""
    if it.patch is None or _patch_version(it.patch) in versions:
        return it.patch
    if it.base is None:
        return None
    import ec_patch

    common = set(versions) & set(ec_patch.FORMAT_VERSIONS)
    if not common:
        return None
    it.patch = _patch_of(it.base, it.target, max(common))
    return it.patch


# ---------------------------------------------------------------- transport


class _NotSent(Exception):
    """The connection could not be opened (or the pin did not match):
    nothing reached the EPS."""


class _PinMismatch(_NotSent):
    """The EPS's certificate is not the one the enrolment bundle pins (§2.3).
    `expected` and `got` are SHA-256 pins of SubjectPublicKeyInfos: public
    values, safe to log."""

    def __init__(self, expected: bytes, got: Optional[bytes]) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            f"pin mismatch: the EPS certificate's SubjectPublicKeyInfo SHA-256 is "
            f"{got.hex() if got else 'absent'}, the enrolment pin is {expected.hex()}"
        )


class _SentFailure(Exception):
    """The request may have reached the EPS; the outcome is unknown."""


@dataclass
class Traffic:
    """Bytes on the device-EPS link, HTTP framing included (TLS records
    excluded), and time spent in exchanges, since the client was made. The
    device proxy reads it before and after a save to count what the save
    cost and to measure the link."""

    bytes_out: int = 0
    bytes_in: int = 0
    seconds: float = 0.0
    exchanges: int = 0
    #: The EPS's own time in the exchanges that reported it (spec §7.3 `eps`),
    #: and how many did: `seconds - eps_seconds` over those is link time.
    eps_seconds: float = 0.0
    timed_exchanges: int = 0
    #: Time the EPS reported rebuilding patched items (§7.3 `rb`).
    rebuild_seconds: float = 0.0
    #: Time the EPS reported in provider exchanges (§7.3 `pv`), and how many
    #: exchanges reported it: `eps_seconds - rebuild_seconds - provider_seconds`
    #: over those is what the EPS adds on its own (store, hashing).
    provider_seconds: float = 0.0
    provider_timed_exchanges: int = 0
    #: The part of `rebuild_seconds` that ran during `provider_seconds` (§7.3
    #: `ov`, a streamed save, §5.6): what the EPS adds on its own is then
    #: `eps_seconds - rebuild_seconds - provider_seconds + overlap_seconds`.
    overlap_seconds: float = 0.0

    def since(self, before: "Traffic") -> "Traffic":
        return Traffic(*(getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(Traffic)))

    def copy(self) -> "Traffic":
        return Traffic(*(getattr(self, f.name) for f in dataclasses.fields(Traffic)))


def server_timing(value: Optional[str]) -> dict[str, float]:
    """The durations of a `Server-Timing` field (spec §7.3), in seconds, by
    metric name; metrics without a readable `dur` are left out, and an
    absent or unreadable field gives an empty dict (it is advisory)."""
    out: dict[str, float] = {}
    for metric in (value or "").split(","):
        name, _, params = metric.strip().partition(";")
        for param in params.split(";"):
            key, _, v = param.strip().partition("=")
            if key.strip().lower() == "dur" and name.strip():
                try:
                    ms = float(v.strip().strip('"'))
                except ValueError:
                    continue
                if 0 <= ms < 1e9:
                    out[name.strip().lower()] = ms / 1e3
    return out


class _Transport:
    """One keep-alive HTTP/1.1 connection to the EPS, reopened on failure."""

    def __init__(self, bundle: EnrolmentBundle, connect_timeout: float, read_timeout: float) -> None:
        parts = urlsplit(bundle.url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.tls else 80)
        self.pin = bundle.spki_sha256
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.conn: Optional[http.client.HTTPConnection] = None
        self.requests_on_conn = 0
        self.last_used = 0.0
        self.traffic = Traffic()
        #: The last pin mismatch (expected, got), cleared by a connection whose pin matched.
        self.pin_mismatch: Optional[tuple[bytes, Optional[bytes]]] = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _open(self) -> http.client.HTTPConnection:
        try:
            if self.tls:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                # The pin replaces CA validation (§2.3); it is checked below,
                # before any request byte is written.
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.connect_timeout, context=ctx
                )
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
            conn.connect()
        except (OSError, http.client.HTTPException) as e:
            raise _NotSent(f"cannot connect to the EPS: {type(e).__name__}") from e
        if self.tls:
            der = conn.sock.getpeercert(binary_form=True)
            got = spki_sha256_of_der_certificate(der) if der is not None else None
            if got is None or not hmac.compare_digest(got, self.pin):
                conn.close()
                self.pin_mismatch = (self.pin, got)
                raise _PinMismatch(self.pin, got)
            self.pin_mismatch = None
        conn.sock.settimeout(self.read_timeout)
        self.requests_on_conn = 0
        return conn

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        # The EPS keeps idle connections at least 120 s (§2.2); reopening
        # before that runs out means a failure on a reused connection is a
        # real one, never a server's routine idle close.
        if self.conn is not None and time.monotonic() - self.last_used > IDLE_REOPEN_S:
            self.close()
        # A kept-alive connection the EPS has closed meanwhile (it stopped or
        # restarted): open a new one instead of writing into it, so a request
        # that never left is not mistaken for one whose outcome is unknown (§7.1).
        if self.conn is not None and _dropped(self.conn):
            self.close()
        if self.conn is None:
            self.conn = self._open()
        conn = self.conn
        started = time.monotonic()
        # What http.client writes: request line, Host, Content-Length, blank line.
        host = self.host if self.port == (443 if self.tls else 80) else f"{self.host}:{self.port}"
        head_out = len(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n")
        self.traffic.bytes_out += head_out + len(body)
        try:
            conn.putrequest("POST", path, skip_accept_encoding=True)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            head_in = len(f"HTTP/1.1 {resp.status} {resp.reason}\r\n") + sum(len(k) + len(v) + 4 for k, v in resp.getheaders()) + 2
            self.traffic.bytes_in += head_in + len(data)
            timing = server_timing(resp.getheader("Server-Timing"))
            if "eps" in timing:
                self.traffic.eps_seconds += timing["eps"]
                self.traffic.timed_exchanges += 1
            self.traffic.rebuild_seconds += timing.get("rb", 0.0)
            if "eps" in timing and "pv" in timing:
                self.traffic.provider_seconds += timing["pv"]
                self.traffic.provider_timed_exchanges += 1
                self.traffic.overlap_seconds += timing.get("ov", 0.0)
            if resp.will_close:
                self.close()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise _SentFailure(f"EPS connection failed after sending: {type(e).__name__}") from e
        finally:
            self.traffic.seconds += time.monotonic() - started
            self.traffic.exchanges += 1
        self.requests_on_conn += 1
        self.last_used = time.monotonic()
        return status, data


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection was closed by the peer: between
    exchanges nothing is due from the EPS, so a readable socket means EOF
    (or stray bytes, equally a reason not to reuse it)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


# ---------------------------------------------------------------- session state


@dataclass
class _Ctx:
    ctx_id: int
    head: bytes
    body: bytes
    doc: Optional[DocKey]
    last_used: float = 0.0
    #: The head and body last sent under this context (§4.3.2's redefinition
    #: rule: a change that persists is worth a redefinition, one that comes
    #: anew with every request is not).
    last_head: Optional[bytes] = None
    last_body: Optional[bytes] = None

    def definition(self) -> ContextDef:
        return ContextDef(self.ctx_id, self.head, self.body, self.doc)


@dataclass
class _Session:
    session_id: bytes
    caps: int
    patch_versions: tuple[int, ...]
    limits: Limits
    seq: int = 0
    contexts: dict = field(default_factory=dict)  # context key -> _Ctx

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


@dataclass
class _Job:
    """One app request across all its transmissions (one request_id)."""

    path: str
    request_id: bytes
    heads: list[bytes]
    requests: list[ProviderRequest]
    keys: list[Hashable]
    doc: Optional[DocKey]  # the document the resp_ref and response cache follow
    force_define: set = field(default_factory=set)  # ctx ids to define again
    force_full: set = field(default_factory=set)  # item indexes to send FULL
    defined_last: set = field(default_factory=set)  # ctx ids defined by the last transmission
    sent_kinds: list = field(default_factory=list)  # payload kind of each item in the last transmission


class EpsClient:
    """The device's client of one EPS; see the module text for the outcomes
    and the concurrency rule."""

    def __init__(
        self,
        bundle: EnrolmentBundle,
        *,
        label: str = "",
        caps: int = Cap.ALL_V1,
        patch_versions: Optional[Iterable[int]] = None,
        connect_timeout: float = 5.0,
        read_timeout: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        retry_window: float = OUTCOME_RETRY_WINDOW_S,
        retry_backoff_max: float = OUTCOME_RETRY_BACKOFF_MAX_S,
        response_aliases: Optional[Callable[[DocKey, bytes], Iterable[DocKey]]] = None,
    ) -> None:
        if patch_versions is None:
            import ec_patch

            patch_versions = tuple(ec_patch.FORMAT_VERSIONS)
        self.bundle = bundle
        self.label = label
        self.want_caps = caps
        self.patch_versions = tuple(sorted(set(patch_versions), reverse=True))
        # §6.0: the device waits at least op_timeout + 10 s; refined after HELLO.
        self._read_timeout_override = read_timeout
        self._transport = _Transport(bundle, connect_timeout, read_timeout or Limits().op_timeout + 10)
        self._clock = clock
        self._sleep = sleep
        #: §7.1: seconds to keep asking the EPS about a save whose outcome is unknown.
        self.retry_window = float(retry_window)
        self.retry_backoff_max = float(retry_backoff_max)
        self._lock = threading.RLock()
        self._session: Optional[_Session] = None
        self._paused_until = 0.0
        #: (document, "save" or "fetch") -> the digest of its last response of that kind
        self._responses: dict[tuple[DocKey, str], bytes] = {}
        self._by_digest: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()  # digest -> (head, body)
        #: Other keys of the document a successful save's response describes
        #: (a created file's id, a driveItem's path): (doc, body) -> keys. The
        #: next save under any of them names this response (§4.6.2).
        self.response_aliases = response_aliases

    # -- public API

    def close(self) -> None:
        with self._lock:
            self._transport.close()

    #: How each item of the last save's last transmission travelled ("patch" or
    #: "full"): the client sends an item FULL when its patch is over the EPS's
    #: limit or after base_unknown, whatever the caller offered.
    last_sent_kinds: list = []
    #: The ERROR codes the last exchange resent after (§7: "base_unknown",
    #: "patch_failed", "target_mismatch", "session_unknown", ...).
    last_resends: set = set()

    def traffic(self) -> Traffic:
        """A snapshot of the link counters (see `Traffic`)."""
        return self._transport.traffic.copy()

    @property
    def pin_mismatch(self) -> Optional[tuple[str, str]]:
        """(expected, got) in hex when the last connection attempt met a
        certificate the enrolment pin does not match; None otherwise."""
        pm = self._transport.pin_mismatch
        if pm is None:
            return None
        return pm[0].hex(), pm[1].hex() if pm[1] else "absent"

    @property
    def session_caps(self) -> Optional[int]:
        """The session's capabilities (the AND of both sides), or None."""
        s = self._session
        return None if s is None else s.caps

    @property
    def limits(self) -> Optional[Limits]:
        s = self._session
        return None if s is None else s.limits

    @property
    def patch_version(self) -> Optional[int]:
        """The newest edit-patch format version both sides read (the EPS's
        `patch_versions` in HELLO_OK and this client's), or None before a
        session: a SAVE patch of another version goes FULL."""
        s = self._session
        return None if s is None else max(set(s.patch_versions) & set(self.patch_versions), default=None)

    def hello(self) -> Union[HelloOk, Fallback]:
        """Opens a new session (replacing any current one)."""
        with self._lock:
            return self._hello()

    def save(self, procedure: int, requests: list[ProviderRequest], items: list[SaveItem],
             request_id: Optional[bytes] = None) -> SaveOutcome:
        """Performs one app upload through the EPS (§5, §7). `request_id`
        (8 bytes): the id of an earlier save of the same upload whose outcome
        stayed unknown, sent again with the same requests and items, so that
        the EPS answers from its outcome record instead of uploading twice
        (§5.4); by default a new one."""
        if request_id is not None and len(request_id) != 8:
            raise ValueError("a request id is 8 bytes")
        with self._lock:
            return self._save(procedure, requests, items, request_id)

    def save_single(
        self,
        method: Text,
        url: Text,
        headers: list[tuple[Text, Text]],
        file: bytes,
        base: Optional[bytes],
        doc: DocKey,
    ) -> SaveOutcome:
        """A SINGLE save of an app's one-request upload (Dropbox upload, Graph
        simple upload, Drive media upload, WebDAV PUT). Empty files take the
        direct path (§6.0)."""
        if not file:
            return Fallback("empty_file")
        return self.save(SINGLE, [ProviderRequest(method, url, headers)], [make_item(file, doc, base)])

    def fetch(
        self,
        request: ProviderRequest,
        doc: DocKey,
        have: Optional[bytes] = None,
        *,
        follow_redirect: bool = False,
    ) -> FetchOutcome:
        """Performs an app download through the EPS (§4.8). `have` is the
        device's last-synced copy; a PATCH answer is applied to it and the
        result is checked against the target size and SHA-256."""
        with self._lock:
            return self._fetch(request, doc, have, follow_redirect)

    # -- HELLO

    def _hello(self) -> Union[HelloOk, Fallback]:
        self._session = None
        hello = Hello(
            self.bundle.key_id,
            os.urandom(16),
            (PROTOCOL_VERSION,),
            self.patch_versions,
            self.want_caps,
            self.label,
        )
        body = hello.encode(self.bundle.secret)
        try:
            _, data = self._transport.post(HELLO_PATH, body)
        except _PinMismatch as e:
            return Fallback("eps_pin_mismatch", ProtocolError("internal", str(e)))
        except (_NotSent, _SentFailure) as e:
            return Fallback("eps_unreachable", ProtocolError("internal", str(e)))
        try:
            msg = decode_message(data, path=HELLO_PATH)
        except ProtocolError as e:
            return Fallback("bad_response", e)
        authentic = msg.verify(self.bundle.secret, hello.mac)
        if isinstance(msg, Error):
            err = msg.to_exception(authenticated=authentic)
            if err.code == "auth_failed":
                self._paused_until = self._clock() + AUTH_FAILED_PAUSE_S
            return Fallback("hello_failed", err)
        if not isinstance(msg, HelloOk) or not authentic:
            return Fallback("bad_response", ProtocolError("auth_failed", "HELLO_OK MAC does not verify"))
        if msg.chosen_version != PROTOCOL_VERSION:
            return Fallback("hello_failed", ProtocolError("unsupported_version", f"EPS chose {msg.chosen_version}"))
        limits = Limits.from_pairs(list(msg.limits))
        self._session = _Session(msg.session_id, msg.caps & self.want_caps, msg.patch_versions, limits)
        if self._read_timeout_override is None:
            self._transport.read_timeout = limits.op_timeout + 10
        return msg

    def _ensure_session(self) -> Optional[Fallback]:
        if self._clock() < self._paused_until:
            return Fallback("eps_paused")
        if self._session is None:
            out = self._hello()
            if isinstance(out, Fallback):
                return out
        return None

    # -- contexts

    def _context_for(self, session: _Session, key: Hashable, head: bytes, body: bytes, doc, defs: list,
                     first: bool = False):
        ctx = session.contexts.get(key)
        if ctx is not None:
            if _redefine(ctx, head, body):
                ctx.head, ctx.body, ctx.doc = head, body, doc
                defs.append(ctx.definition())
        else:
            borrowed = self._borrow(session, key, head, body, doc if first else None)
            if borrowed is not None:
                borrowed.last_used = self._clock()
                return borrowed
            used = {c.ctx_id for c in session.contexts.values()}
            free = [i for i in range(1, session.limits.max_contexts + 1) if i not in used]
            if free:
                ctx_id = free[0]
            else:
                old_key = min(session.contexts, key=lambda k: session.contexts[k].last_used)
                ctx_id = session.contexts.pop(old_key).ctx_id
            ctx = _Ctx(ctx_id, head, body, doc)
            session.contexts[key] = ctx
            defs.append(ctx.definition())
        ctx.last_used = self._clock()
        ctx.last_head, ctx.last_body = head, body
        return ctx

    def _borrow(self, session: _Session, key: Hashable, head: bytes, body: bytes,
                doc: Optional[DocKey]) -> Optional[_Ctx]:
        """A request of a new context key (a document's first save in a new
        addressing form or method) is coded against the session's context
        that codes it cheapest, when that costs at most BORROW_BYTES and less
        than half a definition of its own (the item then names its document
        when the context's differs, counted in): a first save under a new
        addressing form or method carries a small delta instead of a whole
        head (§4.3.2); its later saves do the same. Only
        contexts of the same credential are candidates (one context per
        document and credential; a new token gets a context of its own),
        and only for the default keys (`_CtxKey`)."""
        if not isinstance(key, _CtxKey):
            return None
        best, best_cost = None, min(BORROW_BYTES, (len(head) + len(body)) // 2) + 1
        for other, ctx in session.contexts.items():
            if not isinstance(other, _CtxKey) or other.auth != key.auth:
                continue
            cost = len(CB.code(ctx.head, head).encode()) - 1
            if body:
                cost += len(CB.code(ctx.body, body).encode()) - 1
            if doc is not None and ctx.doc != doc:
                cost += len(doc.encode())
            if cost < best_cost:
                best, best_cost = ctx, cost
        return best

    def _specs(self, session: _Session, job: _Job, first_doc: Optional[DocKey]):
        defs: list[ContextDef] = []
        specs = []
        ctx_docs = []
        for n, (req, head, key) in enumerate(zip(job.requests, job.heads, job.keys)):
            ctx = self._context_for(session, key, head, req.body, first_doc, defs, first=n == 0)
            if ctx.ctx_id in job.force_define and all(d.ctx_id != ctx.ctx_id for d in defs):
                defs.append(ctx.definition())
            body_cb = CB.code(ctx.body, req.body) if req.body_kind in (BODY_BYTES, BODY_WRAPPED) else None
            specs.append(
                RequestSpec(
                    ctx.ctx_id,
                    CB.code(ctx.head, head),
                    req.body_kind,
                    req.item if req.body_kind in (BODY_FILE, BODY_WRAPPED) else None,
                    body_cb,
                    req.split if req.body_kind == BODY_WRAPPED else None,
                )
            )
            ctx_docs.append(ctx.doc)
        job.defined_last = {d.ctx_id for d in defs}
        job.force_define = set()
        return defs, specs, ctx_docs

    def _resp_ref(self, session: _Session, doc: Optional[DocKey], kind: str) -> Optional[bytes]:
        """The response to name for a `kind` ("save" or "fetch") of `doc`
        (§4.6.2): the document's last response of the same kind (a save's
        metadata is coded best against the last save's, not against a
        download in between), else its last response of any kind."""
        if not session.caps & Cap.RESP_REF or doc is None:
            return None
        other = "fetch" if kind == "save" else "save"
        digest = self._responses.get((doc, kind)) or self._responses.get((doc, other))
        return digest if digest in self._by_digest else None

    def _remember(self, docs: Iterable[DocKey], kind: str, head: bytes, body: bytes) -> None:
        digest = response_digest(head, body)
        self._by_digest[digest] = (head, body)
        self._by_digest.move_to_end(digest)
        while len(self._by_digest) > RESPONSES_KEPT:
            self._by_digest.popitem(last=False)
        for doc in docs:
            self._responses[(doc, kind)] = digest
        while len(self._responses) > 4 * RESPONSES_KEPT:
            self._responses.pop(next(iter(self._responses)))

    # -- SAVE

    def _save(self, procedure: int, requests: list[ProviderRequest], items: list[SaveItem],
              request_id: Optional[bytes] = None) -> SaveOutcome:
        fb = self._ensure_session()
        if fb:
            return fb
        session = self._session
        if not session.caps & Cap.procedure(procedure):
            return Fallback("capability_missing")
        try:
            heads = [canonical_head(r.method, r.url, r.headers, allow_http=self.bundle.plain_http) for r in requests]
        except ProtocolError as e:
            return Fallback("head_not_sendable", e)
        # §9: max_item_size bounds each item's file and all of a save's files together.
        if len(items) > session.limits.max_items or sum(len(i.target) for i in items) > session.limits.max_item_size:
            return Fallback("item_over_limit")
        doc = items[0].doc if items else None
        self.last_sent_kinds = []
        job = _Job(
            SAVE_PATH,
            request_id or os.urandom(8),
            heads,
            requests,
            [r.context_key or _default_context_key(r, doc, k) for k, r in enumerate(requests)],
            doc,
        )

        def build(session: _Session, seq: int) -> Save:
            defs, specs, ctx_docs = self._specs(session, job, doc)
            lim = session.limits
            wire_items = []
            patch_total = 0  # §9: max_patch_size bounds a save's patches together too
            for k, it in enumerate(items):
                patch = None if k in job.force_full else _readable_patch(it, session.patch_versions)
                as_patch = patch is not None and patch_total + len(patch) <= lim.max_patch_size
                if as_patch:
                    patch_total += len(patch)
                wire_items.append(
                    Item(
                        PATCH if as_patch else FULL,
                        len(it.target),
                        it.target_sha256,
                        patch if as_patch else it.target,
                        None if it.doc == ctx_docs[0] else it.doc,
                        it.binding,
                    )
                )
            job.sent_kinds = [i.payload_kind for i in wire_items]
            self.last_sent_kinds = ["patch" if k == PATCH else "full" for k in job.sent_kinds]
            return Save(
                session.session_id,
                seq,
                job.request_id,
                procedure,
                tuple(specs),
                tuple(wire_items),
                tuple(defs),
                self._resp_ref(session, doc, "save"),
            )

        def on_error(err: ProtocolError, resends: set) -> Optional[str]:
            """The resend kind §7 allows for an authenticated ERROR, after
            updating the job; None when the save must end."""
            if err.code in ("base_unknown", "patch_failed") and err.code not in resends:
                job.force_full.update(err.list)
                return err.code
            if err.code == "target_mismatch" and err.code not in resends:
                was_patch = bool(err.list) and all(
                    k < len(job.sent_kinds) and job.sent_kinds[k] == PATCH for k in err.list
                )
                if was_patch:
                    job.force_full.update(err.list)
                    return err.code
            return None

        return self._exchange(job, build, on_error, self._finish_save, upload=True)

    def _finish_save(self, job: _Job, sent, msg) -> Optional[SaveOutcome]:
        if not isinstance(msg, SaveResult):
            return None
        ref_head, ref_body = self._reference(job, sent, msg.ref_used)
        lim = self._session.limits
        try:
            head_bytes = msg.head.resolve(ref_head, lim.max_response_body, "provider_protocol", "response head")
            body = msg.body.resolve(ref_body, lim.max_response_body, "provider_protocol", "response body")
            head = parse_response_head(head_bytes)
        except ProtocolError:
            return None
        if job.doc is not None:
            docs = [job.doc]
            if self.response_aliases is not None and 200 <= head.status < 300:
                try:
                    docs += [d for d in self.response_aliases(job.doc, body) if d != job.doc]
                except Exception:  # noqa: BLE001 - only a coding reference is at stake
                    pass
            self._remember(docs, "save", head_bytes, body)
        return ProviderResponse(
            head.status, head.phrase, head.for_app(len(body)), body, msg.replayed, msg.hash_disagreement
        )

    def _reference(self, job: _Job, sent, ref_used: bool) -> tuple[bytes, bytes]:
        if not ref_used:
            return b"", b""
        if sent.resp_ref is None or sent.resp_ref not in self._by_digest:
            raise _BadResponse("REF_USED without a resp_ref")
        return self._by_digest[sent.resp_ref]

    # -- FETCH

    def _fetch(self, request: ProviderRequest, doc: DocKey, have: Optional[bytes], follow: bool) -> FetchOutcome:
        fb = self._ensure_session()
        if fb:
            return fb
        session = self._session
        if not session.caps & Cap.FETCH or (follow and not session.caps & Cap.FOLLOW_REDIRECT):
            return Fallback("capability_missing")
        if request.body_kind not in (BODY_EMPTY, BODY_BYTES):
            return Fallback("fetch_body_kind")
        try:
            head = canonical_head(request.method, request.url, request.headers, allow_http=self.bundle.plain_http)
        except ProtocolError as e:
            return Fallback("head_not_sendable", e)
        if any(n in ("range", "if-range") for n, _ in parse_head(head).headers):
            return Fallback("ranged_fetch")  # the EPS answers `unsupported` (§4.8)
        job = _Job(
            FETCH_PATH,
            os.urandom(8),
            [head],
            [request],
            [request.context_key or _default_context_key(request, doc, 0)],
            doc,
        )
        have_sha = hashlib.sha256(have).digest() if have is not None else None

        def build(session: _Session, seq: int) -> Fetch:
            defs, specs, ctx_docs = self._specs(session, job, doc)
            return Fetch(
                session.session_id,
                seq,
                job.request_id,
                specs[0],
                None if ctx_docs[0] == doc else doc,
                have_sha,
                follow,
                tuple(defs),
                self._resp_ref(session, doc, "fetch"),
            )

        def finish(job: _Job, sent, msg) -> Optional[FetchOutcome]:
            if not isinstance(msg, FetchResult):
                return None
            return self._finish_fetch(job, sent, msg, have)

        return self._exchange(job, build, lambda err, resends: None, finish)

    def _finish_fetch(self, job: _Job, sent, msg: FetchResult, have: Optional[bytes]) -> FetchOutcome:
        lim = self._session.limits
        ref_head, ref_body = self._reference(job, sent, msg.ref_used)
        parts = []
        final_cached = (b"", b"")
        file_sha = None
        for n, part in enumerate(msg.parts):
            # Only the final part is coded against the reference; the
            # redirect part carries its own (§4.8 gives one reference per
            # result; this client reads it as applying to every part).
            head_bytes = part.head.resolve(ref_head, lim.max_response_body, "provider_protocol", "part head")
            head = parse_response_head(head_bytes)
            if part.body_kind == INLINE:
                body = part.body.resolve(ref_body, lim.max_response_body, "provider_protocol", "part body")
                cached_body = body
            else:
                cached_body = b""
                if part.body_kind == PART_PATCH:
                    if have is None:
                        return Fallback("fetch_patch_without_base")
                    import ec_patch

                    try:
                        body = bytes(ec_patch.apply(have, msg.payload))
                    except ec_patch.PatchError:
                        return Fallback("fetch_patch_failed")
                else:
                    body = msg.payload
                if len(body) != part.target_size or not hmac.compare_digest(
                    hashlib.sha256(body).digest(), part.target_sha256
                ):
                    return Fallback("fetch_target_mismatch")
                file_sha = part.target_sha256
            if n == len(msg.parts) - 1:
                final_cached = (head_bytes, cached_body)
            parts.append(ProviderResponse(head.status, head.phrase, head.for_app(len(body)), body))
        if job.doc is not None:
            self._remember([job.doc], "fetch", *final_cached)
        return FetchResponse(parts, file_sha, msg.hash_disagreement)

    # -- the exchange loop of §7

    def _exchange(self, job: _Job, build, on_error, finish, *, upload: bool = False):
        """Sends the job until it has an outcome (§7). For an upload, once a
        transmission may have reached the EPS without an answer (`maybe_sent`)
        the direct path is closed: the client asks the EPS again with the same
        `request_id` until it answers or `retry_window` passes (§7.1)."""
        resends: set[str] = set()
        self.last_resends = resends
        transport_failures = 0  # downloads: transport failures so far
        first_failure_at: Optional[float] = None
        in_progress_deadline: Optional[float] = None
        # Uploads: a transmission (or a running save, `in_progress`) may have
        # reached the EPS and a provider; nothing but the EPS's answer settles it.
        maybe_sent = False
        window: Optional[_Window] = None

        def lost(reason: str, err: Optional[ProtocolError]):
            """A transmission ended without a usable answer. Returns the final
            outcome, or None to transmit again (after the backoff pause)."""
            nonlocal window, transport_failures, first_failure_at
            # The same definitions go again: whether the EPS applied them is unknown.
            job.force_define |= job.defined_last
            # A new connection, perhaps a restarted EPS: these may happen once more.
            resends.difference_update({"session_unknown", "context_unknown", "replayed"})
            if upload:
                if window is None:
                    window = _Window(self._clock() + self.retry_window)
                pause = window.next_pause(self._clock(), self.retry_backoff_max)
                if pause is None:
                    return AppError(504, "outcome_unknown", err or ProtocolError("internal", reason))
                if pause > 0:
                    self._sleep(pause)
                return None
            now = self._clock()
            first_failure_at = first_failure_at or now
            transport_failures += 1
            if transport_failures > TRANSPORT_RETRIES or now - first_failure_at > TRANSPORT_RETRY_WINDOW_S:
                return Fallback(reason, err)
            return None

        def unknown_end(err: Optional[ProtocolError]) -> AppError:
            """An upload whose outcome is unknown and that cannot be asked about any more."""
            return AppError(504, "outcome_unknown", err)

        while True:
            session = self._session
            if session is None:
                fb = self._ensure_session()
                if fb:
                    if not (upload and maybe_sent):
                        return fb
                    if fb.reason == "eps_paused" or (fb.error is not None and fb.error.code == "auth_failed"):
                        return unknown_end(fb.error)  # the EPS refuses this device: no answer will come
                    out = lost(fb.reason, fb.error)
                    if out is not None:
                        return out
                    continue
                session = self._session
            msg_out = build(session, session.next_seq())
            body = msg_out.encode(self.bundle.secret)
            if len(msg_out.signed_part()) > session.limits.max_envelope:
                if upload and maybe_sent:
                    return unknown_end(None)
                return Fallback("envelope_over_limit")
            try:
                status, data = self._transport.post(job.path, body)
            except _NotSent as e:
                reason = "eps_pin_mismatch" if isinstance(e, _PinMismatch) else "eps_unreachable"
                if not (upload and maybe_sent):
                    # Nothing of this request ever reached the EPS: the direct path is safe.
                    return Fallback(reason, ProtocolError("internal", str(e)))
                # Refused now proves nothing about the transmission whose answer was lost.
                self._session = None
                out = lost(reason, ProtocolError("internal", str(e)))
                if out is not None:
                    return out
                continue
            except _SentFailure as e:
                maybe_sent = True
                out = lost("eps_unreachable", ProtocolError("internal", str(e)))
                if out is not None:
                    return out
                continue
            outcome = self._read_answer(job, msg_out, status, data, finish)
            if isinstance(outcome, _Retry):
                maybe_sent = True
                out = lost("bad_response", None)
                if out is not None:
                    return out
                continue
            if not isinstance(outcome, ProtocolError):
                return outcome
            err = outcome
            if not err.authenticated:
                if err.code == "auth_failed":
                    self._paused_until = self._clock() + AUTH_FAILED_PAUSE_S
                if upload and maybe_sent:
                    if err.code == "auth_failed":
                        return unknown_end(err)
                    # Not from the EPS as far as anyone can tell: as good as no answer.
                    out = lost("unauthenticated_error", err)
                    if out is not None:
                        return out
                    continue
                return Fallback("auth_failed" if err.code == "auth_failed" else "unauthenticated_error", err)
            kind: Optional[str] = None
            if err.code == "session_unknown" and "session_unknown" not in resends:
                fb = self._hello()
                if isinstance(fb, Fallback):
                    if not (upload and maybe_sent):
                        return fb
                    out = lost(fb.reason, fb.error)
                    if out is not None:
                        return out
                    continue
                kind = err.code
            elif err.code == "context_unknown" and err.code not in resends:
                job.force_define |= set(err.list)
                kind = err.code
            elif err.code == "replayed" and err.code not in resends:
                kind = err.code
            elif err.code == "in_progress":
                maybe_sent = True
                now = self._clock()
                if in_progress_deadline is None:
                    in_progress_deadline = now + session.limits.op_timeout + 10
                if now < in_progress_deadline:
                    self._sleep(max(err.retry_after_ms, 100) / 1000.0)
                    continue
            elif err.code == "busy" and upload and maybe_sent:
                # Says nothing about the lost transmission: ask again later.
                out = lost("busy", err)
                if out is not None:
                    return out
                continue
            else:
                kind = on_error(err, resends)
            if kind is not None:
                resends.add(kind)
                continue
            if err.stage == 1:
                status = 504 if err.code == "provider_timeout" else 502
                return AppError(status, err.code, err)
            if upload and maybe_sent:
                # A stage-0 answer to a later transmission does not prove that
                # the lost one never reached a provider.
                return unknown_end(err)
            return Fallback(err.code, err)

    def _read_answer(self, job: _Job, sent, status: int, data: bytes, finish):
        """A final outcome, a ProtocolError from an ERROR (with its
        `authenticated` flag), or _Retry for an answer that cannot be
        trusted (treated as a transport failure, §7)."""
        try:
            msg = decode_message(data, path=job.path, limits=self._session.limits)
        except ProtocolError:
            return _Retry()
        if (status == 200) == isinstance(msg, Error):
            return _Retry()  # §2.2: 200 carries a result, any other status an ERROR
        authentic = msg.verify(self.bundle.secret, sent.mac)
        if isinstance(msg, Error):
            if msg.mac == bytes(16) or not authentic:
                # A zero MAC is the EPS's "I could not authenticate you"; a
                # wrong non-zero MAC is a forged or corrupted answer.
                if msg.mac != bytes(16):
                    return _Retry()
                return msg.to_exception(authenticated=False)
            return msg.to_exception()
        if not authentic:
            return _Retry()
        try:
            out = finish(job, sent, msg)
        except (ProtocolError, _BadResponse):
            return _Retry()
        return _Retry() if out is None else out


class _Retry:
    """Marker: treat the answer as a transport failure."""


@dataclass
class _Window:
    """The retry window of an upload whose outcome is unknown (§7.1)."""

    deadline: float
    attempts: int = 0

    def next_pause(self, now: float, cap: float) -> Optional[float]:
        """The pause before the next transmission, or None when the window is over."""
        if now >= self.deadline:
            return None
        pause = 0.0 if self.attempts == 0 else min(cap, 0.1 * 2 ** (self.attempts - 1))
        self.attempts += 1
        return min(pause, self.deadline - now)


class _BadResponse(Exception):
    pass


def _redefine(ctx: _Ctx, head: bytes, body: bytes) -> bool:
    """§4.3.2: whether to redefine a context rather than code against it.

    Never for a delta of at most REDEFINE_DELTA_BYTES. Always when the delta
    costs half the value or more (the definition is then cheap by
    comparison). Otherwise only for a change that persists (the value is
    much closer to the one last sent under the context than to the context
    itself: a long new value that stays) and costs more than
    PERSISTENT_REDEFINE_BYTES. A field that is new in every request (a
    per-call hash, an upload id) costs as much against any earlier head: a
    redefinition would carry the whole head every time and save nothing. And
    a moderate change that persists (a finish head coded against an upload
    head) is cheaper as a delta in each save than as a definition carried
    by one: no save pays a whole head it could do without.
    """
    pairs = [(ctx.head, ctx.last_head, head)] + ([(ctx.body, ctx.last_body, body)] if body else [])
    for ref, last, value in pairs:
        cost = len(CB.code(ref, value).encode())
        if cost <= REDEFINE_DELTA_BYTES + 2:
            continue
        if 2 * cost >= len(value):
            return True
        if cost <= PERSISTENT_REDEFINE_BYTES:
            continue
        recent = len(CB.code(last, value).encode()) if last is not None else cost
        if 2 * recent <= cost:
            return True
    return False


class _CtxKey(NamedTuple):
    doc: Optional[DocKey]
    auth: Optional[bytes]
    method: str
    index: int


def _default_context_key(req: ProviderRequest, doc: Optional[DocKey], index: int) -> Hashable:
    """One context per (document, credential, method, position) (§4.3.2): a
    new token gets a new context instead of a DELTA against the old one."""
    auth = None
    for name, value in req.headers:
        n = name.lower() if isinstance(name, str) else name.decode("latin-1").lower()
        if n == "authorization":
            v = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
            auth = hashlib.sha256(v).digest()
    method = req.method if isinstance(req.method, str) else req.method.decode("ascii")
    return _CtxKey(doc, auth, method, index)


def _patch_version(patch: bytes) -> int:
    """The edit-patch version byte: the patch header's fifth byte (after the
    4-byte magic, patch spec §2)."""
    return patch[4] if len(patch) > 4 else -1
