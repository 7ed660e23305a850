#!/usr/bin/env python3
"""Density: how many idle EPS instances fit on this host, what each costs
the host, how fast each starts, and what a save costs while they idle.

    python experiments/density/run.py --backend docker --count 300
    python experiments/density/run.py --backend process --count 300

Measured:
- host memory per instance: MemAvailable of /proc/meminfo before the
  instances and after they all answered /healthz and settled, divided by N.
  Whole-system, so the engine's share counts: containerd shims, docker-proxy
  processes, fuse-overlayfs mounts, dockerd/containerd growth, cgroups, network
  namespaces, veths and page tables. A breakdown by process kind (PSS) and
  the kernel's slab and page-table growth is printed alongside;
- start-to-ready per instance: from the start command (`docker run`, or the
  process's spawn) to the first 200 of its /healthz; median and p95;
- the time of one save (a .docx edit, sent as a patch through
  ec_protocol.EpsClient to a lab provider) with 0 and with N instances idle.

HOW IT DRIVES THE RUNTIME. The edge manager's API and `ec-edge` CLI were not
documented yet when this was written, so the benchmark starts containers with
`docker run` exactly as `edge-manager/manager/src/runtime/docker.rs` does
(same flags, same labels, the same kind of ICC-disabled shared networks) and,
for `process`, `ec-eps` processes under distinct uids (without the process
backend's cgroups). Switching it to the manager means replacing
`DockerBackend.start`/`ProcessBackend.start` with the API's create+start.

Every container and process it starts is removed at the end, also on Ctrl-C
(containers carry `edgecourier.instance=bench-*`; `--cleanup` removes any
left over from a killed run).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

IMAGE = "edgecourier/eps:local"
LABEL = "edgecourier.instance"
BENCH_LABEL = "edgecourier.bench"
SECRET = bytes(range(32))
DEVICE_PORT, MANAGEMENT_PORT = 8443, 9100
SYSCTLS = [
    "kernel.keys.maxkeys", "kernel.keys.maxbytes", "kernel.keys.root_maxkeys",
    "net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3",
    "fs.inotify.max_user_instances", "fs.inotify.max_user_watches", "kernel.pid_max", "kernel.threads-max",
    "net.core.somaxconn", "fs.file-max",
]


def sh(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])}…: {r.stderr.strip()}")
    return r


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0]) * 1024
    return out


def mem_available(samples: int = 5, pause: float = 1.0) -> int:
    """Median MemAvailable over a few seconds (other work on the host moves it)."""
    vals = []
    for i in range(samples):
        vals.append(meminfo()["MemAvailable"])
        if i + 1 < samples:
            time.sleep(pause)
    return int(statistics.median(vals))


def pss_by_kind() -> dict[str, tuple[int, int]]:
    """(count, PSS bytes) of the processes an instance brings along, by kind."""
    kinds = {"containerd-shim": "containerd-shim", "docker-proxy": "docker-proxy", "fuse-overlayfs": "fuse-overlayfs",
             "ec-eps": "ec-eps", "dockerd": "dockerd", "containerd": "containerd"}
    out: dict[str, list[int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            name = os.path.basename(cmd) or comm
            kind = next((v for k, v in kinds.items() if name.startswith(k) and not (k == "containerd" and "shim" in name)), None)
            if kind is None:
                continue
            pss = 0
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
        except OSError:
            continue
        c = out.setdefault(kind, [0, 0])
        c[0] += 1
        c[1] += pss
    return {k: (v[0], v[1]) for k, v in out.items()}


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def healthz(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("GET", "/healthz")
        ok = c.getresponse().status == 200
        c.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def wait_ready(host: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if healthz(host, port):
            return True
        time.sleep(0.02)
    return False


def fnv1a(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def eps_config(device: str, management: str, extra: Optional[dict] = None) -> dict:
    cfg = {
        "listen": device,
        "management_listen": management,
        "insecure_plain_http": True,
        "keys": [{"id": 1, "secret_hex": SECRET.hex()}],
        "accounts": [{"provider": "*", "account": "*"}],
    }
    cfg.update(extra or {})
    return cfg


def write_state(dir_: Path, cfg: dict, uid: int, files: Optional[dict[str, bytes]] = None) -> None:
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / "eps.json").write_text(json.dumps(cfg))
    for name, data in (files or {}).items():
        (dir_ / name).write_bytes(data)
    for p in [dir_, *dir_.iterdir()]:
        os.chown(p, uid, uid)


class DockerBackend:
    """`docker run` with the flags of runtime/docker.rs."""

    name = "docker"

    def __init__(self, work: Path, networks: int, publish_device: bool, publish_management: bool, share_binary: bool):
        self.work = work
        self.networks = networks
        self.publish_device = publish_device
        self.publish_management = publish_management
        self.share_binary = share_binary and self._source_binary()
        self.ready_net: set[int] = set()
        self.lock = threading.Lock()
        self.handles: dict[str, str] = {}

    def _source_binary(self) -> Optional[str]:
        """The image's own /ec-eps copied out to the work folder: one host
        inode that every container maps (what runtime/docker.rs does with the
        file the image was built from, when it is unchanged), and that a
        `make build` during the run cannot replace."""
        dest = self.work / "ec-eps"
        cid = sh("docker", "create", IMAGE).stdout.strip()
        try:
            sh("docker", "cp", f"{cid}:/ec-eps", str(dest))
        finally:
            sh("docker", "rm", cid, check=False)
        os.chmod(dest, 0o755)
        return str(dest)

    def network(self, k: int) -> str:
        name = f"ec-bench-{k}"
        with self.lock:
            if k not in self.ready_net:
                if sh("docker", "network", "inspect", name, check=False).returncode != 0:
                    sh("docker", "network", "create", "--driver", "bridge", "--subnet", f"10.215.{4 * k}.0/22",
                       "--opt", "com.docker.network.bridge.enable_icc=false",
                       "--opt", f"com.docker.network.bridge.name=br-ecbench-{k}",
                       "--label", "edgecourier.network=1", name)
                self.ready_net.add(k)
        return name

    def gateway(self, k: int) -> str:
        return f"10.215.{4 * k}.1"

    def start(self, iid: str, uid: int, index: int, limits: dict, extra_cfg: Optional[dict] = None,
              files: Optional[dict[str, bytes]] = None, network: Optional[int] = None) -> tuple[str, int]:
        """Starts an instance; returns where its /healthz answers."""
        state = self.work / iid
        write_state(state, eps_config(f"0.0.0.0:{DEVICE_PORT}", f"0.0.0.0:{MANAGEMENT_PORT}", extra_cfg), uid, files)
        k = fnv1a(iid) % self.networks if network is None else network
        args = ["docker", "run", "--detach", "--name", f"ec-{iid}", "--label", f"{LABEL}={iid}", "--label", f"{BENCH_LABEL}=1",
                "--user", f"{uid}:{uid}", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--restart", "no", "--network", self.network(k),
                "--mount", f"type=bind,source={state},target=/state",
                "--log-opt", "max-size=1m", "--log-opt", "max-file=2",
                "--memory", str(limits["memory"]), "--memory-swap", str(limits["memory"]),
                "--cpus", limits["cpus"], "--pids-limit", str(limits["pids"])]
        if self.share_binary:
            args += ["--mount", f"type=bind,source={self.share_binary},target=/ec-eps,readonly"]
        mport = 12000 + index
        if self.publish_device:
            args += ["--publish", f"127.0.0.1:{10000 + index}:{DEVICE_PORT}"]
        if self.publish_management:
            args += ["--publish", f"127.0.0.1:{mport}:{MANAGEMENT_PORT}"]
        args.append(IMAGE)
        r = sh(*args, check=False)
        if r.returncode != 0:
            sh("docker", "rm", "-f", f"ec-{iid}", check=False)
            lines = [l for l in r.stderr.strip().splitlines() if "--help" not in l]
            raise RuntimeError(lines[0] if lines else f"docker run exit {r.returncode}")
        cid = r.stdout.strip()
        self.handles[iid] = cid
        if self.publish_management:
            return "127.0.0.1", mport
        ip = sh("docker", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid).stdout.strip()
        return ip, MANAGEMENT_PORT

    def memory_bytes(self) -> int:
        total = 0
        for cid in self.handles.values():
            try:
                total += int(Path(f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes").read_text())
            except OSError:
                pass
        return total

    def cleanup(self) -> None:
        ids = sh("docker", "ps", "-aq", "--filter", f"label={BENCH_LABEL}", check=False).stdout.split()
        for i in range(0, len(ids), 100):
            sh("docker", "rm", "-f", *ids[i:i + 100], check=False, timeout=600)
        for k in range(64):
            for _ in range(10):  # endpoints of removed containers go a moment later
                if sh("docker", "network", "inspect", f"ec-bench-{k}", check=False).returncode != 0:
                    break
                if sh("docker", "network", "rm", f"ec-bench-{k}", check=False).returncode == 0:
                    break
                time.sleep(1)
        self.handles.clear()


class ProcessBackend:
    """`ec-eps serve` as a host process under a uid of its own (no cgroup)."""

    name = "process"

    def __init__(self, work: Path):
        self.work = work
        self.binary = str(Path(sys.executable).parent / "ec-eps")
        self.procs: dict[str, subprocess.Popen] = {}

    def gateway(self, k: int) -> str:
        return "127.0.0.1"

    def start(self, iid: str, uid: int, index: int, limits: dict, extra_cfg: Optional[dict] = None,
              files: Optional[dict[str, bytes]] = None, network: Optional[int] = None) -> tuple[str, int]:
        state = self.work / iid
        mport = 12000 + index
        write_state(state, eps_config(f"127.0.0.1:{10000 + index}", f"127.0.0.1:{mport}", extra_cfg), uid, files)

        def demote() -> None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        self.procs[iid] = subprocess.Popen([self.binary, "serve", "--config", str(state / "eps.json")],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=demote)
        return "127.0.0.1", mport

    def memory_bytes(self) -> int:
        total = 0
        for p in self.procs.values():
            try:
                for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total

    def cleanup(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()


def save_times(backend, work: Path, lab, label: str, runs: int) -> dict:
    """Starts one more instance wired to the lab's providers and times saves
    of a .docx edit (the first full, then `runs` patches)."""
    import ec_protocol as p  # noqa: F401  (import check)
    from eps.tests.e2e import Uploader, corpus_files, edited
    from testbed.lab import PROVIDER_HOSTS, WEBDAV_HOST

    port = lab.providers.tls_port
    gw = backend.gateway(0)
    ca = Path(lab.providers.ca).read_bytes()
    extra = {"upstream": {"resolve": {h: f"{gw}:{port}" for h in PROVIDER_HOSTS},
                          "extra_ca_pem_files": ["lab-ca.pem"], "webdav_hosts": [WEBDAV_HOST]}}
    iid = f"bench-save-{label}"
    limits = {"memory": 256 << 20, "cpus": "1.000", "pids": 128}
    t0 = time.monotonic()
    index = 9998 if label == "0" else 9999
    host, mport = backend.start(iid, 70000 + index, index, limits, extra, {"lab-ca.pem": ca}, network=0)
    if not wait_ready(host, mport, time.monotonic() + 60):
        raise RuntimeError("the save instance did not become ready")
    ready = time.monotonic() - t0
    device = f"http://{host}:{DEVICE_PORT}" if backend.name == "docker" else f"http://127.0.0.1:{10000 + index}"
    from ec_protocol.client import EnrolmentBundle, EpsClient

    client = EpsClient(EnrolmentBundle(url=device, key_id=1, secret=SECRET, plain_http=True), label=iid)
    up = Uploader("dropbox", "single")
    # A typical office document: the largest .docx of the corpus under 500 kB.
    doc = max((f for f in corpus_files("docx") if f.stat().st_size < 500_000), key=lambda f: f.stat().st_size).read_bytes()
    base = doc
    out = up.save(client, "density.docx", base, None)
    assert getattr(out, "succeeded", False), out
    times = []
    for n in range(1, runs + 1):
        new = edited(base, n)
        t = time.monotonic()
        out = up.save(client, "density.docx", new, base)
        times.append(time.monotonic() - t)
        assert getattr(out, "succeeded", False), out
        base = new
    kinds = getattr(client, "last_sent_kinds", None)
    return {"ready_s": ready, "save_median_s": statistics.median(times), "save_max_s": max(times), "runs": runs,
            "file_bytes": len(doc), "last_sent": str(kinds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["docker", "process"], required=True)
    ap.add_argument("--count", type=int, default=0, help="idle instances to start")
    ap.add_argument("--parallel", type=int, default=2, help="starts in flight at once (default 2: one per core)")
    ap.add_argument("--networks", type=int, default=4, help="docker: shared networks to spread over (1,022 addresses each)")
    ap.add_argument("--publish-device", choices=["yes", "no"], default="yes",
                    help="docker: publish each device port on the host (one docker-proxy each unless userland-proxy is off)")
    ap.add_argument("--publish-management", choices=["yes", "no"], default="no",
                    help="docker: publish each management port on 127.0.0.1 (default: reach /healthz at the container's address)")
    ap.add_argument("--share-binary", choices=["yes", "no"], default="yes", help="docker: bind-mount the host's ec-eps (see docker/README.md)")
    ap.add_argument("--memory-mb", type=int, default=64, help="memory limit per instance")
    ap.add_argument("--settle", type=float, default=15, help="seconds to wait after the last start before measuring")
    ap.add_argument("--save-runs", type=int, default=5, help="saves timed with 0 and with N instances idle (0: skip)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="leave the instances running (remove them with --cleanup)")
    ap.add_argument("--cleanup", action="store_true", help="only remove what an earlier run left")
    a = ap.parse_args()

    if os.geteuid() != 0:
        print("run as root (instances get uids of their own)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ec-density-"))
    os.chmod(work, 0o755)
    if a.backend == "docker":
        backend = DockerBackend(work, a.networks, a.publish_device == "yes", a.publish_management == "yes", a.share_binary == "yes")
    else:
        backend = ProcessBackend(work)
    if a.cleanup:
        backend.cleanup()
        shutil.rmtree(work, ignore_errors=True)
        return 0

    def on_signal(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    from testbed.lab import Lab

    result: dict = {
        "backend": a.backend, "count": a.count, "parallel": a.parallel,
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "mem_total": meminfo()["MemTotal"]},
        "sysctl": {k: Path("/proc/sys/" + k.replace(".", "/")).read_text().strip() for k in SYSCTLS},
    }
    if a.backend == "docker":
        result["engine"] = sh("docker", "version", "--format", "{{.Server.Version}}").stdout.strip()
        result["settings"] = {"networks": a.networks, "publish_device": a.publish_device, "publish_management": a.publish_management,
                              "share_binary": bool(backend.share_binary)}
    lab = None
    try:
        if a.save_runs:
            lab = Lab(work / "lab", provider_args=("--listen", "0.0.0.0:0"))
            result["save_idle0"] = save_times(backend, work, lab, "0", a.save_runs)
            print(f"save with 0 idle: median {result['save_idle0']['save_median_s'] * 1000:.0f} ms", flush=True)
        if a.backend == "docker":
            for k in range(a.networks):
                backend.network(k)
        before_avail = mem_available()
        before_mem = meminfo()
        before_pss = pss_by_kind()
        before_tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
        limits = {"memory": a.memory_mb << 20, "cpus": "0.500", "pids": 64}
        ready_times: list[float] = []
        errors: list[str] = []
        t_all = time.monotonic()

        launch_times: list[float] = []
        health_at: list[tuple[str, int]] = []

        def one(i: int) -> float:
            iid = f"bench-{i}"
            t0 = time.monotonic()
            host, port = backend.start(iid, 70000 + i, i, limits)
            launch_times.append(time.monotonic() - t0)
            health_at.append((host, port))
            if not wait_ready(host, port, t0 + 60):
                raise RuntimeError(f"{iid} did not answer /healthz within 60 s")
            return time.monotonic() - t0

        with cf.ThreadPoolExecutor(a.parallel) as ex:
            futs = {ex.submit(one, i): i for i in range(a.count)}
            for n, f in enumerate(cf.as_completed(futs), 1):
                try:
                    ready_times.append(f.result())
                except Exception as e:  # noqa: BLE001  (the first failures name the limit hit)
                    errors.append(f"bench-{futs[f]}: {e}")
                    if len(errors) >= 5:
                        for g in futs:
                            g.cancel()
                if n % 50 == 0 or n == a.count:
                    print(f"  {n}/{a.count} started, {len(errors)} failed, {time.monotonic() - t_all:.0f} s", flush=True)
        wall = time.monotonic() - t_all
        ok = len(ready_times)
        time.sleep(a.settle)
        after_avail = mem_available()
        after_mem = meminfo()
        after_pss = pss_by_kind()
        # Threads and processes (kernel.pid_max bounds them all: 32,768 by default).
        after_tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
        used = before_avail - after_avail
        result.update({
            "started": ok, "errors": errors[:5], "wall_s": wall,
            "ready_median_s": statistics.median(ready_times) if ready_times else None,
            "ready_p95_s": quantile(ready_times, 0.95), "ready_max_s": max(ready_times, default=None),
            "launch_median_s": statistics.median(launch_times) if launch_times else None,
            "host_bytes": used, "host_bytes_per_instance": used / ok if ok else None,
            "instances_charged_bytes_per_instance": backend.memory_bytes() / ok if ok else None,
            "tasks_per_instance": (after_tasks - before_tasks) / ok if ok else None, "tasks_after": after_tasks,
            "kernel_growth": {k: after_mem[k] - before_mem[k] for k in ("Slab", "SUnreclaim", "PageTables", "KernelStack", "Shmem")},
            "pss_growth": {k: {"count": after_pss.get(k, (0, 0))[0] - before_pss.get(k, (0, 0))[0],
                               "bytes": after_pss.get(k, (0, 0))[1] - before_pss.get(k, (0, 0))[1]}
                           for k in sorted(set(after_pss) | set(before_pss))},
        })
        # Cross-check of the MemAvailable delta from what the instances bring
        # along: PSS of their processes and the engine's, plus the kernel's
        # unreclaimable slab, page tables and stacks.
        kg = result["kernel_growth"]
        attributed = sum(v["bytes"] for v in result["pss_growth"].values()) + kg["SUnreclaim"] + kg["PageTables"] + kg["KernelStack"]
        result["attributed_bytes_per_instance"] = attributed / ok if ok else None
        print(f"    attributed (PSS of the processes + unreclaimable kernel memory): {attributed / ok / 2**20 if ok else 0:.2f} MiB per instance", flush=True)
        try:
            result["key_users_root"] = next((l.strip() for l in Path("/proc/key-users").read_text().splitlines() if l.strip().startswith("0:")), None)
        except OSError:
            pass
        # What a manager's health watch does: /healthz of every instance, twice
        # in a row (every host<->container pair needs a neighbour entry on both
        # sides: the kernel's table is shared by all namespaces, gc_thresh3).
        sweeps = []
        for _ in range(2):
            t = time.monotonic()
            bad = sum(not healthz(h, p_, timeout=2.0) for h, p_ in health_at)
            sweeps.append({"failed": bad, "seconds": time.monotonic() - t})
        result["health_sweeps"] = sweeps
        result["neighbours"] = len(sh("ip", "-4", "neigh", "show", check=False).stdout.splitlines())
        print(f"    health sweeps of all {ok}: " + ", ".join(f"{x['failed']} failed in {x['seconds']:.1f} s" for x in sweeps), flush=True)
        print(f"{ok}/{a.count} ready in {wall:.0f} s; start-to-ready median {result['ready_median_s'] or 0:.3f} s, "
              f"p95 {result['ready_p95_s']:.3f} s (the start command alone: median {result['launch_median_s'] or 0:.3f} s); host memory {used / 2**20:.0f} MiB = "
              f"{(used / ok if ok else 0) / 2**20:.2f} MiB per instance", flush=True)
        for k, v in result["pss_growth"].items():
            if v["count"] or abs(v["bytes"]) > 1 << 20:
                print(f"    {k:16} +{v['count']:5} processes, PSS {v['bytes'] / 2**20:+8.1f} MiB", flush=True)
        print(f"    tasks (threads and processes): {result['tasks_per_instance'] or 0:.1f} per instance, {after_tasks} on the host", flush=True)
        print("    kernel: " + ", ".join(f"{k} {v / 2**20:+.1f} MiB" for k, v in result["kernel_growth"].items()), flush=True)
        if errors:
            print("  first failures:\n    " + "\n    ".join(errors[:5]), flush=True)
        if a.save_runs and lab is not None:
            result["save_idleN"] = save_times(backend, work, lab, "n", a.save_runs)
            print(f"save with {ok} idle: median {result['save_idleN']['save_median_s'] * 1000:.0f} ms "
                  f"(0 idle: {result['save_idle0']['save_median_s'] * 1000:.0f} ms)", flush=True)
    finally:
        if not a.keep:
            t = time.monotonic()
            backend.cleanup()
            result["cleanup_s"] = time.monotonic() - t
        if lab is not None:
            lab.close()
        if a.json:
            a.json.write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k not in ("sysctl",)}, indent=None)[:3000])
        # The state folders (hundreds of store directories each) go in the
        # background: on a disk mounted with `discard` every rmdir waits.
        if not a.keep:
            subprocess.Popen(["nice", "rm", "-rf", str(work)], start_new_session=True)
    return 0 if not result.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
