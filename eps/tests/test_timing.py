"""Spec §7.3: every answer to a save carries the EPS's own time
(`Server-Timing: eps;dur=...`) and, when it rebuilt patched items, the
rebuild's (`rb;dur=...`); the device's client reads them into its Traffic,
from which the device proxy measures its link and the EPS's rebuild rate
(issue 13)."""

from __future__ import annotations

import pytest

import ec_protocol as p

from .e2e import Uploader, corpus_files, edited


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


def test_server_timing_is_parsed_defensively():
    assert p.client.server_timing("eps;dur=41.3, rb;dur=12.0") == pytest.approx({"eps": 0.0413, "rb": 0.012})
    assert p.client.server_timing('eps;desc="x";dur="5"') == pytest.approx({"eps": 0.005})
    for odd in (None, "", "eps", "eps;dur=", "eps;dur=abc", "eps;dur=-1", ";dur=3", "eps;dur=1e99"):
        assert p.client.server_timing(odd) == {}, odd
