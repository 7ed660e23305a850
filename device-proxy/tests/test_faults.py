"""The fault suite of issue 4 ("zero lost edits"): an app saving office
documents through the real device proxy (`ec-proxy`) while the EPS is away
or killed at each step of a save, the link to the EPS is cut mid-request,
the provider fails, or two devices edit the same document.

Every part is the real one: the app is `http.client` sending the providers'
mobile-app request shapes through the proxy (CONNECT, trusting the proxy's
CA), the EPS is the `ec-eps` binary (the fail-point build where a crash is
placed), the provider is the testbed. After every scenario the test checks
the promise of the issue: the provider holds a version the app uploaded
(never a third one), and the app's next save works.

How a crash is placed is explained in eps/tests/test_crash.py: the
fail-point EPS sleeps at the chosen step, the test sees the sleeping thread
(/proc/<pid>/task/*/wchan) and SIGKILLs the process. Unlike there, the
device here is the proxy, which on a connection failure after sending
asks the EPS again with the same request id (§7.1) until it answers or the
retry window passes; it never takes the direct path then. The test
restarts the EPS at once: the retry is performed (nothing had reached the
provider), answered from the outcome record, or answered "outcome unknown"
(504). test_crash_retry.py restarts it after longer delays.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import pytest

from testbed.lab import EPS_FAILPOINTS_BIN, Eps, Lab, Proxy
from testbed.providers.hashes.dropbox import dropbox_content_hash

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".cache" / "traces"

pytestmark = pytest.mark.skipif(not (TRACES / "writer-1m-start-docx" / "base.docx").exists(),
                                reason="needs the LibreOffice traces (make traces)")

#: How long a fail point holds the save: far longer than any test waits.
HOLD_MS = 60_000


from app_client import (  # noqa: E402  (the app side, shared with the other end-to-end tests)
    DROPBOX_UPLOAD, Reply, Send, Versions, dropbox_upload, proxy_status, trace_versions, onedrive_put, sha, straight, through,
)


def dropbox_session(send: Send, token: str, path: str, data: bytes, chunk: int = 150_000) -> Reply:
    """The Dropbox apps' upload session: start with the first chunk,
    append_v2 the middle ones, finish with the last and the commit. The
    first failing step's answer is returned (apps give up there)."""
    head = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] or [b""]
    base = "https://content.dropboxapi.com/2/files/upload_session/"
    r = send("POST", base + "start", {**head, "Dropbox-API-Arg": json.dumps({"close": False})}, pieces[0])
    if r[0] != 200:
        return r
    sid, offset = json.loads(r[2])["session_id"], len(pieces[0])
    for p in pieces[1:-1]:
        cursor = {"session_id": sid, "offset": offset}
        r = send("POST", base + "append_v2", {**head, "Dropbox-API-Arg": json.dumps({"cursor": cursor, "close": False})}, p)
        if r[0] != 200:
            return r
        offset += len(p)
    last = pieces[-1] if len(pieces) > 1 else b""
    arg = {"cursor": {"session_id": sid, "offset": offset},
           "commit": {"path": path, "mode": "overwrite", "autorename": False, "mute": False}}
    return send("POST", base + "finish", {**head, "Dropbox-API-Arg": json.dumps(arg)}, last)


#: The three upload shapes of the suite: name -> (provider, upload function).
SHAPES: dict[str, tuple[str, Callable[[Send, str, str, bytes], Reply]]] = {
    "dropbox-single": ("dropbox", dropbox_upload),
    "dropbox-session": ("dropbox", dropbox_session),
    "graph-put": ("graph", onedrive_put),
}


def ok(reply: Reply) -> bool:
    return 200 <= reply[0] < 300


# ---------------------------------------------------------------- what the provider and the proxy hold


def held(lab: Lab, provider: str, token: str, path: str) -> Optional[str]:
    """SHA-256 of the file the provider holds at `path` for `token`, or None."""
    for f in lab.providers.files(provider):
        if f["account"] == token and f["path"].lower() == path.lower():
            return f["sha256"]
    return None


def log_seq(lab: Lab) -> int:
    entries = lab.providers.log()
    return entries[-1]["seq"] if entries else 0


def uploads_since(lab: Lab, mark: int, body: bytes) -> int:
    """Provider requests since `mark` that carried the whole of `body`."""
    want = sha(body)
    return sum(1 for e in lab.providers.log() if e["seq"] > mark and e.get("body_sha256") == want)


def doc_status(proxy: Proxy, path: str) -> dict:
    """The proxy's statistics of the document at `path` (Graph keys it as `root:{path}:`)."""
    docs = [d for d in proxy_status(proxy)["documents"] if d["ref"].lower() in (path.lower(), f"root:{path.lower()}:")]
    assert docs, f"the proxy's status knows no {path}"
    return docs[0]


# ---------------------------------------------------------------- documents


@pytest.fixture(scope="module")
def docs() -> Versions:
    """Three saves of a ~380 kB .docx: over 256 KiB, so a SINGLE body spans
    two of the EPS's send frames and `providers::mid_upload` falls inside it."""
    v = trace_versions("writer-1m-start-docx", "writer-1m-middle-docx")
    assert len({v.v0, v.v1, v.v2}) == 3 and len(v.v1) > 256 * 1024
    return v


# ---------------------------------------------------------------- the lab




def assert_next_save_works(lab: Lab, send: Send, shape: str, token: str, path: str, data: bytes) -> None:
    provider, upload = SHAPES[shape]
    r = upload(send, token, path, data)
    assert ok(r), r
    assert held(lab, provider, token, path) == sha(data)


# ---------------------------------------------------------------- the EPS killed at each step


#: The steps of a save, in order (eps/tests/test_crash.py has the store's own steps too).
STEPS = ["eps::before_rebuild", "eps::after_rebuild", "providers::before_first_request", "providers::mid_upload",
         "providers::after_response", "eps::after_provider"]


@pytest.fixture(scope="module")
def crash_eps(lab) -> Eps:
    if not EPS_FAILPOINTS_BIN.exists():
        pytest.skip("needs .venv/bin/ec-eps-failpoints (make eps-failpoints)")
    # Small provider chunks: a collapsed session takes several provider requests, so `mid_upload` is truly mid-file.
    return lab.start_eps("crash-user", binary=EPS_FAILPOINTS_BIN, upstream={"dropbox_chunk": 65536, "graph_fragment": 327680})


@pytest.fixture(scope="module")
def crash_proxy(lab, crash_eps) -> Proxy:
    return lab.start_proxy("crash-laptop", crash_eps)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("point", STEPS)
def test_eps_killed_at_each_step_loses_no_edit(lab, docs, crash_eps, crash_proxy, shape, point):
    provider, upload = SHAPES[shape]
    send = through(crash_proxy)
    token, path = f"crash-{shape}", f"/crash/{point.replace('::', '-')}.docx"
    if crash_eps.proc is None or crash_eps.proc.poll() is not None:
        crash_eps.restart()
    assert ok(upload(send, token, path, docs.v0))
    assert held(lab, provider, token, path) == sha(docs.v0)

    crash_eps.restart(env={"FAILPOINTS": f"{point}=sleep({HOLD_MS})"})
    mark = log_seq(lab)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(upload, send, token, path, docs.v1)
        crash_eps.wait_at_fail_point(running)
        crash_eps.kill()
        crash_eps.restart()
        answer = running.result(timeout=120)
    now = docs.name(held(lab, provider, token, path))
    print(f"{shape} killed at {point}: app got {answer[0]}, provider holds {now}")
    # The app gets the provider's answer (through the restarted EPS) or
    # 502/504; never a third version, never a second upload.
    assert ok(answer) or answer[0] in (502, 504), answer
    assert now in ("v0", "v1")
    if ok(answer):
        assert now == "v1", "the app was told its save succeeded"
    assert uploads_since(lab, mark, docs.v1) <= 1
    # The app's retry is a new request, as apps make them.
    r = upload(send, token, path, docs.v1)
    assert ok(r), r
    assert held(lab, provider, token, path) == sha(docs.v1)
    # The next edit goes through the EPS as a patch and lands whole.
    r = upload(send, token, path, docs.v2)
    assert ok(r), r
    assert held(lab, provider, token, path) == sha(docs.v2)
    st = doc_status(crash_proxy, path)
    assert st["last_how"] == "patch", st


# ---------------------------------------------------------------- the EPS not running


@pytest.mark.parametrize("shape", list(SHAPES))
def test_eps_not_running_means_direct_and_back_via_the_eps_after(lab, small, shape):
    provider, upload = SHAPES[shape]
    eps = lab.start_eps(f"away-{shape}")
    proxy = lab.start_proxy(f"away-{shape}", eps)
    send = through(proxy)
    token, path = f"away-{shape}", "/away/notes.docx"
    try:
        assert ok(upload(send, token, path, small.v0))
        eps.stop()
        r = upload(send, token, path, small.v1)
        assert ok(r), r
        assert held(lab, provider, token, path) == sha(small.v1)
        assert doc_status(proxy, path)["last_how"] == "direct"
        eps.restart()
        r = upload(send, token, path, small.v2)
        assert ok(r), r
        assert held(lab, provider, token, path) == sha(small.v2)
        assert doc_status(proxy, path)["last_how"] in ("patch", "full")
    finally:
        proxy.stop()
        eps.stop()


# ---------------------------------------------------------------- the link to the EPS cut mid-request


class CuttingRelay:
    """A plain TCP relay between the proxy and the EPS that cuts the link
    in the middle of SAVE exchanges, as a Wi-Fi drop does.

    `cut_requests = n`: the next n SAVE requests are forwarded up to half
    their body, then both sides are closed (the EPS never gets the whole
    request). `cut_responses = n`: the next n SAVE requests go through
    whole, and their answers are cut after a few bytes (the EPS performed
    the save; the device cannot know)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.cut_requests = 0
        self.cut_responses = 0
        self.cuts = 0
        self.saves = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()

    def _take(self, what: str) -> bool:
        with self.lock:
            left = getattr(self, what)
            if left > 0:
                setattr(self, what, left - 1)
                self.cuts += 1
                return True
            return False

    def _accept(self) -> None:
        while True:
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
        state = {"cut_response": False}
        threading.Thread(target=self._answers, args=(up, down, state), daemon=True).start()
        self._requests(down, up, state)

    @staticmethod
    def _shut(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _requests(self, down: socket.socket, up: socket.socket, state: dict) -> None:
        pending, body_left, cut_left = b"", 0, None
        try:
            while data := down.recv(65536):
                pending += data
                out = bytearray()
                while pending:
                    if body_left:
                        n = min(body_left, len(pending))
                        out += pending[:n]
                        pending, body_left = pending[n:], body_left - n
                        continue
                    end = pending.find(b"\r\n\r\n")
                    if end < 0:
                        break
                    head, pending = pending[:end + 4], pending[end + 4:]
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    out += head
                    body_left = length
                    if head.startswith(b"POST /ec/1/save "):
                        self.saves += 1
                        if self._take("cut_requests"):
                            cut_left = len(out) + length // 2
                        elif self._take("cut_responses"):
                            state["cut_response"] = True
                if cut_left is not None:
                    up.sendall(bytes(out[:cut_left]))
                    cut_left -= min(cut_left, len(out))
                    if cut_left == 0:
                        break
                    continue
                up.sendall(bytes(out))
        except OSError:
            pass
        self._shut(down, up)

    def _answers(self, up: socket.socket, down: socket.socket, state: dict) -> None:
        try:
            while data := up.recv(65536):
                if state["cut_response"]:
                    down.sendall(data[:12])
                    break
                down.sendall(data)
        except OSError:
            pass
        self._shut(down, up)


#: The proxy's retry window behind the cutting relay (spec §7.1; 30 s by default).
RELAY_RETRY_WINDOW = 3


@pytest.fixture
def relayed(lab, eps):
    """A proxy whose EPS link runs through a CuttingRelay (the proxy's --edge is the relay)."""
    relay = CuttingRelay(eps.device)
    name = f"relay-{time.monotonic_ns()}"
    # start_proxy reads only the Eps's address: the relay's stands in for it.
    proxy = lab.start_proxy(name, Eps(name="relay", state=Path("."), config_path=Path("."), device=relay.url.removeprefix("http://")),
                            "--eps-retry-window", str(RELAY_RETRY_WINDOW))
    yield relay, proxy
    proxy.stop()
    relay.close()


@pytest.mark.parametrize("shape", ["dropbox-single", "graph-put"])
@pytest.mark.parametrize("cut,times,answer,uploads", [
    # Cut once mid-body: the EPS never had the request; the retry (same request_id, new connection) performs it once.
    ("cut_requests", 1, "eps", 1),
    # Cut at every try: the device cannot know the EPS never had it; after the retry window the app gets 504, no direct upload.
    ("cut_requests", 99, 504, 0),
    # The answer cut once: the EPS performed the save; the retry is answered from its idempotency record.
    ("cut_responses", 1, "eps", 1),
    # The answer cut at every try: the EPS performed the save once; 504 after the window, never a second upload (§7.1).
    ("cut_responses", 99, 504, 1),
], ids=["request-once", "request-always", "answer-once", "answer-always"])
def test_link_cut_mid_request_loses_no_edit(lab, small, relayed, shape, cut, times, answer, uploads):
    relay, proxy = relayed
    provider, upload = SHAPES[shape]
    send = through(proxy)
    token, path = f"cut-{shape}", f"/cut/{cut}-{times}.docx"
    assert ok(upload(send, token, path, small.v0))
    mark = log_seq(lab)
    setattr(relay, cut, times)
    t0 = time.monotonic()
    r = upload(send, token, path, small.v1)
    waited = time.monotonic() - t0
    assert relay.cuts >= 1, "the relay never cut: the save did not go through the EPS"
    setattr(relay, cut, 0)
    assert uploads_since(lab, mark, small.v1) == uploads
    if answer == "eps":
        assert ok(r), r
        assert held(lab, provider, token, path) == sha(small.v1)
        st = doc_status(proxy, path)
        # Saved through the EPS, as a patch or whole (the link-aware rule's choice).
        assert st["last_how"] in ("patch", "full"), st
    else:
        assert r[0] == answer and r[2] == b"", r
        assert RELAY_RETRY_WINDOW <= waited < RELAY_RETRY_WINDOW + 20, waited
        assert held(lab, provider, token, path) == sha(small.v1 if uploads else small.v0)
        # Counted after the app's answer (the answer waits for no bookkeeping): read until it is there.
        assert eventually(lambda: proxy_status(proxy)["eps"]["counts"]["outcome_unknown"] >= 1), proxy_status(proxy)["eps"]
    assert_next_save_works(lab, send, shape, token, path, small.v2)
    st = doc_status(proxy, path)
    assert st["last_how"] == "patch", st


def test_a_session_finish_asked_again_after_an_unknown_outcome_uploads_once(lab, small, relayed):
    """A Dropbox upload session's finish whose answer the link loses every
    time: the app gets 504, the EPS performed the upload once. The app then
    sends its finish again (as the SDKs retry a 5xx): the device sends the
    same SAVE again, request id and all, and the EPS answers from its outcome
    record. Before, the device made a new SAVE of the session it still held,
    and the provider got the file a second time."""
    relay, proxy = relayed
    send = through(proxy)
    token, path = "cut-session-again", "/cut/session-again.docx"
    assert ok(dropbox_session(send, token, path, small.v0))
    finishes = []

    def keeping_the_finish(method, url, headers, body=b""):
        if url.endswith("/upload_session/finish"):
            finishes.append((method, url, headers, body))
        return send(method, url, headers, body)

    mark = log_seq(lab)
    relay.cut_responses = 99
    r = dropbox_session(keeping_the_finish, token, path, small.v1)
    assert r[0] == 504 and relay.cuts >= 1, r
    relay.cut_responses = 0
    assert held(lab, "dropbox", token, path) == sha(small.v1)  # the EPS did upload it
    again = send(*finishes[-1])
    assert ok(again), again
    assert json.loads(again[2])["content_hash"] == dropbox_content_hash(small.v1), again
    finishes_at_provider = [e for e in lab.providers.log()
                            if e["seq"] > mark and e["route"] == "upload_session/finish" and e["status"] == 200]
    assert len(finishes_at_provider) == 1, finishes_at_provider
    assert_next_save_works(lab, send, "dropbox-session", token, path, small.v2)


def test_an_upload_with_a_content_encoding_reaches_the_provider_as_the_app_sent_it(lab, small, proxy):
    """An upload whose body the app compressed (`Content-Encoding: gzip`):
    mitmproxy hands the addon the body decoded, and a save made of it sent
    the provider the plain file under the app's `Content-Encoding`, other
    bytes than the app's. It goes on untouched: the provider answers and
    keeps what it does without EdgeCourier."""
    gz = gzip.compress(small.v1)

    def gzipped(send: Send, token: str, path: str) -> Reply:
        arg = json.dumps({"path": path, "mode": "overwrite", "autorename": False, "mute": False})
        return send("POST", DROPBOX_UPLOAD, {"Authorization": f"Bearer {token}", "Dropbox-API-Arg": arg,
                                             "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, gz)

    path = "/encoded/report.docx"
    assert ok(dropbox_upload(through(proxy), "encoded", path, small.v0))  # a base: the next save could be a patch
    assert ok(dropbox_upload(straight(lab), "encoded-plain", path, small.v0))
    mark = log_seq(lab)
    via = gzipped(through(proxy), "encoded", path)
    plain = gzipped(straight(lab), "encoded-plain", path)
    assert via[0] == plain[0] == 200, (via, plain)
    answered = [json.loads(r[2]) for r in (via, plain)]
    assert [(a["content_hash"], a["size"], a["rev"]) for a in answered] == [(answered[1]["content_hash"], answered[1]["size"],
                                                                              answered[1]["rev"])] * 2, answered
    assert held(lab, "dropbox", "encoded", path) == held(lab, "dropbox", "encoded-plain", path), (via, plain)
    sent = [e for e in lab.providers.log() if e["seq"] > mark and e["route"] == "upload"]
    assert len(sent) == 2 and sent[0]["body_sha256"] == sent[1]["body_sha256"], sent  # the same body, as the provider read it


# ---------------------------------------------------------------- the provider failing


#: Per-request fields of error bodies (Graph innerError ids, Dropbox upload_session_id), new on every answer.
VOLATILE = {"request-id", "client-request-id", "date", "upload_session_id"}


def comparable(body: bytes) -> object:
    """A body with its per-request fields removed (a JSON body), else the bytes."""
    def strip(v: object) -> object:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in VOLATILE}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    try:
        return strip(json.loads(body))
    except ValueError:
        return body


def same_answer(through_ec: Reply, without_ec: Reply) -> None:
    """The app's answer through EdgeCourier equals the provider's answer to
    the same request sent with no EdgeCourier: status, body (but for
    per-request ids) and the headers an app acts on."""
    assert through_ec[0] == without_ec[0], (through_ec, without_ec)
    assert comparable(through_ec[2]) == comparable(without_ec[2]), (through_ec, without_ec)
    for h in ("retry-after", "content-type"):
        assert through_ec[1].get(h) == without_ec[1].get(h), (h, through_ec[1], without_ec[1])


#: The route of each shape that answers the app's final request.
FINAL_ROUTE = {"dropbox-single": "upload", "dropbox-session": "upload_session/finish", "graph-put": "simple_upload"}


@pytest.fixture(scope="module")
def direct_proxy(lab) -> Proxy:
    """A proxy whose EPS nobody runs: every save takes the direct path."""
    return lab.start_proxy("faults-no-eps", None)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("fault", [{"kind": "status", "status": 503, "retry_after": 4}, {"kind": "throttle", "retry_after": 7},
                                   {"kind": "status", "status": 500}], ids=["503", "429", "500"])
@pytest.mark.parametrize("path_kind", ["via-eps", "direct"])
def test_provider_failure_reaches_the_app_as_without_edgecourier(lab, small, proxy, direct_proxy, clean_faults, shape, fault, path_kind):
    provider, upload = SHAPES[shape]
    px = proxy if path_kind == "via-eps" else direct_proxy
    token, path = f"fail-{path_kind}-{shape}", f"/fail/{fault['kind']}-{fault.get('status', 429)}.docx"
    assert ok(upload(through(px), token, path, small.v0))
    assert ok(upload(straight(lab), token + "-plain", path, small.v0))

    spec = {"provider": provider, "route": FINAL_ROUTE[shape], "method": "*", "count": 1, **fault}
    lab.providers.fault(**spec)
    got = upload(through(px), token, path, small.v1)
    lab.providers.fault(**spec)
    plain = upload(straight(lab), token + "-plain", path, small.v1)
    assert not ok(got)
    same_answer(got, plain)
    assert held(lab, provider, token, path) == sha(small.v0), "a refused save changed the provider's file"
    if path_kind == "via-eps":
        assert doc_status(px, path)["last_how"] != "direct", "the save did not go through the EPS"

    # The app's retry goes through, and so does the next edit.
    assert_next_save_works(lab, through(px), shape, token, path, small.v1)
    assert_next_save_works(lab, through(px), shape, token, path, small.v2)


# ---------------------------------------------------------------- two devices, one document


def rev_of(reply: Reply) -> str:
    return json.loads(reply[2])["rev"]


def etag_of(reply: Reply) -> str:
    return json.loads(reply[2])["eTag"]


def update(rev: str) -> dict:
    return {".tag": "update", "update": rev}


def test_a_direct_upload_that_fails_leaves_no_pending_version(lab, small, clean_faults):
    """A save the EPS could not take goes directly, its version recorded as
    pending until the provider answers; the provider drops the connection
    instead, so the flow ends in an error and no answer. The pending version
    is let go then, as after a refusal. Before, it stayed until the proxy
    restarted: never evicted, counted in the store's size, it pushed the
    real bases out."""
    px = lab.start_proxy(f"faults-pending-{time.monotonic_ns()}", None)
    try:
        send = through(px)
        for n in range(3):
            lab.providers.fault(provider="dropbox", route="upload", method="*", count=1, kind="drop", when="before")
            r = dropbox_upload(send, "pending-leak", f"/pending/leak-{n}.docx", small.v1)
            assert r[0] == 502, r
        deadline = time.monotonic() + 10
        while proxy_status(px)["pending"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proxy_status(px)["pending"] == 0, proxy_status(px)
        assert ok(dropbox_upload(send, "pending-leak", "/pending/leak-0.docx", small.v1))
    finally:
        px.stop()


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether `check()` holds within `timeout` seconds (the proxy's store
    records are written after the app's answer)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("shape", ["dropbox-single", "dropbox-session"])
def test_an_unreadable_base_is_dropped_and_the_save_goes_whole_through_the_eps(lab, small, eps, shape):
    """The document's base fails to read with an I/O error of its own (a
    directory stands where its file was: EISDIR), neither missing nor
    corrupt. The device store drops it as it drops a corrupt one (deleted
    at once, counted in `status`, logged with its errno): the
    save goes whole through the EPS, once, the version the provider accepted
    becomes the base, and the next save is a patch again. Before, every read
    of it raised a store error: an upload session went directly (replayed),
    a single upload failed in the proxy and went directly unrecorded, and
    the unreadable base stayed, so every later save did the same."""
    provider, upload = SHAPES[shape]
    px = lab.start_proxy(f"faults-store-{time.monotonic_ns()}", eps)
    try:
        send = through(px)
        token, path = f"store-unreadable-{shape}", "/store/unreadable.docx"
        assert ok(upload(send, token, path, small.v0))
        assert eventually(lambda: doc_status(px, path)["held_bytes"] == len(small.v0))
        blob = px.state / "store" / "blobs" / sha(small.v0)[:2] / sha(small.v0)
        blob.unlink()
        blob.mkdir()  # reading it now fails with EISDIR: an I/O error, not a missing or corrupt file
        mark = log_seq(lab)
        r = upload(send, token, path, small.v1)
        assert ok(r), r
        assert json.loads(r[2])["content_hash"] == dropbox_content_hash(small.v1), r
        assert held(lab, provider, token, path) == sha(small.v1)
        assert uploads_since(lab, mark, small.v1) == 1
        assert eventually(lambda: doc_status(px, path)["held_bytes"] == len(small.v1)), doc_status(px, path)
        st = doc_status(px, path)
        assert (st["last_how"], st["saves"]) == ("full", 2), st
        assert proxy_status(px)["dropped"] == {"missing": 0, "corrupt": 0, "unreadable": 1}
        assert "cannot be read (EISDIR" in px.log_path.read_text()
        assert not blob.exists() and not (px.state / "store" / "quarantine").exists()  # deleted, nothing kept
        assert_next_save_works(lab, send, shape, token, path, small.v2)
        assert eventually(lambda: doc_status(px, path)["last_how"] == "patch"), doc_status(px, path)
    finally:
        px.stop()


@pytest.fixture(scope="module")
def second_proxy(lab, eps) -> Proxy:
    """A second device of the same user: its own state, the same EPS."""
    return lab.start_proxy("faults-phone", eps)


def two_devices(lab: Lab, proxy: Proxy, second_proxy: Proxy, first: str) -> tuple[Send, Send]:
    return (through(proxy) if first == "proxy" else straight(lab)), through(second_proxy)


@pytest.mark.parametrize("first", ["proxy", "direct"])
def test_two_devices_dropbox_update_conflict_as_without_edgecourier(lab, small, proxy, second_proxy, first):
    """Both devices hold rev r0; A saves with mode update r0 and wins; B's
    save with update r0 gets Dropbox's 409 exactly as it would without
    EdgeCourier, and the provider keeps A's version. B's next save (after
    learning the new rev, as the apps do) works."""
    a, b = two_devices(lab, proxy, second_proxy, first)
    token, path = f"conflict-{first}", "/shared/plan.docx"
    r0 = rev_of(dropbox_upload(a, token, path, small.v0))
    win = dropbox_upload(a, token, path, small.v1, mode=update(r0))
    assert ok(win), win
    lose = dropbox_upload(b, token, path, small.v2, mode=update(r0))

    # The same three requests with no EdgeCourier, on another file.
    plain = straight(lab)
    p0 = rev_of(dropbox_upload(plain, token, path + ".plain", small.v0))
    assert ok(dropbox_upload(plain, token, path + ".plain", small.v1, mode=update(p0)))
    expected = dropbox_upload(plain, token, path + ".plain", small.v2, mode=update(p0))
    assert expected[0] == 409
    assert lose[0] == 409 and json.loads(lose[2])["error_summary"].startswith("path/conflict")
    same_answer(lose, expected)
    assert held(lab, "dropbox", token, path) == sha(small.v1), "the winner's edit was lost"

    # B, told of the conflict, saves against the current rev: its edit lands.
    r = dropbox_upload(b, token, path, small.v2, mode=update(rev_of(win)))
    assert ok(r), r
    assert held(lab, "dropbox", token, path) == sha(small.v2)


@pytest.mark.parametrize("first", ["proxy", "direct"])
def test_two_devices_graph_if_match_conflict_as_without_edgecourier(lab, small, proxy, second_proxy, first):
    """Graph's optimistic concurrency: If-Match with a stale eTag is 412
    for the second writer, through EdgeCourier exactly as without it."""
    a, b = two_devices(lab, proxy, second_proxy, first)
    token, path = f"ifmatch-{first}", "/shared/budget.docx"
    e0 = etag_of(onedrive_put(a, token, path, small.v0))
    win = onedrive_put(a, token, path, small.v1, if_match=e0)
    assert ok(win), win
    lose = onedrive_put(b, token, path, small.v2, if_match=e0)

    plain = straight(lab)
    p0 = etag_of(onedrive_put(plain, token, path + ".plain.docx", small.v0))
    assert ok(onedrive_put(plain, token, path + ".plain.docx", small.v1, if_match=p0))
    expected = onedrive_put(plain, token, path + ".plain.docx", small.v2, if_match=p0)
    assert expected[0] == 412
    assert lose[0] == 412, lose
    same_answer(lose, expected)
    assert held(lab, "graph", token, path) == sha(small.v1), "the winner's edit was lost"

    r = onedrive_put(b, token, path, small.v2, if_match=etag_of(win))
    assert ok(r), r
    assert held(lab, "graph", token, path) == sha(small.v2)


# ---------------------------------------------------------------- a Dropbox batch with a failed entry


DROPBOX_SESSION_URL = "https://content.dropboxapi.com/2/files/upload_session/"
DROPBOX_BATCH_URL = "https://api.dropboxapi.com/2/files/upload_session/finish_batch_v2"


def dropbox_sessions(send: Send, token: str, files: list[bytes]) -> list[str]:
    """One closed upload session per file (start with the whole file): their ids."""
    ids = []
    for data in files:
        r = send("POST", DROPBOX_SESSION_URL + "start", {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream",
                                                         "Dropbox-API-Arg": json.dumps({"close": True})}, data)
        assert r[0] == 200, r
        ids.append(json.loads(r[2])["session_id"])
    return ids


def dropbox_finish_batch(send: Send, token: str, entries: list[tuple[str, int, str, object]]) -> Reply:
    """finish_batch_v2 of (session id, offset, path, mode) entries."""
    body = {"entries": [{"cursor": {"session_id": sid, "offset": offset},
                         "commit": {"path": path, "mode": mode, "autorename": False, "mute": False}}
                        for sid, offset, path, mode in entries]}
    return send("POST", DROPBOX_BATCH_URL, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                json.dumps(body).encode())


@pytest.mark.parametrize("path_kind", ["via-eps", "direct"])
def test_a_batch_entry_dropbox_refused_is_not_recorded_as_synced(lab, small, proxy, direct_proxy, path_kind):
    """A finish_batch_v2 of two files: Dropbox answers 200 and commits one,
    and refuses the other (its mode `update` names a rev another device
    replaced: a path conflict, `.tag: failure`). The app gets Dropbox's
    answer; the device records the committed file as that document's
    last-synced version and keeps the refused one's as it was. Before, the
    batch's 200 made both files last-synced versions, one of them a version
    the provider never held (the base of the document's next patch). The
    refused entry's session stays for the app's retry, as Dropbox keeps it."""
    assert len(small.v0) != len(small.v1)  # the held size tells which version the device holds
    px = proxy if path_kind == "via-eps" else direct_proxy
    send = through(px)
    token, a, b = f"batch-{path_kind}", "/batch/a.docx", "/batch/b.docx"
    assert ok(dropbox_upload(send, token, a, small.v0))
    r0 = rev_of(dropbox_upload(send, token, b, small.v0))
    assert ok(dropbox_upload(straight(lab), token, b, small.v2))  # another device replaces b

    sa, sb = dropbox_sessions(send, token, [small.v1, small.v1])
    r = dropbox_finish_batch(send, token, [(sa, len(small.v1), a, "overwrite"), (sb, len(small.v1), b, update(r0))])
    assert r[0] == 200, r
    entries = json.loads(r[2])["entries"]
    assert [e[".tag"] for e in entries] == ["success", "failure"], entries
    assert entries[1]["failure"]["path"][".tag"] == "conflict", entries
    assert held(lab, "dropbox", token, a) == sha(small.v1)
    assert held(lab, "dropbox", token, b) == sha(small.v2), "the refused entry changed the provider's file"
    assert eventually(lambda: doc_status(px, a)["held_bytes"] == len(small.v1)), doc_status(px, a)
    time.sleep(0.5)  # any record still queued after the answer
    assert doc_status(px, b)["held_bytes"] == len(small.v0), "a version the provider refused became b's last-synced one"

    # The app's retry of the refused entry, now overwriting, with the same session.
    r = dropbox_finish_batch(send, token, [(sb, len(small.v1), b, "overwrite")])
    assert r[0] == 200 and json.loads(r[2])["entries"][0][".tag"] == "success", r
    assert held(lab, "dropbox", token, b) == sha(small.v1)
    assert eventually(lambda: doc_status(px, b)["held_bytes"] == len(small.v1)), doc_status(px, b)
    assert_next_save_works(lab, send, "dropbox-single", token, b, small.v2)
