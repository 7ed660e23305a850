"""The density benchmark (`experiments/density/run.py`), small: one run of
the process backend through the real edge manager (three instances, their
saves timed), and an interrupted run that leaves nothing behind. Needs root
(the manager runs each instance under its own uid) and `make build`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "density" / "run.py"
sys.path.insert(0, str(SCRIPT.parent))
from run import LAB_PREFIX, STATE_PREFIX  # noqa: E402


def run_processes() -> list[str]:
    """Processes (the manager, its EPS instances) whose command line names a density run's folders."""
    found = []
    marks = (STATE_PREFIX.encode(), LAB_PREFIX.encode())
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if proc.name.isdigit() and any(m in cmdline for m in marks) and b"pytest" not in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]!r}")
    return found


def eps_count() -> int:
    return sum(1 for p in run_processes() if "ec-eps" in p)


def test_a_small_process_run_measures_and_cleans_up(tmp_path):
    out = tmp_path / "density.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--backends", "process", "--count", "3", "--parallel", "2",
                        "--save-runs", "2", "--settle", "0.5", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    b = json.loads(out.read_text())["backends"][0]
    assert b["backend"] == "process" and b["fitted"] == 3 and b["crashes"] == 0, b
    assert b["cleanup"]["deleted"] == 3 and b["cleanup"]["leftovers"] == [], b["cleanup"]
    for series in ("save_idle0", "save_idleN"):
        assert b[series]["last_sent"] == "['patch']" and b[series]["save_median_s"] > 0, b[series]
    assert b["save_idleN"]["idle"] == 3
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "| process |" in r.stdout
    assert not run_processes()


def test_an_interrupted_run_stops_at_once_and_leaves_nothing(tmp_path):
    """SIGINT while instances start: the run does not wait for the starts
    under way, deletes what it started, reports it, and exits 130."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--backends", "process", "--count", "400", "--parallel", "2",
                             "--settle", "30", "--json", str(tmp_path / "d.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and eps_count() < 3:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert eps_count() >= 3, "no EPS instance started in time"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert code == 130, err[-3000:]
    assert "interrupted" in err
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and run_processes():
        time.sleep(0.5)
    assert not run_processes()
    assert json.loads((tmp_path / "d.json").read_text())["backends"][0]["interrupted"] is True
