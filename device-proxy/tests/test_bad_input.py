"""Bad input from the network, through the real device proxy (issue 4):
a hostile or broken EPS answer, malformed provider responses, oversized
bodies, and traffic the proxy must not touch.

The hostile EPS is `HostileEps`, a small HTTP server that stands where the
proxy expects its EPS: it forwards each request to a real `ec-eps` and
spoils the answer (garbage, a flipped MAC, a truncated message, an
oversized body, a SAVE_RESULT MACed with another key), so the proxy meets
answers that look exactly like the real ones but for the fault. The
promise checked each time: the app is served (the provider's own answer,
or a 502/504 when the outcome cannot be known), the provider never holds
a file the app did not upload, the proxy logs why, and the next save works.

Helpers (the app's request shapes, what the provider holds) come from the
fault suite, test_faults.py.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import threading
from pathlib import Path
from typing import Optional

import pytest

import ec_protocol as ecp
from testbed.lab import Eps, Lab, Proxy

from app_client import Versions, dropbox_upload, onedrive_put, sha, straight, through, via_proxy
from test_faults import SHAPES, doc_status, held, log_seq, ok, same_answer, uploads_since

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".cache" / "traces"

pytestmark = pytest.mark.skipif(not (TRACES / "writer-100k-middle-docx" / "base.docx").exists(),
                                reason="needs the LibreOffice traces (make traces)")



def at(url: str) -> Eps:
    """An Eps record that only carries an address: `Lab.start_proxy` reads
    nothing else, so a proxy can be pointed at a test server."""
    return Eps(name="stand-in", state=Path("."), config_path=Path("."), device=url.removeprefix("http://"))


def proxy_log(proxy: Proxy) -> str:
    return proxy.log_path.read_text(errors="replace")


# ---------------------------------------------------------------- a hostile EPS


#: How HostileEps spoils an answer.
SPOILS = ["garbage", "flipped-mac", "truncated", "cut-connection", "oversized", "wrong-key"]
WRONG_KEY = bytes(range(100, 132))


class HostileEps:
    """Forwards each protocol request to the real EPS at `target` and
    spoils the answers to `path` (`/ec/hello` or `/ec/1/save`) the next
    `times` times in the way `spoil` names."""

    def __init__(self, target: str, path: str, spoil: str, times: int) -> None:
        self.target, self.path, self.spoil, self.times = target, path, spoil, times
        self.lock = threading.Lock()
        self.spoiled = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, answer = owner.forward(self.path, body)
                spoil = owner.take(self.path)
                if spoil is None:
                    return self.send(status, answer)
                if spoil == "cut-connection":
                    # The head promises the whole answer; half comes, then the connection closes.
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer[: len(answer) // 2])
                    self.close_connection = True
                    return
                self.send(status, owner.spoiled_answer(spoil, self.path, body, answer))

            def send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take(self, path: str) -> Optional[str]:
        with self.lock:
            if path != self.path or self.times <= 0:
                return None
            self.times -= 1
            self.spoiled += 1
            return self.spoil

    def forward(self, path: str, body: bytes) -> tuple[int, bytes]:
        host, port = self.target.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", path, body=body, headers={"Content-Length": str(len(body))})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    @staticmethod
    def spoiled_answer(spoil: str, path: str, request: bytes, answer: bytes) -> bytes:
        if spoil == "garbage":
            return os.urandom(max(64, len(answer)))
        if spoil == "truncated":
            return answer[: len(answer) // 2]
        if spoil == "oversized":
            # Over max_response_body (16 MiB) and any envelope: the genuine answer, then junk.
            return answer + bytes(17 << 20)
        req_mac = ecp.decode_message(request, path=path).mac
        msg = ecp.decode_message(answer, path=path)
        if spoil == "flipped-mac":
            msg.mac = bytes([msg.mac[0] ^ 1]) + msg.mac[1:]
            return msg.encode()
        if spoil == "wrong-key":
            # A well-formed answer whose MAC verifies, but with another key than the device's.
            return msg.encode(WRONG_KEY, req_mac)
        raise ValueError(spoil)


#: The proxies' retry window behind a hostile EPS (spec §7.1; 30 s by default).
HOSTILE_RETRY_WINDOW = 2


@pytest.fixture
def hostile(lab, eps, request):
    made: list = []

    def make(path: str, spoil: str, times: int) -> tuple[HostileEps, Proxy]:
        server = HostileEps(eps.device, path, spoil, times)
        px = lab.start_proxy(f"hostile-{len(made)}-{request.node.name}"[:80].replace("/", "-"), at(server.url),
                             "--eps-retry-window", str(HOSTILE_RETRY_WINDOW))
        made.append((server, px))
        return server, px

    yield make
    for server, px in made:
        px.stop()
        server.close()


@pytest.mark.parametrize("spoil", SPOILS)
def test_hostile_hello_answer_means_the_direct_path(lab, eps, small, hostile, spoil):
    """A spoiled HELLO answer is a stage-0 failure: the app's save goes to
    the provider directly and whole, and the EPS performs no save."""
    server, px = hostile("/ec/hello", spoil, 1000)
    token, path = f"hello-{spoil}", "/hostile/hello.docx"
    saves_before = eps.metric("ec_eps_requests_total", 'endpoint="save"')
    for v in (small.v0, small.v1):
        r = dropbox_upload(through(px), token, path, v)
        assert ok(r), r
        assert held(lab, "dropbox", token, path) == sha(v)
    assert server.spoiled >= 1
    assert eps.metric("ec_eps_requests_total", 'endpoint="save"') == saves_before, "a save reached the EPS"
    assert doc_status(px, path)["last_how"] == "direct"
    assert "goes directly" in proxy_log(px)


@pytest.mark.parametrize("shape", ["dropbox-single", "graph-put"])
@pytest.mark.parametrize("spoil", SPOILS)
def test_hostile_save_answer_never_corrupts_and_the_app_is_served(lab, eps, small, hostile, spoil, shape):
    """Every answer to the save spoiled: the proxy cannot trust any of them
    (§7: a response whose MAC fails is a transport failure), so the save's
    outcome is unknown: it asks again (same request_id) for the retry
    window, then answers the app 504 (§7.1), never taking the direct path.
    The provider took the app's file exactly once (the EPS's upload; the
    retries are answered from its outcome record)."""
    provider, upload = SHAPES[shape]
    server, px = hostile("/ec/1/save", spoil, 0)
    token, path = f"save-{spoil}-{shape}", "/hostile/save.docx"
    assert ok(upload(through(px), token, path, small.v0))
    mark = log_seq(lab)
    server.times = 1000
    r = upload(through(px), token, path, small.v1)
    server.times = 0
    assert server.spoiled >= 2, "the proxy did not ask again"
    assert r[0] == 504 and r[2] == b"", r
    assert held(lab, provider, token, path) == sha(small.v1)
    assert "goes directly" not in proxy_log(px)
    assert "did not answer again" in proxy_log(px)
    # Exactly one provider request carried a whole file: the app's, through the EPS.
    whole_uploads = [e for e in lab.providers.log() if e["seq"] > mark and e["body_size"] >= len(small.v0) // 2]
    assert len(whole_uploads) == 1 and whole_uploads[0]["body_sha256"] == sha(small.v1), whole_uploads
    # The next edit goes through the (now honest) EPS.
    r = upload(through(px), token, path, small.v2)
    assert ok(r), r
    assert held(lab, provider, token, path) == sha(small.v2)
    assert doc_status(px, path)["last_how"] in ("patch", "full")


@pytest.mark.parametrize("spoil", SPOILS)
def test_one_spoiled_save_answer_is_retried_and_replayed(lab, eps, small, hostile, spoil):
    """Only the first answer spoiled: the retry (same request_id) is
    answered from the EPS's idempotency record, so the provider took the
    file exactly once and the app gets the EPS's answer."""
    server, px = hostile("/ec/1/save", spoil, 0)
    token, path = f"once-{spoil}", "/hostile/once.docx"
    assert ok(dropbox_upload(through(px), token, path, small.v0))
    mark, replays = log_seq(lab), eps.metric("ec_eps_idempotent_replays_total")
    server.times = 1
    r = dropbox_upload(through(px), token, path, small.v1)
    assert server.spoiled == 1
    assert ok(r), r
    assert json.loads(r[2])["content_hash"] == next(
        f["provider_hash"]["content_hash"] for f in lab.providers.files("dropbox") if f["account"] == token)
    assert held(lab, "dropbox", token, path) == sha(small.v1)
    assert uploads_since(lab, mark, small.v1) == 1
    assert eps.metric("ec_eps_idempotent_replays_total") == replays + 1
    assert doc_status(px, path)["last_how"] in ("patch", "full")


# ---------------------------------------------------------------- malformed provider responses


def try_upload(send, *args) -> tuple[int, bytes]:
    """(status, body) of an upload; a body cut short by the server is
    reported as status -1 (what the app saw: the provider's broken answer)."""
    try:
        r = dropbox_upload(send, *args)
        return r[0], r[2]
    except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError) as e:
        return -1, repr(e).encode()


@pytest.fixture(scope="module")
def direct_proxy(lab) -> Proxy:
    return lab.start_proxy("bad-input-no-eps", None)


@pytest.mark.parametrize("path_kind", ["direct", "via-eps"])
def test_truncated_provider_answer(lab, small, proxy, direct_proxy, clean_faults, path_kind):
    """The provider stores the file and sends half its answer. On the direct
    path the app sees the provider's broken answer (cut short) or a 502; via
    the EPS, whose provider leg had started, a 502. Either way the provider
    holds the app's file and the next save works."""
    px = direct_proxy if path_kind == "direct" else proxy
    token, path = f"trunc-{path_kind}", "/trunc/a.docx"
    assert ok(dropbox_upload(through(px), token, path, small.v0))
    lab.providers.fault(provider="dropbox", route="upload", method="*", count=1, kind="truncate", truncate_at=20)
    status, body = try_upload(through(px), token, path, small.v1)
    lab.providers.fault(provider="dropbox", route="upload", method="*", count=1, kind="truncate", truncate_at=20)
    plain_status, _ = try_upload(straight(lab), token + "-plain", path, small.v1)
    print(f"{path_kind}: app got {status}; without EdgeCourier {plain_status}")
    assert plain_status == -1
    assert status in ((-1, 502) if path_kind == "direct" else (502,)), (status, body)
    assert held(lab, "dropbox", token, path) == sha(small.v1)
    # The app cannot know the save landed: it saves again, and then edits.
    for v in (small.v1, small.v2):
        r = dropbox_upload(through(px), token, path, v)
        assert ok(r), r
        assert held(lab, "dropbox", token, path) == sha(v)


# ---------------------------------------------------------------- oversized bodies


def test_uploads_over_the_store_bound_reach_the_provider_whole(lab, eps, small):
    """A store bound smaller than the file: the proxy cannot keep a base, so
    every save is whole (through the EPS or directly), and lands whole."""
    px = lab.start_proxy("tiny-store", eps, "--max-store", "1000")
    try:
        token, path = "tiny-store", "/big/a.docx"
        for v in (small.v0, small.v1, small.v2):
            r = dropbox_upload(through(px), token, path, v)
            assert ok(r), r
            assert held(lab, "dropbox", token, path) == sha(v)
        st = doc_status(px, path)
        assert st["patch_saves"] == 0 and st["saves"] == 3, st
    finally:
        px.stop()


#: EPS limits lowered under the documents' sizes, and how the proxy must then send them.
LIMITS = [({"max_patch_size": 100}, "full"), ({"max_item_size": 10_000}, "direct"), ({"max_envelope": 300}, "direct")]


def save_under_limits(lab: Lab, small: Versions, limits: dict, shape: str) -> dict:
    """Saves three versions through a proxy whose EPS has `limits`; checks
    each lands whole; returns the proxy's statistics of the document."""
    provider, upload = SHAPES[shape]
    name = f"{next(iter(limits))}-{shape}"
    low = lab.start_eps(f"limits-{name}", limits=limits)
    px = lab.start_proxy(f"limits-{name}", low)
    try:
        token, path = f"limits-{name}", "/limits/a.docx"
        for v in (small.v0, small.v1, small.v2):
            r = upload(through(px), token, path, v)
            assert ok(r), r
            assert held(lab, provider, token, path) == sha(v)
        return doc_status(px, path)
    finally:
        px.stop()
        low.stop()


@pytest.mark.parametrize("limits,how", LIMITS, ids=["patch-over-limit", "file-over-limit", "envelope-over-limit"])
@pytest.mark.parametrize("shape", ["dropbox-single", "graph-put"])
def test_uploads_over_the_eps_limits_reach_the_provider_whole(lab, small, limits, how, shape):
    st = save_under_limits(lab, small, limits, shape)
    if how == "direct":
        assert st["last_how"] == "direct" and st["direct_saves"] == 3, st


def test_a_patch_over_the_eps_limit_is_reported_as_a_whole_save(lab, small):
    st = save_under_limits(lab, small, {"max_patch_size": 100}, "dropbox-single")
    # The two edits crossed the link whole (~43 kB each), so they are not patch saves.
    assert st["patch_saves"] == 0 and st["last_how"] == "full", st


# ---------------------------------------------------------------- what the proxy must not touch


def test_non_office_files_pass_through_untouched(lab, eps, proxy):
    """A .txt and a .png uploaded with the office-document route: the
    provider gets the app's bytes, the EPS sees nothing."""
    saves_before = eps.metric("ec_eps_requests_total", 'endpoint="save"')
    for name, data in (("notes.txt", b"plain text\n" * 500), ("photo.png", b"\x89PNG\r\n\x1a\n" + os.urandom(20_000))):
        mark = log_seq(lab)
        r = dropbox_upload(through(proxy), "untouched", f"/misc/{name}", data)
        assert ok(r), r
        entries = [e for e in lab.providers.log() if e["seq"] > mark]
        assert [(e["route"], e["body_sha256"]) for e in entries] == [("upload", sha(data))], entries
        r = onedrive_put(through(proxy), "untouched", f"/misc/{name}", data)
        assert ok(r), r
        assert held(lab, "graph", "untouched", f"/misc/{name}") == sha(data)
    assert eps.metric("ec_eps_requests_total", 'endpoint="save"') == saves_before, "the EPS saw a non-office upload"


@pytest.mark.parametrize("method,url", [
    ("POST", "https://content.dropboxapi.com/2/files/upload_v9"),
    ("POST", "https://api.dropboxapi.com/2/files/get_metadata"),
    ("PATCH", "https://graph.microsoft.com/v1.0/me/drive/root:/odd/a.docx:"),
    ("POST", "https://graph.microsoft.com/v1.0/me/drive/root:/odd/a.docx:/unknownAction"),
], ids=["dropbox-unknown", "dropbox-metadata", "graph-patch", "graph-unknown"])
def test_unknown_provider_routes_pass_through_untouched(lab, eps, proxy, small, method, url):
    """Requests the recognisers do not know (even carrying a .docx body) go
    to the provider as sent; the app gets the provider's answer, exactly as
    without EdgeCourier; the EPS sees nothing."""
    body = small.v0 if "unknown" in url or "v9" in url else json.dumps({"path": "/odd/a.docx"}).encode()
    headers = {"Authorization": "Bearer odd-user", "Content-Type": "application/octet-stream" if body == small.v0 else "application/json",
               "Dropbox-API-Arg": json.dumps({"path": "/odd/a.docx", "mode": "overwrite"})}
    saves_before = eps.metric("ec_eps_requests_total", 'endpoint="save"')
    mark = log_seq(lab)
    got = via_proxy(proxy, method, url, headers, body)
    entries = [e for e in lab.providers.log() if e["seq"] > mark]
    assert len(entries) == 1 and entries[0]["body_sha256"] == sha(body) and entries[0]["method"] == method, entries
    plain = straight(lab)(method, url, headers, body)
    same_answer(got, plain)
    assert eps.metric("ec_eps_requests_total", 'endpoint="save"') == saves_before


@pytest.mark.parametrize("option,value,name", [("--keep-idle", "-1", "edgecourier_keep_idle"),
                                               ("--keep-idle", "90000", "edgecourier_keep_idle"),
                                               ("--eps-retry-window", "-5", "edgecourier_retry_window")])
def test_an_option_value_the_proxy_refuses_is_one_clear_line(tmp_path, option, value, name):
    """`ec-proxy run` with a value the addon refuses exits with one line
    naming the option, not a traceback, before it listens."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "ec_proxy", "run", "--edge", "http://127.0.0.1:9", "--secret", "ab" * 32,
                        "--plain-edge", "--port", "0", "--state", str(tmp_path), option, value],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and '"ready"' not in r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"ec-proxy run: {name} "), r.stderr
