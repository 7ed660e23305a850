#!/usr/bin/env python3
"""The emulated Wi-Fi testbed: network namespaces, kernel shaping, a compiled delay line.

Hosts (one network namespace each, named `<run>-<host>`, run = `ect-<6 hex>`):

    device ─┐                                                      
    sta1   ─┼─ air ── ap ── wan ── cloud                            
    sta2   ─┘                                                      

- `device`: the phone or laptop (ec-proxy and the app run here).
- `sta1`, `sta2`: two more Wi-Fi hosts, for cross traffic through the AP.
- `air`: the Wi-Fi cell, a router namespace. Everything the stations send
  goes up to the AP and everything the AP sends goes down through it, one
  shared capacity each way: tbf on the egress of its AP-facing interface
  shapes the uplink, and the ingress of the same interface, redirected to
  an ifb device with its own tbf, shapes the downlink. Policy routing by
  input interface sends every packet through ec-delayline (a TUN device per
  direction) for delay and loss. Station-to-station traffic is relayed by
  the AP, as in infrastructure-mode Wi-Fi.
- `ap`: the access point (the edge manager and the EPS instances run here);
  it routes between the cell and the WAN.
- `wan`: the WAN link, a router namespace shaped and delayed the same way.
- `cloud`: the provider servers.

Rates are shaped in the kernel (tbf, ingress + ifb); delay and loss come
from `ec-delayline` (experiments/delayline), because these kernels have no
netem. Every namespace is recorded in `/run/ec-netlab/<run>.json` before it
is made; closing the testbed (also on SIGINT, SIGTERM and SIGHUP) kills
every process inside the namespaces and deletes them, and
`netlab.py cleanup` removes what a killed run (SIGKILL) left.

    sudo .venv/bin/python experiments/netlab/netlab.py profiles
    sudo .venv/bin/python experiments/netlab/netlab.py measure --wifi wifi-ac-near --wan wan-fiber
    sudo .venv/bin/python experiments/netlab/netlab.py delayline-rate
    sudo .venv/bin/python experiments/netlab/netlab.py cleanup
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import profiles as link_profiles  # noqa: E402
from profiles import LinkProfile  # noqa: E402

PREFIX = "ect-"
STATE_DIR = Path(os.environ.get("EC_NETLAB_STATE", "/run/ec-netlab"))
PROTOTYPE = REPO / "experiments" / "delayline" / "prototype.py"
HOSTS = ("device", "sta1", "sta2", "air", "ap", "wan", "cloud")
MTU_FRAME = 1514  # what tbf counts per full-size packet on a veth (IP 1500 + Ethernet 14)
TCP_PAYLOAD = 1448  # TCP payload of that packet (timestamps on)

# Addresses (the same in every run: each run has its own namespaces).
ADDR = {
    "device": "10.77.1.2", "sta1": "10.77.2.2", "sta2": "10.77.3.2",
    "ap": "10.77.10.2", "ap_wan": "10.77.20.1", "cloud": "10.77.30.2",
}

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


class NetlabError(Exception):
    """The testbed could not be set up, or a measurement failed."""


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL when the testbed's process dies, even by SIGKILL."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def delayline_binary() -> Path:
    """ec-delayline: $EC_DELAYLINE, .venv/bin, target/release, else built now (cargo)."""
    for candidate in (os.environ.get("EC_DELAYLINE"), REPO / ".venv" / "bin" / "ec-delayline",
                      REPO / "target" / "release" / "ec-delayline"):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    print("netlab: building ec-delayline (cargo build --release --locked -p ec-delayline)", file=sys.stderr)
    subprocess.run([cargo, "build", "--release", "--locked", "-p", "ec-delayline"], cwd=REPO, check=True)
    return REPO / "target" / "release" / "ec-delayline"


def sh(*argv: str, ns: Optional[str] = None, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode:
        raise NetlabError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


# --------------------------------------------------------------------------
# Cleanup: what a run records, and removing it

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def remove_namespace(ns: str) -> None:
    """Kills every process in `ns` (TERM, then KILL) and deletes it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _ns_pids(ns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline and _ns_pids(ns):
            time.sleep(0.05)
    subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    # Per-namespace /etc files (`ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts).
    shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup(run: Optional[str] = None, everything: bool = False) -> list[str]:
    """Removes the namespaces of runs whose process is gone (or of `run`, or of
    every run with `everything`); returns the namespaces removed."""
    removed = []
    owners: dict[str, int] = {}
    if STATE_DIR.is_dir():
        for path in STATE_DIR.glob(f"{PREFIX}*.json"):
            with contextlib.suppress(OSError, ValueError):
                owners[path.stem] = json.loads(path.read_text())["pid"]
    for ns in list_namespaces():
        if not ns.startswith(PREFIX):
            continue
        owner_run = ns.rsplit("-", 1)[0]
        owner = owners.get(owner_run)
        mine = run is not None and owner_run == run
        orphan = run is None and (owner is None or not _alive(owner))
        if mine or everything or orphan:
            remove_namespace(ns)
            removed.append(ns)
    for name, pid in owners.items():
        if (run == name) or everything or (run is None and not _alive(pid)):
            with contextlib.suppress(OSError, ValueError):
                forget_extra(json.loads((STATE_DIR / f"{name}.json").read_text()))
            with contextlib.suppress(FileNotFoundError):
                (STATE_DIR / f"{name}.json").unlink()
    return removed


def forget_extra(record: dict[str, Any]) -> None:
    """What an experiment recorded beside the namespaces (Testbed.extra_record):
    an edge manager's state folder under /tmp and its instances' cgroups
    (empty once the namespaces, and every process in them, are gone), and
    the containers of a docker manager (by name prefix)."""
    for edge in record.get("edges", []):
        prefix = edge.get("containers")
        if prefix and shutil.which("docker"):
            names = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{prefix}"], capture_output=True,
                                   text=True, timeout=120).stdout.split()
            if names:
                subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=300)
        state = Path(edge.get("state", ""))
        if state.name.startswith("ec-netlab-edge-") and state.parent == Path(tempfile.gettempdir()):
            shutil.rmtree(state, ignore_errors=True)
        lo, hi = edge.get("uids", (0, 0))
        roots = [Path("/sys/fs/cgroup") / c / "edgecourier" for c in ("memory", "cpu", "pids")]
        for folder in roots + [Path("/sys/fs/cgroup/edgecourier")]:
            if not folder.is_dir():
                continue
            for group in folder.iterdir():
                tail = group.name.rsplit("-u", 1)
                if len(tail) == 2 and tail[1].isdigit() and lo <= int(tail[1]) < hi:
                    with contextlib.suppress(OSError):
                        group.rmdir()


# --------------------------------------------------------------------------
# Entering a namespace from this process (one thread at a time)

def enter_netns(ns: str) -> None:
    """Moves the calling thread into network namespace `ns` (for a thread of
    its own, or a pool's initializer)."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Runs `fn` in a new thread that has joined namespace `ns`; returns its
    result. Sockets it creates stay in `ns` (network namespaces are per thread)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            enter_netns(ns)
            box["result"] = fn()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            box["error"] = error

    thread = threading.Thread(target=target, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


# --------------------------------------------------------------------------
# The testbed

class Testbed:
    """The namespaces, links and delay lines of one run; a context manager.

        with Testbed(wifi="wifi-ac-far", wan="wan-fiber") as bed:
            bed.popen("cloud", ["python3", "-m", "http.server"])
            bed.ns("device")   # the namespace's name, for `ip netns exec`
    """

    def __init__(self, wifi: str | LinkProfile = link_profiles.DEFAULT_WIFI,
                 wan: str | LinkProfile = link_profiles.DEFAULT_WAN, run: Optional[str] = None,
                 delayline: str = "compiled") -> None:
        """delayline: "compiled" (ec-delayline) or "python" (the prototype, for comparison)."""
        self.delayline = delayline
        self.wifi = wifi if isinstance(wifi, LinkProfile) else link_profiles.get(wifi, "wifi")
        self.wan = wan if isinstance(wan, LinkProfile) else link_profiles.get(wan, "wan")
        self.run = run or f"{PREFIX}{secrets.token_hex(3)}"
        self.state_path = STATE_DIR / f"{self.run}.json"
        self.procs: list[subprocess.Popen] = []
        self.delaylines: dict[str, subprocess.Popen] = {}
        self.delayline_stats: dict[str, list[dict[str, Any]]] = {}
        self._made: list[str] = []
        self._old_handlers: dict[int, Any] = {}
        self.path_cost_ms: dict[str, float] = {}
        #: More to record with the run (an experiment's own leftovers, for cleanup(): see forget_extra).
        self.extra_record: dict[str, Any] = {}
        self.up = False

    def ns(self, host: str) -> str:
        return f"{self.run}-{host}"

    # -- life cycle --------------------------------------------------------

    def __enter__(self) -> "Testbed":
        self._install_signal_handlers()
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupted(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, interrupted)

    def record(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "namespaces": self._made,
                                   "wifi": self.wifi.name, "wan": self.wan.name, **self.extra_record}))
        os.replace(tmp, self.state_path)

    _record = record

    def _add_ns(self, host: str) -> str:
        name = self.ns(host)
        self._made.append(name)
        self._record()  # recorded before it exists: an interrupted run is still cleaned up
        sh("ip", "netns", "add", name)
        sh("ip", "link", "set", "lo", "up", ns=name)
        return name

    def setup(self, calibrate: bool = True) -> None:
        if os.geteuid() != 0:
            raise NetlabError("the testbed needs root (network namespaces)")
        binary = delayline_binary()
        for host in HOSTS:
            self._add_ns(host)
        n = self.ns
        # veth pairs: made directly inside their namespaces, so no name is global.
        links = [("device", "eth0", "air", "st-dev"), ("sta1", "eth0", "air", "st-1"),
                 ("sta2", "eth0", "air", "st-2"), ("air", "to-ap", "ap", "wlan0"),
                 ("ap", "wan0", "wan", "to-ap"), ("wan", "to-cloud", "cloud", "eth0")]
        for a, a_if, b, b_if in links:
            sh("ip", "link", "add", a_if, "netns", n(a), "type", "veth", "peer", "name", b_if, "netns", n(b))
        addrs = [("device", "eth0", "10.77.1.2/24"), ("air", "st-dev", "10.77.1.1/24"),
                 ("sta1", "eth0", "10.77.2.2/24"), ("air", "st-1", "10.77.2.1/24"),
                 ("sta2", "eth0", "10.77.3.2/24"), ("air", "st-2", "10.77.3.1/24"),
                 ("air", "to-ap", "10.77.10.1/24"), ("ap", "wlan0", "10.77.10.2/24"),
                 ("ap", "wan0", "10.77.20.1/24"), ("wan", "to-ap", "10.77.20.2/24"),
                 ("wan", "to-cloud", "10.77.30.1/24"), ("cloud", "eth0", "10.77.30.2/24")]
        for host, iface, cidr in addrs:
            sh("ip", "addr", "add", cidr, "dev", iface, ns=n(host))
            sh("ip", "link", "set", iface, "up", ns=n(host))
        for host, gw in (("device", "10.77.1.1"), ("sta1", "10.77.2.1"), ("sta2", "10.77.3.1"),
                         ("ap", "10.77.20.2"), ("cloud", "10.77.30.1")):
            sh("ip", "route", "add", "default", "via", gw, ns=n(host))
        sh("ip", "route", "add", "10.77.0.0/20", "via", "10.77.10.1", ns=n("ap"))
        sh("ip", "route", "add", "10.77.0.0/16", "via", "10.77.20.1", ns=n("wan"))
        for host in ("air", "ap", "wan"):
            for key, value in (("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.rp_filter", "0"),
                               ("net.ipv4.conf.default.rp_filter", "0"),
                               ("net.ipv4.conf.all.send_redirects", "0"),
                               ("net.ipv4.conf.default.send_redirects", "0"),
                               ("net.ipv4.conf.default.accept_local", "1")):
                sh("sysctl", "-qw", f"{key}={value}", ns=n(host))
        # The air: uplink = everything from the stations, toward the AP; downlink = from the AP.
        self._delay_router("air", self.wifi, up_in=["st-dev", "st-1", "st-2"], up_out=("to-ap", "10.77.10.2"),
                           down_in=["to-ap"], binary=binary)
        self._shape(n("air"), "to-ap", egress_mbit=self.wifi.up_mbit, ingress_mbit=self.wifi.down_mbit)
        # The WAN: "up" = from the AP toward the cloud.
        self._delay_router("wan", self.wan, up_in=["to-ap"], up_out=("to-cloud", "10.77.30.2"),
                           down_in=["to-cloud"], binary=binary)
        self._shape(n("wan"), "to-ap", egress_mbit=self.wan.down_mbit, ingress_mbit=self.wan.up_mbit)
        self.up = True
        if calibrate:
            self.calibrate()

    #: Per link: (near host, far host, its router, the router's address as the near host sees it).
    LINKS = {"air": ("device", "ap", "air", "10.77.1.1"), "wan": ("ap", "cloud", "wan", "10.77.20.2")}

    def set_rtt(self, link: str, rtt_ms: float) -> None:
        """Sets the round trip `link` ("air" or "wan") adds, net of the path's own
        forwarding cost found by calibrate(); half of it each way."""
        one_way = max(0.0, rtt_ms - self.path_cost_ms.get(link, 0.0)) / 2
        proc = self.delaylines[link]
        proc.stdin.write(f"dl-up {one_way:.4f}ms\ndl-down {one_way:.4f}ms\n")
        proc.stdin.flush()
        time.sleep(0.05)

    def calibrate(self) -> None:
        """The two routing hops and two TUN passes of a delay line cost about
        0.1 ms per round trip here, on top of the profile's delay: measured
        with the delay at zero (an echo across the link minus one to the
        link's router), then subtracted from the delay, so that the link adds
        what its profile says."""
        for link, (near, far, router, router_addr) in self.LINKS.items():
            profile = self.wifi if link == "air" else self.wan
            self.path_cost_ms[link] = 0.0
            self.set_rtt(link, 0.0)
            across = measure_rtt(self, near, far, count=30, gap=0.002, stat=min)
            base = measure_rtt(self, near, router, count=30, address=router_addr, gap=0.002, stat=min)
            self.path_cost_ms[link] = max(0.0, across - base)
            self.set_rtt(link, profile.rtt_ms)

    def _delay_router(self, host: str, profile: LinkProfile, up_in: list[str], up_out: tuple[str, str],
                      down_in: list[str], binary: Path) -> None:
        """Routes every packet entering `up_in` through the TUN `dl-up` and every
        packet entering `down_in` through `dl-down`; ec-delayline holds them."""
        ns = self.ns(host)
        delay = "0ms"  # set by calibrate()
        command = [str(binary)] if self.delayline == "compiled" else [sys.executable, str(PROTOTYPE)]
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *command, "--tun", f"dl-up:{delay}:{profile.loss}",
                                 "--tun", f"dl-down:{delay}:{profile.loss}"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_die_with_parent)
        self.delaylines[host] = proc
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            raise NetlabError(f"ec-delayline in {ns} did not start: {line!r} {proc.stderr.read()[-1000:]}")
        out_if, out_gw = up_out
        for tun in ("dl-up", "dl-down"):
            sh("ip", "link", "set", tun, "up", ns=ns)
            for key in ("rp_filter", "accept_local"):
                sh("sysctl", "-qw", f"net.ipv4.conf.{tun}.{key}={'1' if key == 'accept_local' else '0'}", ns=ns)
        sh("ip", "route", "add", "default", "dev", "dl-up", "table", "101", ns=ns)
        sh("ip", "route", "add", "default", "dev", "dl-down", "table", "102", ns=ns)
        # Back from dl-up: always on toward the far side (station-to-station goes via the AP too).
        sh("ip", "route", "add", "default", "via", out_gw, "dev", out_if, "table", "103", ns=ns)
        for iface in up_in:
            sh("ip", "rule", "add", "iif", iface, "lookup", "101", "priority", "100", ns=ns)
        for iface in down_in:
            sh("ip", "rule", "add", "iif", iface, "lookup", "102", "priority", "100", ns=ns)
        sh("ip", "rule", "add", "iif", "dl-up", "lookup", "103", "priority", "100", ns=ns)

    @staticmethod
    def _tbf(rate_mbit: float) -> list[str]:
        rate = rate_mbit * 1e6 / 8  # bytes/s
        # The bucket must hold what arrives between two timer ticks at full
        # rate, or tbf falls short of its rate; the queue holds ~50 ms.
        burst = max(int(rate * 0.004), 4 * MTU_FRAME)
        limit = max(int(rate * 0.050), 2 * burst, 64 * MTU_FRAME)
        return ["tbf", "rate", f"{int(rate_mbit * 1e6)}bit", "burst", str(burst), "limit", str(limit)]

    def _shape(self, ns: str, iface: str, egress_mbit: float, ingress_mbit: float) -> None:
        """tbf on `iface`'s egress; its ingress redirected to an ifb with a tbf of its own."""
        sh("tc", "qdisc", "replace", "dev", iface, "root", *self._tbf(egress_mbit), ns=ns)
        ifb = f"ifb-{iface}"[:15]
        sh("ip", "link", "add", ifb, "type", "ifb", ns=ns)
        sh("ip", "link", "set", ifb, "up", ns=ns)
        sh("tc", "qdisc", "replace", "dev", ifb, "root", *self._tbf(ingress_mbit), ns=ns)
        sh("tc", "qdisc", "add", "dev", iface, "handle", "ffff:", "ingress", ns=ns)
        sh("tc", "filter", "add", "dev", iface, "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0",
           "action", "mirred", "egress", "redirect", "dev", ifb, ns=ns)

    def popen(self, host: str, argv: list[str], own_sysfs: bool = True, **kw: Any) -> subprocess.Popen:
        """Starts a process in `host`'s namespace; it is stopped when the testbed closes
        (and killed by the kernel if this process dies)."""
        # `ip netns exec` mounts a sysfs of the namespace's own over /sys, which
        # hides /sys/fs/cgroup: a process that makes cgroups (the edge
        # manager's launcher) enters only the network namespace instead.
        enter = ["ip", "netns", "exec", self.ns(host)] if own_sysfs else ["nsenter", f"--net=/run/netns/{self.ns(host)}", "--"]
        proc = subprocess.Popen([*enter, *argv], preexec_fn=_die_with_parent, **kw)
        self.procs.append(proc)
        return proc

    def hosts_file(self, host: str, entries: dict[str, str]) -> None:
        """/etc/hosts as processes in `host` see it (name -> address); removed with the namespace."""
        folder = Path("/etc/netns") / self.ns(host)
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{addr} {name}" for name, addr in entries.items()]
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def run_cmd(self, host: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns(host), *argv], **kw)

    def call(self, host: str, fn: Callable[[], Any]) -> Any:
        return in_netns(self.ns(host), fn)

    def link_bytes(self, host: str = "device", iface: str = "eth0") -> int:
        """Bytes sent plus received on an interface (Ethernet frames, as the kernel counts them)."""
        out = sh("ip", "-j", "-s", "link", "show", "dev", iface, ns=self.ns(host)).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"] + stats["tx"]["bytes"]

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for host, proc in self.delaylines.items():
            if proc.poll() is None:
                proc.terminate()
                try:
                    out, _ = proc.communicate(timeout=5)
                    self.delayline_stats[host] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for ns in reversed(self._made):
            remove_namespace(ns)
        forget_extra(self.extra_record)  # after the namespaces: their processes are gone
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()
        self._made = []
        self.up = False
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}


# --------------------------------------------------------------------------
# Measurements: TCP goodput and round-trip time between two hosts

def _tcp_sink(bed: Testbed, host: str, addr: str) -> tuple[socket.socket, int]:
    def make() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, 0))
        s.listen(4)
        return s

    server = bed.call(host, make)
    return server, server.getsockname()[1]


def measure_rate(bed: Testbed, sender: str, receiver: str, seconds: float = 3.0, warmup: float = 0.7) -> float:
    """TCP goodput from `sender` to `receiver` in Mbit/s, counted after `warmup` seconds."""
    server, port = _tcp_sink(bed, receiver, ADDR[receiver])
    marks: list[tuple[float, int]] = []

    def receive() -> None:
        conn, _ = server.accept()
        buf = bytearray(1 << 20)
        total = 0
        with conn:
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                total += n
                now = time.monotonic()
                if not marks or now - marks[-1][0] > 0.05:
                    marks.append((now, total))
            marks.append((time.monotonic(), total))

    rx = threading.Thread(target=receive)
    rx.start()

    def send() -> None:
        data = b"\0" * (1 << 20)
        with socket.create_connection((ADDR[receiver], port), timeout=30) as s:
            end = time.monotonic() + seconds + warmup
            while time.monotonic() < end:
                s.sendall(data)

    try:
        bed.call(sender, send)
    finally:
        rx.join(30)
        server.close()
    t0 = marks[0][0] + warmup
    after = [(t, b) for t, b in marks if t >= t0]
    if len(after) < 2:
        raise NetlabError("rate measurement too short")
    (ta, ba), (tb, bb) = after[0], after[-1]
    return (bb - ba) * 8 / (tb - ta) / 1e6


def measure_rtt(bed: Testbed, client: str, server_host: str, count: int = 20,
                address: Optional[str] = None, gap: float = 0.01, stat: Callable = statistics.median) -> float:
    """Round-trip time in ms of small UDP packets (an echo in `server_host`, at
    `address`, default its usual one): `stat` (default the median) of `count`."""
    address = address or ADDR[server_host]

    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((address, 0))
        s.settimeout(5)
        return s

    echo = bed.call(server_host, make)
    port = echo.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                data, peer = echo.recvfrom(2048)
            except (socket.timeout, OSError):
                continue
            echo.sendto(data, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def ping() -> list[float]:
        times = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            for i in range(count):
                start = time.perf_counter()
                s.sendto(str(i).encode(), (address, port))
                try:
                    while s.recv(2048) != str(i).encode():
                        pass
                except socket.timeout:
                    continue
                times.append((time.perf_counter() - start) * 1000)
                time.sleep(gap)
        return times

    try:
        times = bed.call(client, ping)
    finally:
        stop.set()
        echo.close()
    if len(times) < count // 2:
        raise NetlabError(f"RTT: {count - len(times)} of {count} echoes lost")
    return stat(times)


def link_rate_from_goodput(goodput_mbit: float) -> float:
    """The rate tbf enforces counts whole Ethernet frames; TCP goodput sees only the payload."""
    return goodput_mbit * MTU_FRAME / TCP_PAYLOAD


def measure_profiles(bed: Testbed, seconds: float = 3.0, links: tuple[str, ...] = ("air", "wan")) -> list[dict[str, Any]]:
    """Rate each way and RTT of the Wi-Fi link (device <-> ap) and the WAN (ap <-> cloud)."""
    rows = []
    for link in links:
        near, far, router, router_addr = bed.LINKS[link]
        profile = bed.wifi if link == "air" else bed.wan
        row: dict[str, Any] = {"profile": profile.name, "kind": profile.kind, "link": f"{near} <-> {far}",
                               "claimed": {"down_mbit": profile.down_mbit, "up_mbit": profile.up_mbit,
                                           "rtt_ms": profile.rtt_ms}}
        # What the link adds: echoes across it minus echoes to the near side of
        # the link's router (its own address: delivered before the delay line),
        # i.e. without the hosts' stacks and Python's echo. The minimum of 30:
        # the link's delay is fixed, and a loaded machine only ever adds to it.
        # Measured first, while no queue is left over from the rate tests.
        row["rtt_raw_ms"] = measure_rtt(bed, near, far, count=30, stat=min)
        row["rtt_base_ms"] = measure_rtt(bed, near, router, count=30, address=router_addr, stat=min)
        row["rtt_ms"] = row["rtt_raw_ms"] - row["rtt_base_ms"]
        # "down" is toward the device for Wi-Fi and toward the AP for the WAN: far -> near in both.
        # tbf caps the rate, and a machine busy with other work can only lower
        # it (the sender, receiver and delay line share its CPUs): a direction
        # short of its rate is measured again, up to three times, the best kept.
        for key, src, dst, want in (("down_mbit", far, near, profile.down_mbit), ("up_mbit", near, far, profile.up_mbit)):
            row[key], row[key + "_attempts"] = 0.0, 0
            while row[key] < 0.95 * want and row[key + "_attempts"] < 3:
                row[key] = max(row[key], link_rate_from_goodput(measure_rate(bed, src, dst, seconds)))
                row[key + "_attempts"] += 1
        if profile.loss:
            row["loss_seen"] = None  # filled from the delay line's counters at close
        rows.append(row)
    return rows


def print_measurements(rows: list[dict[str, Any]]) -> None:
    print(f"{'profile':14} {'link':16} {'down Mbit/s':>22} {'up Mbit/s':>22} {'RTT ms':>18}")
    for r in rows:
        c = r["claimed"]

        def cell(got: float, want: float) -> str:
            return f"{got:8.1f} / {want:<6g} {100 * (got - want) / want:+5.1f}%"

        print(f"{r['profile']:14} {r['link']:16} {cell(r['down_mbit'], c['down_mbit']):>22} "
              f"{cell(r['up_mbit'], c['up_mbit']):>22} {cell(r['rtt_ms'], c['rtt_ms']):>18}")
    print("  measured / claimed, difference; rates are TCP goodput scaled to Ethernet frames "
          f"(x {MTU_FRAME}/{TCP_PAYLOAD}, what tbf counts), 0.7 s of warm-up not counted, the best of up to 3 "
          "attempts when one falls short (a busy machine only lowers it); RTT = the fastest of 30 UDP "
          "echoes across the link minus the fastest of 30 to the link's near router (the hosts' own part: "
          + ", ".join(f"{r['rtt_base_ms']:.2f} ms" for r in rows) + ")")


# --------------------------------------------------------------------------
# The delay line's own ceiling: an unshaped link, delay only

def delayline_ceiling(seconds: float = 4.0, delay_ms: float = 1.0, delayline: str = "compiled") -> dict[str, Any]:
    """TCP goodput device -> ap with no rate limit (tbf set far above), the delay line in the path."""
    fast = LinkProfile("unshaped", "wifi", 10_000, 10_000, 2 * delay_ms, 0.0, "measurement only")
    wan = LinkProfile("unshaped-wan", "wan", 10_000, 10_000, 2 * delay_ms, 0.0, "measurement only")
    with Testbed(wifi=fast, wan=wan, delayline=delayline) as bed:
        up = measure_rate(bed, "device", "ap", seconds)
        down = measure_rate(bed, "ap", "device", seconds)
        rtt = measure_rtt(bed, "device", "ap") - measure_rtt(bed, "device", "air", address="10.77.1.1")
    return {"delayline": delayline, "up_goodput_mbit": up, "down_goodput_mbit": down, "rtt_ms": rtt,
            "delay_ms_each_way": delay_ms,
            "counters": bed.delayline_stats.get("air")}


# --------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("profiles", help="list the link profiles and their sources")
    m = sub.add_parser("measure", help="set up the testbed, measure rate and RTT of its links, tear it down")
    m.add_argument("--wifi", default=link_profiles.DEFAULT_WIFI)
    m.add_argument("--wan", default=link_profiles.DEFAULT_WAN)
    m.add_argument("--seconds", type=float, default=3.0)
    m.add_argument("--json", metavar="FILE")
    d = sub.add_parser("delayline-rate", help="the delay line's ceiling: TCP through it with no rate limit")
    d.add_argument("--seconds", type=float, default=4.0)
    d.add_argument("--rounds", type=int, default=3)
    d.add_argument("--json", metavar="FILE")
    u = sub.add_parser("up", help="set up the testbed and keep it until interrupted (prints the namespaces)")
    u.add_argument("--wifi", default=link_profiles.DEFAULT_WIFI)
    u.add_argument("--wan", default=link_profiles.DEFAULT_WAN)
    c = sub.add_parser("cleanup", help="remove what killed runs left (namespaces and their processes)")
    c.add_argument("--run", help="only this run (ect-xxxxxx), even if its process lives")
    c.add_argument("--all", action="store_true", help="every testbed run, even live ones")
    args = parser.parse_args(argv)

    if args.command == "profiles":
        for p in link_profiles.PROFILES.values():
            print(f"{p.kind:5} {p.describe()}\n      source: {p.source}")
        return 0
    if args.command == "cleanup":
        removed = cleanup(args.run, args.all)
        print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
        return 0
    if args.command == "delayline-rate":
        results = []
        for rep in range(args.rounds):
            for impl in ("python", "compiled"):  # interleaved: the machine is shared
                print(f"round {rep + 1}/{args.rounds}: {impl} delay line", file=sys.stderr, flush=True)
                results.append(delayline_ceiling(args.seconds, delayline=impl))
        print(f"Delay line throughput: TCP goodput through the Wi-Fi link with no rate limit, "
              f"{results[0]['delay_ms_each_way']:g} ms each way, {args.seconds:g} s per direction, "
              f"{args.rounds} rounds (median)")
        print(f"{'delay line':40} {'device -> ap':>14} {'ap -> device':>14} {'RTT added':>10}")
        medians = {}
        for impl, label in (("python", "Python prototype (delayline/prototype.py)"),
                            ("compiled", "ec-delayline (Rust)")):
            rs = [r for r in results if r["delayline"] == impl]
            up = statistics.median(r["up_goodput_mbit"] for r in rs)
            down = statistics.median(r["down_goodput_mbit"] for r in rs)
            medians[impl] = min(up, down)
            print(f"{label:40} {up:>9.0f} Mbit/s {down:>7.0f} Mbit/s "
                  f"{statistics.median(r['rtt_ms'] for r in rs):>7.2f} ms")
        print(f"ec-delayline / prototype: {medians['compiled'] / medians['python']:.1f}x (slower direction); "
              f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    if args.command == "measure":
        with Testbed(args.wifi, args.wan) as bed:
            print(f"testbed {bed.run}: {bed.wifi.describe()}; {bed.wan.describe()}")
            rows = measure_profiles(bed, args.seconds)
        print_measurements(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    if args.command == "up":
        with Testbed(args.wifi, args.wan) as bed:
            print(json.dumps({"run": bed.run, "namespaces": {h: bed.ns(h) for h in HOSTS}, "addresses": ADDR}),
                  flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NetlabError as error:
        print(f"netlab: error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
