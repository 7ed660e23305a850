#!/usr/bin/env python3
"""Figs. 12 and 13 of the original paper: the access point's forwarding throughput, and document sync time, with N active EPS instances, per runtime.

On the netns testbed (experiments/netlab; default wifi-ac-far, 100 Mbit/s
each way, and wan-fiber), for each runtime in turn:

- the edge manager (`ec-edge serve --runtime R`) runs in the `ap`
  namespace, as on an access point (experiments/netlab/edge.py); the
  provider test servers run in `cloud`;
- instances are made the way devices get them: the operator adds a user
  (`POST /v1/users`, from the AP), the user's device joins from the
  `device` namespace over the Wi-Fi link (`POST /v1/join` on the manager's
  device listener), and the manager creates and starts the user's EPS and
  hands back the enrolment bundle;
- **"active" means saving**: every instance gets one save of a real .docx
  (240 kB, word2008-mac_Bug51170.docx of the shared corpus, the one the
  density benchmark saves) every `--period` seconds (default 30, a phase of
  its own each), a byte-exact one-edit version sent as a patch (the first
  save of each is the whole file, before it counts as active), by a load
  generator in `device` speaking the device protocol (ec_protocol's
  EpsClient, a kept-open TLS connection per instance) over the Wi-Fi link;
  instance 0 is the probe, saving every `--probe-interval` seconds
  (default 2): Fig. 13's sync time is its save time (request sent to the
  provider's answer back on the device: the Wi-Fi link, the EPS's rebuild,
  the upload over the WAN); the median over every save in the window is
  reported too;
- with N instances active, iperf3 sends UDP cross traffic from `sta1` to
  `sta2` at `--udp-mbit` (default 90: under the cell's 100 Mbit/s, so any
  shortfall is the access point's, not the link's) for `--window` seconds;
  Fig. 12's throughput is what iperf3's server in `sta2` received (the cell
  relays station-to-station traffic through the AP, as in infrastructure
  mode Wi-Fi).

N grows in steps (instances are added, never restarted), with a first step
of 0 instances (no manager yet: the AP's own throughput). A step that
cannot be reached (a start fails, or MemAvailable drops under
`--min-available-mib`) ends that runtime's series: how far it got is a
result. Runtimes: process and microvm run in the AP's namespace; docker's
manager runs in the root namespace, where the engine publishes its ports,
joined to the AP by a veth (experiments/netlab/edge.py). xen: this
machine has no Xen, so a whole Xen host nested under QEMU (TCG: software
emulation; unikernel/xen-host, `make xen-host`) boots inside the AP
namespace, its dom0 runs the manager (`--runtime xen`) and the instances
are Xen PVH guests; devices reach them at the AP's address across the Wi-Fi
link (an nftables DNAT to QEMU's port forwards), the guests reach `cloud`
across the WAN link (QEMU's user network makes their connections its own,
in the AP namespace): everything of it runs emulated, twice over for the
guests, and its times are those of emulation, not of an access point.

Nothing is left behind: the manager and every instance (EPS processes,
QEMU) run inside the testbed's namespaces and die with them, also on
SIGINT/SIGTERM; instances are deleted through the API at the end; the
manager's state folder and its instances' cgroups are recorded with the
run, so that `netlab.py cleanup` removes them after a SIGKILL too.

    .venv/bin/python experiments/paper/fig12_13.py [--runtimes process,microvm] [--counts 'process=1,5,...;microvm=1,5,10'] [--out DIR]
    .venv/bin/python experiments/paper/fig12_13.py --plot-from run1/fig12_13.json,run2/fig12_13.json [--out DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import heapq
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "netlab"))
import figures  # noqa: E402
import netlab  # noqa: E402
import system  # noqa: E402
from edge import ApManager  # noqa: E402  (experiments/netlab/edge.py)

REPO = figures.REPO
sys.path.insert(0, str(REPO))
from testbed.edge import StartPool  # noqa: E402
from testbed.lab import WEBDAV_HOST  # noqa: E402

ALL_COUNTS = (1, 5, 10, 20, 50, 100, 200, 500, 1000)
#: What this machine (2 cores, 24 GiB, no KVM, shared) can do per runtime in a few minutes each
#: (docs/results.md: process saturates the CPUs by 500, microvm under TCG by 50; xen, a Xen host nested
#: under TCG, does 1 and 5 in about 5 minutes and stopped at 14 of 20); --counts for more.
DEFAULT_COUNTS = {"process": (1, 5, 10, 20, 50, 100, 200, 500), "docker": (1, 5, 10, 20, 50, 100, 200),
                  "microvm": (1, 5, 10, 20, 50), "xen": (1, 5)}
DOCUMENT = "word2008-mac_Bug51170.docx"
from edge import APPLIANCE_DIR, DOCKER_IMAGE, ApXenManager, xen_host_missing  # noqa: E402
#: The paper's numbers: sync-time medians from its raw logs (1 and 200 instances); Docker stopped short of 200.
PAPER_SYNC_MEDIAN_S = {1: 0.67, 200: 6.5}
PAPER_MAX = {"process": 200, "docker": "<200 (could not reach 200)", "unikernel": 200}
MiB = 1 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mem_available_mib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def quantile(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ------------------------------------------------------------------ active instances: the load

class Load:
    """Devices saving to their EPS instances: each saves a one-edit version
    of the document every `period` seconds, by `workers` threads in the
    device's namespace; the probe (the first device) saves every
    `probe_interval` seconds from a thread of its own, so that its save
    times are not held up by a queue of other devices' saves.

    A save is the app's Dropbox upload request and one SaveItem, as
    eps.tests.e2e's Uploader builds them, with the two patches (version 0
    to 1 and back) made once: the device's diff is not what is measured,
    and 1,000 devices' diffs on the machine's two CPUs would be."""

    def __init__(self, bed: netlab.Testbed, document: bytes, period: float, probe_interval: float, workers: int) -> None:
        import ec_patch
        from eps.tests.e2e import dropbox_content_hash, edited

        self.bed, self.period, self.probe_interval = bed, period, probe_interval
        self.versions = [document, edited(document, 1)]  # alternating: every save is a one-edit patch
        self.patches = [bytes(ec_patch.diff(self.versions[1], self.versions[0])),
                        bytes(ec_patch.diff(self.versions[0], self.versions[1]))]
        self.hashes = [dropbox_content_hash(v) for v in self.versions]
        self.lock = threading.Condition()
        self.heap: list[tuple[float, int]] = []
        self.devices: list[dict[str, Any]] = []
        self.saves: list[tuple[float, float, int, bool, str]] = []  # start, seconds, device, ok, sent as
        self.under_way: dict[int, float] = {}  # thread id: start of the save it is making
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._worker, daemon=True, name=f"load-{k}") for k in range(workers)]
        self.threads.append(threading.Thread(target=self._probe, daemon=True, name="load-probe"))
        self.started = False

    def add(self, client: Any, name: str) -> None:
        """A device whose instance got the whole document already (its base)."""
        with self.lock:
            index = len(self.devices)
            self.devices.append({"client": client, "name": name, "version": 0})
            if index:  # the probe has its own thread
                heapq.heappush(self.heap, (time.monotonic() + random.uniform(0, self.period), index))
            self.lock.notify()

    def seed(self, client: Any, name: str) -> None:
        """The first save of an instance: the whole file."""
        from eps.tests.e2e import Uploader

        out = Uploader("dropbox", "single").save(client, name, self.versions[0], None)
        if not getattr(out, "succeeded", False):
            raise RuntimeError(f"the first save of {name} failed: {out!r}")

    def begin(self) -> None:
        if not self.started:
            self.started = True
            for t in self.threads:
                t.start()

    def _save(self, index: int) -> None:
        """One save of device `index`: the other version, as a patch against the one it holds."""
        import ec_protocol as p
        from ec_protocol import ProviderRequest, SaveItem
        from eps.tests.e2e import Uploader, auth

        device = self.devices[index]
        k = 1 - device["version"]
        up = Uploader("dropbox", "single")
        arg = json.dumps({"path": up._dropbox_path(device["name"]), "mode": "overwrite", "content_hash": self.hashes[k]})
        request = ProviderRequest("POST", "https://content.dropboxapi.com/2/files/upload",
                                  [auth(up.token), ("Dropbox-API-Arg", arg), ("Content-Type", "application/octet-stream")])
        item = SaveItem(self.versions[k], up.doc(device["name"]), self.patches[k], b"")
        start = time.monotonic()
        with self.lock:
            self.under_way[threading.get_ident()] = start
        try:
            out = device["client"].save(p.SINGLE, [request], [item])
            ok = bool(getattr(out, "succeeded", False))
        except Exception:  # noqa: BLE001 - a failed save is a result
            ok = False
        seconds = time.monotonic() - start
        sent = ",".join(getattr(device["client"], "last_sent_kinds", []) or []) or "?"
        with self.lock:
            if ok:
                device["version"] = k
            self.saves.append((start, seconds, index, ok, sent))
            del self.under_way[threading.get_ident()]
            self.lock.notify_all()

    def _probe(self) -> None:
        # It saves at once: the first save after the instances started (a cold EPS, under nested Xen seconds long)
        # falls in the settling time before a window, not across the window's start.
        netlab.enter_netns(self.bed.ns("device"))
        while not self.stop.is_set():
            if self.devices:
                self._save(0)
            self.stop.wait(self.probe_interval)

    def _worker(self) -> None:
        netlab.enter_netns(self.bed.ns("device"))
        while not self.stop.is_set():
            with self.lock:
                while not self.stop.is_set() and (not self.heap or self.heap[0][0] > time.monotonic()):
                    self.lock.wait(min(0.2, self.heap[0][0] - time.monotonic()) if self.heap else 0.2)
                if self.stop.is_set():
                    return
                due, index = heapq.heappop(self.heap)
            self._save(index)
            with self.lock:
                # Behind schedule, a device keeps its rate but does not queue up more than one period.
                heapq.heappush(self.heap, (max(due + self.period, time.monotonic() - self.period), index))
                self.lock.notify()

    def offered_per_s(self) -> float:
        n = len(self.devices)
        return (1 / self.probe_interval if n else 0) + max(0, n - 1) / self.period

    def window(self, t0: float, t1: float, wait: float = 120.0) -> dict[str, Any]:
        """The saves that started in [t0, t1). Those still under way at t1 are waited for (at most `wait`
        seconds; one that has not ended by then counts as failed): leaving them out would leave out the
        slowest saves of a loaded step and make its sync times look shorter than they were."""
        deadline = time.monotonic() + wait
        with self.lock:
            while any(start < t1 for start in self.under_way.values()) and time.monotonic() < deadline:
                self.lock.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            saves = list(self.saves)
            unfinished = sum(1 for start in self.under_way.values() if t0 <= start < t1)
        return window_stats(saves, t0, t1, unfinished, self.offered_per_s())

    def close(self, wait: float = 60) -> None:
        """Stops the devices; a save under way may take `wait` seconds to end (0 when interrupted)."""
        self.stop.set()
        with self.lock:
            self.lock.notify_all()
        deadline = time.monotonic() + wait
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        for device in self.devices:
            try:
                device["client"].close()
            except Exception:  # noqa: BLE001
                pass


def window_stats(saves: list[tuple[float, float, int, bool, str]], t0: float, t1: float, unfinished: int,
                 offered_per_s: float) -> dict[str, Any]:
    """A step's row from the saves (start, seconds, device, ok, sent as) that started in [t0, t1), however long
    after t1 they ended; `unfinished` more started in it and never ended: they count as failed. Device 0 is the
    probe."""
    inside = [s for s in saves if t0 <= s[0] < t1]
    probe = [s[1] for s in inside if s[2] == 0 and s[3]]
    every = [s[1] for s in inside if s[3]]
    kinds = [s[4] for s in inside if s[3]]
    return {"probe_saves": len(probe), "probe_median_s": quantile(probe, 0.5), "probe_p90_s": quantile(probe, 0.9),
            "all_saves": len(inside) + unfinished, "failed_saves": sum(1 for s in inside if not s[3]) + unfinished,
            "all_median_s": quantile(every, 0.5), "all_p90_s": quantile(every, 0.9),
            "saves_per_s": (len(inside) + unfinished) / max(t1 - t0, 1e-9), "offered_per_s": offered_per_s,
            "patches": sum(1 for k in kinds if k == "patch")}


# ------------------------------------------------------------------ cross traffic

def cross_traffic(bed: netlab.Testbed, mbit: float, seconds: float) -> dict[str, Any]:
    """iperf3 UDP sta1 -> sta2 through the AP; what sta2 received."""
    server = bed.popen("sta2", ["iperf3", "-s", "-1", "-J", "-p", "5201", "-B", netlab.ADDR["sta2"]],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    client = bed.run_cmd("sta1", ["iperf3", "-c", netlab.ADDR["sta2"], "-p", "5201", "-u", "-b", f"{mbit:g}M",
                                  "-t", f"{seconds:g}", "-J", "--connect-timeout", "5000"],
                         capture_output=True, text=True, timeout=seconds + 60)
    try:
        out, err = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        out, err = server.communicate()
    if client.returncode:
        raise netlab.NetlabError(f"iperf3 client failed: {client.stdout[-800:]} {client.stderr[-800:]}")
    received = json.loads(out)["end"]["sum_received"]
    return {"received_mbit": received["bits_per_second"] / 1e6, "lost_percent": received.get("lost_percent"),
            "jitter_ms": received.get("jitter_ms"), "offered_mbit": mbit}


# ------------------------------------------------------------------ one runtime

def runtime_missing(runtime: str) -> Optional[str]:
    if runtime == "xen":
        return xen_host_missing()
    if runtime == "docker":
        if shutil.which("docker") is None:
            return "no docker command"
        if subprocess.run(["docker", "image", "inspect", DOCKER_IMAGE], capture_output=True).returncode:
            return f"no image {DOCKER_IMAGE} (make docker-image)"
    if runtime == "microvm":
        for f in ("vmlinux", "initramfs.cpio.lz4"):
            if not (APPLIANCE_DIR / f).exists():
                return f"no {APPLIANCE_DIR / f} (make appliance)"
        if shutil.which("qemu-system-x86_64") is None:
            return "no qemu-system-x86_64"
    if runtime not in ("process", "docker", "microvm", "xen"):
        return f"unknown runtime {runtime}"
    return None


def run_runtime(bed: netlab.Testbed, runtime: str, counts: list[int], a: argparse.Namespace, ca: Path,
                document: bytes, progress: figures.Progress) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    tag = f"f{bed.run[-6:]}{runtime[0]}"
    if runtime == "xen":
        progress.step("xen: booting the nested Xen host (QEMU TCG) in the AP namespace")
        try:
            manager: Any = ApXenManager(bed, max(counts) + 2, ca, tag)
        except RuntimeError as error:  # XenEdge: the host did not come up
            raise netlab.NetlabError(f"the nested Xen host did not start: {str(error)[-1500:]}") from error
        log(f"fig12_13: xen: the nested Xen host and its manager answered after {manager.ready_seconds:.0f} s")
    else:
        manager = ApManager(bed, runtime, max(counts) + 2, ca, tag)
    load = Load(bed, document, a.period, a.probe_interval, a.workers)
    interrupted = True
    stopped: Optional[str] = None
    try:
        def one(i: int) -> tuple[Any, str]:
            from ec_protocol.client import EnrolmentBundle, EpsClient

            credential = manager.add_user(f"{tag}n{i}")
            joined = manager.join(credential)
            if joined["instance"].get("state") != "running":
                raise RuntimeError(f"instance {joined['instance'].get('id')}: {joined['instance'].get('state')}")
            client = EpsClient(EnrolmentBundle.from_dict(joined["enrolment"]), label=joined["instance"]["id"])
            name = f"fig13-{runtime}-{i}.docx"
            load.seed(client, name)
            return client, name

        have = 0
        for n in counts:
            progress.step(f"{runtime}: starting {n} instances")
            t_start = time.monotonic()
            # Not a ThreadPoolExecutor: its threads are joined at the interpreter's exit, and an interrupted run
            # must not wait for joins and first saves under way (guests boot in minutes under nested Xen; a save
            # to a container whose testbed is gone waits for its timeout); the manager's close below ends them.
            ex = StartPool(a.parallel, initializer=netlab.enter_netns, initargs=(bed.ns("device"),))
            futures = []
            for i in range(have, n):
                futures.append(ex.submit(one, i))
            try:
                for future in futures:
                    if mem_available_mib() < a.min_available_mib and not stopped:
                        stopped = f"MemAvailable under {a.min_available_mib} MiB"
                    if stopped:
                        for f in futures:
                            f.cancel()
                    client, name = future.result()
                    load.add(client, name)
                    have += 1
            except cf.CancelledError:
                pass
            except Exception as error:  # noqa: BLE001 - how far it got is a result
                stopped = stopped or f"instance {have + 1} did not start: {str(error)[:300]}"
                for f in futures:
                    f.cancel()
            except BaseException:  # interrupted: joins not begun are dropped, those under way not waited for
                ex.shutdown(wait=False, cancel_futures=True)
                raise
            ex.shutdown(wait=True)
            start_s = time.monotonic() - t_start
            if have < n:
                log(f"fig12_13: {runtime}: stopped at {have} of {n} instances: {stopped}")
                rows.append({"runtime": runtime, "instances": n, "running": have, "stopped": stopped})
                break
            load.begin()
            time.sleep(a.settle)
            progress.step(f"{runtime}: {n} active, iperf3 {a.window:g} s")
            t0 = time.monotonic()
            traffic = cross_traffic(bed, a.udp_mbit, a.window)
            t1 = time.monotonic()
            row = {"runtime": runtime, "instances": n, "running": have, "stopped": "", "start_s": start_s,
                   **({"host_ready_s": round(manager.ready_seconds, 1)} if runtime == "xen" else {}),
                   **traffic, **load.window(t0, t1), "mem_available_mib": mem_available_mib(),
                   "load_avg": os.getloadavg()[0]}
            rows.append(row)
            checkpoint(a, rows)
            log(f"fig12_13: {runtime} N={n}: {row['received_mbit']:.1f} Mbit/s received, sync "
                f"{fmt(row['probe_median_s'])} (probe median), {fmt(row['all_median_s'])} (all), "
                f"{row['saves_per_s']:.2f}/{row['offered_per_s']:.2f} saves/s")
        interrupted = False
    finally:
        if interrupted:
            log(f"fig12_13: {runtime}: ended early; stopping the devices and the manager (joins under way end with it)")
        load.close(wait=0 if interrupted else 60)
        # The testbed removes its state folder and cgroups (extra_record); xen keeps its host's console with the results.
        manager.close(delete=not interrupted, **({"keep_logs_in": a.out} if runtime == "xen" else {}))
    return rows


def checkpoint(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """This runtime's rows so far, in --plot-from's format: a long run interrupted keeps what it measured."""
    (a.out / "fig12_13.partial.json").write_text(json.dumps(
        {"rows": rows, "notes": ["partial: the run did not finish"], "args": {k: str(v) for k, v in vars(a).items()}},
        indent=1))


def fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f} s"


# ------------------------------------------------------------------ output

COLUMNS = ["runtime", "instances", "running", "received_mbit", "offered_mbit", "lost_percent", "probe_median_s",
           "probe_p90_s", "all_median_s", "all_p90_s", "probe_saves", "all_saves", "failed_saves", "patches",
           "saves_per_s", "offered_per_s", "start_s", "mem_available_mib", "load_avg", "paper_sync_median_s", "stopped",
           "host_ready_s"]


def plot(rows: list[dict[str, Any]], path: Path, a: argparse.Namespace) -> None:
    plt = figures.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6.2))
    colours = {"process": "#1f77b4", "docker": "#ff7f0e", "microvm": "#2ca02c", "xen": "#9467bd"}
    label = {"microvm": "microvm (TCG)", "xen": "xen (nested, TCG)"}
    baseline = [r for r in rows if r["instances"] == 0 and r.get("received_mbit") is not None]
    for runtime in sorted({r["runtime"] for r in rows if r["instances"] > 0}):
        done = [r for r in rows if r["runtime"] == runtime and r["instances"] > 0 and r.get("received_mbit") is not None]
        if not done:
            continue
        xs = [r["instances"] for r in done]
        left.plot(xs, [r["received_mbit"] for r in done], "o-", color=colours.get(runtime), label=f"ours: {label.get(runtime, runtime)}")
        # A count whose saves did not end within the window has no sync times: no point there.
        probed = [r for r in done if r.get("probe_median_s") is not None and r.get("probe_p90_s") is not None]
        right.plot([r["instances"] for r in probed], [r["probe_median_s"] for r in probed], "o-",
                   color=colours.get(runtime), label=f"ours: {label.get(runtime, runtime)} (probe median)")
        right.fill_between([r["instances"] for r in probed], [r["probe_median_s"] for r in probed],
                           [r["probe_p90_s"] for r in probed], color=colours.get(runtime), alpha=0.15)
        timed = [r for r in done if r.get("all_median_s") is not None]
        right.plot([r["instances"] for r in timed], [r["all_median_s"] for r in timed], "x:", color=colours.get(runtime),
                   label=f"ours: {label.get(runtime, runtime)} (median of all saves)")
        behind = [r for r in done if r.get("offered_per_s", 0) >= 2 and r.get("all_median_s")
                  and r["saves_per_s"] < 0.8 * r["offered_per_s"]]
        if behind:  # the largest count at which the saves did not keep up with the load offered
            r = behind[-1]
            right.annotate(f"{runtime}: {r['saves_per_s']:.1f} of {r['offered_per_s']:.1f}\nsaves/s done",
                           (r["instances"], r["all_median_s"]), textcoords="offset points", xytext=(-100, -4),
                           fontsize=7, color=colours.get(runtime))
        end = [r for r in rows if r["runtime"] == runtime and r.get("stopped")]
        if end:
            left.annotate(f"{runtime} stopped at {end[0]['running']}", (xs[-1], done[-1]["received_mbit"]),
                          textcoords="offset points", xytext=(5, -14), fontsize=8, color=colours.get(runtime))
    if baseline:
        left.axhline(baseline[0]["received_mbit"], color="grey", linestyle="--",
                     label=f"no EPS on the AP: {baseline[0]['received_mbit']:.1f} Mbit/s")
    left.axhline(a.udp_mbit, color="black", linewidth=0.8, linestyle=":", label=f"offered: {a.udp_mbit:g} Mbit/s UDP")
    right.plot(list(PAPER_SYNC_MEDIAN_S), list(PAPER_SYNC_MEDIAN_S.values()), "s", color="#d62728", markersize=8,
               label="paper: median sync time (its raw logs, 1 and 200 instances)")
    for n, v in PAPER_SYNC_MEDIAN_S.items():
        right.annotate(f"paper {v:g} s", (n, v), textcoords="offset points", xytext=(6, 4), fontsize=8, color="#d62728")
    for ax in (left, right):
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("active EPS instances on the access point")
        ax.set_xticks([1, 5, 10, 20, 50, 100, 200, 500, 1000])
        ax.set_xticklabels(["1", "5", "10", "20", "50", "100", "200", "500", "1k"])
        ax.set_xlim(0.8, 1200)
    left.set_ylim(0, a.udp_mbit * 1.15)
    left.set_ylabel("UDP throughput sta1 -> sta2 through the AP, Mbit/s")
    left.set_title("Fig. 12: AP forwarding under cross traffic (iperf3 UDP)")
    right.set_yscale("log")
    right.set_ylabel("sync time of a one-edit .docx save, s (band: median to p90)")
    right.set_title("Fig. 13: document sync time")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.suptitle(f"Wi-Fi {a.wifi}, WAN {a.wan}; every instance saves a 240 kB .docx every {a.period:g} s "
                 f"(the probe every {a.probe_interval:g} s); 2 vCPUs, no KVM (microvm under TCG; xen: a Xen host nested "
                 f"under TCG)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(rows: list[dict[str, Any]], notes: list[str], a: argparse.Namespace) -> None:
    """The table (stdout), fig12_13.csv, fig12_13.json and fig12_13.png in --out."""
    for r in rows:
        r["paper_sync_median_s"] = PAPER_SYNC_MEDIAN_S.get(r["instances"], "")
    table = []
    for r in rows:
        if r.get("received_mbit") is None:
            table.append([r["runtime"], r["instances"], f"stopped at {r['running']}: {r['stopped']}"[:90],
                          "", "", "", "", ""])
            continue
        table.append([r["runtime"], r["instances"], f"{r['received_mbit']:.1f}", f"{r['lost_percent']:.2f}%",
                      fmt(r.get("probe_median_s")) + (f" / {fmt(r.get('probe_p90_s'))}" if r.get("probe_p90_s") else ""),
                      fmt(r.get("all_median_s")),
                      f"{r.get('saves_per_s', 0):.2f} / {r.get('offered_per_s', 0):.2f}" if r["instances"] else "-",
                      f"{r['paper_sync_median_s']} s" if r["paper_sync_median_s"] != "" else ""])
    notes = notes + [f"Wi-Fi {a.wifi}, WAN {a.wan}; iperf3 UDP {a.udp_mbit:g} Mbit/s sta1 -> sta2 for {a.window:g} s per step; "
              f"every instance saves a one-edit 240 kB .docx every {a.period:g} s, the probe (instance 0) every "
              f"{a.probe_interval:g} s; sync time = the probe's save, device to provider and back",
              "paper: 1 to 200 instances (Docker could not reach 200); sync-time medians 0.67 s (1) to 6.5 s (200) "
              "from its raw logs; its throughput figure gives no number to put beside ours"]
    figures.print_table("Figs. 12-13: AP throughput and sync time with N active EPS instances",
                        ["runtime", "N", "UDP received Mbit/s", "loss", "sync: probe median / p90",
                         "sync: all saves median", "saves/s done / offered", "paper sync median"], table, notes)
    figures.write_csv(a.out / "fig12_13.csv", COLUMNS, [[r.get(c, "") for c in COLUMNS] for r in rows])
    (a.out / "fig12_13.json").write_text(json.dumps({"rows": rows, "notes": notes, "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    plot(rows, a.out / "fig12_13.png", a)
    print(f"wrote {a.out / 'fig12_13.csv'} and {a.out / 'fig12_13.png'}")


def rows_from_csv(path: Path) -> dict[str, Any]:
    """An earlier fig12_13.csv (docs/figures keeps the published one) as a run: its rows,
    numbers as numbers; no notes, and the run's settings are the command line's."""
    def value(text: str) -> Any:
        if text == "":
            return None
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text
    with path.open(newline="") as f:
        rows = [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]
    for r in rows:
        r["stopped"] = r.get("stopped") or ""
    return {"rows": rows, "notes": [], "args": None}


def report_from(paths: list[Path], a: argparse.Namespace) -> int:
    """Several runs in one table and plot: the AP-alone row of the first, every runtime's rows.
    A run is a fig12_13.json, or a fig12_13.csv (the published steps, docs/figures)."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for path in paths:
        run = rows_from_csv(path) if path.suffix == ".csv" else json.loads(path.read_text())
        for r in run["rows"]:
            if r["runtime"] == "none" and any(x["runtime"] == "none" for x in rows):
                continue
            rows.append(r)
        notes += [f"{path.parent.name}: {n}" if len(paths) > 1 else n for n in run["notes"]
                  if not n.startswith(("Wi-Fi ", "paper: "))]
        for key in ("wifi", "wan", "period", "probe_interval", "window", "udp_mbit"):
            if run["args"] is not None:
                value = run["args"][key]
                setattr(a, key, type(getattr(a, key))(value))
    # One block per runtime, in the order they first appear, by instance count.
    order = {rt: i for i, rt in reversed(list(enumerate(r["runtime"] for r in rows)))}
    rows.sort(key=lambda r: (order[r["runtime"]], r["instances"]))
    a.out.mkdir(parents=True, exist_ok=True)
    report(rows, notes, a)
    return 0


def parse_counts(text: Optional[str], runtimes: list[str]) -> dict[str, list[int]]:
    """`process=1,5,10;microvm=1,5` or `1,5,10` (every runtime)."""
    counts = {r: list(DEFAULT_COUNTS.get(r, ALL_COUNTS)) for r in runtimes}
    if text:
        for part in text.split(";"):
            name, _, values = part.rpartition("=")
            for r in ([name] if name else runtimes):
                counts[r] = sorted({int(v) for v in values.split(",") if v.strip()})
    return counts


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", default="process,docker,microvm,xen")
    parser.add_argument("--counts", help="instance counts: '1,5,10' for every runtime, or 'process=1,5;microvm=1' "
                        "(default: " + "; ".join(f"{k}={','.join(map(str, v))}" for k, v in DEFAULT_COUNTS.items()) + ")")
    parser.add_argument("--period", type=float, default=30.0, help="seconds between two saves of one instance")
    parser.add_argument("--probe-interval", type=float, default=2.0, help="seconds between two saves of the probe")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of iperf3 cross traffic per step")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of load before a step's window")
    parser.add_argument("--udp-mbit", type=float, default=90.0)
    parser.add_argument("--wifi", default="wifi-ac-far")
    parser.add_argument("--wan", default="wan-fiber")
    parser.add_argument("--parallel", type=int, default=4, help="joins (instance starts) in flight")
    parser.add_argument("--workers", type=int, default=16, help="load generator threads")
    parser.add_argument("--min-available-mib", type=float, default=4096)
    parser.add_argument("--corpus", type=Path, default=figures.shared.root() / "corpus" / "real")
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT)
    parser.add_argument("--plot-from", metavar="JSON|CSV,...", help="no run: the table, CSV and PNG of earlier runs' "
                        "fig12_13.json files together (say, one run per runtime), or of a fig12_13.csv such as the "
                        "published docs/figures/fig12_13-instances.csv (its runs' settings are the command line's)")
    a = parser.parse_args(argv)
    if a.plot_from:
        return report_from([Path(p) for p in a.plot_from.split(",")], a)
    # A kept-open connection per device here, and the manager (a child) watches every instance.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    runtimes = [r.strip() for r in a.runtimes.split(",") if r.strip()]
    counts = parse_counts(a.counts, runtimes)
    document = (a.corpus / "docx" / DOCUMENT).read_bytes()
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    runnable, failed = [], []
    for r in runtimes:
        why = runtime_missing(r)
        if why:
            notes.append(f"{r}: {why}")
            log(f"fig12_13: {r}: {why}")
        else:
            runnable.append(r)
    progress = figures.Progress(1 + sum(2 * len(counts[r]) + (r == "xen") for r in runnable), "Figs. 12-13")
    t_all = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ec-fig12-"))
    try:
        with netlab.Testbed(a.wifi, a.wan) as bed:
            proc = bed.popen("cloud", [str(system.PYTHON), "-m", "testbed.providers", "serve", "--state",
                                       str(work / "providers-state"), "--certs", str(work / "providers-certs"),
                                       "--listen", system.CLOUD_TLS, "--plain-listen", system.CLOUD_PLAIN,
                                       "--webdav-host", WEBDAV_HOST],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=open(work / "providers.log", "wb"), text=True)
            ca = Path(system._read_json_line(proc, "the provider servers", work / "providers.log")["ca"]).resolve()
            ca_copy = work / "providers-ca.pem"  # instances' uids (and containers' mounts) read it
            shutil.copy(ca, ca_copy)
            work.chmod(0o711)
            ca_copy.chmod(0o644)
            progress.step("0 instances: the AP alone")
            rows.append({"runtime": "none", "instances": 0, "running": 0, "stopped": "",
                         **cross_traffic(bed, a.udp_mbit, a.window), "mem_available_mib": mem_available_mib(),
                         "load_avg": os.getloadavg()[0]})
            for runtime in runnable:
                try:
                    rows += run_runtime(bed, runtime, counts[runtime], a, ca_copy, document, progress)
                except netlab.NetlabError as error:
                    failed.append(runtime)
                    notes.append(f"{runtime}: {error}")
                    log(f"fig12_13: {runtime}: {error}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress.finish()
    notes.append(f"{time.monotonic() - t_all:.0f} s in all; " + figures.machine_line())
    report(rows, notes, a)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except netlab.NetlabError as error:
        print(f"fig12_13: error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
