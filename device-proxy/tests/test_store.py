"""Tests of ec_proxy.store: the last-synced store's invariant, restarts,
crashes (a child process killed between its steps), LRU bounds, damaged files."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ec_protocol import DROPBOX, GRAPH, WEBDAV, DocKey
from ec_proxy.store import DeviceStore, StoreError, StoreLocked, read_stats

A = DocKey(DROPBOX, b"dbid:alice", b"/docs/a.docx")
B = DocKey(GRAPH, b"drive-1", b"root:/b.xlsx:")
C = DocKey(WEBDAV, b"alice@cloud", b"/remote.php/dav/files/alice/c.odt")
D = DocKey(DROPBOX, b"dbid:alice", b"/docs/d.pptx")


def blob_files(folder: Path) -> set[str]:
    return {p.name for p in (folder / "blobs").glob("*/*")}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_pending_version_is_not_a_base_until_accepted(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        assert s.base(A) is None
        s.downloaded(A, b"v1" * 100)
        token = s.pending(A, b"v2" * 100)
        assert s.base(A) == b"v1" * 100
        assert s.accepted(token) is True
        assert s.base(A) == b"v2" * 100
        assert s.accepted(token) is False  # settled once
        assert blob_files(tmp_path) == {sha(b"v2" * 100)}  # v1 is no longer held


def test_a_new_tokens_key_borrows_the_base_of_the_same_document_under_the_old_token(tmp_path):
    """An account the device knows only by its bearer token (`tok:` + a
    digest) gets a new key with every OAuth refresh. Before, the document's
    first save under the new token had no base and went whole (every hour
    for OneDrive); now the key borrows the base the same document has under
    the most recently used other token, and keeps it as its own. Only the
    same provider, reference and path root; never an account named
    otherwise (a Dropbox user id, a Graph drive, a WebDAV user)."""
    old, new = b"tok:0123456789ab", b"tok:ba9876543210"
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(DocKey(DROPBOX, old, b"/docs/a.docx"), b"v1" * 100)
        s.downloaded(DocKey(DROPBOX, b"tok:cccccccccccc", b"/docs/a.docx"), b"v0" * 100)
        s.base(DocKey(DROPBOX, old, b"/docs/a.docx"))  # the most recently used of the two
        mine = DocKey(DROPBOX, new, b"/docs/a.docx")
        assert s.has_base(mine) and s.has_base_now(mine)
        assert s.edge_base(mine) == b"v1" * 100
        assert mine in set(s.documents()), "kept as its own"
        for other in (DocKey(GRAPH, new, b"/docs/a.docx"), DocKey(DROPBOX, new, b"/docs/b.docx"),
                      DocKey(DROPBOX, new + b"|root:team", b"/docs/a.docx"), DocKey(DROPBOX, b"dbid:alice", b"/docs/a.docx"),
                      DocKey(DROPBOX, new, b"/docs/a.docx/x"), DocKey(DROPBOX, new, b"a.docx")):
            assert not s.has_base(other) and s.base(other) is None, other
        # The new key's own version, once accepted, is its base; the old token's stays as it was.
        s.accepted(s.pending(mine, b"v2" * 100))
        assert s.base(mine) == b"v2" * 100 and s.base(DocKey(DROPBOX, old, b"/docs/a.docx")) == b"v1" * 100


def test_a_rejected_version_is_forgotten_and_the_base_kept(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"base")
        token = s.pending(A, b"refused by the provider")
        assert s.rejected(token) is True
        assert s.rejected(token) is False
        assert s.base(A) == b"base"
        assert blob_files(tmp_path) == {sha(b"base")}


def test_has_base_now_answers_without_waiting_for_a_busy_store(tmp_path):
    """The proxy asks on its event loop, from an upload's head: a store
    another thread is using (its writes fsync) answers "unknown", never blocks."""
    import threading

    with DeviceStore(tmp_path, 10_000_000) as s:
        assert s.has_base_now(A) is False
        s.downloaded(A, b"v1")
        assert s.has_base_now(A) is True and s.has_base_now(B) is False
        taken, release = threading.Event(), threading.Event()

        def hold():
            with s._mutex:
                taken.set()
                release.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert taken.wait(10)
            start = time.monotonic()
            assert s.has_base_now(A) is None
            assert time.monotonic() - start < 1.0
        finally:
            release.set()
            t.join()
        assert s.has_base_now(A) is True


def test_last_accepted_wins_when_two_uploads_overlap(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        t1 = s.pending(A, b"first")
        t2 = s.pending(A, b"second")
        s.accepted(t2)
        s.accepted(t1)
        assert s.base(A) == b"first"


def test_forget_keeps_pending_uploads_and_statistics(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"old")
        s.record_save(A, 100, 1000, "patch", "pays")
        token = s.pending(A, b"new")
        s.forget(A)
        assert s.base(A) is None
        assert s.accepted(token)
        assert s.base(A) == b"new"
        assert s.stats().docs[0].saves == 1


def test_restart_keeps_bases_and_drops_pending(tmp_path):
    s = DeviceStore(tmp_path, 10_000_000)
    s.downloaded(A, b"a1")
    t = s.pending(B, b"b-in-flight")
    s.downloaded(C, b"c1")
    s.close()
    with DeviceStore(tmp_path, 10_000_000) as s:
        assert s.base(A) == b"a1"
        assert s.base(C) == b"c1"
        assert s.base(B) is None
        assert s.accepted(t) is False  # its outcome was lost with the old process
        assert blob_files(tmp_path) == {sha(b"a1"), sha(b"c1")}
        assert s.stats().pending == 0


def test_one_process_owns_a_state_folder(tmp_path):
    with DeviceStore(tmp_path, 1000):
        with pytest.raises(StoreLocked, match="in use by another process"):
            DeviceStore(tmp_path, 1000)
    DeviceStore(tmp_path, 1000).close()  # free again once closed


def test_lru_eviction_over_max_bytes(tmp_path):
    with DeviceStore(tmp_path, 3000) as s:
        s.downloaded(A, b"a" * 1000)
        s.downloaded(B, b"b" * 1000)
        s.downloaded(C, b"c" * 1000)
        assert s.base(A) == b"a" * 1000  # A is now the most recently used
        s.downloaded(D, b"d" * 1000)
        assert s.base(B) is None  # least recently used
        assert [s.base(k) is not None for k in (A, C, D)] == [True, True, True]
        assert s.held_bytes() == 3000
        assert len(blob_files(tmp_path)) == 3


def test_identical_versions_are_held_once(tmp_path):
    with DeviceStore(tmp_path, 1500) as s:
        s.downloaded(A, b"x" * 1000)
        s.downloaded(B, b"x" * 1000)
        assert s.held_bytes() == 1000
        assert s.base(A) == s.base(B) == b"x" * 1000
        s.forget(A)
        assert s.base(B) == b"x" * 1000  # the shared file stays while B names it


def test_pending_versions_are_never_evicted(tmp_path):
    with DeviceStore(tmp_path, 2000) as s:
        s.downloaded(A, b"a" * 1000)
        t1 = s.pending(B, b"b" * 1500)
        t2 = s.pending(C, b"c" * 1500)
        # over the bound with pending versions only: A went, both uploads stay
        assert s.base(A) is None
        assert s.held_bytes() == 3000
        assert s.accepted(t1) and s.accepted(t2)
        # settled: back under the bound, B (older) evicted
        assert s.held_bytes() <= 2000
        assert s.base(C) == b"c" * 1500 and s.base(B) is None


def test_a_version_larger_than_the_store_is_not_kept_but_drops_the_stale_base(tmp_path):
    with DeviceStore(tmp_path, 1000) as s:
        s.downloaded(A, b"small")
        t = s.pending(A, b"L" * 5000)
        assert s.base(A) == b"small"
        s.accepted(t)
        assert s.base(A) is None  # the provider no longer holds "small"
        s.downloaded(B, b"B" * 5000)
        assert s.base(B) is None
        assert blob_files(tmp_path) == set()


def test_lowering_max_bytes_evicts_at_open(tmp_path):
    with DeviceStore(tmp_path, 10_000) as s:
        for i, k in enumerate((A, B, C)):
            s.downloaded(k, bytes([65 + i]) * 1000)
    with DeviceStore(tmp_path, 1500) as s:
        assert s.held_bytes() == 1000
        assert s.base(C) is not None


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_version_is_dropped_on_read(tmp_path, damage):
    data = b"PK\x03\x04" + os.urandom(2000)
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, data)
        path = tmp_path / "blobs" / sha(data)[:2] / sha(data)
        if damage == "flip":
            raw = bytearray(path.read_bytes())
            raw[100] ^= 1
            path.write_bytes(raw)
        elif damage == "truncate":
            path.write_bytes(data[:-1])
        else:
            path.unlink()
        assert s.base(A) is None
        assert not path.exists()
        assert s.base(A) is None
        s.downloaded(A, data)  # the next download restores it
        assert s.base(A) == data


def make_unreadable(path: Path, how: str) -> None:
    """A real I/O error for the next read of `path`, as root too (where
    permissions do not stop a read): a folder where the file was (EISDIR),
    or a symlink to itself (ELOOP)."""
    path.unlink()
    if how == "folder":
        path.mkdir()
        (path / "inside").write_bytes(b"x")
    else:
        path.symlink_to(path.name)


def state_entries(folder: Path) -> list[str]:
    """Every file (or symlink) in the state folder but the index and its
    lock: what the store keeps beyond its index."""
    keep = {"index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm", "LOCK"}
    out = []
    for root, dirs, files in os.walk(folder):
        out += [os.path.relpath(os.path.join(root, n), folder) for n in files + dirs
                if n not in keep and (n in files or os.path.islink(os.path.join(root, n)))]
    return sorted(out)


@pytest.mark.parametrize("how", ["folder", "symlink-loop"])
def test_an_unreadable_version_is_dropped_deleted_and_counted(tmp_path, how, caplog):
    """A version whose file fails to read with an I/O error of its own (not
    missing, not corrupt) is dropped as a corrupt one is: `base` answers
    None (the save goes whole and the provider's accepted version becomes
    the base), the entry is deleted at once (so that writing the same
    content again does not take it for the file, and nothing is kept of
    it), the drop is counted for `ec_proxy status` and logged with its
    errno. Before, every read raised StoreError and the version stayed the
    base for ever: every save of the document failed in the proxy and went
    directly, unrecorded."""
    data = b"PK\x03\x04" + os.urandom(3000)
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, data)
        s.downloaded(B, b"another document")
        path = tmp_path / "blobs" / sha(data)[:2] / sha(data)
        make_unreadable(path, how)
        assert s.has_base(A)
        assert s.base(A) is None
        assert not s.has_base(A) and not os.path.lexists(path)
        assert not (tmp_path / "quarantine").exists()
        assert ("EISDIR" if how == "folder" else "ELOOP") in caplog.text and "cannot be read" in caplog.text
        assert s.stats().dropped == {"missing": 0, "corrupt": 0, "unreadable": 1}
        assert read_stats(tmp_path).dropped["unreadable"] == 1
        assert s.base(B) == b"another document"
        # The provider's next accepted version of the same bytes is a sound base again.
        token = s.pending(A, data)
        s.accepted(token)
        assert s.base(A) == data
    with DeviceStore(tmp_path, 10_000_000) as s:
        assert s.base(A) == data and s.stats().dropped["unreadable"] == 1


def test_a_failing_medium_does_not_grow_the_state_folder_save_after_save(tmp_path):
    """The same document saved again and again while its entry fails to
    read every time (a failing medium): each save writes the version, the
    next read finds it unreadable and drops it. Nothing of the dropped
    entries stays in the state folder. Before, each one was moved into
    quarantine/, emptied only at the next open: one more file per save,
    without bound, for as long as the proxy ran."""
    with DeviceStore(tmp_path, 10_000_000) as s:
        for n in range(20):
            data = b"PK\x03\x04" + n.to_bytes(2, "big") + os.urandom(2000)
            s.accepted(s.pending(A, data))
            make_unreadable(tmp_path / "blobs" / sha(data)[:2] / sha(data), "folder" if n % 2 else "symlink-loop")
            assert s.base(A) is None
            assert state_entries(tmp_path) == [], n
        s.accepted(s.pending(A, b"sound"))
        assert state_entries(tmp_path) == [f"blobs/{sha(b'sound')[:2]}/{sha(b'sound')}"]
        assert s.stats().dropped["unreadable"] == 20


def test_an_unreadable_entry_that_cannot_be_deleted_is_replaced_by_the_next_write(tmp_path, monkeypatch):
    """An unreadable entry (a folder where the file was) that cannot be
    deleted when it is dropped (here the deletion and the old rename aside
    both fail) stays in place: the next write of the same content must
    neither take it for the file nor fail on it. Before, the write renamed
    its file onto the folder (EISDIR) and every write of that content was a
    StoreError until the proxy restarted: the document's saves went
    directly, and the version never became a base again."""
    data = b"PK\x03\x04" + os.urandom(3000)
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, data)
        path = tmp_path / "blobs" / sha(data)[:2] / sha(data)
        make_unreadable(path, "folder")

        def cannot(*args, **kwargs):
            raise OSError(5, "Input/output error")

        with monkeypatch.context() as m:
            m.setattr(DeviceStore, "_remove", staticmethod(lambda path: False))
            m.setattr("ec_proxy.store.os.rename", cannot)
            assert s.base(A) is None
        assert path.is_dir()  # still there
        s.accepted(s.pending(A, data))
        assert path.is_file() and s.base(A) == data
        assert list((tmp_path / "tmp").iterdir()) == []


def test_an_unreadable_edge_version_is_dropped_and_the_base_offered(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"edge" * 100, at_edge=True)
        s.downloaded(A, b"base" * 100)
        make_unreadable(tmp_path / "blobs" / sha(b"edge" * 100)[:2] / sha(b"edge" * 100), "folder")
        assert s.edge_base(A) == b"base" * 100
        assert s.edge_base(A) == b"base" * 100 and s.stats().dropped["unreadable"] == 1


def test_a_folder_in_place_of_a_version_neither_stops_the_store_opening_nor_evicting(tmp_path):
    """A folder where an orphan version's file was (deleted at open) or where
    an evicted version's file is: before, the store failed to open
    (unlink: EISDIR), so the proxy did not start, or every later write that
    evicted failed."""
    with DeviceStore(tmp_path, 10_000) as s:
        s.downloaded(A, b"a" * 4000)
        s.downloaded(B, b"b" * 4000)
        make_unreadable(tmp_path / "blobs" / sha(b"a" * 4000)[:2] / sha(b"a" * 4000), "folder")
        orphan = tmp_path / "blobs" / "ff" / ("f" * 64)
        orphan.parent.mkdir(exist_ok=True)
        orphan.mkdir()
        (tmp_path / "tmp" / "left-over").mkdir()
        s.downloaded(C, b"c" * 4000)  # evicts A, least recently used, whose file is a folder
        assert not s.has_base(A) and s.base(C) == b"c" * 4000
    with DeviceStore(tmp_path, 10_000) as s:
        assert not orphan.exists() and list((tmp_path / "tmp").iterdir()) == []
        assert s.base(B) == b"b" * 4000


TRANSIENT_CHILD = textwrap.dedent("""
    import errno, os, resource, sys
    from ec_protocol import DocKey
    from ec_proxy.store import DeviceStore, StoreError

    doc = DocKey(1, b"dbid:alice", b"/docs/a.docx")
    s = DeviceStore(sys.argv[1], 10_000_000)
    s.downloaded(doc, b"v1" * 500)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        assert e.errno == errno.EMFILE, e
    try:
        s.base(doc)
        print("no error")
    except StoreError as e:
        print("StoreError", e)
    for fd in held:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print("kept" if s.base(doc) == b"v1" * 500 else "dropped", s.stats().dropped)
""")


def test_a_read_failing_for_want_of_file_descriptors_keeps_the_version(tmp_path):
    """EMFILE says nothing about the version: the read fails (StoreError:
    the save goes as when the store fails) and the version stays the base."""
    script = tmp_path / "emfile.py"
    script.write_text(TRANSIENT_CHILD)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "state")], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().splitlines()
    assert out[0].startswith("StoreError") and "Too many open files" in out[0], out
    assert out[1].startswith("kept") and "'unreadable': 0" in out[1], out


def test_an_unreadable_index_is_moved_aside(tmp_path):
    with DeviceStore(tmp_path, 10_000) as s:
        s.downloaded(A, b"a")
    (tmp_path / "index.sqlite3").write_bytes(b"this is not an sqlite database" * 100)
    for extra in ("index.sqlite3-wal", "index.sqlite3-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    with DeviceStore(tmp_path, 10_000) as s:
        assert s.base(A) is None
        assert blob_files(tmp_path) == set()  # the orphaned version is gone too
    assert list(tmp_path.glob("index.sqlite3.unreadable-*"))


def test_matches_a_model_over_random_operations(tmp_path):
    """A dict model of the invariant: the base is the last version the
    provider accepted or served; eviction may only drop bases."""
    rng = random.Random(4)
    docs = [A, B, C, D]
    model: dict[DocKey, bytes] = {}
    inflight: dict[str, tuple[DocKey, bytes]] = {}
    with DeviceStore(tmp_path, 6000) as s:
        for step in range(400):
            op = rng.choice(["pending", "accepted", "rejected", "downloaded", "base", "forget"])
            doc = rng.choice(docs)
            data = f"{step}:".encode() * rng.randint(1, 300)
            if op == "pending":
                inflight[s.pending(doc, data)] = (doc, data)
            elif op in ("accepted", "rejected") and inflight:
                token = rng.choice(sorted(inflight))
                d, v = inflight.pop(token)
                if op == "accepted":
                    assert s.accepted(token)
                    if len(v) <= 6000:
                        model[d] = v
                    else:
                        model.pop(d, None)
                else:
                    assert s.rejected(token)
            elif op == "downloaded":
                s.downloaded(doc, data)
                model[doc] = data
            elif op == "forget":
                s.forget(doc)
                model.pop(doc, None)
            got = s.base(doc)
            if got is None:
                model.pop(doc, None)  # evicted is allowed
            else:
                assert got == model.get(doc), f"step {step}: base is not the last accepted version"
            assert s.held_bytes() <= 6000 + sum(len(v) for _, v in inflight.values())
        expected = {sha(v) for v in model.values()} | {sha(v) for _, v in inflight.values() if len(v) <= 6000}
        assert blob_files(tmp_path) <= expected


# ----- the EPS's version (the edge version) -------------------------------------

def test_a_direct_save_keeps_the_version_the_eps_holds_as_the_next_patch_base(tmp_path):
    """A save the proxy sends straight to the provider leaves the EPS with the
    version before it: that one stays the patch base (`edge_base`) until a
    save goes through the EPS again; `base` is always the provider's version."""
    v1, v2, v3, v4 = (f"v{i}".encode() * 100 for i in range(1, 5))
    with DeviceStore(tmp_path, 10_000_000) as s:
        assert s.accepted(s.pending(A, v1), at_edge=True)  # through the EPS
        assert s.edge_base(A) == v1
        assert s.accepted(s.pending(A, v2))  # directly
        assert (s.base(A), s.edge_base(A)) == (v2, v1)
        assert s.accepted(s.pending(A, v3))  # directly again: the EPS still holds v1
        assert (s.base(A), s.edge_base(A)) == (v3, v1)
        assert blob_files(tmp_path) == {sha(v1), sha(v3)}  # v2 is held by no one
        assert s.held_bytes() == len(v1) + len(v3)
        assert s.stats().docs == [] and s.stats().documents_held == 1
        assert s.accepted(s.pending(A, v4), at_edge=True)  # through the EPS: it holds v4 now
        assert (s.base(A), s.edge_base(A)) == (v4, v4)
        assert blob_files(tmp_path) == {sha(v4)}


def test_a_version_the_eps_never_held_makes_no_edge_version(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"served directly")  # the EPS did not fetch it
        assert s.accepted(s.pending(A, b"saved directly"))
        assert s.edge_base(A) == b"saved directly"  # nothing known of the EPS: the base
        s.downloaded(B, b"fetched by the EPS", at_edge=True)
        s.downloaded(B, b"served directly")
        assert s.edge_base(B) == b"fetched by the EPS"
        s.downloaded(B, b"fetched by the EPS")  # the version the EPS holds, directly: nothing older to keep
        assert (s.base(B), s.edge_base(B)) == (b"fetched by the EPS", b"fetched by the EPS")
        assert blob_files(tmp_path) == {sha(b"saved directly"), sha(b"fetched by the EPS")}


def test_the_edge_version_survives_a_restart_and_goes_with_its_document(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"at the edge" * 50, at_edge=True)
        s.downloaded(A, b"direct" * 50)
    with DeviceStore(tmp_path, 10_000_000) as s:  # recovery keeps both files
        assert (s.base(A), s.edge_base(A)) == (b"direct" * 50, b"at the edge" * 50)
        s.forget(A)
        assert s.edge_base(A) is None and blob_files(tmp_path) == set()
        s.downloaded(A, b"a" * 600, at_edge=True)
        s.downloaded(A, b"b" * 600)
    with DeviceStore(tmp_path, 1000) as s:  # smaller bound: the document goes, both versions with it
        assert s.edge_base(A) is None and s.base(A) is None
        assert blob_files(tmp_path) == set()


def test_a_damaged_edge_version_is_dropped_and_the_base_offered(tmp_path, caplog):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"edge" * 100, at_edge=True)
        s.downloaded(A, b"base" * 100)
        path = tmp_path / "blobs" / sha(b"edge" * 100)[:2] / sha(b"edge" * 100)
        path.write_bytes(b"Edge" * 100)
        assert s.edge_base(A) == b"base" * 100
        assert "corrupt; dropped" in caplog.text
        assert not path.exists() and s.base(A) == b"base" * 100


def test_a_damaged_base_takes_its_edge_version_with_it(tmp_path):
    with DeviceStore(tmp_path, 10_000_000) as s:
        s.downloaded(A, b"edge" * 100, at_edge=True)
        s.downloaded(A, b"base" * 100)
        path = tmp_path / "blobs" / sha(b"base" * 100)[:2] / sha(b"base" * 100)
        path.write_bytes(b"Base" * 100)
        assert s.edge_base(A) == b"edge" * 100  # the edge version itself is sound
        assert s.base(A) is None  # the damaged base drops the document's row
        assert s.edge_base(A) is None and blob_files(tmp_path) == set() and s.held_bytes() == 0


def test_a_schema_1_index_is_migrated_and_its_bases_kept(tmp_path):
    """A state folder of an earlier proxy (index schema 1, no edge columns)."""
    data = b"kept across the upgrade"
    (tmp_path / "blobs" / sha(data)[:2]).mkdir(parents=True)
    (tmp_path / "blobs" / sha(data)[:2] / sha(data)).write_bytes(data)
    db = sqlite3.connect(tmp_path / "index.sqlite3")
    db.executescript("""
        CREATE TABLE meta (k TEXT PRIMARY KEY, v) WITHOUT ROWID;
        CREATE TABLE synced (doc BLOB PRIMARY KEY, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
                             used INTEGER NOT NULL) WITHOUT ROWID;
        CREATE INDEX synced_used ON synced (used);
        CREATE INDEX synced_sha ON synced (sha256);
        CREATE TABLE pending (token TEXT PRIMARY KEY, doc BLOB NOT NULL, sha256 TEXT, size INTEGER NOT NULL) WITHOUT ROWID;
        PRAGMA user_version=1;
    """)
    db.execute("INSERT INTO synced VALUES (?, ?, ?, 1)", (A.encode(), sha(data), len(data)))
    db.commit()
    db.close()
    with DeviceStore(tmp_path, 10_000_000) as s:
        assert s.base(A) == data and s.edge_base(A) == data  # taken as not held by the EPS
        s.downloaded(A, b"next")
        assert s.edge_base(A) == b"next"
    assert sqlite3.connect(tmp_path / "index.sqlite3").execute("PRAGMA user_version").fetchone()[0] == 2


def test_edge_versions_match_a_model_over_random_operations(tmp_path):
    """The model: `base` is the last version accepted or served; the EPS holds
    the last one that went through it (`at_edge`), if any since the document
    was last dropped; `edge_base` is that one, else the base."""
    rng = random.Random(13)
    docs = [A, B, C]
    base: dict[DocKey, bytes] = {}
    eps: dict[DocKey, bytes] = {}
    inflight: dict[str, tuple[DocKey, bytes]] = {}
    with DeviceStore(tmp_path, 8000) as s:
        for step in range(500):
            for gone in set(base) - set(s.documents()):  # evicted by an earlier step
                base.pop(gone), eps.pop(gone, None)
            op = rng.choice(["pending", "settle", "settle", "downloaded", "forget"])
            doc = rng.choice(docs)
            data = f"{step}:".encode() * rng.randint(1, 250)
            at_edge = rng.random() < 0.4
            if op == "pending":
                inflight[s.pending(doc, data)] = (doc, data)
                continue
            if op == "settle" and inflight:
                token = rng.choice(sorted(inflight))
                doc, data = inflight.pop(token)
                if rng.random() < 0.2:
                    assert s.rejected(token)
                    continue
                assert s.accepted(token, at_edge)
            elif op == "downloaded":
                s.downloaded(doc, data, at_edge)
            elif op == "forget":
                s.forget(doc)
                base.pop(doc, None), eps.pop(doc, None)
                continue
            else:
                continue
            if len(data) > 8000:
                base.pop(doc, None), eps.pop(doc, None)
                continue
            base[doc] = data
            for gone in set(base) - set(s.documents()):  # evicted (least recently used), edge version and all
                base.pop(gone), eps.pop(gone, None)
            if doc not in base:
                continue
            if at_edge:
                eps[doc] = data
            got_edge, got_base = s.edge_base(doc), s.base(doc)
            assert got_base == base[doc], f"step {step}"
            assert got_edge == eps.get(doc, base[doc]), f"step {step}"
        held = {sha(v) for v in base.values()} | {sha(v) for v in eps.values()} | \
            {sha(v) for _, v in inflight.values() if len(v) <= 8000}
        assert blob_files(tmp_path) <= held


# ----- crashes: a child process killed at a chosen step -----------------------

CHILD = textwrap.dedent("""
    import os, signal, sys
    from ec_protocol import DocKey
    from ec_proxy.store import DeviceStore

    folder, op, stage = sys.argv[1], sys.argv[2], sys.argv[3]

    class Crashy(DeviceStore):
        armed = False
        def _crash_point(self, where):
            if self.armed and where == stage:
                os.kill(os.getpid(), signal.SIGKILL)

    doc = DocKey(1, b"dbid:alice", b"/docs/a.docx")
    s = Crashy(folder, 10_000_000)
    s.downloaded(doc, b"v1" * 500)
    token = s.pending(doc, b"v2" * 500) if op == "accepted" else None
    s.armed = True
    if op == "pending":
        s.pending(doc, b"v2" * 500)
    elif op == "accepted":
        s.accepted(token)
    elif op == "downloaded":
        s.downloaded(doc, b"v2" * 500)
    sys.exit(3)  # not reached when the crash point fires
""")


def run_child(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "state"), *args],
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("op,stage", [
    ("pending", "blob-written"),
    ("pending", "row-written"),
    ("accepted", "row-written"),
    ("downloaded", "blob-written"),
    ("downloaded", "row-written"),
])
def test_a_crash_between_file_and_commit_leaves_the_old_base(tmp_path, op, stage):
    done = run_child(tmp_path, op, stage)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    state = tmp_path / "state"
    doc = DocKey(1, b"dbid:alice", b"/docs/a.docx")
    with DeviceStore(state, 10_000_000) as s:
        assert s.base(doc) == b"v1" * 500
        assert s.stats().pending == 0
    assert blob_files(state) == {sha(b"v1" * 500)}  # the new file was an orphan and is gone
    assert list((state / "tmp").iterdir()) == []


LOOP_CHILD = textwrap.dedent("""
    import os, sys
    from ec_protocol import DocKey
    from ec_proxy.store import DeviceStore

    folder, journal = sys.argv[1], sys.argv[2]
    docs = [DocKey(1, b"acct", f"/d{i}.docx".encode()) for i in range(3)]
    s = DeviceStore(folder, 20_000)
    j = open(journal, "a")
    def note(line):
        j.write(line + "\\n"); j.flush(); os.fsync(j.fileno())
    n = 0
    while True:
        for i, doc in enumerate(docs):
            n += 1
            data = f"{i}:{n}:".encode() * 700
            token = s.pending(doc, data)
            if n % 3 == 0:
                s.rejected(token)
                continue
            note(f"promote {i} {n}")
            s.accepted(token)
            note(f"acked {i} {n}")
""")


@pytest.mark.parametrize("seed", range(4))
def test_killed_at_random_the_store_reopens_with_accepted_versions_only(tmp_path, seed):
    script, journal, state = tmp_path / "loop.py", tmp_path / "journal", tmp_path / "state"
    script.write_text(LOOP_CHILD)
    journal.touch()
    child = subprocess.Popen([sys.executable, str(script), str(state), str(journal)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while journal.stat().st_size < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(random.Random(seed).uniform(0.0, 0.3))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()
    promoted: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}
    acked: dict[int, int] = {}
    for line in journal.read_text().splitlines():
        kind, i, n = line.split()
        if kind == "promote":
            promoted[int(i)].add(int(n))
        else:
            acked[int(i)] = int(n)
    assert acked, "the child made no progress before the kill"
    with DeviceStore(state, 20_000) as s:
        for i in range(3):
            base = s.base(DocKey(1, b"acct", f"/d{i}.docx".encode()))
            if base is None:
                continue  # evicted, allowed
            n = int(base.split(b":")[1])
            assert base == f"{i}:{n}:".encode() * 700
            assert n in promoted[i], "a version that was never accepted became a base"
            assert n >= acked.get(i, 0), "an acknowledged acceptance was lost"
        held = blob_files(state)
        assert len(held) <= 3
        assert s.stats().pending == 0


# ----- statistics ---------------------------------------------------------------

def test_save_statistics_per_document_and_total(tmp_path):
    with DeviceStore(tmp_path, 10_000) as s:
        s.record_save(A, 600, 43_551, "patch", "pays")
        s.record_save(A, 44_000, 43_551, "full", "base_unknown")
        s.record_save(A, 700, 43_551, "patch", "pays")
        s.record_save(B, 0, 5_000, "direct", "eps_unreachable")
        with pytest.raises(ValueError):
            s.record_save(B, 0, 5, "sideways", "?")
        st = s.stats()
    by_ref = {d.ref: d for d in st.docs}
    a, b = by_ref[A.ref], by_ref[B.ref]
    assert (a.saves, a.patch_saves, a.full_saves, a.direct_saves) == (3, 2, 1, 0)
    assert a.sent_bytes == 45_300 and a.whole_bytes == 130_653 and a.link_bytes == 45_300
    assert a.last_how == "patch" and a.last_whole_reason == "base_unknown"
    assert b.link_bytes == 5_000 and b.saved_bytes == 0  # direct: the whole file crossed the link
    assert st.total.saves == 4 and st.total.whole_bytes == 135_653
    assert st.total.link_bytes == 50_300
    assert st.total.last_whole_reason == "eps_unreachable"
    assert round(st.total.saved_percent, 1) == round(100 * (135_653 - 50_300) / 135_653, 1)


def test_read_stats_while_the_store_is_owned(tmp_path):
    with DeviceStore(tmp_path, 10_000) as s:
        s.downloaded(A, b"x" * 100)
        s.record_save(A, 10, 100, "patch", "pays")
        st = read_stats(tmp_path)
        assert st.total.saves == 1 and st.documents_held == 1 and st.max_bytes == 10_000
        assert st.docs[0].held_bytes == 100
        with pytest.raises(sqlite3.OperationalError):
            sqlite3.connect(f"{(tmp_path / 'index.sqlite3').as_uri()}?mode=ro", uri=True).execute(
                "DELETE FROM stats")


def test_a_failed_write_is_a_store_error_and_keeps_the_base(tmp_path):
    new = b"the new version"
    with DeviceStore(tmp_path, 10_000) as s:
        s.downloaded(A, b"base")
        (tmp_path / "blobs" / sha(new)[:2]).write_bytes(b"")  # a file where the folder must go
        with pytest.raises(StoreError, match="cannot write a version"):
            s.pending(A, new)
        assert s.base(A) == b"base"
        assert s.stats().pending == 0
    with pytest.raises(StoreError, match="closed"):
        s.base(A)


def test_has_base_answers_without_reading_the_version(tmp_path):
    """The proxy asks `has_base` before deciding whether to diff: a row is
    enough; `base` reads and checks the file (and drops a corrupt one)."""
    with DeviceStore(tmp_path, 10_000_000) as s:
        assert not s.has_base(A)
        s.downloaded(A, b"PK\x03\x04 version one")
        assert s.has_base(A)
        (blob,) = blob_files(tmp_path)
        path = next(p for p in tmp_path.rglob(blob))
        path.write_bytes(b"PK\x03\x04 version ONE")
        assert s.has_base(A), "not read: still listed"
        assert s.base(A) is None, "read and checked: corrupt, dropped"
        assert not s.has_base(A)


def test_statistics_keep_the_last_saved_documents_and_fold_the_others_into_the_total(tmp_path):
    """One row of statistics per document ever saved grew without end (a
    proxy running for months, a sync client saving thousands of files):
    beyond `max_stats_docs` documents, the least recently saved ones are
    folded into the total, which stays whole; a reopened store with a lower
    bound folds at open."""
    docs = [DocKey(DROPBOX, b"dbid:alice", f"/docs/{n}.docx".encode()) for n in range(7)]
    with DeviceStore(tmp_path, 10_000, max_stats_docs=3) as s:
        for n, doc in enumerate(docs):
            s.record_save(doc, 10 + n, 1000, "direct" if n == 0 else "patch", f"r{n}")
            time.sleep(0.002)  # distinct last_at
        s.record_save(docs[4], 5, 1000, "full", "again")
        st = s.stats()
        rows = sqlite3.connect(tmp_path / "index.sqlite3").execute("SELECT count(*) FROM stats").fetchone()[0]
    assert [d.ref for d in st.docs] == [docs[4].ref, docs[6].ref, docs[5].ref]
    assert rows == 4  # three documents and the folded sums
    assert st.folded_docs == 4
    assert st.total.saves == 8 and st.total.whole_bytes == 8000
    assert st.total.sent_bytes == sum(10 + n for n in range(7)) + 5
    assert st.total.link_bytes == st.total.sent_bytes + 1000  # the direct save's whole file, folded in
    assert (st.total.patch_saves, st.total.full_saves, st.total.direct_saves) == (6, 1, 1)
    assert st.total.last_how == "full" and st.total.last_whole_reason == "again"
    assert read_stats(tmp_path).total.saves == 8
    with DeviceStore(tmp_path, 10_000, max_stats_docs=1) as s:
        st = s.stats()
    assert [d.ref for d in st.docs] == [docs[4].ref] and st.folded_docs == 6 and st.total.saves == 8
