"""Edit-trace replay (experiments/replay): the save policies cut the real
keystroke recordings of EC_EDITING_TRACES (CC BY 4.0, josephg/editing-traces)
where they say, the text replays to the recording's own end, and a short
replay through rclone, ec-proxy and the EPS on the netns testbed saves every
version exactly (provider hash) and mostly as patches."""

import csv
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPLAY = HERE.parent / "replay" / "replay.py"
sys.path.insert(0, str(REPLAY.parent))

import replay  # noqa: E402


def test_policies_cut_the_recording_where_they_say():
    session = replay.load_session("clownschool_flat")
    every = replay.saves(session, "every:60")
    assert every[-1].text == session["endContent"] and every[-1].edits == len(session["txns"])
    gaps = [(b.at - a.at).total_seconds() for a, b in zip(every, every[1:-1])]
    assert all(g >= 60 for g in gaps)
    keys = replay.saves(session, "keys:500")
    assert [s.edits for s in keys[:3]] == [500, 1000, 1500]
    idle = replay.saves(session, "idle:10")
    assert 1 < len(idle) < len(every)
    assert len(replay.saves(session, "every:1", max_saves=5)) == 5


def run(*args):
    done = subprocess.run([sys.executable, str(REPLAY), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rows(path):
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_replay_docx_against_direct(tmp_path):
    out = run("clownschool_flat", "--policy", "every:60", "--max-saves", "3", "--format", "docx", "--wifi", "wifi-20m",
              "--out", str(tmp_path))
    assert "all equal" in out and "CC BY 4.0" in out
    saved = rows(tmp_path / "replay-clownschool_flat-docx.csv")
    assert len(saved) == 3
    assert saved[0]["how"] == "full" and all(r["how"] == "patch" for r in saved[1:])
    for r in saved[1:]:
        assert int(r["upload_bytes"]) < int(r["whole_bytes"]) == int(r["file_bytes"])
        assert int(r["edgecourier_link_bytes"]) < int(r["direct_link_bytes"])
    assert (tmp_path / "replay-clownschool_flat-docx.png").stat().st_size > 10_000


def test_replay_spreadsheet_without_baseline(tmp_path):
    out = run("seph-blog1", "--policy", "keys:2000", "--max-saves", "2", "--format", "ods", "--no-direct",
              "--out", str(tmp_path))
    assert "all equal" in out
    saved = rows(tmp_path / "replay-seph-blog1-ods.csv")
    assert [r["how"] for r in saved] == ["full", "patch"]
    assert saved[1]["edgecourier_provider_ok"] == "True"
