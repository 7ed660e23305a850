"""The EdgeCourier mitmproxy addon: office-document saves become edit
patches to the user's edge service (EPS); everything else is untouched.

Hooks, in the order a flow meets them:

- `requestheaders`: a single-request upload of an office document that the
  patch-or-whole rule sends directly whatever its bytes (its size from
  `Content-Length` decides: too small or too large to diff, or a link too
  fast for any patch to pay) is decided from its head, and its body streams
  to the provider as it arrives, kept aside for the store (`_Collected`).
- `request`: recognise the app's request (`ec_proxy.recognise`). A whole
  upload of an office document goes to the EPS as one SAVE (a patch against
  the last-synced copy when one pays, `ec_proxy.decide`); the steps of an
  upload session are answered here in the provider's own format
  (`ec_proxy.sessions`) and the final one goes to the EPS as one SAVE; a
  download goes through the EPS as a FETCH and comes back as a patch.
  Anything else, or anything that fails, goes on to the provider directly.
- `response`: for uploads and downloads that went directly, the device's
  last-synced store learns the version the provider accepted or served.

The rules that make it safe (spec §7): the app's request reaches the
provider unchanged unless the EPS answered it; an EPS answer is handed to
the app exactly; a failure before any provider was contacted falls back to
the direct path; after (stage 1) the app gets 502 / 504, never a second
upload. A save whose outcome is unknown (the EPS connection failed after
the request was sent, e.g. the EPS died mid-save) is asked about again,
same request id, for up to `edgecourier_retry_window` seconds (spec §7.1):
the app gets the provider's answer from the EPS's outcome record, or 504;
never a direct upload. Any exception in this addon before the EPS was
asked falls back to the direct path: the app sees what it would have seen
without EdgeCourier.

The EPS's health (reachable, pin mismatch, key refused) is logged when it
changes and recorded in the state folder for `ec_proxy status`.

The store only ever holds versions a provider accepted (`pending` until
the provider's 2xx). Its writes (SQLite commits and fsynced files, several
ms each) run on one worker thread of their own, in the order they are
asked for, never on mitmproxy's event loop: other flows proceed meanwhile.
The app's answer does not wait for them: the pending version is written
while the upload travels, and the records made after the provider
answered (the version accepted, the save counted, a download's version,
the EPS's health) are queued behind it (`_after`). The next save's reads
of the store wait for what is queued (`_settled`), so they see every
earlier save. A crash before a queued record is written loses only that
record: the provider has the file, and the next save of the document goes
whole (or against the older base, which the EPS still holds by hash).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

import ec_patch
import ec_protocol as ecp
from mitmproxy import ctx, exceptions, http

from ec_proxy import decide as decide_mod
from ec_proxy.recognise import Kind, Recognised, is_office_content, is_office_name, recognise
from ec_proxy.recognise.common import SESSION_KINDS
from ec_proxy.sessions import (
    Answer, Attempt, GatheredFile, GatheredUpload, SessionBook, accepted_files, same_operation, used_up,
)
from ec_proxy.sessions import dropbox as dropbox_sessions
from ec_proxy.store import DeviceStore, StoreError

log = logging.getLogger("ec_proxy")

#: Clients of the EPS kept open: saves run at once up to this many.
POOL_SIZE = 4
#: A persisting EPS problem is logged again at most this often (seconds).
HEALTH_LOG_EVERY_S = 60.0
# The rule's view of the link is written to the store (for `ec_proxy status`)
# at most this often: one more row per save would be one more transaction.
LINK_RECORD_EVERY_S = 10.0
#: How long a Graph download's body fetched through the EPS waits for the app to follow the 302 (spec §6.8).
REDIRECT_TTL_S = 60.0
#: At most this many of those bodies wait at once, and at most this many bytes of them (`KeptRedirects`).
REDIRECT_MAX_ENTRIES = 32
REDIRECT_MAX_BYTES = 64 << 20
#: Documents remembered as "check every block" after the EPS did not take a spot-checked patch.
FULL_CHECK_DOCS = 1024
SPOT_CHECK_CHOICES = ("auto", "on", "off")

_T = TypeVar("_T")


class _Collected:
    """mitmproxy's `stream` callable for an upload decided from its head
    (`EdgeCourier.requestheaders`): each chunk goes on to the provider as it
    is, and is kept for the store until more than `limit` bytes came (the
    store keeps no larger version), so that the version the provider
    accepts can become the document's base."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.chunks: Optional[list[bytes]] = []

    def __call__(self, data: bytes) -> bytes:
        self.size += len(data)
        if self.chunks is not None:
            if self.size > self.limit:
                self.chunks = None
            elif data:
                self.chunks.append(data)
        return data

    def data(self) -> Optional[bytes]:
        """The whole body, or None when it was larger than `limit`."""
        return None if self.chunks is None else b"".join(self.chunks)


class FinalSteps:
    """One final request at a time per upload session (`EdgeCourier._gathered`):
    an app that asks again while its first request is still on its way (it
    timed out), or two of its threads, would otherwise both find no attempt
    for the session and each send a SAVE of its own, and the provider would
    get the file twice. The second waits, then finds the first one's attempt
    and is answered from it (`_gathered_again`). A session's lock lives while
    a request holds or waits for it; a batch takes its sessions' locks in
    order. A request that waited reads its session again once it holds the
    lock: the one before may have completed it (the provider's answer for a
    used-up session, as the provider gives), or left it with an attempt."""

    def __init__(self) -> None:
        self.locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, keys: Sequence[str]):
        """Holds the sessions' locks; yields whether another request held or
        waited for one of them when this one came (it may have changed the
        sessions since this request was read)."""
        keys = sorted(set(keys))
        waited = False
        for k in keys:  # before any wait: a lock is never dropped while someone holds or waits for it
            lock, users = self.locks.get(k) or (asyncio.Lock(), 0)
            self.locks[k] = (lock, users + 1)
            waited = waited or users > 0
        acquired: list[str] = []
        try:
            for k in keys:
                await self.locks[k][0].acquire()
                acquired.append(k)
            yield waited
        finally:
            for k in reversed(acquired):
                self.locks[k][0].release()
            for k in keys:
                lock, users = self.locks[k]
                if users <= 1:
                    del self.locks[k]
                else:
                    self.locks[k] = (lock, users - 1)


class KeptRedirects:
    """Graph downloads fetched through the EPS (spec §6.8): the redirect's
    target URL -> the final response, served once when the app follows the
    302 within `ttl` seconds. Bounded: at most `max_entries` responses and
    `max_bytes` of them (bodies, heads and URLs); the oldest go first, and a
    response over `max_bytes` alone is not kept. A response that is not
    kept costs nothing but the transfer: the app's request for the URL goes
    to the provider, as any download."""

    #: What an entry costs beyond its bytes (the dict slot, the tuple, the response object).
    OVERHEAD = 256

    def __init__(self, max_entries: int = REDIRECT_MAX_ENTRIES, max_bytes: int = REDIRECT_MAX_BYTES,
                 ttl: float = REDIRECT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._clock = clock
        self._kept: collections.OrderedDict[str, tuple[float, ecp.ProviderResponse, int]] = collections.OrderedDict()
        #: The bytes kept now, as `max_bytes` counts them.
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    @classmethod
    def cost(cls, url: str, response: ecp.ProviderResponse) -> int:
        heads = sum(len(n) + len(v) for n, v in response.headers)
        return cls.OVERHEAD + len(url) + len(response.reason) + heads + len(response.body)

    def _pop(self, url: str) -> Optional[tuple[float, ecp.ProviderResponse, int]]:
        found = self._kept.pop(url, None)
        if found is not None:
            self.bytes -= found[2]
        return found

    def keep(self, url: str, response: ecp.ProviderResponse) -> bool:
        """Keeps `response` for the app's request of `url`; False when it is
        larger than the bound alone (not kept). Expired and, over the
        bounds, the oldest responses go first."""
        now = self._clock()
        self._pop(url)
        while self._kept and next(iter(self._kept.values()))[0] <= now:
            self._pop(next(iter(self._kept)))
        size = self.cost(url, response)
        if size > self.max_bytes or self.max_entries < 1:
            return False
        while self._kept and (len(self._kept) >= self.max_entries or self.bytes + size > self.max_bytes):
            self._pop(next(iter(self._kept)))
        self._kept[url] = (now + self.ttl, response, size)
        self.bytes += size
        return True

    def take(self, url: str) -> Optional[ecp.ProviderResponse]:
        """The response kept for `url`, once, if it has not expired."""
        found = self._pop(url)
        if found is None or found[0] <= self._clock():
            return None
        return found[1]


@dataclass
class Pending:
    """A direct upload the store learns from when the provider answers.
    `token`: the store's pending token, or the store thread's future of it
    (settled on the same thread, after it); None when nothing was recorded
    before the upload (the rule sent it directly: the version is recorded
    only once the provider accepted it). `streamed`: the body of an upload
    decided from its head, as it went to the provider."""

    doc: ecp.DocKey
    token: "str | concurrent.futures.Future[str] | None"
    whole: int
    reason: str
    streamed: Optional[_Collected] = None
    #: The rule's explanation (`Decision.describe`), for the log line after the provider answered.
    why: str = ""
    #: Bytes the device's link carried to and from the EPS for this save
    #: before it went directly (a fallback's attempts; 0 when the rule sent it directly).
    eps_bytes: int = 0


def _wait_parts(flow: http.HTTPFlow, decision, traffic) -> str:
    """Where the app's wait for a save through the EPS went, for the log:
    its request's body arriving, the diff, the proxy's own work (the base
    read, the store, threads), the device's link (the exchange with the EPS
    less the EPS's reported time, spec §7.3) and the EPS (of which the
    provider's requests and the rebuild, which overlap in a streamed save)."""
    req = flow.request
    if not req.timestamp_start or not req.timestamp_end or traffic.exchanges < 1:
        return ""
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    now = time.time()
    diff = decision.diff_seconds if decision is not None else 0.0
    own = now - req.timestamp_end - diff - traffic.seconds
    eps = f"EPS {ms(traffic.eps_seconds)}"
    if traffic.provider_seconds or traffic.rebuild_seconds:
        eps += f" (provider {ms(traffic.provider_seconds)}, rebuild {ms(traffic.rebuild_seconds)})"
    return (f"waited {ms(now - req.timestamp_start)} ms: body {ms(req.timestamp_end - req.timestamp_start)}, "
            f"diff {ms(diff)}, proxy {ms(own)}, link {ms(traffic.seconds - traffic.eps_seconds)}, {eps}")


def _waited(flow: http.HTTPFlow) -> float:
    """Seconds from the first byte of the app's request to the provider's
    answer (its last byte when the proxy has read it, else now), less the
    set-up of the upstream connection when it was opened for this request:
    most saves find it open, and one measured with its handshakes must not
    price the others."""
    start = flow.request.timestamp_start
    end = flow.response.timestamp_end if flow.response is not None and flow.response.timestamp_end else time.time()
    setup = 0.0
    server = flow.server_conn
    opened = getattr(server, "timestamp_start", None)
    ready = getattr(server, "timestamp_tls_setup", None) or getattr(server, "timestamp_tcp_setup", None)
    if opened and ready and opened >= start:
        setup = ready - opened
    return end - start - setup


def _headers(flow: http.HTTPFlow) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for k, v in flow.request.headers.fields]


def _response(status: int, reason: str, headers: Sequence[tuple[str, object]], body: bytes) -> http.Response:
    fields = []
    for name, value in headers:
        if name.lower() in ("content-length", "transfer-encoding", "connection"):
            continue
        v = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
        fields.append((name.encode("latin-1"), v))
    r = http.Response.make(status, body, fields)
    if reason:
        r.reason = reason
    return r


def _answer_of(r: ecp.ProviderResponse) -> Answer:
    """The provider's answer as the book keeps it (`SessionBook.settle`)."""
    return Answer(r.status, r.reason, tuple(r.headers), r.body)


class EdgeCourier:
    """The addon. One instance per proxy; its state lives in `edgecourier_state`."""

    def __init__(self) -> None:
        self.store: Optional[DeviceStore] = None
        self.book = SessionBook()
        #: A session's final requests, one at a time (`FinalSteps`).
        self.final_steps = FinalSteps()
        self.estimator = decide_mod.LinkEstimator()
        self.pool: Optional[asyncio.Queue] = None
        #: The newest edit-patch format version the EPS reads, from the last
        #: session opened (protocol §4 `patch_versions`); None until then.
        self.patch_version: Optional[int] = None
        #: The EPS's limits (protocol §9) as the last session opened advertised
        #: them; None until then (a save then assumes the defaults).
        self.eps_limits: Optional[ecp.Limits] = None
        self.bundle: Optional[ecp.EnrolmentBundle] = None
        self.webdav_hosts: frozenset[str] = frozenset()
        # The EPS's health as last recorded: (state, reason), and when it was last logged.
        self.health: Optional[tuple[str, str]] = None
        self.health_logged = 0.0
        #: when the rule's view of the link was last recorded (`_record_link`)
        self.link_recorded: Optional[float] = None
        self.probe_task: Optional[asyncio.Task] = None
        #: Graph downloads fetched through the EPS (spec §6.8), served when the
        #: app follows the 302 within REDIRECT_TTL_S (bounded: `KeptRedirects`).
        self.redirects = KeptRedirects()
        #: The store's work (its writes, and the reads that move its LRU
        #: clock) runs on this one thread, off the event loop, in the order
        #: the hooks ask for it (`_stored`).
        self.writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ec-store")
        #: The last store work queued after an answer left (`_after`).
        self.queued: Optional[concurrent.futures.Future] = None
        #: `_learn_later`'s thread, one version at a time, and the version it is learning.
        self.learner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ec-learn")
        self.learning: Optional[concurrent.futures.Future] = None
        #: The timer that lets go of the document contents the core keeps
        #: once no save or download came for `edgecourier_keep_idle` (`_let_go_later`).
        self.let_go: Optional[asyncio.TimerHandle] = None
        #: Documents whose spot-checked patch the EPS did not take (it went
        #: whole): their next diffs in this process check every block.
        self.full_check: collections.OrderedDict[ecp.DocKey, None] = collections.OrderedDict()

    # ---- options ---------------------------------------------------------

    def load(self, loader) -> None:
        loader.add_option("edgecourier_edge", str, "", "URL of the user's EPS (https://…, or http://… with edgecourier_plain_edge).")
        loader.add_option("edgecourier_secret", str, "", "The instance secret of the enrolment bundle, 64 hex digits.")
        loader.add_option("edgecourier_key_id", int, 1, "The key id of the enrolment bundle.")
        loader.add_option("edgecourier_pin", str, "", "SHA-256 (hex) of the EPS certificate's SubjectPublicKeyInfo.")
        loader.add_option("edgecourier_plain_edge", bool, False, "Lab only: plain HTTP to the EPS (test credentials only).")
        loader.add_option("edgecourier_state", str, "~/.edgecourier", "State folder: last-synced store and statistics.")
        loader.add_option("edgecourier_max_store", int, 1 << 30, "Bound on the last-synced store, bytes.")
        loader.add_option("edgecourier_webdav_hosts", Sequence[str], [], "WebDAV / Nextcloud hosts whose paths are WebDAV.")
        loader.add_option("edgecourier_mode", str, "hybrid", "Patch decision: hybrid (the shortest wait, from the link's measured rate and round trip, the diff and the EPS's rebuild) or metered (the fewest bytes: patch whenever smaller; 'bytes' is its older name).")
        loader.add_option("edgecourier_spot_check", str, "auto",
                          "Check a block-parallel part's recipe on a sample of its blocks (the EPS's SHA-256 check "
                          "confirms it; a wrong one costs a whole-file resend): auto (on unless the mode is metered), on, off.")
        loader.add_option("edgecourier_graph_fragment_auth", str, "reject",
                          "Graph upload fragments carrying Authorization: reject (401, as OneDrive answers) or accept.")
        loader.add_option("edgecourier_keep_idle", float, 60.0,
                          "Seconds without a save or download after which the proxy lets go of the document contents "
                          "its diffs keep for the next save (up to 80 MB; the next diff inflates them again).")
        loader.add_option("edgecourier_retry_window", int, int(ecp.OUTCOME_RETRY_WINDOW_S),
                          "Seconds to keep asking the EPS about a save whose outcome is unknown (spec §7.1) before answering the app 504.")

    def configure(self, updated: set[str]) -> None:
        if updated & {"edgecourier_edge", "edgecourier_secret", "edgecourier_key_id", "edgecourier_pin", "edgecourier_plain_edge"}:
            o = ctx.options
            if not o.edgecourier_edge:
                self.bundle = None
            else:
                try:
                    self.bundle = ecp.EnrolmentBundle(
                        url=o.edgecourier_edge,
                        key_id=o.edgecourier_key_id,
                        secret=bytes.fromhex(o.edgecourier_secret),
                        plain_http=o.edgecourier_plain_edge,
                        spki_sha256=bytes.fromhex(o.edgecourier_pin) if o.edgecourier_pin else None,
                    )
                except ValueError as e:
                    raise exceptions.OptionsError(f"EdgeCourier enrolment: {e}") from e
            self.pool = None  # rebuilt on first use, on the event loop
        if updated & {"edgecourier_state", "edgecourier_max_store"}:
            import os

            if self.store is not None:
                # After the writes already asked for (the folder's lock goes with it).
                self.writer.submit(self.store.close).result()
            try:
                self.store = DeviceStore(os.path.expanduser(ctx.options.edgecourier_state) + "/store", ctx.options.edgecourier_max_store)
            except Exception as e:
                raise exceptions.OptionsError(f"EdgeCourier state folder: {e}") from e
        if "edgecourier_webdav_hosts" in updated:
            self.webdav_hosts = frozenset(h.lower() for h in ctx.options.edgecourier_webdav_hosts)
        if "edgecourier_graph_fragment_auth" in updated:
            try:
                self.book.graph_fragment_auth = SessionBook(graph_fragment_auth=ctx.options.edgecourier_graph_fragment_auth).graph_fragment_auth
            except ValueError as e:
                raise exceptions.OptionsError(f"edgecourier_graph_fragment_auth: {e}") from e
        if "edgecourier_mode" in updated and ctx.options.edgecourier_mode not in decide_mod.MODES:
            raise exceptions.OptionsError("edgecourier_mode is hybrid, metered or bytes")
        if "edgecourier_spot_check" in updated and ctx.options.edgecourier_spot_check not in SPOT_CHECK_CHOICES:
            raise exceptions.OptionsError("edgecourier_spot_check is auto, on or off")
        if "edgecourier_keep_idle" in updated and not 0 <= ctx.options.edgecourier_keep_idle <= 86400:
            raise exceptions.OptionsError("edgecourier_keep_idle is a number of seconds from 0 to 86400")
        if "edgecourier_retry_window" in updated:
            if ctx.options.edgecourier_retry_window < 0:
                raise exceptions.OptionsError("edgecourier_retry_window is a number of seconds, 0 or more")
            self.pool = None

    def running(self) -> None:
        # One machine-readable line for scripts and tests (ports given as 0 are resolved here).
        addrs = []
        server = ctx.master.addons.get("proxyserver")
        if server is not None:
            addrs = [f"{a[0]}:{a[1]}" for a in server.listen_addrs()]
        print(json.dumps({"ready": True, "listen": addrs, "edge": ctx.options.edgecourier_edge}), flush=True)
        if self.bundle is not None and self.store is not None:
            # Say at once whether the EPS is usable (a wrong pin would otherwise
            # show only as saves quietly going directly).
            self.probe_task = asyncio.get_running_loop().create_task(self._probe())  # kept: tasks are weakly held

    def done(self) -> None:
        if self.let_go is not None:
            self.let_go.cancel()
        self.learner.shutdown(wait=False, cancel_futures=True)
        if self.store is not None:
            self.writer.submit(self.store.close).result()  # after the writes already asked for

    # ---- memory kept between saves ---------------------------------------

    def _learn_later(self, doc: ecp.DocKey, data: bytes) -> None:
        """A version became the document's base without this process diffing
        it as a new file (a save that went whole through the EPS, a
        download; not a save sent directly, whose link the rule found too
        fast for a patch to pay, so that its next save most likely goes
        directly too): learns its
        block-parallel members' layouts and contents on a thread of its own,
        after the app's answer (`ec_patch.learn`), so that the next save's
        diff against it is as quick as one against a version diffed before
        (issue 13: 17 against 3 ms for the 1 MB-text .docx, `save_profile.py`).
        One version at a time; one that comes while another is being learnt
        is not learnt (its next diff is only slower)."""
        if self.learning is not None and not self.learning.done():
            return
        # Once the app's answer is written, as `_after`.
        self.learning = _submit_once_answered(self.learner, ec_patch.learn, data, spot_check=self._spot_check(doc))
        self.learning.add_done_callback(functools.partial(_log_learnt, doc.ref.decode("utf-8", "replace")))
        self._let_go_later()

    def _let_go_later(self) -> None:
        """(Re)arms the timer that lets go of the document contents the core
        keeps after a diff or an apply (`ec_patch.kept_bytes`: the last large
        parts, inflated, so that the next save of the document need not
        inflate them again): a proxy that runs for days on a phone should not
        hold tens of MB for a document nobody edits any more."""
        if self.let_go is not None:
            self.let_go.cancel()
        self.let_go = asyncio.get_running_loop().call_later(ctx.options.edgecourier_keep_idle, self._let_go)

    def _let_go(self) -> None:
        self.let_go = None
        released = ec_patch.forget_kept()
        if released:
            log.info("EdgeCourier: let go of %d bytes of document contents kept from the last saves (%g s without a save)",
                     released, ctx.options.edgecourier_keep_idle)

    # ---- the store's thread ------------------------------------------------

    async def _stored(self, fn: Callable[..., _T], *args) -> _T:
        """Runs `fn(*args)` (store work) on the store's thread and waits for
        it without holding up the event loop; its result, or its exception."""
        return await asyncio.get_running_loop().run_in_executor(self.writer, functools.partial(fn, *args))

    def _after(self, fn: Callable[..., object], *args) -> None:
        """Queues `fn(*args)` on the store's thread without waiting for it:
        the records of what already happened (the provider answered), which
        the app's answer need not wait for. A failure is logged.

        Called from a hook on the event loop, the work reaches the store's
        thread only once the hook's answer is written to the app
        (`_submit_once_answered`): started at once, that thread's hashing and
        SQLite calls took the interpreter's lock from the loop for up to
        its switch interval (5 ms) while the answer was still to be sent.
        `queued` stands for it from now on, so a later read still waits."""
        self.queued = _submit_once_answered(self.writer, fn, *args)
        self.queued.add_done_callback(_log_store_failure)

    async def _settled(self) -> None:
        """Waits until the store work `_after` queued is done (the store's
        thread runs it in order: the last one queued is the last to end), so
        that a read from another thread sees it."""
        queued = self.queued
        if queued is not None and not queued.done():
            wrapped = asyncio.wrap_future(queued)
            await asyncio.wait([wrapped])
            wrapped.exception()  # already logged (`_log_store_failure`); retrieved, so asyncio does not log it again

    # ---- the EPS clients ---------------------------------------------------

    def _clients(self) -> asyncio.Queue:
        if self.pool is None:
            # LIFO: the most recently used client has a warm session and contexts.
            self.pool = asyncio.LifoQueue()
            for _ in range(POOL_SIZE):
                self.pool.put_nowait(ecp.EpsClient(self.bundle, label="ec-proxy",
                                                   retry_window=float(ctx.options.edgecourier_retry_window),
                                                   response_aliases=response_aliases))
        return self.pool

    async def _call(self, fn_name: str, *args, **kwargs):
        """Runs a blocking EpsClient call in a thread; returns (outcome, traffic)."""
        pool = self._clients()
        client = await pool.get()
        try:
            before = client.traffic()
            if fn_name == "save":
                outcome, sent = await asyncio.to_thread(_save_within_limits, client, self.eps_limits, *args, **kwargs)
            else:
                outcome, sent = await asyncio.to_thread(getattr(client, fn_name), *args, **kwargs), None
            traffic = client.traffic().since(before)
            #: A save's items as sent (`_save_within_limits`: some may have gone FULL), for `_learn_patch`.
            traffic.items = sent
            traffic.kinds = list(client.last_sent_kinds)
            traffic.resends = set(client.last_resends)
            pin = client.pin_mismatch
            self.patch_version = client.patch_version or self.patch_version
            self.eps_limits = client.limits or self.eps_limits
        finally:
            pool.put_nowait(client)
        self._learn_link(fn_name, traffic)
        self._after(self._note_eps, outcome, pin)  # bookkeeping: the app's answer does not wait for it
        self._after(self._record_link)
        return outcome, traffic

    def _learn_link(self, fn_name: str, traffic) -> None:
        """Teaches the estimator the link from a real exchange: one exchange
        whose EPS time is known (spec §7.3 on saves; a HELLO's is negligible)
        gives the link's time for its bytes."""
        if traffic.exchanges != 1:
            return  # a resend or reconnect mixes several exchanges: no clean sample
        if traffic.timed_exchanges == 1:
            self.estimator.observe_exchange(traffic.bytes_out, traffic.bytes_in, traffic.seconds, traffic.eps_seconds)
            if getattr(traffic, "provider_timed_exchanges", 0) == 1:
                # Spec §7.3: what the EPS did beyond rebuilding and the provider's exchanges
                # (which overlap by `ov` in a streamed save, §5.6). The rebuild is still
                # charged whole (`_learn_patch`): the provider's request cannot end before it.
                self.estimator.observe_eps_overhead(traffic.eps_seconds - traffic.rebuild_seconds - traffic.provider_seconds
                                                    + getattr(traffic, "overlap_seconds", 0.0))
        elif fn_name == "hello":
            self.estimator.observe(traffic.bytes_out, traffic.bytes_in, traffic.seconds)

    def _record_link(self) -> None:
        """The rule's view of the link, for `ec_proxy status` (on the store's
        thread), at most every LINK_RECORD_EVERY_S."""
        now = time.monotonic()
        if self.link_recorded is not None and now - self.link_recorded < LINK_RECORD_EVERY_S:
            return
        self.link_recorded = now
        self.store.record_link(self.estimator.summary())

    def _learn_patch(self, traffic) -> None:
        """What a save that went as a patch teaches: the EPS's reported rebuild
        time (§7.3 `rb`) for the files it rebuilt, and whether the EPS had
        the patches' bases (q). From the items as sent (`traffic.items`,
        `_save_within_limits`: those whose bases did not fit went FULL) and
        how the client's last transmission sent each (`traffic.kinds`: FULL
        too when a patch was over `max_patch_size`, or after `base_unknown`):
        only files the EPS rebuilt count towards the rebuild rate. Before,
        the targets of every patch offered were added up, so a batch with
        files made FULL taught a rate too high by their bytes."""
        sent = getattr(traffic, "items", None) or []
        if not any(it.patch is not None for it in sent):
            return
        kinds = list(getattr(traffic, "kinds", []))
        rebuilt = sum(len(it.target) for it, kind in zip(sent, kinds) if kind == "patch" and it.patch is not None)
        # After base_unknown the client resent the item FULL: its last sent kind is "full".
        missed = "base_unknown" in getattr(traffic, "resends", set())
        if rebuilt and traffic.rebuild_seconds > 0:
            self.estimator.observe_rebuild(rebuilt, traffic.rebuild_seconds)
        if rebuilt or missed:
            self.estimator.observe_base(not missed)

    async def _probe(self) -> None:
        """One HELLO at start, so that `status` and the log tell at once
        whether the EPS is usable."""
        try:
            await self._call("hello")
        except Exception:  # noqa: BLE001
            log.exception("EdgeCourier: the EPS probe failed")

    # ---- the EPS's health ------------------------------------------------------

    def _note_eps(self, outcome, pin: Optional[tuple[str, str]]) -> None:
        """Logs and records (for `ec_proxy status`) how the EPS was found:
        ok, unreachable, pin mismatch, or refusing the device's key.
        Outcomes that say nothing about the EPS itself (a provider's 409, a
        stage-0 error of one save) change nothing."""
        url = self.bundle.url if self.bundle is not None else ""
        count = None
        if isinstance(outcome, (ecp.ProviderResponse, ecp.FetchResponse, ecp.HelloOk)):
            state, reason = "ok", ""
        elif isinstance(outcome, ecp.AppError) and outcome.reason == "outcome_unknown":
            state, count = ("unreachable" if pin is None else "pin_mismatch"), "outcome_unknown"
            reason = (f"a save's outcome stayed unknown: the EPS did not answer within the retry window "
                      f"({self._retry_window()} s); the app got 504")
            if pin is not None:
                reason += f"; pin mismatch: expected {pin[0]} got {pin[1]}"
        elif isinstance(outcome, ecp.Fallback) and outcome.reason == "eps_pin_mismatch":
            state, count = "pin_mismatch", "pin_mismatch"
            expected, got = pin if pin is not None else (self.bundle.spki_sha256.hex() if self.bundle and self.bundle.spki_sha256 else "?", "?")
            reason = (f"pin mismatch: expected {expected} got {got} (SHA-256 of the EPS certificate's "
                      f"SubjectPublicKeyInfo); EdgeCourier is off for this device, saves go directly to the provider")
        elif isinstance(outcome, ecp.Fallback) and outcome.reason == "eps_unreachable":
            state, count = "unreachable", "unreachable"
            detail = outcome.error.detail if outcome.error is not None else ""
            reason = f"{detail or 'the EPS cannot be reached'}; saves go directly to the provider"
        elif isinstance(outcome, ecp.Fallback) and (
                outcome.reason in ("auth_failed", "eps_paused")
                or (outcome.error is not None and outcome.error.code == "auth_failed")):
            state = "auth_failed"
            count = None if outcome.reason == "eps_paused" else "auth_failed"
            reason = ("the EPS does not accept this device's key (auth_failed): re-enrol; "
                      "saves go directly to the provider for 5 minutes at a time")
        else:
            return
        now = time.monotonic()
        changed = self.health != (state, reason)
        if changed or count is not None:
            self.store.record_eps(state, reason, count, url)
        if state == "ok":
            if changed and self.health is not None:
                log.info("EdgeCourier: the EPS at %s is reachable again", url)
        elif changed or now - self.health_logged >= HEALTH_LOG_EVERY_S:
            log.error("EdgeCourier: EPS %s at %s: %s", state.replace("_", " "), url, reason)
            self.health_logged = now
        self.health = (state, reason)

    def _retry_window(self) -> int:
        try:
            return int(ctx.options.edgecourier_retry_window)
        except (AttributeError, KeyError):
            return int(ecp.OUTCOME_RETRY_WINDOW_S)

    # ---- hooks -------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Decides, from its head, a single-request upload that goes directly
        whatever its bytes, and streams its body (module docstring).

        Only what the body cannot change is decided here: an office name in
        the URL or the provider's argument header (not content sniffing, not
        a multipart body), a `Content-Length` and neither `Content-Encoding`
        nor `Transfer-Encoding` (the size the rule is given is the file's).
        The rule is asked only when its answer is at hand without waiting
        (the store not busy). A record of an earlier save still queued
        (`_settled`) may change only whether a base exists: this save then
        goes directly or whole through the EPS where, after it, it would
        have gone the other way; both are safe, and several uploads at once
        (rclone's transfers) need not wait for each other's records.
        Whatever it answers is kept for the `request` hook, which does not
        ask it again (the rule's exploration counts each save once); when it
        is not asked here, the upload waits for its body as any other."""
        if flow.response or flow.error or self.bundle is None or self.store is None:
            return
        try:
            self._decide_from_head(flow)
        except Exception:  # noqa: BLE001 - the upload then waits for its body as any other
            log.exception("EdgeCourier: deciding an upload from its head failed")
            flow.metadata.pop("edgecourier_pre", None)

    def _decide_from_head(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if req.method not in ("PUT", "POST") or "content-encoding" in req.headers or "transfer-encoding" in req.headers:
            return  # the body's size is not the declared one, or is declared nowhere
        try:
            size = int(req.headers.get("content-length", ""))
        except ValueError:
            return
        if size < 0:
            return
        rec = recognise(req.method, req.pretty_url, _headers(flow), None, webdav_hosts=self.webdav_hosts)
        if rec is None or rec.kind is not Kind.UPLOAD_SINGLE or rec.doc is None or not is_office_name(rec.name):
            return
        try:
            has_base = self.store.has_base_now(rec.doc)
        except StoreError:
            return
        if has_base is None:
            return
        pre = decide_mod.precheck(size, has_base, self.estimator, mode=ctx.options.edgecourier_mode)
        if pre is None or pre.send != "direct":
            flow.metadata["edgecourier_pre"] = (pre,)
            return
        self._let_go_later()
        # No larger version is kept: the store would not hold it, nor would a diff read it.
        collected = _Collected(min(self.store.max_bytes, decide_mod.MAX_DIFF_SIZE))
        req.stream = collected
        why = pre.describe()
        flow.metadata["edgecourier"] = Pending(rec.doc, None, size, pre.reason, collected, why)
        # One line per save by default: the one after the provider answered says why.
        log.debug("EdgeCourier: %s goes directly (%s), streamed as it arrives", rec.doc.ref.decode("utf-8", "replace"), why)

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or self.bundle is None or self.store is None or flow.request.stream:
            return
        if self.redirects and self._serve_redirect(flow):
            return
        if "content-encoding" in flow.request.headers:
            # mitmproxy hands over the body decoded; a save made of it would send the provider other bytes
            # than the app's under the app's Content-Encoding. Such a request goes on untouched.
            return
        rec = recognise(flow.request.method, flow.request.pretty_url, _headers(flow), flow.request.content, webdav_hosts=self.webdav_hosts)
        if rec is None or rec.kind is Kind.OTHER:
            return
        try:
            if rec.kind is Kind.UPLOAD_SINGLE:
                await self._upload(flow, rec)
            elif rec.kind in SESSION_KINDS:
                await self._session(flow, rec)
            elif rec.kind is Kind.DOWNLOAD:
                await self._download(flow, rec)
        except Exception:  # noqa: BLE001 - the app must be served whatever happens here
            log.exception("EdgeCourier: %s %s failed in the addon; the request goes to the provider directly", rec.kind.value, rec.name)
            if flow.response is None and rec.kind not in SESSION_KINDS:
                meta = flow.metadata.pop("edgecourier", None)
                if isinstance(meta, Pending) and meta.token is not None:
                    self._after(self._settle, [meta.token], False)
            elif flow.response is None:
                flow.response = _response(502, "Bad Gateway", [], b"")

    def _serve_redirect(self, flow: http.HTTPFlow) -> bool:
        """The app follows a Graph download's 302: answer with the body the
        EPS already fetched (once; a Range request or a late one goes to the provider)."""
        if flow.request.method != "GET" or "range" in flow.request.headers:
            return False
        final = self.redirects.take(flow.request.pretty_url)
        if final is None:
            return False
        flow.response = _response(final.status, final.reason, final.headers, final.body)
        return True

    async def response(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get("edgecourier")
        if self.store is None or meta is None or flow.response is None:
            return
        try:
            if isinstance(meta, Pending):
                ok = 200 <= flow.response.status_code < 300
                if meta.streamed is not None:
                    data = meta.streamed.data() if ok else None
                else:
                    rec = flow.metadata.get("edgecourier_upload")
                    data = rec.file if ok and rec is not None else None
                self._after(self._record_direct, meta, ok, data, (flow.response.content or b"") if data is not None else None)
                if ok and meta.token is None:
                    # A direct save the rule chose (not a fallback, which holds a failed EPS
                    # attempt): the app's wait that way, for the rule's measured comparison.
                    self.estimator.observe_save("direct", meta.whole, _waited(flow))
                log.info("EdgeCourier: %s went directly%s (%s): provider %d", meta.doc.ref.decode("utf-8", "replace"),
                         ", streamed as it arrived" if meta.streamed is not None else "", meta.why or meta.reason,
                         flow.response.status_code)
            elif meta == "download" and flow.response.status_code == 200:
                rec = flow.metadata.get("edgecourier_rec")
                body = flow.response.content or b""
                if rec is not None and rec.doc is not None and "content-encoding" not in flow.response.headers and _document(rec, body):
                    self._after(self.store.downloaded, rec.doc, body)
                    self._learn_later(rec.doc, body)
        except Exception:  # noqa: BLE001
            log.exception("EdgeCourier: could not record a direct transfer")

    def error(self, flow: http.HTTPFlow) -> None:
        """A flow that ended without the provider's answer (the provider
        unreachable or dropping the connection, the app gone): a direct
        upload's pending version is let go, as after a refusal, and nothing
        is recorded as accepted. Should the provider hold the file all the
        same, the store keeps the older base: a patch against it still
        rebuilds the next version exactly."""
        meta = flow.metadata.pop("edgecourier", None)
        if self.store is not None and isinstance(meta, Pending) and meta.token is not None:
            self._after(self._settle, [meta.token], False)

    def _record_direct(self, meta: Pending, ok: bool, data: Optional[bytes], response_body: Optional[bytes]) -> None:
        """The store's records of an upload that went directly (on the store's
        thread): its pending version settled (or, with no pending version,
        the accepted file recorded as the base), the aliases the provider's
        answer names (`data` and `response_body` given when it accepted a
        known file), the save counted: sent to the EPS only what an attempt
        before the fallback carried (`meta.eps_bytes`), the whole upload
        (`meta.whole`) once, which the store adds to the link's bytes as
        every direct save's."""
        if meta.token is not None:
            self._settle([meta.token], ok)
        elif ok and data is not None:
            self.store.downloaded(meta.doc, data)
        elif ok and meta.streamed is not None:
            self.store.forget(meta.doc)  # larger than the store keeps: the older base is no longer the provider's
        if data is not None and response_body is not None:
            self._learn_aliases(meta.doc, data, response_body)
        self.store.record_save(meta.doc, meta.eps_bytes, meta.whole, "direct", meta.reason)

    # ---- uploads -------------------------------------------------------------

    def _spot_check(self, doc: ecp.DocKey) -> bool:
        """Whether this document's diff may spot-check block recipes
        (`ec_patch.diff(spot_check=True)`): by default on unless the link is
        metered (a wrong claim costs a whole-file resend, in bytes), and
        never again for a document whose spot-checked patch the EPS did not take."""
        choice = ctx.options.edgecourier_spot_check
        on = choice == "on" or (choice == "auto" and not decide_mod.minimises_bytes(ctx.options.edgecourier_mode))
        return on and doc not in self.full_check

    def _patch(self, doc: ecp.DocKey, data: bytes, head: Optional[tuple] = None) -> tuple[Optional[bytes], decide_mod.Decision, bool]:
        """The patch to send (or None), why, and whether its recipes were
        spot-checked. `head`: the rule's precheck as `requestheaders` made
        it, in a 1-tuple (its answer may be None: a diff worth making)."""
        # The base is read (and its SHA-256 checked) only for a diff worth making.
        if head is not None:
            pre = head[0]
        else:
            pre = decide_mod.precheck(len(data), self.store.has_base(doc), self.estimator, mode=ctx.options.edgecourier_mode)
        if pre is not None:
            return None, pre, False
        # The version the EPS holds: the last-synced one, or an older one when
        # the saves since went directly (the patch then carries their edits too).
        base = self.store.edge_base(doc)
        if base is None:  # dropped just now: missing, corrupt or unreadable (the store logs and counts it)
            return None, decide_mod.precheck(len(data), False, self.estimator), False
        mode = ctx.options.edgecourier_mode
        spot = self._spot_check(doc)
        t0 = time.perf_counter()
        try:
            # Metered: the smallest patch, whatever the CPU (zstd level 19 for
            # unrelated versions); otherwise no CPU spent beyond what pays.
            # Spot check: the EPS's SHA-256 check of the rebuilt file (always
            # made, spec §5.3) is the judge of the recipes' claim; when it
            # refutes one the client resends the file whole (§7), and
            # `_spot_refuted` turns the spot check off for the document.
            # The format version the EPS reads (learnt at HELLO; 1, which
            # every EPS reads, before any session).
            patch: Optional[bytes] = bytes(ec_patch.diff(base, data, verify=False, quick=not decide_mod.minimises_bytes(mode),
                                                         spot_check=spot, max_version=self.patch_version or 1))
        except ec_patch.PatchError as e:
            log.info("EdgeCourier: the core made no patch (%s)", e.code)
            patch = None
        seconds = time.perf_counter() - t0
        d = dataclasses.replace(decide_mod.decide(len(data), None if patch is None else len(patch), seconds, self.estimator,
                                                  mode=mode), diff_seconds=seconds)
        sent = patch if d.send == "patch" else None
        return sent, d, spot and sent is not None

    def _spot_refuted(self, docs: Sequence[Optional[ecp.DocKey]], spotted: Sequence[bool], traffic) -> None:
        """A spot-checked patch that went whole in the end because the EPS
        answered `patch_failed` or `target_mismatch` (its rebuild was not the
        file: the claim was wrong) and the client resent the file: the
        document's next diffs check every block. A resend after
        `base_unknown` alone says nothing about the recipes (the EPS lacked
        the base: the saves before went directly) and changes nothing."""
        kinds = getattr(traffic, "kinds", [])
        if not {"patch_failed", "target_mismatch"} & getattr(traffic, "resends", {"patch_failed"}):
            return
        for k, (doc, spot) in enumerate(zip(docs, spotted)):
            if doc is None or not spot or (k < len(kinds) and kinds[k] == "patch"):
                continue
            self.full_check[doc] = None
            self.full_check.move_to_end(doc)
            while len(self.full_check) > FULL_CHECK_DOCS:
                self.full_check.popitem(last=False)
            log.info("EdgeCourier: %s: the EPS did not take a spot-checked patch (it went whole); "
                     "this document's next patches check every block", doc.ref.decode("utf-8", "replace"))

    async def _upload(self, flow: http.HTTPFlow, rec: Recognised) -> None:
        data = rec.file
        if rec.doc is None or data is None or not rec.office:
            return
        # The diff and the store's fsyncs run off the event loop: other
        # traffic through the proxy must not wait for them (proxy_bench's stall part).
        flow.metadata["edgecourier_upload"] = rec  # the direct path's response learns aliases from it
        await self._settled()  # the records of this document's last save, before its base is read
        patch, decision, spotted = await asyncio.to_thread(self._patch, rec.doc, data, flow.metadata.get("edgecourier_pre"))
        self._let_go_later()
        if decision.send == "direct":
            # Whole, and the EPS would only add its own upload to the wait: the
            # request goes on to the provider as the app sent it. Nothing is
            # written before it leaves (the store's hashing and fsyncs would
            # compete with the upload for the CPU): once the provider accepted
            # the file, the response hook queues it as the document's base.
            why = decision.describe()
            flow.metadata["edgecourier"] = Pending(rec.doc, None, len(flow.request.raw_content or b""), decision.reason, why=why)
            log.debug("EdgeCourier: %s goes directly (%s)", rec.doc.ref.decode("utf-8", "replace"), why)
            return
        # The pending version is written while the save travels (the store's
        # one thread settles it after, in order), not before it leaves.
        token = self.writer.submit(self.store.pending, rec.doc, data)
        if rec.file_span is not None:
            body = flow.request.content
            request = ecp.ProviderRequest(flow.request.method, flow.request.pretty_url, _headers(flow), body_kind=ecp.BODY_WRAPPED,
                                          item=0, body=body[: rec.file_span[0]] + body[rec.file_span[1]:], split=rec.file_span[0])
        else:
            request = ecp.ProviderRequest(flow.request.method, flow.request.pretty_url, _headers(flow))
        item = ecp.SaveItem(data, rec.doc, patch)
        outcome, traffic = await self._call("save", ecp.SINGLE, [request], [item])
        self._learn_patch(traffic)
        if isinstance(outcome, ecp.ProviderResponse):
            self._spot_refuted([rec.doc], [spotted], traffic)
        await self._finish_save(flow, rec.doc, [token], outcome, traffic, len(flow.request.raw_content or b""), decision,
                                parts=_wait_parts(flow, decision, traffic))
        if isinstance(outcome, ecp.ProviderResponse) and outcome.succeeded and traffic.exchanges == 1 \
                and getattr(traffic, "kinds", []) == ["patch"]:
            # The app's wait for a patched save after its diff (the rule compares it with a direct one's).
            self.estimator.observe_save("patch", len(data), _waited(flow) - decision.diff_seconds)
        if isinstance(outcome, ecp.ProviderResponse) and outcome.succeeded:
            self._after(self._learn_aliases, rec.doc, data, outcome.body, True)
            if patch is None:
                self._learn_later(rec.doc, data)

    def _learn_aliases(self, doc: ecp.DocKey, data: bytes, response_body: bytes, at_edge: bool = False) -> None:
        """The provider's answer to an accepted save names the file in other
        ways too (Drive: the id of a created file; Graph: the driveItem's id
        and path): the same version becomes the last-synced copy under those
        keys, so a save addressed either way finds its base. The EPS finds
        bases by content hash, so it needs nothing. `at_edge`: the save went
        through the EPS, which holds the version."""
        keys = response_aliases(doc, response_body)
        for key in keys:
            self.store.downloaded(key, data, at_edge)
        if keys:
            log.info("EdgeCourier: %s is also known as %s", doc.ref.decode("utf-8", "replace"),
                     ", ".join(k.ref.decode("utf-8", "replace") for k in keys))

    def _settle(self, tokens: Sequence["str | concurrent.futures.Future[str] | None"], ok: "bool | Sequence[bool]",
                at_edge: bool = False) -> None:
        """Pending versions become bases (the provider accepted them; `at_edge`:
        through the EPS, which holds them too) or are forgotten (on the
        store's thread; a token still a future of that thread was made
        before, so it is ready). `ok`: one answer for all, or one per token
        (a Dropbox batch's entries, `accepted_files`); a None token (a file
        with no document key) is skipped. A version whose pending record
        failed (the store's error is logged) is not recorded; the others are."""
        each = [ok] * len(tokens) if isinstance(ok, bool) else list(ok)
        failed: Optional[BaseException] = None
        for t, accepted in zip(tokens, each):
            if t is None:
                continue
            try:
                t = t.result() if isinstance(t, concurrent.futures.Future) else t
                if accepted:
                    self.store.accepted(t, at_edge)
                else:
                    self.store.rejected(t)
            except StoreError as e:
                failed = e
        if failed is not None:
            raise failed

    def _record_answered(self, tokens, ok: "bool | Sequence[bool]", saves: list) -> None:
        """The store's records of a save the EPS answered (on the store's
        thread): its versions settled, and each file counted (`saves`, as
        `DeviceStore.record_saves` takes them)."""
        try:
            self._settle(tokens, ok, at_edge=True)
        finally:
            self.store.record_saves(saves)

    async def _finish_save(self, flow, doc, tokens, outcome, traffic, whole: int, decision, parts: str = "",
                           accepted: Optional[Sequence[bool]] = None, files: Optional[Sequence] = None,
                           items: Optional[Sequence[ecp.SaveItem]] = None,
                           decisions: Optional[Sequence] = None, answer_app: bool = True) -> bool:
        """Hands the EPS's answer to the app; True when the EPS answered.
        `parts`: where the app's wait went (`_wait_parts`), for the log;
        `accepted`: per token, whether the provider accepted its version
        (a gathered upload's files, `accepted_files`), else the answer's status says it for all.
        `files`, `items`, `decisions`: a gathered upload's files, the SAVE's
        items and the rule's decisions, in the same order: each file is
        counted as a save of its own document (`_save_records`); without
        them, the one save of `doc` (`whole` bytes, `decision`).
        `answer_app` False: only the records of a provider's answer that the
        app asked for no longer (`_settle_earlier`); the caller answers it."""
        name = doc.ref.decode("utf-8", "replace")
        if isinstance(outcome, ecp.ProviderResponse):
            if answer_app:
                flow.response = _response(outcome.status, outcome.reason, outcome.headers, outcome.body)
            sent = traffic.bytes_out + traffic.bytes_in
            if files is not None and items is not None:
                saves = _save_records([f.doc for f in files], items, decisions or [None] * len(items), traffic)
            else:
                saves = _save_records([doc], [None], [decision], traffic, whole)
            self._after(self._record_answered, tokens, outcome.succeeded if accepted is None else accepted, saves)
            hows = sorted({how for _, _, _, how, _ in saves}) or ["full"]
            count = f" ({len(saves)} files)" if len(saves) > 1 else ""
            log.info("EdgeCourier: %s%s saved via the EPS as a %s: %d bytes on the link instead of %d; provider %d%s (%s)",
                     name, count, " and ".join(hows), sent, whole, outcome.status, parts and f"; {parts}",
                     decision.describe() if decision is not None else "no decision")
            return True
        if isinstance(outcome, ecp.AppError):
            flow.response = _response(outcome.status, "", [], b"")
            self._after(self._settle, tokens, False)
            if outcome.reason == "outcome_unknown":
                log.warning("EdgeCourier: %s: no usable answer from the EPS after the save was sent, and it did not "
                            "answer again within %d s; the provider may hold the save, so it is not sent directly; "
                            "the app gets %d", name, self._retry_window(), outcome.status)
            else:
                log.warning("EdgeCourier: %s: the EPS may have reached the provider and failed (%s); the app gets %d",
                            name, outcome.reason, outcome.status)
            return True
        # Fallback: the direct path.
        reason = outcome.reason if isinstance(outcome, ecp.Fallback) else "unexpected"
        if len(tokens) == 1:
            flow.metadata["edgecourier"] = Pending(doc, tokens[0], whole, reason,
                                                   eps_bytes=traffic.bytes_out + traffic.bytes_in)
        log.info("EdgeCourier: %s goes directly: %s", name, reason)
        return False

    # ---- upload sessions -------------------------------------------------------

    async def _session(self, flow: http.HTTPFlow, rec: Recognised) -> None:
        result = self.book.feed(rec)
        if result is None:
            return  # not one of ours (e.g. a session started before the proxy): pass through
        if isinstance(result, Answer):
            flow.response = _response(result.status, result.reason, result.headers, result.body)
            return
        async with self.final_steps.of(result.keys) as waited:
            if waited:  # the request before this one may have completed or settled the session since
                result = self.book.feed(rec)
                if result is None:
                    return
                if isinstance(result, Answer):
                    flow.response = _response(result.status, result.reason, result.headers, result.body)
                    return
            await self._gathered(flow, result)

    async def _gathered(self, flow: http.HTTPFlow, up: GatheredUpload) -> None:
        """A session's final request (one at a time per session: `FinalSteps`)."""
        if up.procedure == ecp.DROPBOX_BATCH:
            taken = self.book.earlier(up)
            if any(e is not None for e in taken):
                await self._batch_again(flow, up, taken)
                return
        if up.procedure == ecp.DROPBOX_SESSION:
            kept = self.book.earlier(up)
            if len(kept) == 1 and isinstance(kept[0], tuple):
                # A batch committed this session's file, the app not told yet (`_batch_again` kept its result).
                self.book.settle_entry(up.keys[0], "drop")
                self._answer_finish_from_batch(flow, up, kept[0], None)
                return
        earlier = self.book.attempt(up)
        if earlier is not None and await self._gathered_again(flow, up, earlier):
            return
        #: The files' pending versions, in the order of `up.files` (None: a file with no document key).
        tokens: list = [None] * len(up.files)
        try:
            items, decisions, spotted = await self._gathered_items(up, tokens)
        except Exception as e:  # noqa: BLE001 - nothing was sent yet: the direct path, as for any failure before the EPS
            doc = up.files[0].doc
            name = doc.ref.decode("utf-8", "replace") if doc is not None else "an upload"
            if isinstance(e, StoreError):
                log.warning("EdgeCourier: %s: the device store failed (%s); nothing was sent, the upload goes directly",
                            name, e)
            else:
                log.exception("EdgeCourier: %s: preparing the save failed; nothing was sent, the upload goes directly", name)
            await self._replay(flow, up, tokens, "store_error" if isinstance(e, StoreError) else "unexpected")
            return
        whole = sum(len(f.data) for f in up.files)
        attempt = Attempt(os.urandom(8), up.procedure, tuple(up.provider_requests()), tuple(items), tuple(up.keys))
        self.book.attempting(up, attempt)
        outcome, traffic = await self._call("save", attempt.procedure, list(attempt.requests), items,
                                            request_id=attempt.request_id)
        self._learn_patch(traffic)
        if isinstance(outcome, ecp.ProviderResponse):
            self._spot_refuted([f.doc for f in up.files], spotted, traffic)
        doc = up.files[0].doc
        if isinstance(outcome, (ecp.ProviderResponse, ecp.AppError)):
            oks = self._accepted(up, outcome)
            await self._finish_save(flow, doc, tokens, outcome, traffic, whole, decisions[0], accepted=oks,
                                    files=up.files, items=items, decisions=decisions)
            if oks[0] and len(up.files) == 1 and doc is not None and up.files[0].office:
                self._after(self._learn_aliases, doc, up.files[0].data, outcome.body, True)
            if isinstance(outcome, ecp.ProviderResponse):
                self.book.settle(up, oks, _answer_of(outcome))
            # else the outcome is unknown: the sessions keep the attempt, which the app's retry sends again
            return
        reason = outcome.reason if isinstance(outcome, ecp.Fallback) else "unexpected"
        await self._replay(flow, up, tokens, reason, traffic.bytes_out + traffic.bytes_in)

    async def _gathered_items(self, up: GatheredUpload, tokens: list) -> tuple[list, list, list]:
        """The SAVE's items of a gathered upload (each file diffed against its
        base when a patch pays), their decisions and spot checks; each
        file's pending version is queued into `tokens` as it goes. Raises
        what the store or the diff raise (the caller goes directly)."""
        items, decisions, spotted = [], [], []
        await self._settled()
        for k, f in enumerate(up.files):
            doc = f.doc
            patch, decision, spot = await asyncio.to_thread(self._patch, doc, f.data) if doc is not None and f.office else (None, None, False)
            if decision is not None and decision.send == "direct":
                # A gathered upload (several requests the proxy answered) has no
                # direct path but a replay: whole files go FULL through the EPS.
                decision = dataclasses.replace(decision, send="full")
            spotted.append(spot)
            if doc is not None:
                tokens[k] = self.writer.submit(self.store.pending, doc, f.data)  # written while the save travels
            items.append(ecp.SaveItem(f.data, doc, patch, f.binding))
            decisions.append(decision)
        self._let_go_later()
        return items, decisions, spotted

    @staticmethod
    def _accepted(up: GatheredUpload, outcome) -> tuple[bool, ...]:
        """Per file of `up`, whether the provider accepted it (`accepted_files`;
        none for an AppError), and the refused ones of a batch logged."""
        if not isinstance(outcome, ecp.ProviderResponse):
            return (False,) * len(up.files)
        oks = accepted_files(up, outcome.status, outcome.body)
        if outcome.succeeded and not all(oks):
            log.info("EdgeCourier: the provider answered %d but refused %d of the %d files of the upload (per entry); "
                     "their last-synced versions stay as they were", outcome.status, oks.count(False), len(oks))
        return oks

    async def _replay(self, flow: http.HTTPFlow, up: GatheredUpload, tokens: Sequence, reason: str, eps_bytes: int = 0) -> None:
        """The direct path of a gathered upload that nothing sent yet (the EPS
        not asked, or sure not to have reached the provider): the device
        performs the provider's sequence itself (`ec_proxy.direct`).
        `eps_bytes`: what the attempt through the EPS before carried on the
        link (counted as sent to the EPS, shared among the files by size)."""
        self.book.settle(up, False)  # the EPS did not take it: a retry is a new attempt
        from ec_proxy import direct

        doc = up.files[0].doc
        log.info("EdgeCourier: %s goes directly (%s): replaying the provider's upload sequence", doc and doc.ref, reason)
        try:
            answer = await asyncio.to_thread(direct.replay, up, self._sender())
        except direct.DirectError as e:
            log.warning("EdgeCourier: the direct replay failed: %s", e)
            answer = Answer(502, "Bad Gateway", (), b"")
        except OSError as e:
            log.warning("EdgeCourier: the provider could not be reached for the direct replay: %s", e)
            answer = Answer(502, "Bad Gateway", (), b"")
        flow.response = _response(answer.status, answer.reason, answer.headers, answer.body)
        oks = accepted_files(up, answer.status, answer.body)
        if 200 <= answer.status < 300 and not all(oks):
            log.info("EdgeCourier: the provider answered %d but refused %d of the %d files of the upload (per entry); "
                     "their last-synced versions stay as they were", answer.status, oks.count(False), len(oks))
        self._after(self._settle, list(tokens), oks)
        if oks[0] and len(up.files) == 1 and doc is not None and up.files[0].office:
            self._after(self._learn_aliases, doc, up.files[0].data, answer.body)
        # Each file once, whole, as the link carried it to the provider (the store adds it to the
        # link's bytes); sent to the EPS: only the attempt before, if any.
        counted = [f for f in up.files if f.doc is not None]
        total = sum(len(f.data) for f in counted)
        shares = [eps_bytes * len(f.data) // total if total else 0 for f in counted]
        if shares:
            shares[0] += eps_bytes - sum(shares)
        saves = [(f.doc, share, len(f.data), "direct", reason) for f, share in zip(counted, shares)]
        if saves:
            self._after(self.store.record_saves, saves)  # each file of a batch is a save of its own document
        self.book.settle(up, oks, answer)

    async def _gathered_again(self, flow: http.HTTPFlow, up: GatheredUpload, attempt: Attempt) -> bool:
        """The app's final request of an upload session while the SAVE it
        made before (`attempt`) has no known outcome (the EPS may have
        uploaded the file, its answer lost). That SAVE is sent again as it
        was, with its request id, so the EPS answers from its outcome
        record, or performs it if it never started it (protocol spec §5.4):
        never the direct path, never a second upload. Then:

        - the app asks for the same operation (`same_operation`): it gets
          that SAVE's answer;
        - the app asks for another one (a Dropbox finish with another
          commit, another last fragment or chunk, a single finish of a
          session an unknown batch took): the earlier SAVE's answer settles
          its files (the store and the statistics learn it, the app is not
          told of it), and the app's request is answered as the provider
          would answer it now: if the earlier SAVE committed the session's
          file, the session is used up (`used_up`: Dropbox
          `lookup_failed/not_found`, Graph and Drive 404, Nextcloud's 404
          for the upload folder); if the provider refused it, nothing was
          committed and the app's request is a save of its own (False:
          the caller makes it).

        True when the app is answered."""
        doc = up.files[0].doc
        name = doc.ref.decode("utf-8", "replace") if doc is not None else "an upload"
        whole = sum(len(f.data) for f in up.files)
        same = same_operation(up, attempt)
        outcome, traffic = await self._call("save", attempt.procedure, list(attempt.requests), list(attempt.items),
                                            request_id=attempt.request_id)
        if isinstance(outcome, ecp.ProviderResponse) and same:
            log.info("EdgeCourier: %s: the app asked again for an upload whose outcome was unknown; the EPS answered "
                     "for the save it was sent before (request id %s), which reached the provider once", name,
                     attempt.request_id.hex())
            tokens = [self.writer.submit(self.store.pending, f.doc, f.data) if f.doc is not None else None for f in up.files]
            oks = self._accepted(up, outcome)
            await self._finish_save(flow, doc, tokens, outcome, traffic, whole, None, accepted=oks,
                                    files=up.files, items=attempt.items)
            if oks[0] and len(up.files) == 1 and doc is not None and up.files[0].office:
                self._after(self._learn_aliases, doc, up.files[0].data, outcome.body, True)
            self.book.settle(up, oks, _answer_of(outcome))
            return True
        if isinstance(outcome, ecp.ProviderResponse):
            if attempt.procedure == ecp.DROPBOX_BATCH:
                return await self._finish_after_batch(flow, up, attempt, outcome, traffic)
            old, oks = await self._settle_earlier(flow, up.provider, attempt, outcome, traffic)
            self.book.settle(old, oks, _answer_of(outcome))
            if any(oks):
                answer = used_up(up)
                flow.response = _response(answer.status, answer.reason, answer.headers, answer.body)
                log.warning("EdgeCourier: %s: the app asked again for an upload whose outcome was unknown, but for "
                            "another operation (another commit, or other bytes); the save sent before (request id %s) "
                            "reached the provider and used the session up, so the app gets the provider's answer for "
                            "a used-up session (%d), not that save's", name, attempt.request_id.hex(), answer.status)
                return True
            log.info("EdgeCourier: %s: the save sent before (request id %s) was refused by the provider (%d): the app's "
                     "changed request is a save of its own", name, attempt.request_id.hex(), outcome.status)
            return False
        if isinstance(outcome, ecp.AppError):
            await self._finish_save(flow, doc, [], outcome, traffic, whole, None)
            return True
        # The EPS could not be asked this time: the earlier save may still have reached the provider.
        flow.response = _response(503, "Service Unavailable", [("Retry-After", "5")], b"")
        log.warning("EdgeCourier: %s: the app asked again for an upload whose outcome is unknown, and the EPS "
                    "could not be asked (%s); the app gets 503 and the file is not sent directly, which could "
                    "upload it twice", name, outcome.reason if isinstance(outcome, ecp.Fallback) else "unexpected")
        return True

    async def _settle_earlier(self, flow: http.HTTPFlow, provider: int, attempt: Attempt, outcome: ecp.ProviderResponse,
                              traffic) -> tuple[GatheredUpload, tuple[bool, ...]]:
        """The records of an earlier SAVE whose answer came now, for a
        request of the app that asked for something else (the app is not
        given this answer): the store learns the versions the provider
        accepted, the statistics count its files. Its upload and, per
        file, whether the provider accepted it."""
        files = tuple(GatheredFile(i.target, i.doc, None, i.binding) for i in attempt.items)
        old = GatheredUpload(provider, attempt.procedure, (), files, attempt.keys)
        tokens = [self.writer.submit(self.store.pending, f.doc, f.data) if f.doc is not None else None for f in files]
        oks = self._accepted(old, outcome)
        first = files[0].doc if files else None
        await self._finish_save(flow, first or ecp.DocKey(provider, b"", b""), tokens, outcome, traffic,
                                sum(len(f.data) for f in files), None, accepted=oks, files=files, items=attempt.items,
                                answer_app=False)
        if oks and oks[0] and len(files) == 1 and first is not None and files[0].office:
            self._after(self._learn_aliases, first, files[0].data, outcome.body, True)
        return old, oks

    def _earlier_batch_results(self, flow: http.HTTPFlow, x: Attempt, outcome: ecp.ProviderResponse, sent: Optional[list],
                               name: str) -> tuple[bool, Optional[list[dict]]]:
        """The EPS's answer to an earlier finish_batch_v2 SAVE (`x`, whose
        entries were `sent`) whose outcome was unknown: whether its results
        can be matched to that SAVE's entries, and the results (None: the
        batch refused as a whole). When a 2xx cannot be matched, the app gets
        502 and the sessions keep that save: a retry asks the EPS again and
        never uploads twice."""
        results = dropbox_sessions.batch_results(outcome.body, len(x.items)) if outcome.succeeded else None
        if outcome.succeeded and (results is None or sent is None or not len(sent) == len(x.items) == len(x.keys)):
            flow.response = _response(502, "Bad Gateway", [], b"")
            log.warning("EdgeCourier: %s: the EPS answered a batch whose outcome was unknown (request id %s) with %d, but "
                        "its entries cannot be told apart; the app gets 502, the sessions keep that save (a retry asks "
                        "the EPS again, never uploads twice)", name, x.request_id.hex(), outcome.status)
            return False, None
        return True, results

    async def _finish_after_batch(self, flow: http.HTTPFlow, up: GatheredUpload, x: Attempt, outcome: ecp.ProviderResponse,
                                  traffic) -> bool:
        """A Dropbox upload_session/finish of a session that an earlier
        finish_batch_v2 SAVE (`x`), whose outcome was unknown, took; the
        EPS has just answered that SAVE. Its entries are settled as
        `_batch_again` settles them (the committed ones the app did not name
        are kept for its retry of the batch); the app's finish gets, when
        the batch committed this session's file, the file's metadata if it
        names the same commit and bytes (its result), else Dropbox's
        `lookup_failed/not_found` (the session is used up); when it did not,
        the finish is a save of its own (False)."""
        sent = dropbox_sessions.batch_entries(x.requests[0].body if x.requests else None)
        matched, results = self._earlier_batch_results(flow, x, outcome, sent, "a Dropbox batch")
        if not matched:
            return True
        await self._settle_earlier(flow, up.provider, x, outcome, traffic)
        if results is None:  # refused as a whole: nothing committed
            for key in x.keys:
                self.book.settle_entry(key, "retry")
            return False
        mine = up.keys[0] if len(up.keys) == 1 else None
        committed_mine: Optional[tuple[object, dict]] = None
        for key, then, result in zip(x.keys, sent, results):
            committed = result.get(".tag") == "success"
            if key == mine and committed:
                committed_mine = (then, result)
                self.book.settle_entry(key, "drop")
            else:
                self.book.settle_entry(key, "answered" if committed else "retry", (then, result))
        if committed_mine is None:
            log.info("EdgeCourier: a Dropbox batch whose outcome was unknown (request id %s) did not commit this "
                     "session's file: the app's finish is a save of its own", x.request_id.hex())
            return False
        self._answer_finish_from_batch(flow, up, committed_mine, x.items[x.keys.index(mine)].target)
        return True

    def _answer_finish_from_batch(self, flow: http.HTTPFlow, up: GatheredUpload, committed: tuple[object, dict],
                                  target: Optional[bytes]) -> None:
        """The app's upload_session/finish of a session whose file a batch
        committed (`committed`: the entry as the batch sent it, its result):
        the file's metadata when the finish names the same cursor and
        commit (and, `target` given, the same bytes), else Dropbox's
        `lookup_failed/not_found` (the session is used up). Nothing is sent."""
        then, result = committed
        arg = _dropbox_arg(up.requests[0]) if up.requests else None
        if (isinstance(arg, dict) and dropbox_sessions.same_entry(arg, then)
                and (target is None or up.files[0].data == target)):
            meta = {n: v for n, v in result.items() if n != ".tag"}
            flow.response = _response(200, "OK", [("Content-Type", "application/json")], json.dumps(meta).encode())
            how = "its result"
        else:
            answer = used_up(up)
            flow.response = _response(answer.status, answer.reason, answer.headers, answer.body)
            how = "Dropbox's answer for a used-up session"
        log.info("EdgeCourier: a Dropbox finish of a session a batch committed once: the app gets %s", how)

    async def _batch_again(self, flow: http.HTTPFlow, up: GatheredUpload, taken: list) -> None:
        """A Dropbox finish_batch_v2 that names sessions an earlier SAVE took
        (`SessionBook.earlier`): the app's retry after an answer it did not
        get (504), of the same entries, of some of them, in another order,
        or with new ones. Dropbox answers one result per entry the app
        names, in its order (UploadSessionFinishBatchResult), so:

        - The earlier SAVE whose outcome is unknown is sent again as it was
          (request id, requests and items: protocol §5.4), never a new one:
          the EPS answers from its outcome record, or performs it if it
          never started it; each file reaches the provider once. Its
          definite answer settles every file of that SAVE: the store
          learns the bases of the entries the provider committed, the
          statistics count each file.
        - The app gets that answer unchanged when it named exactly the
          entries that SAVE sent, in the same order, or when the provider
          refused the batch as a whole (not 2xx); otherwise an answer of
          the provider's status and heads whose entries are the results
          of the entries the app names, in its order: an entry that SAVE
          sent as the app sends it now gets its result; a committed file's
          session named with another commit gets `lookup_failed/not_found`
          (its session is used up, as at Dropbox); a session no SAVE took
          yet, or one of another SAVE still unknown, gets the retryable
          `too_many_write_operations` (its session is kept: the app's retry
          of it is a save of its own).
        - The results of the entries the app did not name this time are
          kept on their sessions (`Session.answered`) for its retry of them,
          which is then answered here without asking the EPS again.
        - A 2xx answer whose entries cannot be matched to the SAVE's: the
          app gets 502, and the sessions keep the SAVE, so its retry asks
          the EPS again: nothing is uploaded twice.
        - The EPS not answering (504 again) or not reachable (503): as
          `_gathered_again`."""
        asked = dropbox_sessions.batch_entries(up.requests[0].body if up.requests else None) or []
        if len(asked) != len(up.files) or len(up.keys) != len(up.files):
            flow.response = _response(502, "Bad Gateway", [], b"")
            log.warning("EdgeCourier: a Dropbox batch retry whose entries do not match its sessions; the app gets 502")
            return
        if not await self._finishes_again(flow, up, taken):
            return
        pending = [e for e in taken if isinstance(e, Attempt) and e.procedure == ecp.DROPBOX_BATCH]
        x = pending[0] if pending else None
        status, reason = 200, "OK"
        heads: Sequence[tuple[str, object]] = [("Content-Type", "application/json")]
        #: book key -> (the entry as the earlier SAVE sent it, the provider's result)
        settled: dict[str, tuple[object, dict]] = {}
        if x is not None:
            sent = dropbox_sessions.batch_entries(x.requests[0].body if x.requests else None)
            x_files = tuple(GatheredFile(i.target, i.doc, None, i.binding) for i in x.items)
            x_up = GatheredUpload(up.provider, x.procedure, (), x_files, x.keys)
            first = x_files[0].doc if x_files else None
            name = first.ref.decode("utf-8", "replace") if first is not None else "a Dropbox batch"
            outcome, traffic = await self._call("save", x.procedure, list(x.requests), list(x.items), request_id=x.request_id)
            if isinstance(outcome, ecp.AppError):
                flow.response = _response(outcome.status, "", [], b"")
                log.warning("EdgeCourier: %s: the app asked again for a batch whose outcome is unknown, and the EPS "
                            "did not answer it (%s); the app gets %d, nothing was sent directly", name, outcome.reason,
                            outcome.status)
                return
            if not isinstance(outcome, ecp.ProviderResponse):
                flow.response = _response(503, "Service Unavailable", [("Retry-After", "5")], b"")
                log.warning("EdgeCourier: %s: the app asked again for a batch whose outcome is unknown, and the EPS "
                            "could not be asked (%s); the app gets 503 and the files are not sent directly, which "
                            "could upload them twice", name, outcome.reason if isinstance(outcome, ecp.Fallback) else "unexpected")
                return
            matched, results = self._earlier_batch_results(flow, x, outcome, sent, name)
            if not matched:
                return
            tokens = [self.writer.submit(self.store.pending, f.doc, f.data) if f.doc is not None else None for f in x_files]
            oks = self._accepted(x_up, outcome)
            await self._finish_save(flow, first, tokens, outcome, traffic, sum(len(f.data) for f in x_files), None,
                                    accepted=oks, files=x_files, items=x.items)
            log.info("EdgeCourier: %s: the app asked again for a batch whose outcome was unknown (%d of its entries "
                     "now, %d then); the EPS answered for the save sent before (request id %s), which reached the "
                     "provider once", name, len(asked), len(x.items), x.request_id.hex())
            if results is None:  # refused as a whole: nothing committed, the app gets the provider's answer
                for key in x.keys:
                    self.book.settle_entry(key, "retry")
                return
            settled = {key: (sent[k], results[k]) for k, key in enumerate(x.keys)}
            if asked == sent and all(e is x for e in taken):
                for key, ok in zip(x.keys, oks):
                    self.book.settle_entry(key, "drop" if ok else "retry")
                return  # the app named what that save sent: its answer as it is
            status, reason, heads = outcome.status, outcome.reason, outcome.headers
        entries, told = [], set()
        for key, entry, earlier in zip(up.keys, asked, taken):
            if key in settled or isinstance(earlier, tuple):
                then, result = settled[key] if key in settled else earlier
                if dropbox_sessions.same_entry(entry, then):
                    entries.append(result)
                    told.add(key)
                elif result.get(".tag") == "success":
                    entries.append(dropbox_sessions.failure(dropbox_sessions.NOT_FOUND))
                else:
                    entries.append(dropbox_sessions.failure(dropbox_sessions.RETRY_LATER))
            else:
                entries.append(dropbox_sessions.failure(dropbox_sessions.RETRY_LATER))
        for key, (then, result) in settled.items():
            committed = result.get(".tag") == "success"
            self.book.settle_entry(key, ("drop" if key in told else "answered") if committed else "retry", (then, result))
        for key, earlier in zip(up.keys, taken):
            if isinstance(earlier, tuple) and key in told and key not in settled:
                self.book.settle_entry(key, "drop")
        flow.response = _response(status, reason, heads, json.dumps({"entries": entries}).encode())
        log.info("EdgeCourier: a Dropbox batch retry answered per entry: %d from the provider's answers, %d to be "
                 "sent again by the app", len(told), sum(1 for e in entries if e.get("failure") == dropbox_sessions.RETRY_LATER))

    async def _finishes_again(self, flow: http.HTTPFlow, up: GatheredUpload, taken: list) -> bool:
        """A finish_batch_v2 naming sessions that an upload_session/finish
        SAVE whose outcome is unknown took: each such SAVE is sent again as
        it was (request id; protocol §5.4), so the EPS answers from its
        record or performs it if it never started it; never a new one. Its
        definite answer settles its session (the store and the statistics
        learn it): committed, `taken` holds the finish's result as a batch
        entry's result (the entry naming the same commit gets it, another
        gets `lookup_failed/not_found`, as `_batch_again` answers); refused,
        the session is one no SAVE took (the app's retry of the entry is a
        save of its own). Before, such an entry got the retryable
        `too_many_write_operations` for as long as the session lived, and the
        app never learnt its file's outcome. False when the app has been
        answered already (the EPS not answering: 504 / 503, as
        `_gathered_again`)."""
        done: dict[int, object] = {}
        for k, (key, earlier) in enumerate(zip(up.keys, taken)):
            if not isinstance(earlier, Attempt) or earlier.procedure != ecp.DROPBOX_SESSION:
                continue
            if id(earlier) in done:
                taken[k] = done[id(earlier)]
                continue
            outcome, traffic = await self._call("save", earlier.procedure, list(earlier.requests), list(earlier.items),
                                                request_id=earlier.request_id)
            if isinstance(outcome, ecp.AppError):
                flow.response = _response(outcome.status, "", [], b"")
                log.warning("EdgeCourier: a Dropbox batch names a session whose finish had an unknown outcome, and the "
                            "EPS did not answer it (%s); the app gets %d, nothing was sent directly", outcome.reason,
                            outcome.status)
                return False
            if not isinstance(outcome, ecp.ProviderResponse):
                flow.response = _response(503, "Service Unavailable", [("Retry-After", "5")], b"")
                log.warning("EdgeCourier: a Dropbox batch names a session whose finish had an unknown outcome, and the "
                            "EPS could not be asked (%s); the app gets 503, nothing is sent directly",
                            outcome.reason if isinstance(outcome, ecp.Fallback) else "unexpected")
                return False
            _, oks = await self._settle_earlier(flow, up.provider, earlier, outcome, traffic)
            arg = _dropbox_arg(earlier.requests[0]) if earlier.requests else None
            result: Optional[dict] = None
            if oks and oks[0]:
                try:
                    meta = json.loads(outcome.body or b"null")
                except ValueError:
                    meta = None
                result = {".tag": "success", **meta} if isinstance(meta, dict) else {".tag": "success"}
            if result is not None and isinstance(arg, dict):
                then = {"cursor": arg.get("cursor"), "commit": arg.get("commit")}
                taken[k] = (then, result)
                self.book.settle_entry(key, "answered", (then, result))
            elif result is not None:  # committed, but its commit cannot be read: used up for any entry
                taken[k] = (None, result)
                self.book.settle_entry(key, "answered", (None, result))
            else:
                taken[k] = None
                self.book.settle_entry(key, "retry")
            done[id(earlier)] = taken[k]
            log.info("EdgeCourier: a Dropbox batch names a session whose finish had an unknown outcome (request id %s): "
                     "the EPS answered %d for it (%s)", earlier.request_id.hex(), outcome.status,
                     "committed once" if result is not None else "not committed: the entry is a save of its own")
        return True

    def _sender(self):
        """Sends provider requests from the proxy itself (the direct replay of a
        collapsed upload): TLS verified against mitmproxy's upstream trust (the
        lab's test CA when `ssl_verify_upstream_trusted_ca` is set), the lab's
        routing table applied."""
        import ssl

        from ec_proxy import direct

        context = ssl.create_default_context(cafile=ctx.options.ssl_verify_upstream_trusted_ca or None)
        routing = ctx.master.addons.get("labrouting")
        return direct.HttpSender(context, routing.table if routing is not None else None)

    # ---- downloads ---------------------------------------------------------------

    async def _download(self, flow: http.HTTPFlow, rec: Recognised) -> None:
        if _named_non_document(rec.name):
            return  # a file named as no document (status.json, a .txt): not EdgeCourier's business
        if rec.doc is None:
            flow.metadata["edgecourier"] = "download"
            flow.metadata["edgecourier_rec"] = rec
            return
        follow = rec.download is not None and rec.download.follow_redirect
        have = await self._stored(self.store.edge_base, rec.doc)  # a patch can only be against a version the EPS holds
        request = ecp.ProviderRequest(flow.request.method, flow.request.pretty_url, _headers(flow),
                                      body_kind=ecp.BODY_BYTES if flow.request.content else ecp.BODY_EMPTY, body=flow.request.content or b"")
        outcome, traffic = await self._call("fetch", request, rec.doc, have, follow_redirect=follow)
        self._let_go_later()
        if isinstance(outcome, ecp.FetchResponse):
            final = outcome.final
            first = outcome.parts[0]
            location = _header(first.headers, "location") if len(outcome.parts) == 2 else None
            if location is not None:
                # Graph: the app gets the 302 and, when it follows it, the body the EPS fetched (§6.8).
                if not self.redirects.keep(location, final):
                    log.info("EdgeCourier: %s: the downloaded body (%d bytes) is over what the proxy keeps for "
                             "the app's redirect; the app will fetch it from the provider",
                             rec.doc.ref.decode("utf-8", "replace"), len(final.body))
                flow.response = _response(first.status, first.reason, first.headers, first.body)
            else:
                flow.response = _response(final.status, final.reason, final.headers, final.body)
            if final.status == 200 and not outcome.hash_disagreement and _document(rec, final.body):
                self._after(self.store.downloaded, rec.doc, final.body, True)  # the EPS keeps what it fetched
                self._learn_later(rec.doc, final.body)
            log.info("EdgeCourier: %s downloaded via the EPS: %d bytes on the link for a %d-byte file",
                     rec.doc.ref.decode("utf-8", "replace"), traffic.bytes_out + traffic.bytes_in, len(final.body))
        elif isinstance(outcome, ecp.AppError):
            flow.response = _response(outcome.status, "", [], b"")
        else:
            flow.metadata["edgecourier"] = "download"
            flow.metadata["edgecourier_rec"] = rec


def patch_base_size(patch: bytes) -> Optional[int]:
    """The `base_size` of an edit patch's header (edit-patch-v1.md §2, the
    same in version 2: a varint at offset 7), or None when it is not there."""
    if patch[:4] != b"\x89ECP":
        return None
    value, shift = 0, 0
    for byte in patch[7:17]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    return None


def bound_bases(items: Sequence[ecp.SaveItem], max_item_size: int) -> tuple[list[ecp.SaveItem], int]:
    """The items of a SAVE with the bases of its PATCH items held to
    `max_item_size` together (protocol §5.1 step 8, §9: the EPS answers
    `too_large` otherwise, and the save would go directly): patches are
    kept in item order while their bases fit, the others' items go FULL
    (their files fit: the client checks the files together against the
    same limit). Returns the items and how many were made FULL. As the
    client does for the patches' own sizes against `max_patch_size`."""
    out, total, made_full = [], 0, 0
    for it in items:
        if it.patch is not None:
            size = patch_base_size(it.patch)
            if size is not None and total + size <= max_item_size:
                total += size
            else:
                it = dataclasses.replace(it, patch=None)
                made_full += 1
        out.append(it)
    return out, made_full


def _save_within_limits(client: "ecp.EpsClient", known: Optional[ecp.Limits], procedure: int, requests: list,
                        items: list, request_id: Optional[bytes] = None) -> tuple[object, list]:
    """`client.save`, its items' bases held to the EPS's `max_item_size`
    together (`bound_bases`) by the limits of the client's session. A save
    with patches on a client with no session opens it first (HELLO: the
    EPS advertises its limits there, protocol §4), so that the bound is the
    EPS's own, not the protocol's defaults: before, an EPS with a lowered
    `max_item_size` cost the first save after a start (or after the probe
    failed) a `too_large` and a direct upload. If the session cannot be
    opened, the save's answer is that failure, as `client.save` would give
    it (it opens the session the same way, and honours the pause after
    `auth_failed`). `known` (the limits the proxy last learnt) is used only
    when the client offers none even so. Returns the outcome and the items
    as offered to the client (what the EPS was sent: those made FULL here
    carry no patch), for what the save teaches (`_learn_patch`)."""
    with client._lock:  # the client is this thread's (taken from the pool); held for the session check and the save
        if client.limits is None and any(it.patch is not None for it in items):
            failed = client._ensure_session()  # noqa: SLF001 - the save's own HELLO, with its pause rule
            if failed is not None:
                return failed, list(items)
        limits = client.limits or known or ecp.Limits()
        bounded, made_full = bound_bases(items, limits.max_item_size)
        if made_full:
            log.info("EdgeCourier: the bases of the save's patches come to more than the EPS takes together "
                     "(max_item_size %d bytes): %d of its %d files go whole", limits.max_item_size, made_full, len(items))
        return client.save(procedure, requests, bounded, request_id=request_id), bounded


def _save_records(docs: Sequence[Optional[ecp.DocKey]], items: Sequence[Optional[ecp.SaveItem]], decisions: Sequence,
                  traffic, whole: Optional[int] = None) -> list[tuple[ecp.DocKey, int, int, str, str]]:
    """The statistics of a save the EPS answered, one record per file with a
    document key (`DeviceStore.record_saves`): (doc, bytes on the link,
    whole bytes, how, reason). How each item travelled is the client's last
    transmission's (`traffic.kinds`: it sends an item whole when its patch
    is over the EPS's limits or the EPS lacked the base), not what was
    offered. The link's bytes are shared among the files by what each put
    on it (its patch, or its file), so that they add up to the exchange's.
    `items[k]` None: a single upload of `whole` bytes."""
    kinds = list(getattr(traffic, "kinds", []))
    if len(docs) == 1 and "patch" in kinds:
        kinds = ["patch"]
    rows, weights = [], []
    for k, (doc, item, decision) in enumerate(zip(docs, items, decisions)):
        how = kinds[k] if k < len(kinds) and kinds[k] in ("patch", "full") else "full"
        reason = decision.reason if decision is not None and how == decision.send else ("sent_whole_by_client" if how == "full" else "patch")
        size = len(item.target) if item is not None else (whole or 0)
        if doc is None:
            continue
        rows.append([doc, 0, size, how, reason])
        weights.append(len(item.patch) if item is not None and how == "patch" and item.patch is not None else size)
    sent = traffic.bytes_out + traffic.bytes_in
    total = sum(weights)
    for row, w in zip(rows, weights):
        row[1] = sent * w // total if total else sent // len(rows)
    if rows:
        rows[0][1] += sent - sum(r[1] for r in rows)  # what integer division left
    return [tuple(r) for r in rows]


def response_aliases(doc: ecp.DocKey, response_body: bytes) -> list[ecp.DocKey]:
    """Other keys of the file a provider's answer to an accepted save names
    (Drive: the id of a created file; Graph: the driveItem's id and path)."""
    if doc.provider not in (ecp.DRIVE, ecp.GRAPH):
        return []
    try:
        resource = json.loads(response_body or b"null")
    except ValueError:
        return []
    from ec_proxy.recognise import drive as drive_rec, graph as graph_rec

    return (drive_rec.aliases if doc.provider == ecp.DRIVE else graph_rec.aliases)(doc, resource)


def _submit_once_answered(executor: concurrent.futures.Executor, fn: Callable[..., _T], *args, **kwargs) -> "concurrent.futures.Future[_T]":
    """`executor.submit(fn, ...)` on the event loop's next turn: after the
    hook that calls this returns and mitmproxy writes its answer to the app
    (the hooks after ours and the write happen in the same turn when none of
    them waits); at once when no loop runs in this thread. The future it
    returns at once ends as the work does (with RuntimeError when the
    executor was shut down meanwhile, cancelled when the work was)."""
    result: concurrent.futures.Future = concurrent.futures.Future()

    def pass_on(done: concurrent.futures.Future) -> None:
        if done.cancelled():
            result.cancel()
            return
        e = done.exception()
        if e is not None:
            result.set_exception(e)
        else:
            result.set_result(done.result())

    def submit() -> None:
        try:
            work = executor.submit(fn, *args, **kwargs)
        except RuntimeError as e:  # the proxy is shutting down: the executor is gone
            result.set_exception(e)
            return
        work.add_done_callback(pass_on)

    try:
        asyncio.get_running_loop().call_soon(submit)
    except RuntimeError:
        submit()
    return result


def _log_store_failure(future: concurrent.futures.Future) -> None:
    """Done-callback of store work nobody waits for (`EdgeCourier._after`)."""
    e = future.exception()
    if e is not None:
        log.error("EdgeCourier: a store record failed after the app was answered (the next save of the document "
                  "may go whole): %s", e, exc_info=e)


def _log_learnt(name: str, future: concurrent.futures.Future) -> None:
    """Done-callback of `EdgeCourier._learn_later`: what was learnt; a version
    that could not be learnt only makes its next diff slower (a cancelled one:
    the proxy stopped)."""
    if future.cancelled():
        return
    e = future.exception()
    if e is not None:
        log.info("EdgeCourier: %s: could not learn this version ahead of its next diff: %s", name, e)
    elif future.result():
        log.info("EdgeCourier: %s: learnt %d block-parallel member(s) of this version ahead of its next diff", name, future.result())


def _document(rec: Recognised, body: Optional[bytes]) -> bool:
    """Only documents enter the store: an office name, or (name unknown or
    not office, body known) an office container's content."""
    return is_office_name(rec.name) or (body is not None and is_office_content(body))


def _dropbox_arg(request) -> Optional[object]:
    """The JSON of a Dropbox request's argument, or None: its
    `Dropbox-API-Arg` head field, else its `?arg=` (as the recogniser reads
    it: `recognise.dropbox.arg`)."""
    raw = _header(request.headers, "dropbox-api-arg")
    if raw is None:
        raw = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.url).query)).get("arg")
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return None


def _header(headers, name: str) -> Optional[str]:
    for n, v in headers:
        if n.lower() == name:
            return v.decode("latin-1") if isinstance(v, bytes) else v
    return None


def _named_non_document(name: Optional[str]) -> bool:
    """A name with an extension that no document has (`status.php`,
    `notes.txt`); ids and revisions (`id:…`, `rev:…`) and names without an
    extension say nothing, and their content decides."""
    if not name or name.startswith(("id:", "rev:", "ns:")):
        return False
    base = name.rsplit("/", 1)[-1]
    return "." in base.lstrip(".") and not is_office_name(base)


def _addons():
    from ec_proxy.lazy import LazyProviderConnections
    from ec_proxy.routing import LabRouting

    return [LabRouting(), LazyProviderConnections(), EdgeCourier()]


#: For `mitmdump -s device-proxy/ec_proxy/addon.py` (the `ec-proxy` command adds them itself).
addons = _addons()
