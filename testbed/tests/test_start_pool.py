"""testbed.edge.StartPool: the instance starts of fig12_13 and the density
benchmark. An interrupted run must exit while a start is still under way
(a ThreadPoolExecutor's threads are joined at the interpreter's exit, which
hung a CI run of fig12_13 for minutes after SIGINT)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.edge import StartPool

REPO = Path(__file__).resolve().parents[2]

# A run whose start never ends, interrupted while it waits for it.
INTERRUPTED_RUN = """
import concurrent.futures as cf, sys, threading, time
sys.path.insert(0, {repo!r})
from testbed.edge import StartPool
pool = {pool}(2)
futures = [pool.submit(time.sleep, 3600) for _ in range(3)]
try:
    time.sleep(0.3)
    raise KeyboardInterrupt
except KeyboardInterrupt:
    pool.shutdown(wait=False, cancel_futures=True)
    print("interrupted", flush=True)
    sys.exit(130)
"""


def run_interrupted(pool: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", INTERRUPTED_RUN.format(repo=str(REPO), pool=pool)],
                          capture_output=True, text=True, timeout=20)


def test_an_interrupted_run_exits_while_a_start_is_under_way():
    out = run_interrupted("StartPool")
    assert (out.returncode, out.stdout.strip()) == (130, "interrupted"), out.stderr


def test_the_executor_it_replaces_does_not():
    """What the pool is for: the same run on a ThreadPoolExecutor is still waiting when its time is up."""
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", INTERRUPTED_RUN.format(repo=str(REPO), pool="cf.ThreadPoolExecutor")],
                       capture_output=True, text=True, timeout=3)


def test_results_errors_cancellation_and_initializer():
    seen: list[str] = []
    pool = StartPool(2, initializer=lambda tag: setattr(threading.current_thread(), "tag", tag), initargs=("ns",))
    gate = threading.Event()

    def start(i: int) -> str:
        gate.wait(10)
        seen.append(getattr(threading.current_thread(), "tag", "?"))
        if i == 1:
            raise RuntimeError("instance 1 did not start")
        return f"started {i}"

    futures = [pool.submit(start, i) for i in range(5)]
    time.sleep(0.2)  # two are under way, three wait
    assert futures[4].cancel()
    gate.set()
    assert futures[0].result(10) == "started 0"
    with pytest.raises(RuntimeError, match="instance 1"):
        futures[1].result(10)
    assert [f.result(10) for f in futures[2:4]] == ["started 2", "started 3"]
    assert futures[4].cancelled()
    pool.shutdown(wait=True)
    assert seen == ["ns"] * 4


def test_shutdown_with_cancel_drops_the_starts_not_begun():
    gate = threading.Event()
    pool = StartPool(1)
    first = pool.submit(gate.wait, 10)
    rest = [pool.submit(lambda: "ran") for _ in range(3)]
    time.sleep(0.1)
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert first.result(10) is True
    assert all(f.cancelled() for f in rest)


def test_a_failing_initializer_fails_the_starts_and_does_not_hang():
    def broken() -> None:
        raise OSError("setns: no such namespace")

    pool = StartPool(2, initializer=broken)
    futures = [pool.submit(lambda: "ran") for _ in range(3)]
    for f in futures:
        with pytest.raises(OSError, match="setns"):
            f.result(10)
    pool.shutdown(wait=True)
