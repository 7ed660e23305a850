"""The netns testbed (experiments/netlab): every link profile measures what it
claims (rate each way and round-trip time within 10%), loss is applied, and
nothing is left behind: not after a normal run, not after SIGINT or SIGTERM,
and after SIGKILL `netlab.py cleanup` removes it. Needs root (we are)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NETLAB = HERE.parent / "netlab"
sys.path.insert(0, str(NETLAB))

import netlab  # noqa: E402
import profiles  # noqa: E402

# Each Wi-Fi profile once, each WAN profile at least once.
PAIRS = [("wifi-ac-near", "wan-fiber", ("air", "wan")), ("wifi-ac-far", "wan-fcc25", ("air", "wan")),
         ("wifi-20m", "wan-fiber", ("air",)), ("wifi-5m", "wan-fiber", ("air",)),
         ("wifi-lossy", "wan-fiber", ("air",))]


def test_every_profile_is_tested():
    assert {p for w, n, _ in PAIRS for p in (w, n)} == set(profiles.PROFILES)
    for p in profiles.PROFILES.values():
        assert p.source, p.name


@pytest.mark.parametrize("wifi,wan,links", PAIRS, ids=[p[0] for p in PAIRS])
def test_links_measure_what_their_profiles_claim(wifi, wan, links):
    with netlab.Testbed(wifi, wan) as bed:
        run = bed.run
        rows = netlab.measure_profiles(bed, seconds=1.0, links=links)
    netlab.print_measurements(rows)
    for row in rows:
        claimed = row["claimed"]
        for key, want in (("down_mbit", claimed["down_mbit"]), ("up_mbit", claimed["up_mbit"]),
                          ("rtt_ms", claimed["rtt_ms"])):
            assert abs(row[key] - want) <= 0.10 * want, f"{row['profile']} {key}: {row[key]:.2f}, claimed {want}"
    if profiles.PROFILES[wifi].loss:
        for stats in bed.delayline_stats["air"]:
            seen = stats["lost"] / stats["packets_in"]
            assert 0.5 * profiles.PROFILES[wifi].loss < seen < 1.5 * profiles.PROFILES[wifi].loss, stats
    assert not [ns for ns in netlab.list_namespaces() if ns.startswith(run)]


def _running(pid):
    """Alive and not a zombie (a killed child waits for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ours(run):
    return [ns for ns in netlab.list_namespaces() if ns.startswith(run)]


def _start_up():
    proc = subprocess.Popen([sys.executable, str(NETLAB / "netlab.py"), "up", "--wifi", "wifi-20m", "--wan", "wan-fiber"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("{"), proc.stderr.read()
    info = json.loads(line)
    run = info["run"]
    assert len(_ours(run)) == len(netlab.HOSTS)
    # Something running inside, as an experiment would have.
    subprocess.run(["ip", "netns", "exec", info["namespaces"]["ap"], "true"], check=True)
    return proc, run


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_nothing(sig):
    proc, run = _start_up()
    pids = [p for ns in _ours(run) for p in netlab._ns_pids(ns)]
    assert pids, "the delay lines run inside the namespaces"
    proc.send_signal(sig)
    assert proc.wait(30) in (0, 130)
    assert _ours(run) == []
    assert not (netlab.STATE_DIR / f"{run}.json").exists()
    time.sleep(0.2)
    assert not [p for p in pids if _running(p)]


def test_cleanup_removes_what_a_killed_run_left():
    proc, run = _start_up()
    pids = [p for ns in _ours(run) for p in netlab._ns_pids(ns)]
    proc.kill()
    proc.wait(10)
    # The kernel killed the delay lines with their parent (PR_SET_PDEATHSIG); the namespaces stay.
    assert len(_ours(run)) == len(netlab.HOSTS)
    out = subprocess.run([sys.executable, str(NETLAB / "netlab.py"), "cleanup"], capture_output=True, text=True,
                         check=True).stdout
    assert run in out
    assert _ours(run) == []
    assert not [p for p in pids if _running(p)]


def test_an_experiment_interrupted_midway_leaves_nothing():
    """table2.py with its providers, EPS, ec-proxy and rclone running: SIGINT, then nothing of it remains."""
    proc = subprocess.Popen([sys.executable, str(HERE.parent / "paper" / "table2.py"), "--quick", "--wifi", "wifi-5m",
                             "--out", "/tmp/ec-netlab-interrupt-test"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    run = None
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        if "on testbed " in line:
            run = line.split("on testbed ", 1)[1].split()[0]
        if run and "writer-" in line:
            break
        assert time.monotonic() < deadline, "table2 did not get to its first save"
    assert run and len(_ours(run)) == len(netlab.HOSTS)
    time.sleep(1.5)  # in the middle of a save
    started = {p for ns in _ours(run) for p in netlab._ns_pids(ns)}
    names = {open(f"/proc/{p}/comm").read().strip() for p in started if _running(p)}
    assert {"ec-eps", "ec-delayline"} <= names, names  # and Python's: providers, ec-proxy, mitmdump
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    assert _ours(run) == []
    time.sleep(0.3)
    assert not [p for p in started if _running(p)]
    assert not os.path.exists(f"/etc/netns/{run}-device")
