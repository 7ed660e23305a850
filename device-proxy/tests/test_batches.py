"""Dropbox batches (upload_session/finish_batch_v2, spec §6.3) through the
real device proxy, EPS and Dropbox test server: every file of a batch is a
save of its own document in the proxy's statistics, whichever way the
batch went.

The app side is `http.client` through the proxy, as in test_faults.py,
whose helpers it shares.
"""

from __future__ import annotations

import json

import ec_patch
import ec_protocol as ecp
import pytest

from app_client import dropbox_upload, proxy_status, sha, through
from test_faults import dropbox_finish_batch, dropbox_sessions, eventually, held, ok
from ec_proxy.addon import bound_bases, patch_base_size
from testbed.lab import Proxy


@pytest.fixture(scope="module")
def direct_proxy(lab) -> Proxy:
    """A proxy whose EPS nobody runs: a batch is replayed directly."""
    return lab.start_proxy("batches-no-eps", None)


def docs_of(proxy: Proxy, token_paths: list[str]) -> dict[str, dict]:
    """The proxy's statistics of the documents at these paths."""
    by_ref = {d["ref"].lower(): d for d in proxy_status(proxy)["documents"]}
    return {p: by_ref.get(p.lower()) for p in token_paths}


@pytest.mark.parametrize("path_kind", ["via-eps", "direct"])
def test_every_file_of_a_batch_is_counted_as_a_save(lab, small, proxy, direct_proxy, path_kind):
    """A finish_batch_v2 of three files, each the next version of a document
    the device holds: `ec-proxy status` counts one save for each of the
    three documents (how it travelled, its bytes), and the total counts
    three. Before, only the batch's first file was counted: the other
    documents' statistics never moved, and the total missed their bytes."""
    px = proxy if path_kind == "via-eps" else direct_proxy
    send = through(px)
    token = f"count-{path_kind}"
    paths = [f"/count/{n}.docx" for n in "abc"]
    news = [small.v1, small.v2, small.v1]
    for p in paths:
        assert ok(dropbox_upload(send, token, p, small.v0))
    assert eventually(lambda: all(d is not None and d["saves"] == 1 for d in docs_of(px, paths).values()))
    before = docs_of(px, paths)
    total_before = proxy_status(px)["total"]

    ids = dropbox_sessions(send, token, news)
    r = dropbox_finish_batch(send, token, [(sid, len(data), p, "overwrite") for sid, data, p in zip(ids, news, paths)])
    assert r[0] == 200, r
    assert [e[".tag"] for e in json.loads(r[2])["entries"]] == ["success"] * 3, r
    for p, data in zip(paths, news):
        assert held(lab, "dropbox", token, p) == sha(data)

    assert eventually(lambda: all(d["saves"] == 2 for d in docs_of(px, paths).values())), docs_of(px, paths)
    docs = docs_of(px, paths)
    for p, data in zip(paths, news):
        d = docs[p]
        if path_kind == "via-eps":
            # A patch against the version the EPS holds: the lab's rule sends one whenever it is smaller.
            assert d["last_how"] == "patch" and d["patch_saves"] == before[p]["patch_saves"] + 1, d
            assert 0 < d["sent_bytes"] - before[p]["sent_bytes"] < len(data), (before[p], d)
        else:
            assert d["last_how"] == "direct" and d["direct_saves"] == before[p]["direct_saves"] + 1, d
        assert d["whole_bytes"] == len(small.v0) + len(data), d
        assert d["held_bytes"] == len(data), d
    total = proxy_status(px)["total"]
    assert total["saves"] == total_before["saves"] + 3, (total_before, total)
    assert total["whole_bytes"] == total_before["whole_bytes"] + sum(len(x) for x in news)
    # The batch's bytes are all counted, shared among its documents.
    assert total["link_bytes"] - total_before["link_bytes"] == sum(
        docs[p]["link_bytes"] - before[p]["link_bytes"] for p in paths), (total_before, total)

@pytest.mark.parametrize("version", ec_patch.FORMAT_VERSIONS)
def test_bound_bases_keeps_patches_in_order_while_their_bases_fit(small, version):
    """The bound the EPS puts on a SAVE's bases together (`bound_bases`),
    read from the patches' own headers (`patch_base_size`)."""
    big, _, little = sorted((small.v0, small.v1, small.v2), key=len, reverse=True)
    patch = bytes(ec_patch.diff(big, little, max_version=version))
    assert patch_base_size(patch) == len(big)
    assert patch_base_size(b"not a patch") is None and patch_base_size(patch[:7]) is None
    doc = ecp.DocKey(ecp.DROPBOX, b"acct", b"/x.docx")
    items = [ecp.SaveItem(little, doc, patch), ecp.SaveItem(little, doc, None), ecp.SaveItem(little, doc, patch)]
    out, made_full = bound_bases(items, len(big) + len(little))
    assert [i.patch is not None for i in out] == [True, False, False] and made_full == 1
    out, made_full = bound_bases(items, 2 * len(big))
    assert [i.patch is not None for i in out] == [True, False, True] and made_full == 0
    assert all(o.target == i.target and o.binding == i.binding for o, i in zip(out, items))


def test_a_batch_whose_bases_are_over_the_eps_limit_together_goes_through_it(lab, small):
    """An EPS whose `max_item_size` holds a batch's two files together but
    not the two bases its patches name (protocol §9: it bounds those
    together too, `too_large`): the device keeps the first file's patch and
    sends the second whole, in the one SAVE, and the EPS takes it. Before,
    the device sent both patches, the EPS answered `too_large`, and the
    batch went directly, whole."""
    big, _, little = sorted((small.v0, small.v1, small.v2), key=len, reverse=True)
    assert len(big) > len(little)
    limit = len(big) + len(little)  # each base fits, both files fit, both bases do not
    eps = lab.start_eps("batches-bases-user", limits={"max_item_size": limit})
    px = lab.start_proxy("batches-bases-laptop", eps)
    try:
        send = through(px)
        token, paths = "bases-bound", ["/bound/a.docx", "/bound/b.docx"]
        for p in paths:
            assert ok(dropbox_upload(send, token, p, big))  # whole through the EPS, which now holds it
        assert eventually(lambda: all(d is not None and d["held_bytes"] == len(big) for d in docs_of(px, paths).values()))
        refused = eps.metric("ec_eps_requests_total", 'outcome="too_large"')
        ids = dropbox_sessions(send, token, [little, little])
        r = dropbox_finish_batch(send, token, [(sid, len(little), p, "overwrite") for sid, p in zip(ids, paths)])
        assert r[0] == 200 and [e[".tag"] for e in json.loads(r[2])["entries"]] == ["success"] * 2, r
        assert all(held(lab, "dropbox", token, p) == sha(little) for p in paths)
        assert eps.metric("ec_eps_requests_total", 'outcome="too_large"') == refused, "the EPS refused the save"
        assert eventually(lambda: all(d["saves"] == 2 for d in docs_of(px, paths).values())), docs_of(px, paths)
        docs = docs_of(px, paths)
        assert (docs[paths[0]]["last_how"], docs[paths[1]]["last_how"]) == ("patch", "full"), docs
        assert "go whole" in px.log_path.read_text()
    finally:
        px.stop()
        eps.stop()

