"""Crash and fault tests of the EPS (issue 3, "Faults"): a save is stopped
at each of its steps by a real SIGKILL, the EPS is restarted, and the test
shows that the last-synced store is never torn, that the provider never
holds anything but the old or the new version of the document, byte for
byte, and that the device's own retry and its next edit end correctly.

How a crash is placed: the EPS build with fail points compiled in
(`ec-eps-failpoints`) is started with `FAILPOINTS=<point>=sleep(60000)`.
When a save reaches the point, the thread running it sleeps; the test sees
that thread in `hrtimer_nanosleep` (/proc/<pid>/task/*/wchan: nothing else
in the EPS sleeps that way, tokio parks in epoll or futexes) and SIGKILLs
the process. That is a true crash at that step, unlike a `panic` action,
which tokio would contain in the task.

The device reaches the EPS through `HoldingRelay`, a plain TCP relay that,
when the EPS side of a connection dies, keeps the device side open until
the test has restarted the EPS. The device's client then sees its
connection fail after sending and performs the retry of spec §7.1 (same
`request_id`, new connection) against the restarted EPS, as it would when a
supervisor restarts the EPS quickly. Without the relay the retry would find
the port closed and take the direct path, which tells nothing about the EPS.

The store is checked from its on-disk layout (eps/store/src/files.rs) by
`read_store`, independently of the store's own `Store::check`, which the
binary does not expose.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

import ec_protocol as p
from ec_protocol.client import EnrolmentBundle, EpsClient
from testbed.lab import EPS_FAILPOINTS_BIN, TEST_SECRET, Lab

from .e2e import TRACES, Uploader, log_seq, provider_requests_since

pytestmark = [
    pytest.mark.skipif(not EPS_FAILPOINTS_BIN.exists(), reason="needs .venv/bin/ec-eps-failpoints (make eps-failpoints)"),
    pytest.mark.skipif(not (TRACES / "manifest.json").exists(), reason="needs the LibreOffice traces (make traces)"),
]

#: How long a fail point holds the save: far longer than any test waits.
HOLD_MS = 60_000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Versions:
    """Three successive versions of one real document: the last-synced one
    (v0), the save that is crashed (v1) and the following edit (v2). They
    are LibreOffice re-saves of a ~380 kB .docx, so the save body spans two
    of the EPS's 256 KiB send frames and "mid-upload" falls inside it."""

    v0: bytes
    v1: bytes
    v2: bytes


@pytest.fixture(scope="module")
def docs() -> Versions:
    start, middle = TRACES / "writer-1m-start-docx", TRACES / "writer-1m-middle-docx"
    v = Versions((start / "base.docx").read_bytes(), (start / "new.docx").read_bytes(), (middle / "new.docx").read_bytes())
    assert len({v.v0, v.v1, v.v2}) == 3 and len(v.v1) > 256 * 1024
    return v


# ---------------------------------------------------------------- the store, read from disk


@dataclass
class StoreState:
    """What a store folder holds: pointers (key digest -> (blob sha, size,
    has outcome record)), blobs (sha -> size), leftover temporaries, and the
    broken invariants found."""

    pointers: dict[str, tuple[str, int, bool]] = field(default_factory=dict)
    blobs: dict[str, int] = field(default_factory=dict)
    temporaries: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


_MAGIC = b"ECSPTR01"
_FIXED = 8 + 32 + 32 + 8 + 1 + 8


def _decode_pointer(data: bytes) -> Optional[tuple[bytes, str, int, bool]]:
    """(key digest, blob sha hex, size, has outcome) of an intact pointer record."""
    if len(data) < _FIXED + 32:
        return None
    body, check = data[:-32], data[-32:]
    if hashlib.sha256(body).digest() != check or body[:8] != _MAGIC:
        return None
    has_outcome, outcome_len = body[80], int.from_bytes(body[81:89], "little")
    if has_outcome > 1 or len(body) - _FIXED != outcome_len or (has_outcome == 0 and outcome_len):
        return None
    return body[8:40], body[40:72].hex(), int.from_bytes(body[72:80], "little"), has_outcome == 1


def read_store(root: Path) -> StoreState:
    """Reads every file of the store folder and lists what breaks the
    store's invariants: a blob whose content does not hash to its name, a
    pointer that is not an intact record for its name, a pointer naming a
    blob that is absent or of another size, a file where none belongs."""
    st = StoreState()
    for f in sorted((root / "tmp").iterdir()):
        st.temporaries.append(f.name)
    for kind in ("blobs", "docs"):
        for f in sorted((root / kind).rglob("*")):
            if f.is_dir():
                if f.parent != root / kind or len(f.name) != 2:
                    st.problems.append(f"stray folder {f}")
                continue
            name = f.name
            if f.parent.parent != root / kind or len(name) != 64 or not name.startswith(f.parent.name) or name != name.lower():
                st.problems.append(f"stray file {f}")
                continue
            data = f.read_bytes()
            if kind == "blobs":
                if sha(data) != name:
                    st.problems.append(f"corrupt blob {name}")
                st.blobs[name] = len(data)
            else:
                rec = _decode_pointer(data)
                if rec is None or rec[0].hex() != name:
                    st.problems.append(f"damaged pointer {name}")
                    continue
                st.pointers[name] = rec[1:]
    for key, (blob, size, _) in st.pointers.items():
        if st.blobs.get(blob) != size:
            st.problems.append(f"pointer {key} names blob {blob} ({size} bytes) that the store does not hold")
    extra = {f.name for f in root.iterdir()} - {"LOCK", "tmp", "blobs", "docs"}
    st.problems += [f"stray file {root / n}" for n in sorted(extra)]
    return st


def pointer_of(st: StoreState, doc: p.DocKey) -> Optional[str]:
    """The blob sha the document's pointer names (the pointer file is named
    by the SHA-256 of the encoded document key, spec §4.4.1)."""
    rec = st.pointers.get(hashlib.sha256(doc.encode()).hexdigest())
    return None if rec is None else rec[0]


# ---------------------------------------------------------------- crash placement


class HoldingRelay:
    """A TCP relay from the device to the EPS. While `hold()` is in force, a
    connection whose EPS side dies keeps its device side open; `release()`
    closes those, so the device notices the failure only once the EPS is
    back and its retry reaches the restarted process."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.server.getsockname()[1]
        self.released = threading.Event()
        self.released.set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.closed = True
        self.released.set()
        self.server.close()

    def client(self, label: str) -> EpsClient:
        return EpsClient(EnrolmentBundle(url=self.url, key_id=1, secret=TEST_SECRET, plain_http=True), label=label)

    def _accept(self) -> None:
        while not self.closed:
            try:
                down, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(down,), daemon=True).start()

    def _serve(self, down: socket.socket) -> None:
        try:
            up = socket.create_connection(self.target, timeout=5)
            up.settimeout(None)
        except OSError:
            down.close()
            return
        threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
        self._pump(up, down)
        self.released.wait()
        for s in (down, up):
            # shutdown, not just close: it wakes the other pump's recv and
            # sends the FIN that tells the device its connection is gone.
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass


# ---------------------------------------------------------------- one crashed save


@dataclass
class CrashReport:
    """What one crash showed, for the assertions and for people."""

    point: str
    provider_after_kill: str  # "v0" / "v1"
    pointer_after_kill: str  # "v0" / "v1"
    temporaries_after_kill: int
    retry: str  # the retried save's outcome
    uploads_of_v1: int  # provider requests whose body was the whole of v1 (SINGLE)
    next_edit: str  # "patch" or "full (base_unknown)"


def _names(v: Versions) -> dict[str, str]:
    return {sha(v.v0): "v0", sha(v.v1): "v1", sha(v.v2): "v2"}


def crash_one_save(lab: Lab, v: Versions, up: Uploader, name: str, point: str, settle: bool = False, **config) -> CrashReport:
    """Learns v0, crashes the save of v1 at `point`, restarts, lets the
    device retry, then saves v2; asserts the invariants at each stage.
    `settle`: the point runs beside the end of the upload (a streamed
    save's CAS write, spec §5.6), so the kill waits until the provider
    holds v1, which it then must."""
    names = _names(v)
    eps = lab.start_eps(f"{up.label}-{name}", binary=EPS_FAILPOINTS_BIN, **config)
    doc = up.doc(name)
    first = eps.client()
    assert up.save(first, name, v.v0, None).succeeded
    first.close()
    assert up.held(lab, name)["sha256"] == sha(v.v0)

    eps.restart(env={"FAILPOINTS": f"{point}=sleep({HOLD_MS})"})
    relay = HoldingRelay(eps.device)
    device = relay.client(name)
    mark = log_seq(lab)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(up.save, device, name, v.v1, v.v0)
        eps.wait_at_fail_point(running, timeout=20)
        if settle:
            deadline = time.monotonic() + 20
            while up.held(lab, name)["sha256"] != sha(v.v1) and time.monotonic() < deadline:
                time.sleep(0.01)
        relay.hold()
        eps.kill()

        # The crash as it left things: never a third file, never a torn store.
        held = names.get(up.held(lab, name)["sha256"], "other")
        assert held in ("v0", "v1"), f"the provider holds {held} after a crash at {point}"
        store = read_store(eps.state / "store")
        assert store.problems == [], store.problems
        pointer = names.get(pointer_of(store, doc), "other")
        assert pointer in ("v0", "v1")
        # The pointer moves only after the provider's success (spec §5.5).
        assert pointer == "v0" or held == "v1"

        eps.restart()
        reopened = read_store(eps.state / "store")
        assert reopened.problems == [] and reopened.temporaries == [], (reopened.problems, reopened.temporaries)
        assert pointer_of(reopened, doc) == pointer_of(store, doc)
        relay.release()
        out = running.result(timeout=60)
    uploads = sum(1 for e in provider_requests_since(lab, mark) if e.get("body_sha256") == sha(v.v1))
    if isinstance(out, p.AppError):
        # The EPS died after the procedure started (its in-flight marker
        # survived): the retry is answered "outcome unknown" at stage 1,
        # never performed a second time (§5.4), and the device answers the
        # app 504. The app's own retry is a new request, and succeeds.
        assert out.status == 504 and out.error is not None and out.error.code == "provider_timeout", out
        retry = "outcome unknown (504)"
        again = up.save(device, name, v.v1, v.v0)
        assert isinstance(again, p.ProviderResponse) and again.succeeded, again
    else:
        assert isinstance(out, p.ProviderResponse) and out.succeeded, f"the device's retry after a crash at {point}: {out!r}"
        retry = "replayed" if out.replayed else f"performed ({out.status})"
    assert up.held(lab, name)["sha256"] == sha(v.v1)

    unknown_before = eps.metric("ec_eps_base_unknown_total")
    nxt = up.save(device, name, v.v2, v.v1)
    assert isinstance(nxt, p.ProviderResponse) and nxt.succeeded, nxt
    assert up.held(lab, name)["sha256"] == sha(v.v2)
    after = read_store(eps.state / "store")
    assert after.problems == [] and names.get(pointer_of(after, doc)) == "v2"
    next_edit = "patch" if eps.metric("ec_eps_base_unknown_total") == unknown_before else "full (base_unknown)"
    device.close()
    relay.close()
    eps.stop()
    return CrashReport(point, held, pointer, len(store.temporaries), retry, uploads, next_edit)


# ---------------------------------------------------------------- the steps of a save

#: Each step of a save that keeps the order of spec §5.1 (an upload
#: session; also a FULL item), in order, with the version the provider must
#: hold when the EPS dies there.
SAVE_STEPS = [
    ("eps::before_rebuild", "v0"),
    ("store::blob_after_temp_write", "v0"),  # step 9: the rebuilt file enters the CAS
    ("store::blob_after_temp_fsync", "v0"),
    ("store::blob_after_rename", "v0"),
    ("store::blob_before_dir_fsync", "v0"),
    ("eps::after_rebuild", "v0"),
    ("providers::before_first_request", "v0"),
    ("providers::mid_upload", "v0"),  # a chunk accepted, the session never finished
    ("providers::after_response", "v1"),
    ("eps::after_provider", "v1"),
    ("store::pointer_after_temp_write", "v1"),  # step 11: the pointer moves
    ("store::pointer_after_temp_fsync", "v1"),
    ("store::pointer_after_rename", "v1"),
    ("store::pointer_before_dir_fsync", "v1"),
]

#: Steps after the EPS wrote the save's in-flight marker (step 10 began).
STARTED = {"providers::before_first_request", "providers::mid_upload", "providers::after_response", "eps::after_provider",
           "store::pointer_after_temp_write", "store::pointer_after_temp_fsync"}

#: Each step of a streamed save (spec §5.6: SINGLE, one PATCH item): the
#: marker is written and the request started before the rebuild is done;
#: the tail of the body waits for the file's hash; the CAS write runs while
#: the provider takes the tail and answers (those steps `settle`: the kill
#: waits for the provider to hold v1).
STREAMED_STEPS = [
    ("eps::before_rebuild", "v0"),  # headers and base checked, nothing sent, no marker
    ("providers::before_first_request", "v0"),  # the marker is written
    ("eps::mid_rebuild", "v0"),  # the first piece of the file handed to the upload
    ("providers::mid_upload", "v0"),  # half the body sent, the rest never comes
    ("eps::after_rebuild", "v0"),  # verified; the held-back tail has not left
    ("store::blob_after_temp_write", "v1"),  # step 9, beside the tail and the provider's answer
    ("store::blob_after_temp_fsync", "v1"),
    ("store::blob_after_rename", "v1"),
    ("store::blob_before_dir_fsync", "v1"),
    ("providers::after_response", "v1"),
    ("eps::after_provider", "v1"),
    ("store::pointer_after_temp_write", "v1"),  # step 11: the pointer moves
    ("store::pointer_after_temp_fsync", "v1"),
    ("store::pointer_after_rename", "v1"),
    ("store::pointer_before_dir_fsync", "v1"),
]

STREAMED_STARTED = {pt for pt, _ in STREAMED_STEPS} - {"eps::before_rebuild", "store::pointer_after_rename",
                                                     "store::pointer_before_dir_fsync"}
#: Steps that run beside the end of the upload.
SETTLE = {"store::blob_after_temp_write", "store::blob_after_temp_fsync", "store::blob_after_rename",
          "store::blob_before_dir_fsync"}

CASES = [("single", pt, exp) for pt, exp in STREAMED_STEPS] + [("session", pt, exp) for pt, exp in SAVE_STEPS]


@pytest.mark.parametrize("provider", ["dropbox", "graph"])
@pytest.mark.parametrize("style,point,expected", CASES, ids=[f"{st}-{pt}" for st, pt, _ in CASES])
def test_kill_at_every_step_of_a_save(lab, docs, provider, style, point, expected):
    """A SINGLE save of a patch is streamed (§5.6); an upload session keeps §5.1's order."""
    up = Uploader(provider, style, token=f"crash-{provider}")
    streamed = style == "single"
    config = {} if streamed else {"upstream": SESSION_CHUNKS}
    r = crash_one_save(lab, docs, up, f"{style}-{point.replace('::', '-')}", point, settle=streamed and point in SETTLE, **config)
    print(r)
    assert r.provider_after_kill == expected
    started = STREAMED_STARTED if streamed else STARTED
    if r.pointer_after_kill == "v1":
        # The outcome record persisted with the pointer answers the retry (§5.4).
        assert r.retry == "replayed"
    elif point in started:
        # The procedure had started: the retry is never performed again.
        assert r.retry == "outcome unknown (504)"
    else:
        # Nothing had reached the provider: the retry performs the save.
        assert r.retry.startswith("performed")
    if streamed:
        # The whole of v1 in one request: at most the one the provider took before the crash, or the retry's.
        if r.pointer_after_kill == "v1" or point not in started:
            assert r.uploads_of_v1 == 1
        else:
            assert r.uploads_of_v1 == (1 if expected == "v1" else 0)


# ---------------------------------------------------------------- upload sessions

#: Small chunks, so that the ~380 kB documents take several provider
#: requests: Dropbox's (any size) and Graph's smallest fragment (320 KiB).
SESSION_CHUNKS = {"dropbox_chunk": 65536, "graph_fragment": 327680}

@pytest.mark.parametrize("provider", ["dropbox", "graph"])
@pytest.mark.parametrize("point,expected", [("providers::mid_upload", "v0"), ("providers::after_response", "v1")])
def test_kill_during_an_upload_session(lab, docs, provider, point, expected):
    """`providers::mid_upload` holds a session save after its first chunk or
    fragment was accepted: the provider has an open session with part of
    the file, which must never become the file."""
    up = Uploader(provider, "session", token=f"crash-{provider}")
    r = crash_one_save(lab, docs, up, "session-" + point.replace("::", "-"), point, upstream=SESSION_CHUNKS)
    print(r)
    assert r.provider_after_kill == expected


#: Provider-side faults on the requests that feed an upload session.
SESSION_FAULTS = [
    ("dropbox", "upload_session/append_v2", {"kind": "status", "status": 503}),
    ("dropbox", "upload_session/append_v2", {"kind": "drop", "when": "before"}),
    ("dropbox", "upload_session/append_v2", {"kind": "drop", "when": "after"}),
    ("dropbox", "upload_session/finish", {"kind": "drop", "when": "before"}),
    ("graph", "upload_fragment", {"kind": "status", "status": 503}),
    ("graph", "upload_fragment", {"kind": "drop", "when": "before"}),
    ("graph", "upload_fragment", {"kind": "drop", "when": "after"}),
    ("graph", "upload_fragment", {"kind": "truncate"}),
]


@pytest.mark.parametrize("provider,route,fault", [
    pytest.param(pr, r, f, id=f"{pr}-{r.rsplit('/', 1)[-1]}-{'-'.join(str(x) for x in f.values())}")
    for pr, r, f in SESSION_FAULTS])
def test_provider_fault_mid_session_never_leaves_a_partial_file(lab, docs, clean_faults, provider, route, fault):
    names = _names(docs)
    up = Uploader(provider, "session", token=f"fault-{provider}")
    name = f"{route.rsplit('/', 1)[-1]}-{'-'.join(str(x) for x in fault.values())}.docx"
    eps = lab.start_eps(f"fault-{provider}-{name}", upstream=SESSION_CHUNKS)
    doc = up.doc(name)
    client = eps.client()
    assert up.save(client, name, docs.v0, None).succeeded

    lab.providers.fault(provider=provider, route=route, method="*", count=1, **fault)
    out = up.save(client, name, docs.v1, docs.v0)
    held = names.get(up.held(lab, name)["sha256"], "other")
    print(provider, route, fault, "->", out if not isinstance(out, p.ProviderResponse) else (out.status, out.body[:120]), "; provider holds", held)
    assert held in ("v0", "v1")
    ok = isinstance(out, p.ProviderResponse) and out.succeeded
    # A success the app sees means the provider holds the new file, and a
    # failure it sees means the app will save again: the provider holds the
    # old one, unless its answer was lost after the commit (drop "after").
    assert held == "v1" if ok else (held == "v0" or fault.get("when") == "after"), (out, held)
    if not ok:
        assert isinstance(out, (p.ProviderResponse, p.AppError)), f"a stage-1 failure must not take the direct path: {out!r}"
    store = read_store(eps.state / "store")
    assert store.problems == [] and store.temporaries == []
    assert names.get(pointer_of(store, doc)) == ("v1" if ok else "v0")

    lab.providers.clear_faults()
    again = up.save(client, name, docs.v1, docs.v0)
    assert isinstance(again, p.ProviderResponse) and again.succeeded, again
    assert up.held(lab, name)["sha256"] == sha(docs.v1)
    assert names.get(pointer_of(read_store(eps.state / "store"), doc)) == "v1"
    client.close()
    eps.stop()


# ---------------------------------------------------------------- exactly-once across a crash


def test_retry_after_a_crash_past_the_provider_is_not_performed_again(lab, docs):
    """A Graph simple upload conditional on the v0 eTag (as OneDrive clients
    send it) is crashed at `eps::after_provider`: the provider has v1. The
    device's retry with the same request_id must not be performed again
    (performed again, it would meet the new eTag and the app would see a
    conflict with its own save, the case §5.4's rationale names): the EPS's
    in-flight marker makes it answer "outcome unknown", stage 1, and the
    device answers the app 504."""
    from .e2e import auth

    up = Uploader("graph", "single", token="once-graph")
    name = "conditional.docx"
    eps = lab.start_eps("once-graph", binary=EPS_FAILPOINTS_BIN)
    first = eps.client()
    created = up.save(first, name, docs.v0, None)
    assert created.succeeded
    first.close()
    etag = json.loads(created.body)["eTag"]
    request = p.ProviderRequest("PUT", up._graph_url(name, "content"),
                                [auth(up.token), ("Content-Type", "application/octet-stream"), ("If-Match", etag)])

    eps.restart(env={"FAILPOINTS": f"eps::after_provider=sleep({HOLD_MS})"})
    relay = HoldingRelay(eps.device)
    device = relay.client(name)
    mark = log_seq(lab)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(device.save, p.SINGLE, [request], [p.make_item(docs.v1, up.doc(name), docs.v0)])
        eps.wait_at_fail_point(running, timeout=20)
        relay.hold()
        eps.kill()
        assert up.held(lab, name)["sha256"] == sha(docs.v1)
        eps.restart()
        relay.release()
        out = running.result(timeout=60)
    device.close()
    relay.close()
    eps.stop()
    assert up.held(lab, name)["sha256"] == sha(docs.v1)
    assert isinstance(out, p.AppError) and out.status == 504, out
    assert out.error is not None and out.error.code == "provider_timeout" and out.error.stage == 1, out.error
    puts = [e for e in provider_requests_since(lab, mark) if e.get("body_sha256") == sha(docs.v1)]
    assert len(puts) == 1, f"the save reached the provider {len(puts)} times"


def test_a_save_whose_task_panics_past_the_provider_is_not_sent_again(lab, docs):
    """A bug that ends a save's task after the provider got the upload (a
    `panic` at `eps::after_provider`, which tokio contains in the task) must
    not let the device take the direct path. Before, the EPS answered such a
    request with an unauthenticated `internal` error, which the device's
    client takes, for a save it sent, as "not performed": `Fallback`, and the
    device proxy then sent the app's upload to the provider a second time.
    Now the EPS closes the connection without an answer; the client asks
    again with the same request_id (§7.1), and the save's claim, settled when
    its task ended, answers "outcome unknown", stage 1: the app gets 504 and
    the provider holds the file once."""
    from .e2e import auth

    up = Uploader("graph", "single", token="panic-graph")
    name = "panics.docx"
    eps = lab.start_eps("panic-graph", binary=EPS_FAILPOINTS_BIN)
    first = eps.client()
    assert up.save(first, name, docs.v0, None).succeeded
    first.close()
    request = p.ProviderRequest("PUT", up._graph_url(name, "content"), [auth(up.token), ("Content-Type", "application/octet-stream")])
    eps.restart(env={"FAILPOINTS": "eps::after_provider=panic"})
    mark = log_seq(lab)
    device = eps.client()
    out = device.save(p.SINGLE, [request], [p.make_item(docs.v1, up.doc(name), docs.v0)])
    device.close()
    eps.stop()
    assert up.held(lab, name)["sha256"] == sha(docs.v1)
    assert isinstance(out, p.AppError), f"the device would send the file again: {out!r}"
    assert out.status == 504 and out.error is not None and out.error.code == "provider_timeout" and out.error.stage == 1, out
    puts = [e for e in provider_requests_since(lab, mark) if e.get("body_sha256") == sha(docs.v1)]
    assert len(puts) == 1, f"the save reached the provider {len(puts)} times"


# ---------------------------------------------------------------- exactly-once when no record was kept


class _FixedRequestId:
    """Makes the device's client choose `rid` as the request id of its next
    saves (it draws request ids with os.urandom(8)), so that a test can send
    "the same app request" again from a new client after a restart."""

    def __init__(self, rid: bytes) -> None:
        import ec_protocol.client as c

        self.module, self.rid = c, rid

    def __enter__(self):
        real = self.module.os
        rid = self.rid

        class _Os:
            def __getattr__(self, name):
                return getattr(real, name)

            @staticmethod
            def urandom(n: int) -> bytes:
                return rid if n == 8 else real.urandom(n)

        self.real = real
        self.module.os = _Os()
        return self

    def __exit__(self, *exc) -> None:
        self.module.os = self.real


def _uploads(lab, mark: int, data: bytes) -> int:
    return sum(1 for e in provider_requests_since(lab, mark) if e.get("body_sha256") == sha(data))


@pytest.mark.parametrize("case", ["provider-409", "record-replaced"])
def test_retry_after_restart_of_a_save_whose_record_was_not_kept(lab, docs, clean_faults, case):
    """The EPS performed a save (the provider received the upload) but kept
    no outcome record that a retry after a restart can find: the provider
    answered 409 (a non-2xx answer moves no pointer, so no record is
    persisted), or a later save of the same document replaced the record.
    The EPS is then SIGKILLed and restarted, and the device sends the same
    request (same request_id) again. It must get the recorded answer or
    "outcome unknown" (provider_timeout, stage 1), and the provider must
    receive the upload exactly once (spec §5.4). Before the fix the EPS
    removed its in-flight marker after any provider response, so the retry
    found nothing and uploaded a second time. (A response with set-cookie,
    also never persisted, takes the same path; the test servers set no
    cookies.)"""
    up = Uploader("dropbox", "single", token=f"unkept-{case}")
    name = f"unkept-{case}.docx"
    eps = lab.start_eps(f"unkept-{case}")
    client = eps.client(retry_window=2.0)
    assert up.save(client, name, docs.v0, None).succeeded
    rid = b"\x5a" * 7 + bytes([len(case)])
    mark = log_seq(lab)
    if case == "provider-409":
        lab.providers.fault(provider="dropbox", route="upload", method="*", count=1, kind="status", status=409)
        with _FixedRequestId(rid):
            first = up.save(client, name, docs.v1, docs.v0)
        assert isinstance(first, p.ProviderResponse) and first.status == 409, first
        lab.providers.clear_faults()
    else:
        with _FixedRequestId(rid):
            first = up.save(client, name, docs.v1, docs.v0)
        assert isinstance(first, p.ProviderResponse) and first.succeeded, first
        # The next edit, a new request, replaces the document's outcome record.
        assert up.save(client, name, docs.v2, docs.v1).succeeded
        assert up.held(lab, name)["sha256"] == sha(docs.v2)
    assert _uploads(lab, mark, docs.v1) == 1
    client.close()
    held = up.held(lab, name)["sha256"]

    eps.kill()
    eps.restart()
    again_client = eps.client(retry_window=2.0)
    with _FixedRequestId(rid):
        again = up.save(again_client, name, docs.v1, docs.v0)
    again_client.close()
    uploads = _uploads(lab, mark, docs.v1)
    print(case, "retry after restart ->", again if not isinstance(again, p.ProviderResponse) else (again.status, again.replayed),
          "; uploads of v1:", uploads)
    assert uploads == 1, f"the provider received the upload {uploads} times"
    assert up.held(lab, name)["sha256"] == held
    if isinstance(again, p.ProviderResponse):
        assert again.replayed, again
    else:
        assert isinstance(again, p.AppError) and again.status == 504, again
        assert again.error is not None and again.error.code == "provider_timeout" and again.error.stage == 1, again.error
    # The markers are kept, bounded by age: one per save of the last 16 minutes.
    assert 1 <= len(list((eps.state / "inflight").iterdir())) <= 3
    eps.stop()
