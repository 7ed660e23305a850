"""Streamed saves (spec §5.6, issue 13): a SINGLE save with a PATCH item is
sent to the provider while the EPS rebuilds it, the file's last bytes held
back until its size and SHA-256 verify.

Everything is real: the EPS binary (the fail-point build where a test needs
a fail point), the provider test servers, the device's codec and client.
`CountingRelay` is a plain TCP relay the EPS reaches the providers through
(the configuration resolves every provider host to it): it counts the bytes
the EPS sends, TLS records and all, which shows what left before the EPS
knew whether its file was right. The provider servers' request log shows
what the providers received whole.

- A streamed save of the 1 MB-text trace lands byte-exact, in one provider
  request, for every single-request upload (Dropbox, Graph simple upload,
  Drive media and multipart, WebDAV PUT).
- A rebuild that fails its hash (`eps::corrupt_rebuild` flips one bit of
  the rebuilt output) after most of the file left: the request is aborted
  short of its length, the provider keeps the old file and logs no
  completed request, the EPS answers `target_mismatch` at stage 0, and the
  device's FULL resend is uploaded once.
- The upload is under way while the rebuild runs: with the rebuild held
  after its first piece went to the upload (`eps::mid_rebuild`), the
  provider link has carried that piece and the provider has no complete
  request yet.
- The content a streamed rebuild keeps for the next patch is let go of
  once the instance has been idle for `kept_content_idle_s`, and the
  memory goes back to the system.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import ec_protocol as p
from testbed.lab import EPS_FAILPOINTS_BIN, PROVIDER_HOSTS
from testbed.relay import Relay

from .e2e import TRACES, RawDevice, Uploader, dropbox_upload, log_seq, patch_item, provider_requests_since

pytestmark = pytest.mark.skipif(not (TRACES / "manifest.json").exists(), reason="needs the LibreOffice traces (make traces)")
needs_failpoints = pytest.mark.skipif(not EPS_FAILPOINTS_BIN.exists(), reason="needs .venv/bin/ec-eps-failpoints (make eps-failpoints)")

#: The EPS holds back this much of a streamed file until it is verified (spec §5.6, Appendix B).
HOLD_BACK = 64 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Versions:
    v0: bytes
    v1: bytes


@pytest.fixture(scope="module")
def docs() -> Versions:
    """The latency benchmark's trace: a LibreOffice .docx with 1 MB of text
    (381 kB), one character typed."""
    t = TRACES / "writer-1m-middle-docx"
    v = Versions((t / "base.docx").read_bytes(), (t / "new.docx").read_bytes())
    assert v.v0 != v.v1 and len(v.v1) > 4 * HOLD_BACK
    return v


class CountingRelay(Relay):
    """A TCP relay in front of the provider servers' TLS port that counts
    the bytes sent towards the providers."""

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port))
        self._sent = 0
        self._lock = threading.Lock()
        self.start()

    @property
    def sent(self) -> int:
        with self._lock:
            return self._sent

    def upstream(self) -> dict:
        """The EPS configuration's `upstream` part that sends every provider host here."""
        return {"resolve": {h: self.address for h in PROVIDER_HOSTS}}

    def pass_on(self, state, upstream: bool, data: bytes, dst: socket.socket) -> None:
        dst.sendall(data)
        if upstream:
            with self._lock:
                self._sent += len(data)


# ---------------------------------------------------------------- byte-exact, once

SINGLE_UPLOADS = [("dropbox", "single"), ("graph", "single"), ("drive", "media"), ("drive", "multipart"), ("webdav", "put")]


@pytest.mark.parametrize("provider,style", SINGLE_UPLOADS, ids=[f"{pr}-{st}" for pr, st in SINGLE_UPLOADS])
def test_a_streamed_save_arrives_byte_exact_once(lab, docs, provider, style):
    up = Uploader(provider, style, token=f"stream-{provider}-{style}")
    eps = lab.start_eps(f"stream-{provider}-{style}")
    client = eps.client()
    name = "streamed.docx"
    assert up.save(client, name, docs.v0, None).succeeded
    streamed = eps.metric("ec_eps_saves_streamed_total")
    mark = log_seq(lab)
    before = client.traffic()
    out = up.save(client, name, docs.v1, docs.v0)
    t = client.traffic().since(before)
    assert isinstance(out, p.ProviderResponse) and out.succeeded and not out.replayed, out
    assert client.last_sent_kinds == ["patch"] and t.exchanges == 1, (client.last_sent_kinds, t)
    # It was streamed (spec §5.6), and it landed byte for byte, in one request.
    assert eps.metric("ec_eps_saves_streamed_total") == streamed + 1
    assert up.held(lab, name)["sha256"] == sha(docs.v1)
    requests = provider_requests_since(lab, mark)
    assert len(requests) == 1 and requests[0]["status"] in (200, 201, 204), requests
    if style != "multipart":
        assert requests[0]["body_sha256"] == sha(docs.v1) and requests[0]["body_size"] == len(docs.v1)
    # §7.3: the rebuild and the provider exchange are both timed; they overlap.
    assert 0 < t.rebuild_seconds and 0 < t.provider_seconds <= t.eps_seconds
    client.close()
    eps.stop()


# ---------------------------------------------------------------- a hash that fails mid-stream


@needs_failpoints
def test_a_rebuild_that_fails_its_hash_mid_stream_is_never_completed(lab, docs):
    relay = CountingRelay(lab.providers.tls_port)
    # Corrupt twice: once for the hand-made transmission, once for the device
    # client's. The first time, the rebuild is also held after its first piece
    # (with the flipped bit) went to the upload, so that the test sees those
    # bytes on the provider link before the hash fails.
    failpoints = "eps::corrupt_rebuild=2*return;eps::mid_rebuild=1*sleep(3000)"
    eps = lab.start_eps("stream-corrupt", binary=EPS_FAILPOINTS_BIN, env={"FAILPOINTS": failpoints}, upstream=relay.upstream())
    up = Uploader("dropbox", "single")
    name = "corrupt.docx"
    doc = up.doc(name)
    client = eps.client()
    assert up.save(client, name, docs.v0, None).succeeded  # FULL: not streamed, the fail point not reached
    assert up.held(lab, name)["sha256"] == sha(docs.v0)

    # One transmission by hand, to see the EPS's answer itself.
    raw = RawDevice(eps)
    raw.hello()
    patch = p.make_item(docs.v1, doc, docs.v0).patch
    assert patch is not None
    mark, sent = log_seq(lab), relay.sent
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(raw.send, raw.save_message(p.SINGLE, [dropbox_upload(name)], [patch_item(patch, docs.v1, doc)]))
        eps.wait_at_fail_point(running, timeout=20)
        deadline = time.monotonic() + 2.5
        while relay.sent - sent < 16 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        left = relay.sent - sent
        status, msg = running.result(timeout=60)
    assert status == 422 and isinstance(msg, p.Error), (status, msg)
    assert (msg.code, msg.stage, tuple(msg.list)) == ("target_mismatch", 0, (0,)), msg
    # The corrupted file's first piece had left for the provider before the hash failed...
    assert left >= 16 * 1024, left
    # ...and the provider completed no request and still holds the old file.
    assert provider_requests_since(lab, mark) == []
    assert up.held(lab, name)["sha256"] == sha(docs.v0)
    assert eps.metric("ec_eps_target_mismatch_total") == 1

    # The device's client: the same failure, then its FULL resend (§7), uploaded once.
    mark = log_seq(lab)
    before = client.traffic()
    out = up.save(client, name, docs.v1, docs.v0)
    t = client.traffic().since(before)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    assert t.exchanges == 2 and client.last_sent_kinds == ["full"], (t, client.last_sent_kinds)
    assert eps.metric("ec_eps_target_mismatch_total") == 2
    requests = provider_requests_since(lab, mark)
    assert [(r["route"], r["body_sha256"]) for r in requests] == [(requests[0]["route"], sha(docs.v1))], requests
    assert up.held(lab, name)["sha256"] == sha(docs.v1)
    client.close()
    eps.stop()
    relay.close()


# ---------------------------------------------------------------- the upload overlaps the rebuild


@needs_failpoints
def test_the_upload_is_under_way_while_the_rebuild_runs(lab, docs):
    relay = CountingRelay(lab.providers.tls_port)
    eps = lab.start_eps("stream-overlap", binary=EPS_FAILPOINTS_BIN, env={"FAILPOINTS": "eps::mid_rebuild=sleep(5000)"},
                        upstream=relay.upstream())
    up = Uploader("dropbox", "single", token="stream-overlap")
    name = "overlap.docx"
    client = eps.client()
    assert up.save(client, name, docs.v0, None).succeeded
    mark, sent = log_seq(lab), relay.sent
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(up.save, client, name, docs.v1, docs.v0)
        # The rebuild is held after handing its first piece (16 KiB or more) to the upload.
        eps.wait_at_fail_point(running, timeout=20)
        deadline = time.monotonic() + 4
        while relay.sent - sent < 16 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        left = relay.sent - sent
        rebuilding = eps.sleeping_at_fail_point()
        completed = provider_requests_since(lab, mark)
        out = running.result(timeout=60)
    print(f"while the rebuild was held: {left} bytes sent towards the provider, {len(completed)} requests completed")
    assert rebuilding, "the rebuild ended before the test looked"
    # The file's first piece was on the provider link before the rebuild ended...
    assert left >= 16 * 1024, left
    # ...in a request the provider had not received whole.
    assert completed == []
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    requests = provider_requests_since(lab, mark)
    assert [r["body_sha256"] for r in requests] == [sha(docs.v1)], requests
    assert up.held(lab, name)["sha256"] == sha(docs.v1)
    client.close()
    eps.stop()
    relay.close()


# ---------------------------------------------------------------- memory kept between saves


def rss_bytes(eps) -> int:
    for line in Path(f"/proc/{eps.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_kept_contents_are_let_go_of_after_the_idle_time(lab, docs):
    """A patched save leaves the rebuilt member's content in the core (for the
    next patch against it); `kept_content_idle_s` after the last save the
    instance lets go of it: the gauge goes to 0, the memory goes back to the
    system, a log line says so, and the next patch still lands byte-exact."""
    up = Uploader("dropbox", "single", token="kept-idle")
    eps = lab.start_eps("kept-idle", kept_content_idle_s=4)
    client = eps.client()
    name = "kept.docx"
    assert up.save(client, name, docs.v0, None).succeeded
    out = up.save(client, name, docs.v1, docs.v0)
    assert isinstance(out, p.ProviderResponse) and out.succeeded and client.last_sent_kinds == ["patch"], out
    kept = eps.metric("ec_eps_kept_content_bytes")
    rss = rss_bytes(eps)
    # word/document.xml of the 1 MB-text trace: 1.78 MB of XML.
    assert kept > 1_500_000, kept
    deadline = time.monotonic() + 60
    while eps.metric("ec_eps_kept_content_bytes") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert eps.metric("ec_eps_kept_content_bytes") == 0
    assert "let go of the document contents kept from the last rebuilds" in eps.log_path.read_text()
    assert rss_bytes(eps) <= rss - kept // 2, (rss, rss_bytes(eps), kept)
    # The next patch (back to the first version) is rebuilt without it, byte-exact.
    out = up.save(client, name, docs.v0, docs.v1)
    assert isinstance(out, p.ProviderResponse) and out.succeeded and client.last_sent_kinds == ["patch"], out
    assert up.held(lab, name)["sha256"] == sha(docs.v0)
    client.close()
    eps.stop()
