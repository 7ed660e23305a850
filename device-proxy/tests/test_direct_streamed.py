"""A save the rule sends directly whatever its bytes is decided from its
head and streamed to the provider as it arrives (issue 13: a save through
EdgeCourier is never slower than the interception itself).

A plain mitmproxy reads a request's whole body before it sends any of it
on; so did ec-proxy, and then ran its hooks. For a single-request upload
whose size alone makes the rule send it directly, the proxy now forwards
the body while the app is still sending it, keeps the bytes, and records
them as the document's base once the provider accepted them.

The saves here are under 1 KiB (`MIN_DIFF_SIZE`): the rule sends them
directly whatever it has measured of the link (`too_small`), so the tests
do not depend on the loopback's speed as the proxy estimates it from one
exchange (a slow first exchange made it diff a 400 kB file instead).

The proxy's upstream connection runs through a counting relay here: while
the app holds back the end of its body, the first 1,000 bytes must already
have reached the relay (the request's head alone is well under that). A
proxy that reads whole bodies first forwards nothing until the app has
sent everything, and fails."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time

import pytest

import app_client as app
from testbed.lab import Lab, Proxy
from testbed.relay import Relay

TOKEN = "streamed-user"


class CountingRelay(Relay):
    """The testbed's relay, counting the bytes it passes towards its target
    (the proxy's upstream TLS stream)."""

    def __init__(self, target: int) -> None:
        super().__init__(("127.0.0.1", target))
        self.sent = 0
        self._lock = threading.Lock()

    def count(self) -> int:
        with self._lock:
            return self.sent

    def pass_on(self, state, upstream: bool, data: bytes, dst: socket.socket) -> None:
        if upstream:
            with self._lock:
                self.sent += len(data)
        dst.sendall(data)


@pytest.fixture(scope="module")
def relay(lab: Lab):
    r = CountingRelay(lab.providers.tls_port).start()
    yield r
    r.close()


@pytest.fixture(scope="module")
def proxy(lab: Lab, eps, relay: CountingRelay) -> Proxy:
    # hybrid: on the loopback no patch pays, so every save after a document's first goes directly.
    return lab.start_proxy("streamed-laptop", eps, "--decision", "hybrid", upstream_port=relay.port)


def _held(lab: Lab, path: str) -> dict:
    found = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
    assert found, f"the provider holds no {path}"
    return found[0]


def _doc_stats(proxy: Proxy, path: str) -> dict:
    return [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == path][0]


def _wait_for(predicate, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _recorded(proxy: Proxy, path: str, saves: int) -> dict:
    """The document's statistics once the proxy has recorded `saves` saves
    of it (its records are written after the app's answer)."""
    assert _wait_for(lambda: _doc_stats(proxy, path)["saves"] == saves), _doc_stats(proxy, path)
    return _doc_stats(proxy, path)


def _seed(lab: Lab, proxy: Proxy, path: str, size: int) -> None:
    """The document's first save: through the EPS (no base yet), so the proxy knows a base."""
    first = os.urandom(size)
    code, _, body = app.dropbox_upload(app.through(proxy), TOKEN, path, first)
    assert code == 200, body
    assert _recorded(proxy, path, 1)["last_how"] == "full"


def test_a_direct_save_streams_its_body_to_the_provider_as_it_arrives(lab, proxy, relay):
    path = "/streamed/report.docx"
    _seed(lab, proxy, path, 20_000)
    data = os.urandom(1_023)
    first = 1_000
    host, port = proxy.listen.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=str(proxy.ca)), timeout=60)
    conn.set_tunnel("content.dropboxapi.com", 443)
    try:
        conn.putrequest("POST", "/2/files/upload", skip_accept_encoding=True)
        for name, value in (("Authorization", f"Bearer {TOKEN}"), ("Dropbox-API-Arg", json.dumps({"path": path, "mode": "overwrite", "autorename": False, "mute": False})),
                            ("Content-Type", "application/octet-stream"), ("Content-Length", str(len(data)))):
            conn.putheader(name, value)
        conn.endheaders()
        before = relay.count()
        conn.send(data[:first])
        # The end is held back until the first bytes have gone on (or the wait is over).
        assert _wait_for(lambda: relay.count() - before >= first), (
            f"the proxy passed on {relay.count() - before} bytes of the first {first} the app sent: "
            "it waits for the whole body before it sends any")
        conn.send(data[first:])
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, body
    held = _held(lab, path)
    assert held["sha256"] == app.sha(data) and held["size"] == len(data)
    doc = _recorded(proxy, path, 2)
    assert (doc["last_how"], doc["last_reason"]) == ("direct", "too_small"), doc
    # The streamed bytes became the document's base once the provider accepted them.
    assert doc["held_bytes"] == len(data), doc
    assert "went directly, streamed as it arrived (too_small" in proxy.log_path.read_text(errors="replace")


def test_a_streamed_save_the_provider_refuses_leaves_the_base_as_it_was(lab, proxy):
    path = "/streamed/refused.docx"
    _seed(lab, proxy, path, 30_000)
    held_before = _doc_stats(proxy, path)["held_bytes"]
    lab.providers.fault(provider="dropbox", route="upload", method="*", count=1, kind="status", status=503)
    try:
        data = os.urandom(900)
        code, _, _ = app.dropbox_upload(app.through(proxy), TOKEN, path, data)
        assert code == 503
    finally:
        lab.providers.clear_faults()
    doc = _recorded(proxy, path, 2)
    assert (doc["last_how"], doc["last_reason"]) == ("direct", "too_small"), doc
    assert doc["held_bytes"] == held_before
    assert _held(lab, path)["size"] == 30_000


def test_a_streamed_save_larger_than_the_store_keeps_forgets_the_older_base(lab, eps):
    small = lab.start_proxy("streamed-small-store", eps, "--decision", "hybrid", "--max-store", "600")
    path = "/streamed/large.docx"
    _seed(lab, small, path, 500)
    assert _doc_stats(small, path)["held_bytes"] == 500
    data = os.urandom(900)  # over the store's bound: it goes directly and is not kept
    code, _, body = app.dropbox_upload(app.through(small), TOKEN, path, data)
    assert code == 200, body
    assert _held(lab, path)["sha256"] == app.sha(data)
    doc = _recorded(small, path, 2)
    assert (doc["last_how"], doc["last_reason"]) == ("direct", "too_small"), doc
    # The provider no longer has the version the store held: the store must not offer it as a base.
    assert doc["held_bytes"] == 0, doc
    assert "went directly, streamed as it arrived (too_small" in small.log_path.read_text(errors="replace")


def test_a_chunked_upload_waits_for_its_body_and_still_goes_directly(lab, proxy):
    """No Content-Length (Transfer-Encoding: chunked): the head does not say
    the file's size, so the upload is decided once its body is read, as
    before: directly all the same, byte-exact, and its version kept."""
    path = "/streamed/chunked.docx"
    _seed(lab, proxy, path, 20_000)
    data = os.urandom(900)
    host, port = proxy.listen.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=str(proxy.ca)), timeout=60)
    conn.set_tunnel("content.dropboxapi.com", 443)
    try:
        conn.request("POST", "/2/files/upload", body=iter([data[:450], data[450:]]), encode_chunked=True,
                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream",
                              "Dropbox-API-Arg": json.dumps({"path": path, "mode": "overwrite"})})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, body
    assert _held(lab, path)["sha256"] == app.sha(data)
    doc = _recorded(proxy, path, 2)
    assert (doc["last_how"], doc["last_reason"]) == ("direct", "too_small"), doc
    assert doc["held_bytes"] == len(data), doc
    log_lines = [line for line in proxy.log_path.read_text(errors="replace").splitlines() if path in line]
    assert any("went directly (too_small" in line for line in log_lines), log_lines
