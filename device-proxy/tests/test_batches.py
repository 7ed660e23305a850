"""Dropbox batches (upload_session/finish_batch_v2, spec §6.3) through the
real device proxy, EPS and Dropbox test server: every file of a batch is a
save of its own document in the proxy's statistics, whichever way the
batch went.

The app side is `http.client` through the proxy, as in test_faults.py,
whose helpers it shares.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import ec_patch
import ec_protocol as ecp
import pytest

from app_client import dropbox_upload, proxy_status, sha, through
from test_faults import (
    RELAY_RETRY_WINDOW, CuttingRelay, dropbox_finish_batch, dropbox_sessions, eventually, held, log_seq, ok, uploads_since,
)
from ec_proxy.addon import bound_bases, patch_base_size
from testbed.lab import Eps, Proxy
from testbed.providers.hashes.dropbox import dropbox_content_hash


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


def test_the_first_save_before_any_session_is_bound_by_the_eps_own_limits(lab, small):
    """The same batch as the first save of a proxy that has no session with
    its EPS yet: the EPS was down when the proxy started (its start-up
    probe failed, so the proxy knows no limits) and came back, holding the
    bases. The device opens the session (HELLO: the EPS's limits) before it
    bounds the bases, and sends one patch and one file whole, which the EPS
    takes. Before, the bound was the protocol's default `max_item_size`
    (2 GiB): both patches went, the EPS answered `too_large`, and the
    first save went directly, whole."""
    big, _, little = sorted((small.v0, small.v1, small.v2), key=len, reverse=True)
    limit = len(big) + len(little)
    eps = lab.start_eps("batches-first-user", limits={"max_item_size": limit})
    px = lab.start_proxy("batches-first-laptop", eps)
    send = through(px)
    token, paths = "bases-first", ["/first/a.docx", "/first/b.docx"]
    try:
        for p in paths:
            assert ok(dropbox_upload(send, token, p, big))
        assert eventually(lambda: all(d is not None and d["held_bytes"] == len(big) for d in docs_of(px, paths).values()))
    finally:
        px.stop()
    eps.stop()
    px = lab.start_proxy("batches-first-laptop", eps)  # the same state folder: the bases are still held
    try:
        assert eventually(lambda: proxy_status(px).get("eps", {}).get("state") == "unreachable", timeout=30)
        eps.restart()
        send = through(px)
        mark = log_seq(lab)
        ids = dropbox_sessions(send, token, [little, little])
        r = dropbox_finish_batch(send, token, [(sid, len(little), p, "overwrite") for sid, p in zip(ids, paths)])
        assert r[0] == 200 and [e[".tag"] for e in json.loads(r[2])["entries"]] == ["success"] * 2, r
        assert all(held(lab, "dropbox", token, p) == sha(little) for p in paths)
        assert eps.metric("ec_eps_requests_total", 'outcome="too_large"') == 0, "the EPS refused the first save"
        assert uploads_since(lab, mark, little) == 2
        assert eventually(lambda: all(d["saves"] == 2 for d in docs_of(px, paths).values())), docs_of(px, paths)
        docs = docs_of(px, paths)
        assert (docs[paths[0]]["last_how"], docs[paths[1]]["last_how"]) == ("patch", "full"), docs
    finally:
        px.stop()
        eps.stop()


def test_what_a_save_teaches_counts_only_the_files_the_eps_rebuilt(small):
    """`_call("save")` hands `_learn_patch` the items as sent: a file whose
    patch `bound_bases` turned FULL (its base over the EPS's
    `max_item_size`) is not counted as rebuilt. Before, the save path
    added up the targets of every patch offered, so the rebuild rate learnt
    from such a batch was too high by the files sent whole."""
    import asyncio

    from ec_proxy.addon import EdgeCourier

    big, _, little = sorted((small.v0, small.v1, small.v2), key=len, reverse=True)
    patch = bytes(ec_patch.diff(big, little))
    doc = ecp.DocKey(ecp.DROPBOX, b"acct", b"/x.docx")
    items = [ecp.SaveItem(little, doc, patch), ecp.SaveItem(little, doc, patch)]

    class Client:
        """An EpsClient whose session advertises max_item_size = |big| + |little|."""
        import threading
        _lock = threading.RLock()
        limits = ecp.Limits(max_item_size=len(big) + len(little))
        patch_version = 1
        pin_mismatch = None
        last_resends: set = set()
        last_sent_kinds: list = []

        def traffic(self):
            return ecp.Traffic(rebuild_seconds=0.010 if self.last_sent_kinds else 0.0)

        def save(self, procedure, requests, sent, request_id=None):
            self.last_sent_kinds = ["patch" if i.patch is not None else "full" for i in sent]
            return ecp.ProviderResponse(200, "OK", [], b"{}")

    addon = EdgeCourier()
    addon.pool = asyncio.LifoQueue()
    addon.pool.put_nowait(Client())
    addon._after = lambda *a: None  # no store here
    seen = []
    addon.estimator.observe_rebuild = lambda size, seconds: seen.append((size, seconds))
    addon.estimator.observe_base = lambda hit: None
    _, traffic = asyncio.run(addon._call("save", ecp.DROPBOX_BATCH, [], items))
    assert traffic.kinds == ["patch", "full"] and [i.patch is not None for i in traffic.items] == [True, False]
    addon._learn_patch(traffic)
    assert seen == [(len(little), 0.010)], seen


# ---------------------------------------------------------------- a batch asked again after an unknown outcome


@pytest.fixture
def relayed(lab, eps):
    """A proxy whose EPS link runs through a CuttingRelay (test_faults.py)."""
    relay = CuttingRelay(eps.device)
    name = f"batches-relay-{time.monotonic_ns()}"
    proxy = lab.start_proxy(name, Eps(name="relay", state=Path("."), config_path=Path("."), device=relay.url.removeprefix("http://")),
                            "--eps-retry-window", str(RELAY_RETRY_WINDOW))
    yield relay, proxy
    proxy.stop()
    relay.close()


def batch_commits(lab, mark: int) -> list[dict]:
    """finish_batch_v2 requests the provider answered 200 since `mark`."""
    return [e for e in lab.providers.log() if e["seq"] > mark and e["route"] == "upload_session/finish_batch_v2" and e["status"] == 200]


def lost_batch(lab, relay: CuttingRelay, send, token: str, paths: list[str], news: list[bytes]) -> tuple[list[tuple], int]:
    """A finish_batch_v2 whose answer the link to the EPS loses every time:
    the app gets 504 and the EPS committed every file once. Its entries and
    the provider's log mark before it."""
    ids = dropbox_sessions(send, token, news)
    entries = [(sid, len(data), p, "overwrite") for sid, data, p in zip(ids, news, paths)]
    mark = log_seq(lab)
    relay.cut_responses = 99
    r = dropbox_finish_batch(send, token, entries)
    relay.cut_responses = 0
    assert r[0] == 504 and relay.cuts >= 1, r
    assert len(batch_commits(lab, mark)) == 1
    for p, data in zip(paths, news):
        assert held(lab, "dropbox", token, p) == sha(data)  # the EPS did commit them
    return entries, mark


def assert_results(reply, expected: list[tuple[str, bytes]]) -> None:
    """The app's answer: 200 and one success per (path, file) asked, in that order."""
    assert reply[0] == 200, reply
    entries = json.loads(reply[2])["entries"]
    assert [(e[".tag"], e.get("path_lower"), e.get("content_hash")) for e in entries] == [
        ("success", p.lower(), dropbox_content_hash(data)) for p, data in expected], entries


def test_a_batch_asked_again_in_part_gets_its_own_entries_and_uploads_each_file_once(lab, small, relayed):
    """A batch of three files whose answer the link lost every time (the
    app got 504; the EPS had committed the three). The app then asks again
    for two of them, in the other order: it gets exactly those two results,
    in its order; the EPS answers from its outcome record (each file reached
    Dropbox once); the device's store learns the three versions as bases,
    the third too. The app's later retry of the third is answered from what
    the device kept, without another upload. Before, the app got the three
    results for its two entries, and the store recorded none of them."""
    relay, proxy = relayed
    send = through(proxy)
    token = "again-part"
    paths = [f"/again/{n}.docx" for n in "abc"]
    news = [small.v1, small.v2, small.v0]
    entries, mark = lost_batch(lab, relay, send, token, paths, news)

    saves = relay.saves
    r = dropbox_finish_batch(send, token, [entries[2], entries[0]])
    assert_results(r, [(paths[2], news[2]), (paths[0], news[0])])
    assert relay.saves == saves + 1  # the earlier SAVE, sent again
    assert len(batch_commits(lab, mark)) == 1, "a file reached the provider twice"
    assert eventually(lambda: all(d is not None and d["held_bytes"] == len(data)
                                  for d, data in zip(docs_of(proxy, paths).values(), news))), docs_of(proxy, paths)

    r = dropbox_finish_batch(send, token, [entries[1]])
    assert_results(r, [(paths[1], news[1])])
    assert relay.saves == saves + 1, "the entry's result was kept: the EPS need not be asked"
    assert len(batch_commits(lab, mark)) == 1
    # Used up: asked once more, the session is gone, as at Dropbox.
    r = dropbox_finish_batch(send, token, [entries[1]])
    assert r[0] == 200 and json.loads(r[2])["entries"][0]["failure"]["lookup_failed"][".tag"] == "not_found", r
    # The next edit of each goes as a patch against the version the store learnt.
    for p in paths:
        assert ok(dropbox_upload(send, token, p, small.v2 if p != paths[1] else small.v1))
    assert eventually(lambda: all(d["last_how"] == "patch" for d in docs_of(proxy, paths).values())), docs_of(proxy, paths)


def test_a_batch_asked_again_with_a_new_entry_commits_the_new_one_once_later(lab, small, relayed):
    """The app asks again for a batch whose outcome it did not learn (one
    file) together with a file no save has taken yet: the earlier file's
    entry gets its result from the EPS's record, the new one Dropbox's
    retryable `too_many_write_operations` (nothing sent for it yet); the
    app's retry of the new one commits it, once. Before, the device made a
    new SAVE of both, and the earlier file reached Dropbox a second time."""
    relay, proxy = relayed
    send = through(proxy)
    token = "again-new"
    old, new = "/again/old.docx", "/again/new.docx"
    entries, mark = lost_batch(lab, relay, send, token, [old], [small.v1])
    (sid,) = dropbox_sessions(send, token, [small.v2])
    fresh = (sid, len(small.v2), new, "overwrite")

    r = dropbox_finish_batch(send, token, [fresh, entries[0]])
    assert r[0] == 200, r
    got = json.loads(r[2])["entries"]
    assert got[0] == {".tag": "failure", "failure": {".tag": "too_many_write_operations"}}, got
    assert got[1][".tag"] == "success" and got[1]["content_hash"] == dropbox_content_hash(small.v1), got
    assert len(batch_commits(lab, mark)) == 1 and held(lab, "dropbox", token, new) is None

    r = dropbox_finish_batch(send, token, [fresh])
    assert_results(r, [(new, small.v2)])
    assert len(batch_commits(lab, mark)) == 2 and held(lab, "dropbox", token, new) == sha(small.v2)
    assert uploads_since(lab, mark, small.v1) == 1 and uploads_since(lab, mark, small.v2) == 1


def test_a_batch_asked_again_whole_gets_the_answer_of_the_save_sent_before(lab, small, relayed):
    """The same batch asked again as it was: the earlier SAVE's answer as the
    EPS recorded it, each file committed once, both learnt as bases."""
    relay, proxy = relayed
    send = through(proxy)
    token, paths, news = "again-whole", ["/again/w1.docx", "/again/w2.docx"], [small.v1, small.v2]
    entries, mark = lost_batch(lab, relay, send, token, paths, news)
    r = dropbox_finish_batch(send, token, entries)
    assert_results(r, list(zip(paths, news)))
    assert len(batch_commits(lab, mark)) == 1
    assert eventually(lambda: all(d is not None and d["held_bytes"] == len(data)
                                  for d, data in zip(docs_of(proxy, paths).values(), news))), docs_of(proxy, paths)
