"""Spec §7.3: every answer to a save carries the EPS's own time
(`Server-Timing: eps;dur=...`) and, when it rebuilt patched items, the
rebuild's (`rb;dur=...`), and when it exchanged with the provider, that
time (`pv;dur=...`), and for a streamed save (§5.6) their overlap
(`ov;dur=...`); the device's client reads them into its Traffic,
from which the device proxy measures its link and the EPS's rebuild rate
(issue 13)."""

from __future__ import annotations

import dataclasses
import socket
import time

import pytest

import ec_protocol as p

from testbed.relay import Relay

from .e2e import TRACES, Uploader, corpus_files, edited


def test_save_answers_carry_the_eps_time_and_the_rebuild_time(lab, eps, client):
    up = Uploader("dropbox", "single")
    original = corpus_files("docx")[0].read_bytes()
    versions = [original, edited(original, 1), edited(original, 2)]
    before = client.traffic()
    client.hello()
    t = client.traffic().since(before)
    assert (t.exchanges, t.timed_exchanges) == (1, 0), "HELLO answers are not timed"
    base = None
    for n, data in enumerate(versions):
        before = client.traffic()
        out = up.save(client, "timing.docx", data, base)
        t = client.traffic().since(before)
        assert isinstance(out, p.ProviderResponse) and out.succeeded, out
        assert (t.exchanges, t.timed_exchanges) == (1, 1)
        # The EPS's part (its rebuild and its upload to the provider) is part of the exchange.
        assert 0 < t.eps_seconds < t.seconds
        # Its provider exchanges (`pv`) are part of its own time, beside the rebuild.
        assert t.provider_timed_exchanges == 1 and 0 < t.provider_seconds <= t.eps_seconds + 0.0001
        if base is None:
            assert t.provider_seconds + t.rebuild_seconds <= t.eps_seconds + 0.0002  # each rounded to 0.1 ms
        else:
            # A patch is streamed (§5.6): its rebuild runs during the provider exchange
            # (`ov` says by how much), so only each on its own is part of `eps`.
            assert t.rebuild_seconds <= t.eps_seconds + 0.0001
            # The client reads the overlap (0 when this small file was rebuilt before its
            # request started): the EPS's own part is then eps - rb - pv + ov, never
            # negative (each figure rounded to 0.1 ms). A large file's overlap: below.
            assert 0 <= t.overlap_seconds <= t.rebuild_seconds + 0.0001
            assert t.eps_seconds - t.rebuild_seconds - t.provider_seconds + t.overlap_seconds >= -0.0003
        if base is None:
            assert t.rebuild_seconds == 0, "a FULL save rebuilds nothing"
        else:
            assert 0 < t.rebuild_seconds < t.eps_seconds, f"save {n} went as a patch: the EPS timed its rebuild"
        base = data
    # A refused save is timed too (an ERROR answer).
    before = client.traffic()
    out = client.save_single("POST", "https://content.dropboxapi.com/2/files/upload", [], b"x" * 10, b"y" * 10,
                             up.doc("timing-refused.docx"))
    t = client.traffic().since(before)
    assert t.timed_exchanges == t.exchanges >= 1, (out, t)


def test_a_streamed_rebuild_overlaps_the_provider_exchange(lab, eps, client):
    """The 1 MB-text trace's patch takes milliseconds to rebuild, after its
    provider request started (§5.6): the answer's `ov` says so, the client
    reads it, and with it the EPS's own part, eps - rb - pv + ov, is not
    negative (without it, it would be less by the overlap)."""
    up = Uploader("dropbox", "single")
    trace = TRACES / "writer-1m-middle-docx"
    base, new = (trace / "base.docx").read_bytes(), (trace / "new.docx").read_bytes()
    assert up.save(client, "overlap.docx", base, None).succeeded
    before = client.traffic()
    out = up.save(client, "overlap.docx", new, base)
    t = client.traffic().since(before)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    assert t.rebuild_seconds > 0 and 0 < t.overlap_seconds <= t.rebuild_seconds + 0.0001, t
    assert t.eps_seconds - t.rebuild_seconds - t.provider_seconds + t.overlap_seconds >= -0.0003, t


def test_server_timing_is_parsed_defensively():
    assert p.client.server_timing("eps;dur=41.3, rb;dur=12.0") == pytest.approx({"eps": 0.0413, "rb": 0.012})
    assert p.client.server_timing("eps;dur=41.3, rb;dur=12.0, pv;dur=20.5") == pytest.approx(
        {"eps": 0.0413, "rb": 0.012, "pv": 0.0205})
    assert p.client.server_timing('eps;desc="x";dur="5"') == pytest.approx({"eps": 0.005})
    for odd in (None, "", "eps", "eps;dur=", "eps;dur=abc", "eps;dur=-1", ";dur=3", "eps;dur=1e99"):
        assert p.client.server_timing(odd) == {}, odd


class SlowBody(Relay):
    """A TCP relay to the EPS that holds the device's bytes for `pause`
    seconds after the first `head` bytes of each connection: a slow link as
    the EPS sees it (the request's head arrives, its body later)."""

    def __init__(self, target: tuple[str, int], head: int, pause: float) -> None:
        super().__init__(target)
        self.head, self.pause = head, pause
        self.start()

    def opened(self) -> dict:
        return {"sent": 0}  # bytes of this connection sent towards the EPS

    def pass_on(self, state: dict, upstream: bool, data: bytes, dst: socket.socket) -> None:
        sent = state["sent"]
        if upstream and sent < self.head <= sent + len(data):
            cut = self.head - sent
            dst.sendall(data[:cut])
            time.sleep(self.pause)
            data = data[cut:]
            sent += cut
        dst.sendall(data)
        if upstream:
            state["sent"] = sent + len(data)


def test_the_eps_time_leaves_out_the_time_the_body_took_to_arrive(eps):
    """On a slow link the request's body arrives long after its head; that
    is link time, and the device must not count it as the EPS's (it would
    then believe its link infinitely fast)."""
    host, port = eps.url.removeprefix("http://").rsplit(":", 1)
    relay = SlowBody((host, int(port)), head=2000, pause=0.5)
    client = p.EpsClient(dataclasses.replace(eps.bundle(), url=f"http://127.0.0.1:{relay.port}"), label="slow")
    try:
        up = Uploader("dropbox", "single")
        data = corpus_files("docx")[0].read_bytes()
        assert len(data) > 4000
        client.hello()
        before = client.traffic()
        out = up.save(client, "slow-body.docx", data, None)
        t = client.traffic().since(before)
        assert isinstance(out, p.ProviderResponse) and out.succeeded, out
        assert t.seconds > 0.5 and t.timed_exchanges == 1
        assert t.eps_seconds < 0.4, f"the EPS counted {t.eps_seconds:.3f} s of a {t.seconds:.3f} s exchange as its own"
    finally:
        client.close()
        relay.close()

