"""Tests of `python -m ec_proxy.status` on a store filled through ec_proxy.store,
run as the user runs it (a subprocess), also while the store is open."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ec_protocol import DROPBOX, WEBDAV, DocKey
from ec_proxy.store import DeviceStore

A = DocKey(DROPBOX, b"dbid:alice", "/docs/r\u00e9sum\u00e9.docx".encode())
B = DocKey(WEBDAV, b"alice@cloud", b"/remote.php/dav/files/alice/b.xlsx")


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ec_proxy.status", *args],
                          capture_output=True, text=True, timeout=60)


def fill(folder) -> DeviceStore:
    s = DeviceStore(folder, 1_000_000)
    s.downloaded(A, b"x" * 43_551)
    s.record_save(A, 44_000, 43_551, "full", "no_base")
    s.record_save(A, 600, 43_551, "patch", "patch_pays")
    s.record_save(A, 580, 43_551, "patch", "patch_pays")
    s.record_save(B, 120, 5_000, "direct", "eps_unreachable")
    return s


def test_json_per_document_and_total(tmp_path):
    with fill(tmp_path):
        done = status("--state", str(tmp_path), "--json")  # while the proxy owns the store
    assert done.returncode == 0, done.stderr
    j = json.loads(done.stdout)
    assert j["documents_held"] == 1 and j["held_bytes"] == 43_551 and j["max_bytes"] == 1_000_000
    docs = {d["ref"]: d for d in j["documents"]}
    a = docs["/docs/r\u00e9sum\u00e9.docx"]
    assert a["provider_name"] == "dropbox" and a["account"] == "dbid:alice"
    assert (a["saves"], a["patch_saves"], a["full_saves"]) == (3, 2, 1)
    assert a["link_bytes"] == 45_180 and a["whole_bytes"] == 130_653
    assert a["last_how"] == "patch" and a["last_whole_reason"] == "no_base"
    b = docs["/remote.php/dav/files/alice/b.xlsx"]
    assert b["link_bytes"] == 5_120 and b["saved_bytes"] == -120 and b["last_reason"] == "eps_unreachable"
    t = j["total"]
    assert t["saves"] == 4 and t["whole_bytes"] == 135_653 and t["link_bytes"] == 50_300
    assert t["saved_percent"] == round(100 * (135_653 - 50_300) / 135_653, 2)
    assert t["last_whole_reason"] == "eps_unreachable"


def test_text_says_what_was_sent_saved_and_why(tmp_path):
    fill(tmp_path).close()
    done = status("--state", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "1 document(s) held" in out
    assert "dropbox  dbid:alice  /docs/r\u00e9sum\u00e9.docx" in out
    assert "3 saves (2 patch, 1 full, 0 direct): sent 44.1 KiB, link 44.1 KiB for 127.6 KiB whole, saved 65.4%" in out
    assert "last: patch (patch_pays)" in out and "last whole: no_base" in out
    assert "webdav  alice@cloud  /remote.php/dav/files/alice/b.xlsx" in out
    assert "last: direct (eps_unreachable)" in out
    assert "total: 4 saves (2 patch, 1 full, 1 direct)" in out
    assert "saved 62.9%" in out


def test_an_empty_store_and_a_missing_one(tmp_path):
    DeviceStore(tmp_path / "s", 1000).close()
    done = status("--state", str(tmp_path / "s"))
    assert done.returncode == 0 and "no saves recorded yet" in done.stdout
    done = status("--state", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "no device store" in done.stderr and "--state folder" in done.stderr
    assert not (tmp_path / "nowhere").exists()  # looking does not create a store


def test_help_explains_the_columns():
    done = status("--help")
    assert done.returncode == 0
    for needle in ("--state DIR", "--json", "link", "whole", "direct", "cannot_pay", "example:"):
        assert needle in done.stdout


def test_eps_health_is_recorded_and_shown(tmp_path):
    """Issue 8: how the proxy last found its EPS (state, reason, since) and
    the counters, in JSON and in text; `since` moves only when the state changes."""
    with DeviceStore(tmp_path, 1_000_000) as s:
        assert s.stats().eps == {}
        assert "EPS: not contacted yet" in status("--state", str(tmp_path)).stdout
        s.record_eps("unreachable", "cannot connect to the EPS: ConnectionRefusedError", "unreachable", "https://eps:8443")
        s.record_eps("pin_mismatch", "pin mismatch: expected aa got bb", "pin_mismatch", "https://eps:8443")
        since = s.stats().eps["since"]
        s.record_eps("pin_mismatch", "pin mismatch: expected aa got bb", "pin_mismatch", "https://eps:8443")
        eps = s.stats().eps
        assert eps["since"] == since and eps["at"] >= since
        assert eps["state"] == "pin_mismatch" and eps["reason"] == "pin mismatch: expected aa got bb"
        assert eps["counts"] == {"pin_mismatch": 2, "unreachable": 1, "auth_failed": 0, "outcome_unknown": 0}
        j = json.loads(status("--state", str(tmp_path), "--json").stdout)
        assert j["eps"]["state"] == "pin_mismatch" and j["eps"]["url"] == "https://eps:8443"
        text = status("--state", str(tmp_path)).stdout
        assert "EPS https://eps:8443: PIN MISMATCH since" in text and "pin mismatch: expected aa got bb" in text
        assert "2 pin mismatch, 1 unreachable" in text
        s.record_eps("ok", "", None, "https://eps:8443")
        assert s.stats().eps["state"] == "ok" and s.stats().eps["counts"]["pin_mismatch"] == 2
        with pytest.raises(ValueError):
            s.record_eps("sleepy")


def test_the_rules_view_of_the_link_is_shown(tmp_path):
    """`status` shows what the patch-or-whole rule believes of the link, as
    the proxy last recorded it (LinkEstimator.summary)."""
    from ec_proxy.decide import EXPLORE_EVERY, LinkEstimator

    est = LinkEstimator()
    est.observe(600, 300, 0.012)                  # a small exchange: the round trip
    est.observe_base(False)
    with DeviceStore(tmp_path, 1_000_000) as s:
        s.record_eps("ok", "", None, "https://eps:8443")
        assert s.stats().eps["link"] is None
        s.record_link(est.summary())
        link = s.stats().eps["link"]
    assert link["rtt_ms"] == pytest.approx(11.7, abs=0.1) and link["mbit_s"] == 20.0
    assert link["patches_seen"] == 1 and link["base_miss_rate"] == pytest.approx(2 / 21, abs=1e-4)
    assert link["explore_after_whole"] == EXPLORE_EVERY + 1
    j = json.loads(status("--state", str(tmp_path), "--json").stdout)
    assert j["eps"]["link"] == link
    text = status("--state", str(tmp_path)).stdout
    assert "the rule's view of the link" in text and "20.0 Mbit/s, round trip 11.6 ms" in text, text
    assert "base misses 9.5% (patches seen: 1)" in text, text


@pytest.mark.parametrize("row", ["{not json", "[1, 2]", '{"mbit_s": 80.0}'])
def test_a_damaged_link_row_hides_only_that_line(tmp_path, row):
    """The store's meta row of the link view is damaged or from another
    version: `status` still shows the EPS and the documents, with the link
    line left out (or its missing numbers as nan), and exits 0."""
    with DeviceStore(tmp_path, 1_000_000) as s:
        s.record_eps("ok", "", None, "https://eps:8443")
        s.record_save(B, 500, 40_000, "patch", "patch_pays")
        s._db.execute("INSERT OR REPLACE INTO meta VALUES ('eps_link', ?)", (row,))
        s._db.commit()
    done = status("--state", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "EPS https://eps:8443: ok" in done.stdout and "b.xlsx" in done.stdout, done.stdout
    if row.startswith("{\"mbit_s"):
        assert "80.0 Mbit/s, round trip nan ms" in done.stdout, done.stdout
    else:
        assert "the rule's view of the link" not in done.stdout, done.stdout
    j = json.loads(status("--state", str(tmp_path), "--json").stdout)
    assert j["eps"]["state"] == "ok"


def test_versions_dropped_when_read_are_shown(tmp_path):
    """A base the store dropped when it read it (here unreadable: a folder
    stands where its file was) is counted in `status`, text and JSON."""
    with DeviceStore(tmp_path, 1_000_000) as s:
        s.downloaded(A, b"x" * 100)
        blob = next(p for p in (tmp_path / "blobs").glob("*/*"))
        blob.unlink()
        blob.mkdir()
        assert s.base(A) is None
    done = status("--state", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dropped"] == {"missing": 0, "corrupt": 0, "unreadable": 1}
    text = status("--state", str(tmp_path)).stdout
    assert "versions dropped when read: 0 missing, 0 corrupt, 1 unreadable" in text
