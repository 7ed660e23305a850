"""The Graph download bodies the proxy keeps for the app's redirect (spec
§6.8: the EPS follows the 302 for the device; the app gets the 302 and,
when it follows it, the body the EPS fetched): bounded in count and bytes,
oldest out, so that downloads whose redirects nobody follows cannot grow
the proxy's memory (`ec_proxy.addon.KeptRedirects`), through the real proxy
and EPS and on their own."""

from __future__ import annotations

import ec_protocol as ecp
import pytest

from app_client import TRACES, graph_url, onedrive_put, sha, straight, through
from ec_proxy.addon import REDIRECT_MAX_ENTRIES, KeptRedirects


def response(body: bytes) -> ecp.ProviderResponse:
    return ecp.ProviderResponse(200, "OK", [("content-type", b"application/octet-stream")], body)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_kept_redirects_are_bounded_in_count_oldest_out():
    kept = KeptRedirects(max_entries=3, max_bytes=1 << 20, ttl=60, clock=Clock())
    for n in range(5):
        assert kept.keep(f"https://dl.example/{n}", response(b"x" * 10))
    assert len(kept) == 3
    assert kept.take("https://dl.example/0") is None and kept.take("https://dl.example/1") is None
    assert kept.take("https://dl.example/4").body == b"x" * 10
    assert kept.take("https://dl.example/4") is None  # served once


def test_kept_redirects_are_bounded_in_bytes_oldest_out():
    body = b"y" * 1000
    one = KeptRedirects.cost("https://dl.example/0", response(body))
    kept = KeptRedirects(max_entries=100, max_bytes=3 * one, ttl=60, clock=Clock())
    for n in range(6):
        assert kept.keep(f"https://dl.example/{n}", response(body))
        assert kept.bytes <= 3 * one
    assert len(kept) == 3
    assert [kept.take(f"https://dl.example/{n}") is not None for n in range(6)] == [False] * 3 + [True] * 3
    assert kept.bytes == 0
    # A body over the bound alone is not kept, and pushes nothing out.
    assert kept.keep("https://dl.example/a", response(body))
    assert not kept.keep("https://dl.example/big", response(b"z" * (3 * one)))
    assert len(kept) == 1 and kept.take("https://dl.example/big") is None


def test_kept_redirects_expire():
    clock = Clock()
    kept = KeptRedirects(max_entries=10, max_bytes=1 << 20, ttl=60, clock=clock)
    kept.keep("https://dl.example/old", response(b"1"))
    clock.now += 61
    assert kept.take("https://dl.example/old") is None
    kept.keep("https://dl.example/a", response(b"2"))
    clock.now += 61
    kept.keep("https://dl.example/b", response(b"3"))  # the expired one goes as a new one comes
    assert len(kept) == 1 and kept.bytes == KeptRedirects.cost("https://dl.example/b", response(b"3"))


@pytest.mark.skipif(not (TRACES / "writer-100k-middle-docx" / "base.docx").exists(),
                    reason="needs the LibreOffice traces (make traces)")
def test_downloads_whose_redirect_nobody_follows_keep_at_most_the_bound(lab, small, proxy):
    """More Graph downloads through the proxy than it keeps bodies for, none
    of their redirects followed: the oldest one's body is let go (following
    its redirect now reaches the provider, which serves it), the newest one
    is still served by the proxy. Before, every body stayed for 60 s however
    many came."""
    token = "redirect-bound"
    send = through(proxy)
    count = REDIRECT_MAX_ENTRIES + 1
    for n in range(count):
        assert onedrive_put(straight(lab), token, f"/dl/doc-{n}.docx", small.v0)[0] in (200, 201)
    locations = []
    for n in range(count):
        r = send("GET", graph_url(f"/dl/doc-{n}.docx"), {"Authorization": f"Bearer {token}"})
        assert r[0] == 302, r
        locations.append(r[1]["location"])

    def served_by_provider(location: str) -> bool:
        mark = lab.providers.log()[-1]["seq"]
        r = send("GET", location, {})
        assert r[0] == 200 and sha(r[2]) == sha(small.v0), r[:2]
        return any(e["seq"] > mark and e["route"] == "download_content" for e in lab.providers.log())

    assert not served_by_provider(locations[-1]), "the newest download's body was not kept"
    assert served_by_provider(locations[0]), "the oldest download's body was still kept past the bound"
