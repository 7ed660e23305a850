#!/usr/bin/env python3
"""Density: how many idle EPS instances fit on this host, what each costs
the host, how fast each starts, and what a save costs while they idle;
several backends of the edge manager side by side in one run.

    sudo .venv/bin/python experiments/density/run.py --backends process,docker,microvm --count 200 --json out.json
    sudo .venv/bin/python experiments/density/run.py --cleanup      # after a killed run

For each backend in turn: one `ec-edge serve --runtime <backend>`, N users
and N instances made and started through its operator API, a pause, the
measurements, two timed saves series (0 and N instances idle), every
instance deleted through the API, the manager stopped. Then the next
backend, on a host as it was before.

Measured, per backend:
- fitted: how many instances the manager started (`POST .../start`
  answered `running`). Starts stop at the first failure (or when
  MemAvailable falls under --min-available-mib): how many fit is a result;
  the first failure's message and how many were running then are reported;
- host memory per instance: MemAvailable of /proc/meminfo before the
  instances and after they all answered and settled, divided by the number
  running. Whole-system, so the backend's share counts (containerd shims,
  docker-proxy, fuse-overlayfs, QEMU, cgroups, taps, page tables) and the
  manager's own growth. Beside it: the manager's own view, `memory_bytes` of
  each instance (the backend's cgroup: the EPS process, the container, or
  QEMU with its guest), and a breakdown by process kind (PSS; ec-eps and
  QEMU counted only for this manager's uids, docker-proxy for its ports,
  shims for its containers) plus the kernel's slab and page-table growth;
- start-to-ready per instance: as the manager reports it (`ready_seconds`:
  the backend's launch to the first 200 of the instance's /healthz) and as
  the client saw it (the `POST /v1/instances/{id}/start` round trip; the
  create is timed apart); median and p95;
- the image each instance boots: docker `docker image inspect` size,
  microvm the appliance's vmlinux + initramfs.cpio.lz4, process the ec-eps
  binary;
- the time of one save (a .docx edit, sent as a patch through
  ec_protocol.EpsClient to the lab's Dropbox) with 0 and with N instances
  idle, on an instance a device got by joining (`POST /v1/join` on the
  device listener, with the user's credential: the enrolment bundle goes to
  the device only).

HOW IT DRIVES THE RUNTIME. Through the real edge manager: `.venv/bin/ec-edge
serve` as root with its launcher, run per backend with `--runtime <backend>`,
`--max-slots` >= N, a free port block for the slots, a uid range of its own
and the limits given here; users and instances are made with its operator
API (`POST /v1/users`, `POST /v1/instances`, `POST /v1/instances/{id}/start`,
`DELETE /v1/instances/{id}`; docs/spec/edge-manager-api-v1.yaml), and the
saves go through an instance a device joined. The script starts no
instance itself (only the lab's provider servers): the docker backend runs
with the manager's own settings (4 shared networks `ec-net-<k>`, device and
management ports published, the host's ec-eps bind-mounted), the process
backend with its launcher and cgroups, microvm with `--vm-subnet` and the
lab's provider servers as `--vm-allow-host` (as the manager's tests do).

The `xen` backend is measured differently, inside a nested Xen host:
`experiments/density/xen.py`.

BOOT TIMING (`--boot-timing N`, microvm): instead of density, N sequential
cold starts (start, then stop) of one instance through the manager, per
variant (`--boot-variant`, repeatable: other QEMU options, CPU model, kernel
command line, manager flags or appliance; each its own manager), the
variants interleaved round by round so that a noisy host weighs on all
alike. Each start's `ready_seconds` is split by the console lines it
printed, timed as they reached the log: prep (the manager until its boot
mark), qemu_to_kernel, kernel_to_init (the guest's own clock, from
ec-init's first line), init (ec-init until the EPS is forked), eps (until
its ready line), healthz (until the manager's first 200). Medians, and
every start in --json:

    sudo .venv/bin/python experiments/density/run.py --boot-timing 8 --json boot.json
    sudo .venv/bin/python experiments/density/run.py --boot-timing 8 --boot-variant default \
        --boot-variant 'westmere:cpu=Westmere' --boot-variant 'tb32:serve=--vm-tcg-cache-mib 32'

Everything is removed at the end, also on Ctrl-C and on an error: every
instance is deleted through the API, then the manager is stopped, then what
is left of this run's processes, containers, cgroups, taps and tables is
removed and reported. A killed run leaves its manager's state folder
(/tmp/ec-density-*): `--cleanup` starts a manager on each one again,
deletes its instances and removes the rest.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VENV = Path(sys.executable).parent.parent
EDGE_BIN = VENV / "bin" / "ec-edge"
EPS_BIN = VENV / "bin" / "ec-eps"
LAUNCHER_BIN = VENV / "bin" / "ec-launcher"
APPLIANCE_DIR = VENV / "share" / "edgecourier" / "appliance"
IMAGE = "edgecourier/eps:local"
STATE_PREFIX = "ec-density-"  # /tmp/ec-density-<backend>-*: this script's managers (the tests' are ec-edge-lab-*)
LAB_PREFIX = "ec-density-lab-"  # /tmp/ec-density-lab-*: the provider servers of a run
USER_RE = re.compile(r"^den[0-9a-f]{4}[a-z](\d+|s0|sn)-")  # this script's users / instance ids
SERVICE = "idle"
SYSCTLS = [
    "kernel.keys.maxkeys", "kernel.keys.maxbytes", "kernel.keys.root_maxkeys",
    "net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3",
    "fs.inotify.max_user_instances", "fs.inotify.max_user_watches", "kernel.pid_max", "kernel.threads-max",
    "net.core.somaxconn", "fs.file-max",
]
MiB = 1 << 20
UID_SPAN = 100_000  # uids per manager


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sh(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])}…: {r.stderr.strip()}")
    return r


# ------------------------------------------------------------------ host readings


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


def tasks_on_host() -> int:
    """Threads and processes (kernel.pid_max bounds them all)."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])


def quantile(xs: list[float], q: float) -> Optional[float]:
    xs = sorted(xs)
    if not xs:
        return None
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def median(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


class Ours:
    """Which processes belong to one manager's instances: ec-eps and QEMU by
    the manager's uid range, docker-proxy by its port range, containerd
    shims by its containers. The rest (engines, fuse-overlayfs) is counted
    host-wide: its growth is what the instances cost the engine."""

    def __init__(self, uid_range: range, port_range: range, manager_pid: Optional[int], container_ids: set[str]):
        self.uids, self.ports, self.manager_pid, self.containers = uid_range, port_range, manager_pid, container_ids


KINDS = ("ec-eps", "qemu-system", "containerd-shim", "docker-proxy", "fuse-overlayfs", "dockerd", "containerd", "ec-edge")


def pss_by_kind(ours: Ours) -> dict[str, tuple[int, int]]:
    """(count, PSS bytes) of the processes instances bring along, by kind."""
    out: dict[str, list[int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            name = os.path.basename(argv[0].decode(errors="replace")) or Path(f"/proc/{pid}/comm").read_text().strip()
            kind = next((k for k in KINDS if name.startswith(k) and not (k == "containerd" and "shim" in name)), None)
            if kind is None:
                continue
            args = [a.decode(errors="replace") for a in argv]
            if kind in ("ec-eps", "qemu-system"):
                uid = int(next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("Uid:")).split()[1])
                if uid not in ours.uids:
                    continue
            elif kind == "docker-proxy":
                port = args[args.index("-host-port") + 1] if "-host-port" in args else ""
                if not port.isdigit() or int(port) not in ours.ports:
                    continue
            elif kind == "containerd-shim":
                cid = args[args.index("-id") + 1] if "-id" in args else ""
                if cid not in ours.containers:
                    continue
            elif kind == "ec-edge" and int(pid) != ours.manager_pid:
                continue
            pss = 0
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
        except (OSError, ValueError, StopIteration, IndexError):
            continue
        c = out.setdefault(kind, [0, 0])
        c[0] += 1
        c[1] += pss
    return {k: (v[0], v[1]) for k, v in out.items()}


from testbed.edge import StartPool, host_address  # noqa: E402 (the repository root is on sys.path above)


def docker_containers(prefix: str = "") -> dict[str, str]:
    """Full id -> instance id of the manager's containers whose instance id starts with `prefix`
    (empty: any of this script's)."""
    r = sh("docker", "ps", "-a", "--no-trunc", "--filter", "label=edgecourier.instance",
           "--format", '{{.ID}} {{.Label "edgecourier.instance"}}', check=False)
    out = {}
    for line in r.stdout.splitlines():
        cid, _, iid = line.partition(" ")
        if (prefix and iid.startswith(prefix)) or (not prefix and USER_RE.match(iid)):
            out[cid] = iid
    return out


def docker_networks() -> set[str]:
    """The networks the docker backend made (label edgecourier.network)."""
    r = sh("docker", "network", "ls", "--filter", "label=edgecourier.network", "--format", "{{.Name}}", check=False)
    return set(r.stdout.split())


def other_managers() -> list[int]:
    """Pids of every ec-edge on the host (ours is stopped when this is asked)."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.path.basename((p / "cmdline").read_bytes().split(b"\0")[0]) == b"ec-edge":
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def remove_new_networks(before: set[str]) -> dict:
    """The manager keeps its shared networks `ec-net-<k>` when it stops (any
    manager on the host uses the same ones). Those this run made go, unless
    another manager runs now (it may be about to start a container in one)."""
    new = sorted(docker_networks() - before)
    if not new:
        return {}
    others = other_managers()
    if others:
        return {"networks_left": new, "networks_left_why": f"another ec-edge runs (pids {others[:5]})"}
    removed = [n for n in new if sh("docker", "network", "rm", n, check=False).returncode == 0]
    return {"networks_removed": removed, **({"networks_left": sorted(set(new) - set(removed))} if set(new) - set(removed) else {})}


# ------------------------------------------------------------------ backends


class Backend:
    """What differs between backends: the manager's extra arguments, the
    instances' template (where the lab's provider servers are reached from
    inside), what an instance boots, and whether this host can run it."""

    name = ""

    def missing(self) -> Optional[str]:
        """Why this host cannot run it (None: it can; the manager has the last word)."""
        return None

    def serve_args(self, lab, a) -> list[str]:
        return []

    def template(self, lab) -> dict:
        return lab.eps_config()

    def image(self, a) -> dict:
        return {}


class ProcessBackend(Backend):
    name = "process"

    def image(self, a) -> dict:
        return {"bytes": EPS_BIN.stat().st_size, "what": "ec-eps (static)"}


def _lab_template_for_guest(lab) -> dict:
    """The lab's providers at the host's address: a container or guest does not see the host's loopback."""
    cfg = lab.eps_config()
    addr = f"{host_address()}:{lab.providers.tls_port}"
    cfg["upstream"]["resolve"] = {h: addr for h in cfg["upstream"]["resolve"]}
    return cfg


class DockerBackend(Backend):
    name = "docker"

    def missing(self) -> Optional[str]:
        if shutil.which("docker") is None:
            return "no docker command"
        if sh("docker", "image", "inspect", IMAGE, check=False).returncode != 0:
            return f"no image {IMAGE} (make docker-image)"
        return None

    def serve_args(self, lab, a) -> list[str]:
        return ["--docker-image", IMAGE]

    def template(self, lab) -> dict:
        return _lab_template_for_guest(lab)

    def image(self, a) -> dict:
        r = sh("docker", "image", "inspect", "--format", "{{.Size}} {{.Id}}", IMAGE, check=False)
        if r.returncode != 0:
            return {}
        size, iid = r.stdout.split()
        return {"bytes": int(size), "what": f"{IMAGE} ({iid[7:19]})"}


class MicrovmBackend(Backend):
    name = "microvm"
    files = ("vmlinux", "initramfs.cpio.lz4")

    def missing(self) -> Optional[str]:
        if shutil.which("qemu-system-x86_64") is None:
            return "no qemu-system-x86_64"
        for f in self.files:
            if not (APPLIANCE_DIR / f).exists():
                return f"no {APPLIANCE_DIR / f} (make appliance)"
        return None

    def serve_args(self, lab, a) -> list[str]:
        # As edge-manager/tests/conftest.py's vm_args, with a subnet that
        # holds the count (a /30 per slot: a /24 holds 64, a /18 4,096).
        # QEMU by its path: the launcher execs it with an empty environment (no PATH to look a bare name up in).
        qemu = shutil.which("qemu-system-x86_64")
        return ["--vm-subnet", a.vm_subnet, "--vm-allow-host", f"{host_address()}:{lab.providers.tls_port}",
                "--appliance-dir", str(APPLIANCE_DIR), *(["--qemu", qemu] if qemu else []),
                "--vm-ksm", a.vm_ksm, *(["--vm-tcg-cache-mib", str(a.vm_tcg_cache_mib)] if a.vm_tcg_cache_mib else [])]

    def template(self, lab) -> dict:
        return _lab_template_for_guest(lab)

    def image(self, a) -> dict:
        sizes = {f: (APPLIANCE_DIR / f).stat().st_size for f in self.files if (APPLIANCE_DIR / f).exists()}
        return {"bytes": sum(sizes.values()), "what": " + ".join(f"{f} {v / MiB:.1f} MiB" for f, v in sizes.items()), "files": sizes}


class XenBackend(Backend):
    """Issue 10's `xen` backend: each instance a Xen guest. It cannot be
    measured from this host's side (dom0's memory, the hypervisor's
    accounting and xl's start path live inside a nested Xen host): its
    measurement runs inside that host (today `unikernel/xen-host/selftest`
    creates guests with `xl` there and reports `density_*` results). The
    place for it here: when a manager with `--runtime xen` runs inside the
    nested host, a subclass whose `serve_args`/`template`/`image` say how,
    and readings taken there (MemAvailable of dom0 plus `xl info`'s
    free_memory) instead of this host's. Until then `missing` says so, and
    `--backends xen` reports and skips it."""

    name = "xen"

    def missing(self) -> Optional[str]:
        return "measured inside a nested Xen host: experiments/density/xen.py"


BACKENDS: dict[str, Backend] = {b.name: b for b in (ProcessBackend(), DockerBackend(), MicrovmBackend(), XenBackend())}


# ------------------------------------------------------------------ the manager


class BenchManager:
    """One `ec-edge serve` for one backend, as testbed.edge.EdgeManager
    starts one, except: its state folder is /tmp/ec-density-<backend>-*
    (so --cleanup finds it and never touches a test's manager), its uid
    and port ranges are sized for N, and close() deletes instances in
    parallel and checks that nothing is left."""

    def __init__(self, lab, backend: Backend, a, slots: int, tag: str, state: Optional[Path] = None):
        from testbed.edge import free_port_block

        self.backend = backend
        self.tag = tag
        self.proc: Optional[subprocess.Popen] = None
        self.ready: dict[str, Any] = {}
        self.failed_log = ""
        if state is not None:  # --cleanup: the settings of the run that left it
            self.state = state
            saved = json.loads((state / "bench.json").read_text())
            self.args, self.slots, self.uid_base = saved["args"], saved["slots"], saved["uid_base"]
            self.device_port_base, self.management_port_base = saved["device_port_base"], saved["management_port_base"]
            return
        self.state = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{backend.name}-"))
        self.state.chmod(0o711)  # instances run as their own uids and traverse it
        self.slots = slots
        tpl = backend.template(lab)
        for k in ("listen", "management_listen", "keys", "insecure_plain_http"):
            tpl.pop(k, None)
        (self.state / "eps-template.json").write_text(json.dumps(tpl, indent=1))
        base = free_port_block(2 * slots)
        self.device_port_base, self.management_port_base = base, base + slots
        # A uid range no test manager uses (theirs are 300000 + (base % 10000) * 100 + n). The
        # manager gives each new instance the next uid (never reused), so the range is wide.
        self.uid_base = 2_000_000 + secrets.randbelow(1000) * UID_SPAN
        self.args = [
            str(EDGE_BIN), "--state", str(self.state), "serve",
            "--operator-listen", "127.0.0.1:0", "--device-listen", "127.0.0.1:0", "--advertise", "127.0.0.1",
            "--device-port-base", str(self.device_port_base), "--management-port-base", str(self.management_port_base),
            "--max-slots", str(slots), "--uid-base", str(self.uid_base),
            "--runtime", backend.name, "--runtimes", backend.name,
            "--memory-mib", str(a.memory_mib), "--cpu-millis", str(a.cpu_millis), "--pids", str(a.pids),
            "--ready-timeout-s", str(a.ready_timeout), "--max-instances-per-user", "2",
            "--eps-binary", str(EPS_BIN), "--launcher", str(LAUNCHER_BIN),
            "--eps-template", str(self.state / "eps-template.json"), *backend.serve_args(lab, a),
        ]
        (self.state / "bench.json").write_text(json.dumps({
            "backend": backend.name, "tag": tag, "args": self.args, "slots": slots, "uid_base": self.uid_base,
            "device_port_base": self.device_port_base, "management_port_base": self.management_port_base}, indent=1))

    def start(self) -> float:
        t0 = time.monotonic()
        logf = open(self.state / "manager.log", "ab")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=logf, text=True, start_new_session=True)
        logf.close()
        (self.state / "manager.pid").write_text(str(self.proc.pid))
        line = self.proc.stdout.readline()  # the ready line, or EOF when it gives up
        if not line.startswith("{"):
            self.proc.kill()
            self.proc.wait()
            text = re.sub(r"\x1b\[[0-9;]*m", "", (self.state / "manager.log").read_text(errors="replace")).strip()
            self.failed_log = text[-4000:]
            # Its last word is the line `ec-edge: <why>` (an nft script or a console may follow it).
            lines = text.splitlines()
            why = next((line for line in lines if line.startswith("ec-edge:")), None) or next(
                (line for line in lines if "rror" in line or "unavailable" in line), lines[-1] if lines else "no log")
            raise RuntimeError(f"ec-edge serve --runtime {self.backend.name} did not start: {why.strip()}")
        self.ready = json.loads(line)
        return time.monotonic() - t0

    def operator(self):
        from testbed.edge import Operator

        return Operator(self.ready["operator"], (self.state / "operator.token").read_text().strip())

    def device(self, credential: str):
        from testbed.edge import Device

        return Device(self.ready["device"], credential)

    @property
    def uid_range(self) -> range:
        return range(self.uid_base, self.uid_base + UID_SPAN)

    @property
    def port_range(self) -> range:
        return range(self.device_port_base, self.management_port_base + self.slots)

    @property
    def id_prefix(self) -> str:
        return f"den{self.tag}"

    def delete_all(self, parallel: int) -> tuple[int, list[str]]:
        """DELETE of every instance, then of every user; (deleted, errors)."""
        op = self.operator()
        ids = [i["id"] for i in op.call("GET", "/v1/instances")["instances"]]
        errors: list[str] = []
        done = 0
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(max(1, parallel)) as ex:
            for n, (iid, (status, body)) in enumerate(zip(ids, ex.map(lambda i: op.raw("DELETE", f"/v1/instances/{i}"), ids)), 1):
                if status in (204, 404):
                    done += 1
                else:
                    errors.append(f"{iid}: {status} {body}")
                if n % 50 == 0:
                    log(f"  deleting: {n}/{len(ids)}, {time.monotonic() - t0:.0f} s")
        for u in op.call("GET", "/v1/users")["users"]:
            op.raw("DELETE", f"/v1/users/{u['user']}")
        return done, errors

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # the manager gives back host resources no instance needs (tables, networks)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self, parallel: int) -> dict:
        """Deletes every instance through the API, stops the manager, then
        removes (and reports) whatever is left of this manager on the host."""
        out: dict[str, Any] = {}
        t0 = time.monotonic()
        if self.proc and self.proc.poll() is None:
            try:
                out["deleted"], errs = self.delete_all(parallel)
                if errs:
                    out["delete_errors"] = errs[:5]
            except Exception as e:  # noqa: BLE001 - the sweep below still runs
                out["delete_errors"] = [f"{type(e).__name__}: {e}"]
        out["delete_s"] = time.monotonic() - t0
        self.stop()
        out["leftovers"] = sweep(self.state, self.id_prefix)
        shutil.rmtree(self.state, ignore_errors=True)
        return out


def kill_processes_naming(folder: Path) -> list[str]:
    """SIGKILL to every process whose command line names `folder`."""
    found = []
    key = str(folder).encode()
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and int(p.name) != os.getpid() and key in (p / "cmdline").read_bytes():
                found.append(f"process {p.name} {(p / 'comm').read_text().strip()}")
                os.kill(int(p.name), signal.SIGKILL)
        except OSError:
            continue
    return found


def sweep(state: Path, id_prefix: str) -> list[str]:
    """Removes what a manager on `state` (instance ids starting with
    `id_prefix`) left on the host; returns what it found."""
    # ec-edge, ec-eps and QEMU name the state folder on their command line.
    found: list[str] = kill_processes_naming(state)
    if shutil.which("docker"):
        conts = docker_containers(id_prefix)
        if conts:
            found += [f"container ec-{i}" for i in conts.values()]
            sh("docker", "rm", "-f", *conts, check=False, timeout=600)
    for root in [*Path("/sys/fs/cgroup").glob("*/edgecourier"), Path("/sys/fs/cgroup/edgecourier")]:  # v1, v2
        for cg in root.glob(f"{id_prefix}*"):
            found.append(f"cgroup {cg}")
            try:
                cg.rmdir()
            except OSError:
                pass
    # The microvm backend's taps and nft table are named after a hash of the state folder (runtime/vmnet.rs).
    links = sh("ip", "-o", "link", "show", check=False).stdout
    for path in {str(state), os.path.realpath(state)}:
        tag = hashlib.sha256(path.encode()).hexdigest()[:4]
        for name in re.findall(rf": (ecv{tag}-\d+)[@:]", links):
            found.append(f"link {name}")
            sh("ip", "link", "del", name, check=False)
        if shutil.which("nft") and sh("nft", "list", "table", "ip", f"ec_vm_{tag}", check=False).returncode == 0:
            found.append(f"nft table ip ec_vm_{tag}")
            sh("nft", "delete", "table", "ip", f"ec_vm_{tag}", check=False)
    return found


def cleanup_leftovers(parallel: int) -> int:
    """--cleanup: every /tmp/ec-density-* state folder of a killed run: its
    manager started again (it re-adopts its instances), every instance deleted
    through the API, the manager stopped, the rest swept; then containers of
    this script whose folder is gone."""
    n = 0
    for state in sorted(Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}*")):
        saved = state / "bench.json"
        if not state.is_dir() or not (saved.exists() or state.name.startswith(LAB_PREFIX)):
            continue
        if not saved.exists():  # the lab of a killed run (its provider servers)
            left = kill_processes_naming(state)
            log(f"{state}: " + (f"stopped {', '.join(left)}" if left else "removed"))
            shutil.rmtree(state, ignore_errors=True)
            continue
        info = json.loads(saved.read_text())
        log(f"{state}: {info['backend']} manager of run {info['tag']}")
        sweep_only = False
        pidf = state / "manager.pid"
        if pidf.exists():  # a manager of a killed run may still serve (and is that pid still it?): stop it first
            try:
                pid = int(pidf.read_text())
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if os.path.basename(argv[0]) == b"ec-edge" and str(state).encode() in argv:
                    os.kill(pid, signal.SIGTERM)
                    time.sleep(2)
            except (OSError, ValueError):
                pass
        mgr = BenchManager(None, BACKENDS[info["backend"]], None, 0, info["tag"], state=state)
        try:
            mgr.start()
            done, errs = mgr.delete_all(parallel)
            log(f"  {done} instances deleted through the API" + (f"; errors: {errs[:3]}" if errs else ""))
        except Exception as e:  # noqa: BLE001
            log(f"  the manager did not start again ({e}); removing its instances by hand")
            sweep_only = True
        mgr.stop()
        left = sweep(state, mgr.id_prefix)
        if left or sweep_only:
            log(f"  removed: {', '.join(left) or 'nothing'}")
        shutil.rmtree(state, ignore_errors=True)
        n += 1
    if shutil.which("docker"):
        conts = docker_containers()
        if conts:
            log(f"containers of this script without a state folder: {', '.join(conts.values())}")
            sh("docker", "rm", "-f", *conts, check=False, timeout=600)
        # The docker backend's shared networks outlive its manager; with no manager running they can go
        # (a manager makes them again when it needs them).
        nets = remove_new_networks(set())
        if nets:
            log(f"docker networks: {nets}")
    log(f"cleanup: {n} state folders")
    return 0


# ------------------------------------------------------------------ one backend


def save_times(mgr: BenchManager, lab, label: str, runs: int) -> dict:
    """A device joins (`POST /v1/join` with its user's credential, service
    dropbox): the manager creates and starts its instance and hands over the
    enrolment bundle. One save of a .docx whole, then `runs` one-edit saves
    timed (patches). The user and instance are deleted afterwards."""
    from ec_protocol.client import EnrolmentBundle, EpsClient
    from eps.tests.e2e import Uploader, corpus_files, edited

    op = mgr.operator()
    user = f"{mgr.id_prefix}{label}"
    cred = op.call("POST", "/v1/users", {"user": user})["credential"]
    t0 = time.monotonic()
    joined = mgr.device(cred).call("POST", "/v1/join", {"service": "dropbox"})
    join_s = time.monotonic() - t0
    iid = joined["instance"]["id"]
    try:
        client = EpsClient(EnrolmentBundle.from_dict(joined["enrolment"]), label=iid)
        up = Uploader("dropbox", "single")
        # A typical office document: the largest .docx of the corpus under 500 kB.
        doc = max((f for f in corpus_files("docx") if f.stat().st_size < 500_000), key=lambda f: f.stat().st_size).read_bytes()
        base = doc
        out = up.save(client, f"density-{label}.docx", base, None)
        if not getattr(out, "succeeded", False):
            raise RuntimeError(f"the first save failed: {out!r}")
        times = []
        for n in range(1, runs + 1):
            new = edited(base, n)
            t = time.monotonic()
            out = up.save(client, f"density-{label}.docx", new, base)
            times.append(time.monotonic() - t)
            if not getattr(out, "succeeded", False):
                raise RuntimeError(f"save {n} failed: {out!r}")
            base = new
        return {"join_s": join_s, "ready_s": joined["instance"].get("ready_seconds"), "save_median_s": statistics.median(times),
                "save_max_s": max(times), "runs": runs, "file_bytes": len(doc), "last_sent": str(getattr(client, "last_sent_kinds", None))}
    finally:
        op.raw("DELETE", f"/v1/instances/{iid}")
        op.raw("DELETE", f"/v1/users/{user}")


def start_instances(mgr: BenchManager, a, stop_event: threading.Event) -> dict:
    """Creates and starts `count` instances, `parallel` in flight; stops
    submitting at the first failure (or low MemAvailable)."""
    op = mgr.operator()
    lock = threading.Lock()
    ok: list[dict] = []
    failures: list[dict] = []
    stopped: dict[str, Any] = {}
    t_all = time.monotonic()
    last_print = [0.0]

    def one(i: int) -> None:
        if stop_event.is_set():
            return
        if a.min_available_mib and meminfo()["MemAvailable"] < a.min_available_mib * MiB:
            with lock:
                if not stopped:
                    stopped.update(reason=f"MemAvailable under {a.min_available_mib} MiB", running=len(ok))
            stop_event.set()
            return
        user = f"{mgr.id_prefix}{i}"
        step = "create user"
        try:
            op.call("POST", "/v1/users", {"user": user})
            step = "create"
            t0 = time.monotonic()
            inst = op.call("POST", "/v1/instances", {"user": user, "service": SERVICE})
            t1 = time.monotonic()
            step = "start"
            view = op.call("POST", f"/v1/instances/{inst['id']}/start")
            t2 = time.monotonic()
            if view.get("state") != "running":
                raise RuntimeError(f"state {view.get('state')} after start: {view.get('last_exit')}")
            with lock:
                ok.append({"id": inst["id"], "create_s": t1 - t0, "start_s": t2 - t1, "ready_s": view.get("ready_seconds")})
        except Exception as e:  # noqa: BLE001 - the first failure names the limit hit
            msg = f"{user}: {step}: {e}"
            with lock:
                failures.append({"instance": i, "message": msg[:600], "running": len(ok)})
                if not stopped:
                    stopped.update(reason="a start failed", first_failure=msg[:600], running=len(ok))
            stop_event.set()
        finally:
            with lock:
                n = len(ok) + len(failures)
                now = time.monotonic()
                if now - last_print[0] > 10 or n == a.count or n % max(1, a.count // 20) == 0:
                    last_print[0] = now
                    log(f"  [{mgr.backend.name}] {len(ok)}/{a.count} running, {len(failures)} failed, {now - t_all:.0f} s")

    # Not a ThreadPoolExecutor: its threads are joined at the interpreter's exit, and an interrupted run must
    # not wait for starts under way (guests boot in minutes under nested Xen); the manager's close, after
    # this, ends them.
    ex = StartPool(a.parallel)
    futs = [ex.submit(one, i) for i in range(a.count)]
    try:
        for f in cf.as_completed(futs):
            if f.cancelled():
                continue
            f.result()
            if stop_event.is_set():
                for g in futs:
                    g.cancel()
    except BaseException:
        stop_event.set()
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown(wait=True)
    return {"ok": ok, "failures": failures, "stopped": stopped, "wall_s": time.monotonic() - t_all}


def measure_backend(backend: Backend, lab, a, tag: str, res: dict) -> dict:
    """Fills `res` (so that an interrupted run still reports what it had)."""
    res.update(backend=backend.name, count=a.count, parallel=a.parallel)
    why = backend.missing()
    if why:
        res["skipped"] = why
        log(f"[{backend.name}] skipped: {why}")
        return res
    res["image"] = backend.image(a)
    if backend.name == "docker":
        res["engine"] = sh("docker", "version", "--format", "{{.Server.Version}}", check=False).stdout.strip()
    mgr = BenchManager(lab, backend, a, a.max_slots or a.count + 4, f"{tag}{backend.name[0]}")
    nets_before = docker_networks() if backend.name == "docker" else set()
    stop_event = threading.Event()
    try:
        log(f"[{backend.name}] starting ec-edge serve --runtime {backend.name} (state {mgr.state})")
        res["manager_start_s"] = mgr.start()
        res["manager"] = {"runtimes": mgr.ready.get("runtimes"), "args": mgr.args[3:]}
        if a.save_runs:
            try:
                res["save_idle0"] = {**save_times(mgr, lab, "s0", a.save_runs), "idle": 0}
                log(f"[{backend.name}] save with 0 idle: median {res['save_idle0']['save_median_s'] * 1000:.0f} ms")
            except Exception as e:  # noqa: BLE001 - reported; density is still measured
                res["save_idle0"] = {"error": f"{type(e).__name__}: {e}"[:600], "idle": 0}
                log(f"[{backend.name}] save with 0 idle failed: {res['save_idle0']['error']}")
        ours = Ours(mgr.uid_range, mgr.port_range, mgr.proc.pid, set())
        before_avail = mem_available()
        before_mem = meminfo()
        before_pss = pss_by_kind(ours)
        before_tasks = tasks_on_host()

        started = start_instances(mgr, a, stop_event)
        ok = started["ok"]
        res.update(started=len(ok) + len(started["failures"]), fitted=len(ok), wall_s=started["wall_s"],
                   stopped=started["stopped"] or None, failures=started["failures"][:5])
        if started["stopped"]:
            log(f"[{backend.name}] stopped starting: {started['stopped']}")
        if not ok:
            log(f"[{backend.name}] none fitted: nothing to measure")
            return res
        log(f"[{backend.name}] {len(ok)} running; settling {a.settle:.0f} s")
        time.sleep(a.settle)

        after_avail = mem_available()
        after_mem = meminfo()
        if backend.name == "docker":
            ours.containers = set(docker_containers(mgr.id_prefix))
        after_pss = pss_by_kind(ours)
        after_tasks = tasks_on_host()
        views = [v for v in mgr.operator().call("GET", "/v1/instances")["instances"] if v["id"].endswith(f"-{SERVICE}")]
        running = [v for v in views if v["state"] == "running"]
        mem = [v["memory_bytes"] for v in running if v.get("memory_bytes") is not None]
        n = len(running)
        used = before_avail - after_avail
        ready_mgr = [o["ready_s"] for o in ok if o["ready_s"] is not None]
        start_cli = [o["start_s"] for o in ok]
        res.update({
            "running_after_settle": n,
            "crashes": sum(v.get("crashes", 0) for v in views),
            "not_running": {v["id"]: v["state"] for v in views if v["state"] != "running"} or None,
            "ready_manager": {"median_s": median(ready_mgr), "p95_s": quantile(ready_mgr, 0.95), "max_s": max(ready_mgr, default=None)},
            "start_client": {"median_s": median(start_cli), "p95_s": quantile(start_cli, 0.95), "max_s": max(start_cli, default=None)},
            "create_client_median_s": median([o["create_s"] for o in ok]),
            "ready_manager_all_s": ready_mgr,
            "host_bytes": used, "host_bytes_per_instance": used / n if n else None,
            "cgroup_bytes_per_instance": sum(mem) / len(mem) if mem else None, "cgroup_readings": len(mem),
            "tasks_per_instance": (after_tasks - before_tasks) / n if n else None, "tasks_after": after_tasks,
            "kernel_growth": {k: after_mem[k] - before_mem[k] for k in ("Slab", "SUnreclaim", "PageTables", "KernelStack", "Shmem")},
            "pss_growth": {k: {"count": after_pss.get(k, (0, 0))[0] - before_pss.get(k, (0, 0))[0],
                               "bytes": after_pss.get(k, (0, 0))[1] - before_pss.get(k, (0, 0))[1]}
                           for k in sorted(set(after_pss) | set(before_pss))},
        })
        # Cross-check of the MemAvailable delta: PSS of the processes the
        # instances bring along plus the kernel's unreclaimable slab, page tables and stacks.
        kg = res["kernel_growth"]
        attributed = sum(v["bytes"] for v in res["pss_growth"].values()) + kg["SUnreclaim"] + kg["PageTables"] + kg["KernelStack"]
        res["attributed_bytes_per_instance"] = attributed / n if n else None

        if a.save_runs:
            idle = n
            if started["stopped"] and running:
                # The host is full: the saving device's instance needs the room of one idle instance.
                mgr.operator().raw("DELETE", f"/v1/instances/{running[-1]['id']}")
                idle -= 1
            try:
                res["save_idleN"] = {**save_times(mgr, lab, "sn", a.save_runs), "idle": idle}
                log(f"[{backend.name}] save with {idle} idle: median {res['save_idleN']['save_median_s'] * 1000:.0f} ms")
            except Exception as e:  # noqa: BLE001 - the measurements above stand
                res["save_idleN"] = {"error": f"{type(e).__name__}: {e}"[:600], "idle": idle}
                log(f"[{backend.name}] save with {idle} idle failed: {res['save_idleN']['error']}")
    except KeyboardInterrupt:
        res["interrupted"] = True
        raise
    except Exception as e:  # noqa: BLE001 - reported; the next backend still runs
        res["error"] = f"{type(e).__name__}: {e}"
        if mgr.failed_log:
            res["manager_log"] = mgr.failed_log
        log(f"[{backend.name}] error: {res['error']}")
    finally:
        stop_event.set()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            log(f"[{backend.name}] deleting every instance through the API, stopping the manager")
            res["cleanup"] = mgr.close(a.parallel)
            if backend.name == "docker":
                res["cleanup"].update(remove_new_networks(nets_before))
            if res["cleanup"]["leftovers"]:
                log(f"[{backend.name}] left behind and removed: {res['cleanup']['leftovers']}")
        finally:
            signal.signal(signal.SIGINT, old)
    return res


# ------------------------------------------------------------------ boot timing


# The console lines that mark the phases of a microvm start (the instance's
# log is its serial console; the manager writes the boot mark before QEMU).
BOOT_MARKS = {
    "mark": "--- ec-edge: booting",              # runtime/microvm.rs BOOT_MARK: disk, initramfs, tap ready; QEMU next
    "init": "ec-init: started ",                 # ec-init's first line: "started X s after the kernel"
    "eps_spawned": "ec-init: the EPS runs as",   # ec-init has mounted, networked and forked the EPS
    "eps_ready": '"ready":true',                 # the EPS's machine-readable ready line (listeners bound)
}
INIT_UPTIME_RE = re.compile(r"ec-init: started ([0-9.]+) s after the kernel")
PHASES = ("prep", "qemu_to_kernel", "kernel_to_init", "init", "eps", "healthz")


class BootVariant(MicrovmBackend):
    """One way of booting the appliance, for a same-run comparison.

    `NAME` or `NAME:key=value;key=value...` with keys
      cpu=MODEL        TCG's -cpu model instead of the manager's
      machine=OPTS     appended to -M microvm,... (e.g. pit=off,pic=off)
      append=WORDS     appended to the kernel command line
      qemu=ARGS        appended to QEMU's command line
      serve=ARGS       extra `ec-edge serve` arguments (e.g. --vm-tcg-cache-mib 32)
      appliance=DIR    another appliance folder (vmlinux, initramfs.cpio.lz4)
      edge=PATH        another ec-edge (a manager built but not installed)
    The QEMU changes go through a wrapper script handed to the manager as
    --qemu (so the manager's own command line is the base of every variant,
    and an empty variant measures the wrapper's exec, a few ms, like the others)."""

    KEYS = ("cpu", "machine", "append", "qemu", "serve", "appliance", "edge")

    def __init__(self, spec: str):
        name, _, rest = spec.partition(":")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,40}", name):
            raise ValueError(f"--boot-variant {spec!r}: the name (before ':') must be 1-40 letters, digits or _.+-")
        self.label = name
        self.opts: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in rest.split(";"))):
            k, eq, v = part.partition("=")
            if not eq or k not in self.KEYS:
                raise ValueError(f"--boot-variant {spec!r}: {part!r}: expected one of {', '.join(k + '=' for k in self.KEYS)}")
            self.opts[k] = v
        self.appliance_dir = Path(self.opts["appliance"]).resolve() if "appliance" in self.opts else APPLIANCE_DIR
        self.wrapper: Optional[Path] = None

    def missing(self) -> Optional[str]:
        if shutil.which("qemu-system-x86_64") is None:
            return "no qemu-system-x86_64"
        for f in self.files:
            if not (self.appliance_dir / f).exists():
                return f"no {self.appliance_dir / f}"
        if "edge" in self.opts and not os.access(self.opts["edge"], os.X_OK):
            return f"edge={self.opts['edge']}: not an executable"
        return None

    def write_wrapper(self, folder: Path) -> Path:
        import shlex

        qemu = shutil.which("qemu-system-x86_64")
        cpu, machine, append = self.opts.get("cpu"), self.opts.get("machine"), self.opts.get("append")
        cases = []
        if append:
            cases.append(f'    -append) a="$a "{shlex.quote(append)} ;;')
        if cpu:  # TCG only: KVM's -cpu host is left alone
            cases.append(f'    -cpu) [ "$a" = max ] && a={shlex.quote(cpu)} ;;')
        if machine:
            cases.append(f'    -M) a="$a,"{shlex.quote(machine)} ;;')
        extra = " ".join(shlex.quote(x) for x in shlex.split(self.opts.get("qemu", "")))
        body = "\n".join([
            "#!/bin/sh",
            f"# boot-timing variant {self.label} (experiments/density/run.py --boot-timing)",
            "prev=",
            'for a in "$@"; do',
            "  shift",
            '  case $prev in',
            *cases,
            "  esac",
            '  set -- "$@" "$a"',
            "  prev=$a",
            "done",
            f'exec {shlex.quote(qemu)} "$@" {extra}'.rstrip(),
            "",
        ])
        self.wrapper = folder / f"qemu-{self.label}"
        self.wrapper.write_text(body)
        self.wrapper.chmod(0o755)
        return self.wrapper

    def serve_args(self, lab, a) -> list[str]:
        import shlex

        args = super().serve_args(lab, a)
        args[args.index("--appliance-dir") + 1] = str(self.appliance_dir)
        if self.wrapper is not None:
            if "--qemu" in args:
                args[args.index("--qemu") + 1] = str(self.wrapper)
            else:
                args += ["--qemu", str(self.wrapper)]
        return args + shlex.split(self.opts.get("serve", ""))

    def image(self, a) -> dict:
        sizes = {f: (self.appliance_dir / f).stat().st_size for f in self.files if (self.appliance_dir / f).exists()}
        return {"bytes": sum(sizes.values()), "files": sizes, "dir": str(self.appliance_dir)}


class ConsoleWatch:
    """Follows an instance's log from its current end and notes the host's
    monotonic time at which each of BOOT_MARKS first shows up (polled every
    2 ms: the times are late by up to that, and by QEMU's write)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.seen: dict[str, float] = {}
        self.text = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = b""
        f = None
        while not self._stop.is_set():
            if f is None:
                try:
                    f = open(self.path, "rb")
                    f.seek(self.offset)
                except OSError:
                    time.sleep(0.002)
                    continue
            chunk = f.read()
            now = time.monotonic()
            if chunk:
                buf += chunk
                text = buf.decode(errors="replace")
                for k, m in BOOT_MARKS.items():
                    if k not in self.seen and m in text:
                        self.seen[k] = now
                self.text = text
            else:
                time.sleep(0.002)
        if f is not None:
            f.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def boot_once(mgr: BenchManager, iid: str) -> dict:
    """One cold start of instance `iid`, timed by the manager and split into
    phases from its console; then a stop. The manager's launch time t0 is
    taken as (when the start call returned) - ready_seconds: the reply goes
    out right after the first 200 of /healthz, so it is late by the reply's
    few ms, which the healthz phase absorbs."""
    op = mgr.operator()
    watch = ConsoleWatch(mgr.state / "logs" / f"{iid}.log")
    t_call = time.monotonic()
    try:
        status, view = op.raw("POST", f"/v1/instances/{iid}/start")
        t_resp = time.monotonic()
    finally:
        time.sleep(0.01)  # the last lines
        watch.stop()
    out: dict[str, Any] = {"status": status}
    if status != 200 or not isinstance(view, dict) or view.get("state") != "running" or view.get("ready_seconds") is None:
        out["error"] = cut(f"{status} {view}", 600)
        out["console"] = watch.text[-2000:]
        return out
    ready = float(view["ready_seconds"])
    t0 = t_resp - ready
    s = watch.seen
    m = INIT_UPTIME_RE.search(watch.text)
    out.update(ready_s=ready, call_s=t_resp - t_call, console=watch.text[-3000:])
    if m and all(k in s for k in BOOT_MARKS):
        up = float(m.group(1))
        t_kernel = s["init"] - up
        out["phases"] = {
            "prep": s["mark"] - t0,                     # manager: state disk, boot.cpio, tap and forwards
            "qemu_to_kernel": t_kernel - s["mark"],     # launcher, QEMU's start, loading the kernel and initramfs
            "kernel_to_init": up,                       # the kernel's boot (its clock), unpacking the initramfs
            "init": s["eps_spawned"] - s["init"],       # ec-init: mounts, network, state disk, fork
            "eps": s["eps_ready"] - s["eps_spawned"],   # the EPS until its listeners are bound
            "healthz": t_resp - s["eps_ready"],         # until the manager's first 200 of /healthz (and the reply)
        }
    else:
        out["phases_missing"] = sorted(set(BOOT_MARKS) - set(s)) + ([] if m else ["init uptime"])
    return out


def boot_timing(lab, a, tag: str, out: dict) -> None:
    """--boot-timing N: N cold starts per variant of one microvm instance,
    the variants interleaved (round r starts each variant once, in an order
    rotated every round), each through its own manager."""
    variants = [BootVariant(s) for s in (a.boot_variant or ["default"])]
    if len({v.label for v in variants}) != len(variants):
        raise ValueError("--boot-variant: two variants with one name")
    if len(variants) > 20:
        raise ValueError("--boot-variant: at most 20 variants")
    for v in variants:
        why = v.missing()
        if why:
            raise RuntimeError(f"variant {v.label}: {why}")
    wrappers = Path(tempfile.mkdtemp(prefix=f"{LAB_PREFIX}qemu-"))
    wrappers.chmod(0o755)  # QEMU runs as each instance's uid
    res: dict[str, Any] = {"n": a.boot_timing, "pause_s": a.boot_pause, "variants": {}}
    out["boot_timing"] = res
    mgrs: dict[str, BenchManager] = {}
    iids: dict[str, str] = {}
    try:
        for i, v in enumerate(variants):
            v.write_wrapper(wrappers)
            mgr = BenchManager(lab, v, a, 2, f"{tag}{chr(ord('b') + i)}")
            if "edge" in v.opts:
                mgr.args[0] = str(Path(v.opts["edge"]).resolve())
            mgrs[v.label] = mgr
            log(f"[boot {v.label}] starting ec-edge serve (state {mgr.state}) {v.opts or ''}")
            mgr.start()
            op = mgr.operator()
            user = f"{mgr.id_prefix}0"
            op.call("POST", "/v1/users", {"user": user})
            iids[v.label] = op.call("POST", "/v1/instances", {"user": user, "service": SERVICE})["id"]
            res["variants"][v.label] = {"opts": v.opts, "image": v.image(a), "manager": {"runtimes": mgr.ready.get("runtimes"), "args": mgr.args[3:]},
                                        "starts": []}
        for r in range(a.boot_timing):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for v in order:
                mgr = mgrs[v.label]
                one = boot_once(mgr, iids[v.label])
                one["round"] = r
                res["variants"][v.label]["starts"].append(one)
                ph = one.get("phases") or {}
                log(f"[boot {v.label}] {r + 1}/{a.boot_timing}: ready {s2(one.get('ready_s'))} s  "
                    + "  ".join(f"{k} {ms(ph.get(k))}" for k in PHASES) + (f"  ERROR {one['error']}" if "error" in one else ""))
                st, body = mgr.operator().raw("POST", f"/v1/instances/{iids[v.label]}/stop")
                if st != 200:
                    log(f"[boot {v.label}] stop: {st} {body}")
                time.sleep(a.boot_pause)
        for label, vr in res["variants"].items():
            ok = [s for s in vr["starts"] if "ready_s" in s]
            vr["ready_median_s"] = median([s["ready_s"] for s in ok])
            vr["ready_min_s"] = min((s["ready_s"] for s in ok), default=None)
            vr["errors"] = len(vr["starts"]) - len(ok)
            vr["phases_median_s"] = {k: median([s["phases"][k] for s in ok if "phases" in s]) for k in PHASES}
    finally:
        for label, mgr in mgrs.items():
            c = mgr.close(1)
            if c["leftovers"]:
                log(f"[boot {label}] left behind and removed: {c['leftovers']}")
        shutil.rmtree(wrappers, ignore_errors=True)


def boot_table(res: dict) -> str:
    vs = res["variants"]
    base = next(iter(vs.values()), {}).get("ready_median_s")
    rows = []
    for label, vr in vs.items():
        med = vr.get("ready_median_s")
        ph = vr.get("phases_median_s") or {}
        ok = len(vr["starts"]) - vr.get("errors", 0)
        rows.append([label, f"{ok}/{len(vr['starts'])}", s2(med), s2(vr.get("ready_min_s")),
                     "—" if not (med and base) else f"{med / base:.3f}", *(ms(ph.get(k)) for k in PHASES)])
    opts = "\n".join(f"- {label}: {vr['opts'] or '(the manager as it is)'}" for label, vr in vs.items())
    return (f"## boot timing: {res['n']} cold starts per variant, interleaved (medians)\n"
            + table(["variant", "ok", "ready s", "min s", "ratio", *(f"{k} ms" for k in PHASES)], rows) + "\n" + opts)


# ------------------------------------------------------------------ output


def ms(x: Optional[float]) -> str:
    return "—" if x is None else f"{x * 1000:.0f}"


def s2(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.2f}"


def cut(text: str, n: int = 100) -> str:
    """A table cell (the JSON has the whole text)."""
    return text if len(text) <= n else text[: n - 1] + "…"


def mib(x: Optional[float], d: int = 2) -> str:
    return "—" if x is None else f"{x / MiB:.{d}f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(cells)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (x + 2) for x in w) + "|", *(line(r) for r in rows)])


def backend_table(r: dict) -> str:
    name = r["backend"]
    if r.get("skipped"):
        return f"## {name}: skipped ({r['skipped']})"
    rows = [
        ["instances started / fitted (ready)", f"{r.get('started', 0)} / {r.get('fitted', 0)}"],
        ["running after settle / crashes", f"{r.get('running_after_settle', '—')} / {r.get('crashes', '—')}"],
    ]
    st = r.get("stopped")
    if st:
        rows.append(["stopped starting", cut(f"{st.get('reason')} with {st.get('running')} running")])
        if st.get("first_failure"):
            rows.append(["  first failure", cut(st["first_failure"])])
    if r.get("error"):
        rows.append(["error", cut(r["error"])])
    if "host_bytes_per_instance" in r:
        rm, sc = r["ready_manager"], r["start_client"]
        rows += [
            ["host MiB per instance (MemAvailable)", mib(r["host_bytes_per_instance"])],
            ["cgroup MiB per instance (manager's memory_bytes)", mib(r["cgroup_bytes_per_instance"])],
            ["attributed MiB per instance (PSS + kernel)", mib(r["attributed_bytes_per_instance"])],
            ["start-to-ready, manager: median / p95 / max s", f"{s2(rm['median_s'])} / {s2(rm['p95_s'])} / {s2(rm['max_s'])}"],
            ["start call, client: median / p95 / max s", f"{s2(sc['median_s'])} / {s2(sc['p95_s'])} / {s2(sc['max_s'])}"],
            ["create call, client: median ms", ms(r["create_client_median_s"])],
            ["all starts, wall s", f"{r['wall_s']:.1f}"],
            ["tasks per instance", "—" if r["tasks_per_instance"] is None else f"{r['tasks_per_instance']:.1f}"],
        ]
        n = r["running_after_settle"] or 1
        for k, v in r["pss_growth"].items():
            if v["count"] or abs(v["bytes"]) > MiB:
                rows.append([f"  PSS {k} (+{v['count']} processes)", f"{v['bytes'] / n / MiB:+.2f} per instance"])
        kg = r["kernel_growth"]
        rows.append(["  kernel SUnreclaim / PageTables / KernelStack", " / ".join(f"{kg[k] / n / MiB:+.2f}" for k in ("SUnreclaim", "PageTables", "KernelStack"))])
    if r.get("image"):
        rows.append(["image", f"{mib(r['image'].get('bytes'), 1)} MiB ({r['image'].get('what')})"])
    for k, label in (("save_idle0", "save before the N"), ("save_idleN", "save among the N")):
        v = r.get(k)
        if v:
            label = f"{label} ({v.get('idle', '?')} idle)"
            if "error" in v:
                rows.append([label, cut(v["error"])])
            else:
                rows.append([f"{label}: median / max ms (join s)", f"{ms(v['save_median_s'])} / {ms(v['save_max_s'])} ({s2(v['join_s'])})"])
    if r.get("cleanup"):
        c = r["cleanup"]
        rows.append(["cleanup: deleted, s, left behind", f"{c.get('deleted', '—')}, {c['delete_s']:.1f}, {len(c['leftovers'])}"])
        if c.get("networks_removed") or c.get("networks_left"):
            rows.append(["  networks made by this run", f"removed {len(c.get('networks_removed', []))}, left {len(c.get('networks_left', []))}"])
    return f"## {name}\n" + table(["", name], rows)


def side_by_side(results: list[dict]) -> str:
    rows = []
    for r in results:
        if r.get("skipped"):
            rows.append([r["backend"], "skipped", *([""] * 7)])
            continue
        rm = r.get("ready_manager") or {}
        sc = r.get("start_client") or {}
        img = r.get("image") or {}
        s0, sn = r.get("save_idle0"), r.get("save_idleN")
        rows.append([
            r["backend"], str(r.get("started", 0)), str(r.get("fitted", 0)),
            mib(r.get("host_bytes_per_instance")), mib(r.get("cgroup_bytes_per_instance")),
            f"{s2(rm.get('median_s'))} / {s2(rm.get('p95_s'))}", f"{s2(sc.get('median_s'))} / {s2(sc.get('p95_s'))}",
            mib(img.get("bytes"), 1),
            f"{ms((s0 or {}).get('save_median_s'))} / {ms((sn or {}).get('save_median_s'))}" + (f" ({sn['idle']} idle)" if sn and "idle" in sn else ""),
        ])
    return table(["backend", "started", "fitted", "host MiB/inst", "cgroup MiB/inst", "ready s med/p95 (mgr)",
                  "start call s med/p95", "image MiB", "save ms idle-0/N"], rows)


def plot(results: list[dict], path: Path) -> Optional[str]:
    """Memory per instance and start-to-ready by backend; None, or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed in this Python: no plot"
    rs = [r for r in results if r.get("fitted")]
    if not rs:
        return "nothing fitted: no plot"
    names = [r["backend"] for r in rs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.27
    series = (("host (MemAvailable)", "host_bytes_per_instance"), ("cgroup (manager)", "cgroup_bytes_per_instance"),
              ("attributed (PSS + kernel)", "attributed_bytes_per_instance"))
    for j, (label, key) in enumerate(series):
        vals = [(r.get(key) or 0) / MiB for r in rs]
        bars = ax1.bar([i + (j - 1) * width for i in range(len(rs))], vals, width, label=label)
        ax1.bar_label(bars, fmt="%.1f", fontsize=7)
    ax1.set_xticks(range(len(rs)), [f"{n}\n({r['fitted']} fitted)" for n, r in zip(names, rs)])
    ax1.set_ylabel("MiB per idle instance")
    ax1.set_title("Memory per instance")
    ax1.legend(fontsize=7)
    data = [r.get("ready_manager_all_s") or [0] for r in rs]
    ax2.boxplot(data, showfliers=True)
    ax2.set_xticks(range(1, len(rs) + 1), names)
    ax2.set_ylabel("seconds (manager's ready_seconds)")
    ax2.set_title("Start-to-ready")
    fig.suptitle(f"EdgeCourier density: {rs[0]['count']} idle instances requested per backend", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


# ------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="process,docker",
                    help="comma-separated, measured in this order: " + ", ".join(BACKENDS) + " (xen: a placeholder, skipped). Default process,docker")
    ap.add_argument("--backend", help=argparse.SUPPRESS)  # the old single-backend option: same as --backends X
    ap.add_argument("--count", type=int, default=10, help="idle instances to start per backend (default 10)")
    ap.add_argument("--parallel", type=int, default=2,
                    help="starts (and at the end, deletes) in flight at once (default 2: one per core); start-to-ready is per instance, so more adds queueing to it")
    ap.add_argument("--memory-mib", "--memory-mb", type=int, default=64, help="memory limit per instance, MiB (the manager's --memory-mib; default 64)")
    ap.add_argument("--cpu-millis", type=int, default=None,
                    help="CPU limit per instance, thousandths of a core (default 500; with --boot-timing 1000, the manager's default)")
    ap.add_argument("--pids", type=int, default=64, help="process limit per instance (default 64)")
    ap.add_argument("--max-slots", type=int, default=0,
                    help="the manager's --max-slots (default count + 4; less than the count shows the early stop: the first failure is reported)")
    ap.add_argument("--ready-timeout", type=int, default=60, help="the manager's --ready-timeout-s (default 60)")
    ap.add_argument("--vm-subnet", default="10.210.0.0/18", help="microvm: the guests' subnet, a /30 per slot (default 10.210.0.0/18: 4,096 slots)")
    ap.add_argument("--vm-ksm", default="auto", choices=("auto", "on", "off"),
                    help="microvm: the manager's --vm-ksm (identical guest pages shared through KSM; default auto)")
    ap.add_argument("--vm-tcg-cache-mib", type=int, default=0,
                    help="microvm under TCG: the manager's --vm-tcg-cache-mib (default: the manager's own)")
    ap.add_argument("--min-available-mib", type=int, default=1024,
                    help="stop starting when MemAvailable falls under this (default 1024; 0: never), so that a shared host keeps working")
    ap.add_argument("--settle", type=float, default=15, help="seconds to wait after the last start before measuring (default 15)")
    ap.add_argument("--save-runs", type=int, default=5, help="saves timed with 0 and with N instances idle (default 5; 0: skip)")
    ap.add_argument("--boot-timing", type=int, default=0, metavar="N",
                    help="instead of density: N sequential cold starts of one microvm instance per variant, "
                         "each start's ready_seconds split into phases from its console (prep, qemu_to_kernel, "
                         "kernel_to_init, init, eps, healthz); medians; variants interleaved")
    ap.add_argument("--boot-variant", action="append", metavar="NAME[:k=v;...]",
                    help="with --boot-timing, repeatable: a way of booting to compare in the same run "
                         "(keys cpu=, machine=, append=, qemu=, serve=, appliance=, edge=; see BootVariant). Default: one variant, the manager as it is")
    ap.add_argument("--boot-pause", type=float, default=1.0, help="with --boot-timing: seconds between a stop and the next start (default 1)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--plot", type=Path, help="write the PNG plot here (default: beside --json, .png)")
    ap.add_argument("--plot-from", type=Path, metavar="JSON", help="only draw the plot of an earlier --json (with --plot)")
    ap.add_argument("--cleanup", action="store_true", help="only remove what a killed run left (its managers' instances, processes, containers)")
    a = ap.parse_args()

    if a.plot_from:
        why = plot(json.loads(a.plot_from.read_text())["backends"], a.plot or a.plot_from.with_suffix(".png"))
        print(why or f"plot: {a.plot or a.plot_from.with_suffix('.png')}")
        return 0 if why is None else 1
    if os.geteuid() != 0:
        print("run as root: the manager's launcher gives every instance a cgroup and a uid of its own", file=sys.stderr)
        return 2
    if a.cleanup:
        return cleanup_leftovers(a.parallel)
    if a.cpu_millis is None:
        a.cpu_millis = 1000 if a.boot_timing else 500
    if a.boot_timing < 0:
        ap.error("--boot-timing: a number of starts")
    if a.boot_variant and not a.boot_timing:
        ap.error("--boot-variant goes with --boot-timing N")
    if a.boot_timing:
        try:
            [BootVariant(v) for v in a.boot_variant or []]
        except ValueError as e:
            ap.error(str(e))
    names = [b.strip() for b in (a.backend or a.backends).split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        ap.error(f"unknown backend {', '.join(unknown)}: {', '.join(BACKENDS)}")
    if not EDGE_BIN.exists():
        ap.error(f"{EDGE_BIN} is missing: make build")

    def on_signal(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started in the background, where SIGINT comes ignored
    from testbed.lab import Lab

    tag = secrets.token_hex(2)
    work = Path(tempfile.mkdtemp(prefix=LAB_PREFIX))
    out: dict[str, Any] = {
        "run": tag, "backends_requested": names, "count": a.count, "parallel": a.parallel,
        "limits": {"memory_mib": a.memory_mib, "cpu_millis": a.cpu_millis, "pids": a.pids},
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "mem_total": meminfo()["MemTotal"],
                    "loadavg": Path("/proc/loadavg").read_text().split()[:3]},
        "sysctl": {k: Path("/proc/sys/" + k.replace(".", "/")).read_text().strip() for k in SYSCTLS},
        "backends": [],
    }
    results: list[dict] = out["backends"]
    lab = None
    rc = 0
    try:
        # The provider servers on all addresses: a container or guest reaches them at the host's address.
        lab = Lab(work / "lab", provider_args=("--listen", "0.0.0.0:0"))
        if a.boot_timing:
            names = []
            try:
                boot_timing(lab, a, tag, out)
            except (RuntimeError, ValueError, OSError) as e:
                out["boot_timing_error"] = f"{type(e).__name__}: {e}"
                log(f"boot timing: {out['boot_timing_error']}")
                rc = 1
        for name in names:
            results.append({"backend": name})
            measure_backend(BACKENDS[name], lab, a, tag, results[-1])
    except KeyboardInterrupt:
        log("interrupted (the instances started were deleted: see 'left behind' below)")
        rc = 130
    finally:
        if lab is not None:
            lab.close()
        shutil.rmtree(work, ignore_errors=True)
        for r in results:
            print(backend_table(r) + "\n")
        if results:
            print("## side by side\n" + side_by_side(results))
        if out.get("boot_timing", {}).get("variants"):
            print(boot_table(out["boot_timing"]))
        if a.json:
            a.json.write_text(json.dumps(out, indent=1))
            print(f"\nJSON: {a.json}")
        png = a.plot or (a.json.with_suffix(".png") if a.json else None)
        if png and results:
            why = plot(results, png)
            print(why or f"plot: {png}")
    if rc == 0 and any(r.get("error") for r in results):
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
