"""The edge manager on the testbed's access point: a real `ec-edge serve`
in the `ap` namespace, whose instances devices get by joining over the
Wi-Fi link, as on a real access point (docs/edge-manager.md).

    with Testbed(...) as bed:
        manager = ApManager(bed, "process", slots=8, ca=ca_file, tag="t1")
        credential = manager.add_user("t1alice")
        joined = bed.call("device", lambda: manager.join(credential))   # the enrolment bundle

The manager is entered with `nsenter --net` (Testbed.popen(own_sysfs=False)):
`ip netns exec` mounts the namespace's own sysfs over /sys, which hides
/sys/fs/cgroup from the manager's launcher. Its state folder and its
instances' uids are recorded with the run (Testbed.extra_record), so that
closing the testbed, or `netlab.py cleanup` after a SIGKILL, removes the
folder and the instances' cgroups; every instance process (an EPS, a
QEMU) runs in the AP namespace and goes with it.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import netlab
from netlab import REPO

sys.path.insert(0, str(REPO))
from testbed.edge import EDGE_BIN, LAUNCHER_BIN, Device, Operator, free_port_block  # noqa: E402
from testbed.lab import EPS_BIN, PROVIDER_HOSTS, WEBDAV_HOST  # noqa: E402

AP = netlab.ADDR["ap"]
OPERATOR_LISTEN = "127.0.0.1:8440"
DEVICE_LISTEN = f"{AP}:8441"
DEVICE_PORT_BASE, MANAGEMENT_PORT_BASE = 20000, 30000
CLOUD_TLS = f"{netlab.ADDR['cloud']}:443"
DOCKER_IMAGE = "edgecourier/eps:local"
APPLIANCE_DIR = REPO / ".venv" / "share" / "edgecourier" / "appliance"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
#: The namespace this program started in (the host's): where a docker manager runs.
_HOST_NETNS = os.open("/proc/self/ns/net", os.O_RDONLY)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ApManager:
    """`ec-edge serve` in the testbed's `ap` namespace; its operator client
    talks to it from inside that namespace, its devices from `device`.

    docker is the exception: the engine, its bridges and the ports it
    publishes (docker-proxy) live in the host's root namespace, which the
    manager must share to reach them. For docker the AP namespace is joined
    to the root namespace by a veth pair (10.77.40.0/30, made inside the AP
    namespace so that it goes with it) and the manager runs in the root
    namespace, advertising 10.77.40.1: devices still reach their instances
    over the Wi-Fi link and through the AP, containers reach the cloud
    through the AP and the WAN, and the containers (named `ec-<tag>...`) are
    removed at the end, or by `netlab.py cleanup` after a SIGKILL."""

    HOST_LINK = ("10.77.40.1", "10.77.40.2")

    def __init__(self, bed: netlab.Testbed, runtime: str, slots: int, ca: Path, tag: str) -> None:
        self.bed, self.runtime, self.slots, self.tag = bed, runtime, slots, tag
        self.in_ap = runtime != "docker"
        self.state = Path(tempfile.mkdtemp(prefix=f"ec-netlab-edge-{bed.run}-"))
        self.state.chmod(0o711)  # instances run as their own uids below it
        self.uid_base = 2_000_000 + random.randrange(0, 1000) * 5000  # apart from the lab managers (300,000-1,300,000)
        record = {"state": str(self.state), "uids": [self.uid_base, self.uid_base + slots + 1]}
        if not self.in_ap:
            record["containers"] = f"ec-{tag}"
        bed.extra_record.setdefault("edges", []).append(record)
        bed.record()
        if self.in_ap:
            self.operator_listen, self.device_listen, advertise = OPERATOR_LISTEN, DEVICE_LISTEN, AP
            device_base, management_base = DEVICE_PORT_BASE, MANAGEMENT_PORT_BASE
            cloud = CLOUD_TLS
        else:
            host, ap_side = self.HOST_LINK
            link = f"ecd-{bed.run[-6:]}"
            netlab.sh("ip", "link", "add", "host0", "netns", bed.ns("ap"), "type", "veth", "peer", "name", link,
                      ns=bed.ns("ap"))
            netlab.sh("ip", "link", "set", link, "netns", "1", ns=bed.ns("ap"))
            netlab.sh("ip", "addr", "add", f"{ap_side}/30", "dev", "host0", ns=bed.ns("ap"))
            netlab.sh("ip", "link", "set", "host0", "up", ns=bed.ns("ap"))
            netlab.sh("ip", "addr", "add", f"{host}/30", "dev", link)
            netlab.sh("ip", "link", "set", link, "up")
            netlab.sh("sysctl", "-qw", f"net.ipv4.conf.{link}.rp_filter=0")
            netlab.sh("ip", "route", "replace", "10.77.0.0/20", "via", ap_side, "dev", link)
            netlab.sh("ip", "route", "replace", "10.77.30.0/24", "via", ap_side, "dev", link)
            base = free_port_block(2 * slots + 2)
            self.operator_listen, self.device_listen = f"127.0.0.1:{base}", f"{host}:{base + 1}"
            advertise, device_base, management_base = host, base + 2, base + 2 + slots
            cloud = CLOUD_TLS
        self.device_base, self.management_base = device_base, management_base
        template = {"accounts": [{"provider": "*", "account": "*"}],
                    "upstream": {"resolve": {h: cloud for h in PROVIDER_HOSTS},
                                 "extra_ca_pem_files": [str(ca)], "webdav_hosts": [WEBDAV_HOST]}}
        (self.state / "eps-template.json").write_text(json.dumps(template, indent=1))
        args = [str(EDGE_BIN), "--state", str(self.state), "serve", "--operator-listen", self.operator_listen,
                "--device-listen", self.device_listen, "--advertise", advertise, "--device-port-base", str(device_base),
                "--management-port-base", str(management_base), "--max-slots", str(slots), "--runtime", runtime,
                "--runtimes", runtime, "--uid-base", str(self.uid_base), "--eps-binary", str(EPS_BIN),
                "--launcher", str(LAUNCHER_BIN), "--eps-template", str(self.state / "eps-template.json"),
                "--max-instances-per-user", "1", "--ready-timeout-s", "120"]
        if runtime == "microvm":
            qemu = shutil.which("qemu-system-x86_64")
            args += ["--appliance-dir", str(APPLIANCE_DIR), "--vm-subnet", "10.210.0.0/18",
                     *(["--qemu", qemu] if qemu else [])]
        if runtime == "docker":
            args += ["--docker-image", DOCKER_IMAGE]
        self.log_path = self.state / "manager.log"
        out = dict(stdout=subprocess.PIPE, stderr=open(self.log_path, "wb"), text=True)
        if self.in_ap:
            self.proc = bed.popen("ap", args, own_sysfs=False, **out)
        else:
            self.proc = subprocess.Popen(args, preexec_fn=netlab._die_with_parent, **out)
            bed.procs.append(self.proc)  # stopped with the testbed
        line = self.proc.stdout.readline()
        if not line.startswith("{"):
            raise netlab.NetlabError(f"ec-edge ({runtime}) did not start: {line!r}; "
                                     f"log: {self.log_path.read_text()[-2000:]}")
        self.ready = json.loads(line)
        self.token = (self.state / "operator.token").read_text().strip()

    def _here(self, fn):
        """`fn` run where the manager's operator listener is (the caller may be in the device's namespace)."""
        if self.in_ap:
            return self.bed.call("ap", fn)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                if _libc.setns(_HOST_NETNS, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns to the host's namespace")
                box["result"] = fn()
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller
                box["error"] = error

        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def operator_call(self, method: str, path: str, body: Any = None) -> Any:
        op = Operator(self.operator_listen, self.token, 300)
        return self._here(lambda: op.call(method, path, body))

    def add_user(self, user: str) -> str:
        return self.operator_call("POST", "/v1/users", {"user": user})["credential"]

    def join(self, credential: str) -> dict:
        """From the calling thread, which must be in the device's namespace: the device's join."""
        return Device(self.device_listen, credential).call("POST", "/v1/join", {"service": "dropbox"})

    def close(self, delete: bool = True, parallel: int = 4) -> None:
        """Deletes every instance through the API (skipped when interrupted:
        the testbed's namespaces take every process with them, and
        netlab.forget_extra removes containers), stops the manager."""
        if delete and self.proc.poll() is None:
            try:
                ids = [i["id"] for i in self.operator_call("GET", "/v1/instances")["instances"]]
                op = Operator(self.operator_listen, self.token, 120)
                init = (netlab.enter_netns, (self.bed.ns("ap"),)) if self.in_ap else (None, ())
                with cf.ThreadPoolExecutor(parallel, initializer=init[0], initargs=init[1]) as ex:
                    list(ex.map(lambda i: op.raw("DELETE", f"/v1/instances/{i}"), ids))
            except Exception as error:  # noqa: BLE001 - the namespaces' removal still ends every instance
                log(f"edge: deleting instances through the API failed ({error}); the testbed removes them")
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


    def management_addr(self, instance: dict) -> str:
        """An instance's management listener (its /metrics), from its device URL's slot."""
        port = int(instance["device_url"].rsplit(":", 1)[1].strip("/"))
        return f"127.0.0.1:{port - self.device_base + self.management_base}"


# ------------------------------------------------------------------ xen: a nested Xen host on the AP

XEN_HOST_DIR = REPO / "unikernel" / "xen-host"


def xen_host_missing() -> str | None:
    """Why the xen runtime cannot run here (None: it can): the nested Xen
    host's image (`make xen-host`), the manager and the appliance."""
    if shutil.which("qemu-system-x86_64") is None:
        return "no qemu-system-x86_64"
    for need, how in ((EDGE_BIN, "make build"), (APPLIANCE_DIR / "vmlinux", "make appliance"),
                      (APPLIANCE_DIR / "initramfs.cpio.lz4", "make appliance")):
        if not Path(need).exists():
            return f"no {need} ({how})"
    key = subprocess.run([str(XEN_HOST_DIR / "build"), "--print-key"], capture_output=True, text=True)
    if key.returncode:
        return f"unikernel/xen-host/build --print-key failed: {key.stderr.strip()[-300:]}"
    cache = Path(os.environ.get("EC_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "edgecourier") / "xen-host" / key.stdout.strip()
    if not (cache / "dom0.cpio.gz").exists():
        return f"the nested Xen host's image is missing ({cache}: `make xen-host` builds it)"
    return None


class ApXenManager:
    """The `xen` runtime on the testbed's access point: the nested Xen host
    (QEMU TCG + Xen + dom0, testbed.xenhost.XenEdge) booted inside the `ap`
    namespace, its dom0 running `ec-edge serve --runtime xen`, whose
    instances are Xen PVH guests. ApManager's interface (add_user, join,
    operator_call, close).

    The wiring, inside the AP namespace (and dom0):
    - QEMU's user network forwards 127.0.0.1:<p> of the AP namespace to
      dom0's <p> (the operator API, the device listener, each instance's
      device port); an nftables DNAT in the AP namespace sends what devices
      address to the AP (10.77.10.2:<p>, across the Wi-Fi link) to
      127.0.0.1:<p> (route_localnet), and the manager advertises the AP's
      address, so instance URLs are the AP's, as with the other runtimes
      (dom0 holds that address on its loopback: the manager checks an
      instance's ports on it; its DNAT takes any local address to the guest);
    - the guests' traffic leaves dom0 masqueraded, and QEMU's user network
      makes it connections of QEMU's own, in the AP namespace: to the
      provider servers in `cloud` (10.77.30.2:443) over the WAN link.

    QEMU (and `unikernel/xen-host/run` above it) runs in the AP namespace,
    so it dies with it (netlab.remove_namespace), also after a SIGKILL once
    `netlab.py cleanup` ran; its work folder (console log, dom0's files) is
    recorded as the edge's state folder, removed with the run."""

    def __init__(self, bed: netlab.Testbed, slots: int, ca: Path, tag: str, *, memory_mb: int = 4096,
                 dom0_mb: int = 1024, boot_timeout: float = 900, join_timeout: float = 900) -> None:
        from testbed.xenhost import XenEdge

        self.bed, self.runtime, self.slots, self.tag, self.join_timeout = bed, "xen", slots, tag, join_timeout
        self.state = Path(tempfile.mkdtemp(prefix=f"ec-netlab-edge-{bed.run}-xen-"))
        bed.extra_record.setdefault("edges", []).append({"state": str(self.state), "uids": [0, 0]})
        bed.record()
        template = {"accounts": [{"provider": "*", "account": "*"}],
                    "upstream": {"resolve": {h: CLOUD_TLS for h in PROVIDER_HOSTS},
                                 "extra_ca_pem_files": [str(ca)], "webdav_hosts": [WEBDAV_HOST]}}
        t0 = time.monotonic()
        self.edge = bed.call("ap", lambda: XenEdge(
            None, self.state, slots=slots, template=template, ca=ca, provider_addr=CLOUD_TLS, advertise=AP,
            boot_timeout=boot_timeout, memory_mb=memory_mb, run_args=("--dom0-mem", str(dom0_mb))))
        self.ready_seconds = time.monotonic() - t0
        e = self.edge
        # dom0 holds the AP's address too (on its loopback), as the access point's own host would: the manager
        # checks an instance's ports are free on the address it advertises before it starts one.
        status, out = bed.call("ap", lambda: e.dom0(f"ip addr add {AP}/32 dev lo"))
        if status:
            self.close(delete=False)
            raise netlab.NetlabError(f"dom0 could not take the AP's address {AP}: {out.strip()[-500:]}")
        ports = f"{e.join_port}, {e.device_port_base}-{e.device_port_base + slots - 1}"
        netlab.sh("sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1", ns=bed.ns("ap"))
        rules = (f"table ip ec_xen_fwd {{\n  chain pre {{\n    type nat hook prerouting priority dstnat; policy accept;\n"
                 f"    ip daddr {AP} tcp dport {{ {ports} }} dnat to 127.0.0.1\n  }}\n}}\n")
        done = subprocess.run(["ip", "netns", "exec", bed.ns("ap"), "nft", "-f", "-"], input=rules, text=True,
                              capture_output=True)
        if done.returncode:
            self.close(delete=False)
            raise netlab.NetlabError(f"nft in the AP namespace failed: {done.stderr.strip()}")
        self.device_listen = f"{AP}:{e.join_port}"
        self.log_path = e.console

    def operator_call(self, method: str, path: str, body: Any = None) -> Any:
        return self.bed.call("ap", lambda: self.edge.operator().call(method, path, body))

    def add_user(self, user: str) -> str:
        return self.operator_call("POST", "/v1/users", {"user": user})["credential"]

    def join(self, credential: str) -> dict:
        """From the calling thread, which must be in the device's namespace: the device's join."""
        return Device(self.device_listen, credential, timeout=self.join_timeout).call("POST", "/v1/join", {"service": "dropbox"})

    def xen_info(self) -> dict:
        return self.bed.call("ap", self.edge.xen_info)

    def close(self, delete: bool = True, keep_logs_in: Path | None = None) -> None:
        """Powers the nested host off, its guests with it (`delete` is
        ApManager's; the guests need no deleting one by one). Interrupted,
        the testbed's namespace removal ends QEMU instead. `keep_logs_in`:
        a folder that gets the host's console (Xen, dom0, the manager's
        log) and the instances' logs, as xen-console.log and
        xen-instances.log (the work folder goes with the run)."""
        if delete:
            self.bed.call("ap", self.edge.close)
        elif self.edge.proc.poll() is None:
            self.edge.proc.terminate()  # `run` kills QEMU on SIGTERM
            try:
                self.edge.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.edge.proc.kill()
                self.edge.proc.wait()
        if keep_logs_in is not None:
            for name in ("console.log", "instances.log"):
                if (self.state / name).exists():
                    shutil.copy(self.state / name, Path(keep_logs_in) / f"xen-{name}")
