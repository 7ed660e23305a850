"""Downloads through the EPS: the first fetch (no `have`) comes back FULL;
after the provider's file changes behind the device's back (saved by
another EPS), a fetch with `have` = the old version comes back as a PATCH
that rebuilds exactly to the provider's bytes and is smaller than the file
(issue 3, "Must show": "downloads come back as patches and rebuild exactly").
"""

from __future__ import annotations

import pytest

import ec_protocol as p

from .e2e import Uploader, delta, device_bytes, download_request, sha256, trace_sequences

CASES = [("dropbox", "single", "docx"), ("graph", "single", "xlsx"), ("drive", "media", "pptx"), ("webdav", "put", "odt")]


@pytest.fixture(scope="module")
def other(start_eps):
    """A second EPS (another device's path to the same accounts) that changes the files."""
    return start_eps("other-device")


@pytest.mark.parametrize("provider,style,fmt", CASES, ids=[c[0] for c in CASES])
def test_fetch_full_then_patch(lab, eps, client, other, provider, style, fmt):
    versions = trace_sequences()[fmt][-1]
    v0, v1, v2 = versions[0], versions[1], versions[2]
    name = f"fetch-{provider}.{fmt}"
    up = Uploader(provider, style)
    out = up.save(client, name, v0, None)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    follow = provider == "graph"

    before = device_bytes(eps)
    got = client.fetch(download_request(provider, name, up.ids), up.doc(name), None, follow_redirect=follow)
    used = delta(device_bytes(eps), before)
    assert isinstance(got, p.FetchResponse), got
    assert got.final.status == 200 and got.final.body == v0 and got.file_sha256.hex() == sha256(v0)
    assert used[("out", "full")] == len(v0) and used[("out", "patch")] == 0
    if follow:
        assert [part.status for part in got.parts] == [302, 200]
    else:
        assert len(got.parts) == 1

    # The file changes at the provider, saved through another EPS by "another device".
    other_client = other.client()
    other_up = Uploader(provider, style, ids=dict(up.ids))
    for data, base in ((v1, None), (v2, v1)):
        out = other_up.save(other_client, name, data, base)
        assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    other_client.close()
    held = up.held(lab, name)
    assert held["sha256"] == sha256(v2)

    before = device_bytes(eps)
    got = client.fetch(download_request(provider, name, up.ids), up.doc(name), v0, follow_redirect=follow)
    used = delta(device_bytes(eps), before)
    assert isinstance(got, p.FetchResponse), got
    assert got.final.status == 200 and got.final.body == v2, "the patch rebuilds to the provider's exact bytes"
    assert got.file_sha256.hex() == held["sha256"] and not got.hash_disagreement
    assert used[("out", "full")] == 0 and 0 < used[("out", "patch")] < len(v2) // 4, used
    if follow:
        assert [part.status for part in got.parts] == [302, 200]

    # Fetching again with the version just received: nothing changed, still a patch (a tiny one).
    before = device_bytes(eps)
    got = client.fetch(download_request(provider, name, up.ids), up.doc(name), v2, follow_redirect=follow)
    used = delta(device_bytes(eps), before)
    assert isinstance(got, p.FetchResponse) and got.final.body == v2
    assert used[("out", "full")] == 0 and used[("out", "patch")] < 1_000


def test_fetch_of_a_missing_file_is_the_providers_answer(eps, client):
    """A 404/409 is not an EPS error: it comes back INLINE as the provider sent it."""
    got = client.fetch(download_request("dropbox", "never-saved.docx"), Uploader("dropbox", "single").doc("never-saved.docx"))
    assert isinstance(got, p.FetchResponse), got
    assert got.final.status == 409 and b"not_found" in got.final.body


def test_edit_patch_versions_are_negotiated(eps):
    """HELLO_OK lists the edit-patch versions the EPS reads, newest first
    (protocol §4): 2 and 1. A device patches in the newest both read; one
    that reads only version 1 gets version 1 (edit-patch-v2.md §1.3)."""
    new = eps.client()
    old = eps.client(patch_versions=(1,))
    try:
        ok = new.hello()
        assert isinstance(ok, p.HelloOk), ok
        assert tuple(ok.patch_versions) == (2, 1)
        assert new.patch_version == 2
        assert isinstance(old.hello(), p.HelloOk)
        assert old.patch_version == 1
    finally:
        new.close()
        old.close()
