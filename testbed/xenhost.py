"""The edge manager on a Xen host, for tests: `unikernel/xen-host/run` boots
Xen and a dom0 under QEMU (TCG), and dom0 runs the real `ec-edge serve
--runtime xen`, whose instances are the EPS appliance as Xen PVH
guests. From this machine it looks like `testbed.edge.EdgeManager`: the
same operator client, device listener and instance URLs, through QEMU's
port forwards.

    with XenEdge(lab, tmp / "xen") as edge:
        cred = edge.add_user("alice")        # then `python -m ec_proxy join --manager <edge.device_addr>`

The network, seen from here:
- the operator API, the device listener and each instance's device port
  are forwarded from 127.0.0.1:<p> here to dom0's <p> (same numbers); the
  manager advertises 127.0.0.1, so the instance URLs it hands out work here;
- the guests reach the provider test servers on this machine's loopback as
  10.0.2.2 (QEMU's user network), masqueraded by dom0.
"""

from __future__ import annotations

import json
import re
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from testbed.edge import EDGE_BIN, ManagerClient, free_port_block
from testbed.lab import ROOT, VENV_BIN, Lab

#: The manager for dom0: `ec-edge` as `make build` makes it. It needs only
#: libc, libm and libgcc_s, which dom0 has from the same Debian release
#: (unikernel/xen-host/build); EC_EDGE_DOM0_BIN may name a static build.
EDGE_DOM0_BIN = Path(os.environ.get("EC_EDGE_DOM0_BIN", EDGE_BIN))
#: The appliance (`make appliance`).
APPLIANCE_DIR = Path(os.environ.get("EC_APPLIANCE_DIR", VENV_BIN.parent / "share" / "edgecourier" / "appliance"))
XEN_HOST = ROOT / "unikernel" / "xen-host"
#: The host's loopback, seen from dom0 and its guests (QEMU's user network).
HOST_FROM_DOM0 = "10.0.2.2"

START = """#!/bin/sh
# /ec/start of the nested Xen host (testbed/xenhost.py): the edge manager in dom0.
mkdir -p /state && chmod 755 /state
cp /ec/operator.token /state/operator.token && chmod 600 /state/operator.token
# The tests' network probe (see PROBE): one prober guest per connection.
busybox nc -ll -p {probe_port} -e /ec/probe &
echo "xenhost: starting ec-edge"
exec /ec/ec-edge --state /state serve {args}
"""

#: dom0's side of `XenEdge.probe` (and of `XenEdge.dom0`, `XenEdge.xen_info`):
#: reads "A:P,B:Q,..." from the connection,
#: boots the appliance with `ec.reach=` (ec-init connects to each and powers
#: off) as a guest on a vif named and addressed like the manager's own (so
#: the manager's nftables rules apply to it), and answers its
#: `ec-init: reach A:P open|refused|timeout` lines. SLOT and NET are filled in.
PROBE = r"""#!/bin/sh
read -r targets
case "$targets" in
  # The tests' hand in dom0 (XenEdge.dom0): a command line, its output and exit status.
  "SH "*) sh -c "${targets#SH }" 2>&1; echo "dom0-exit=$?"; exit 0;;
esac
if [ "$targets" = INFO ]; then
  # The host's own view, for measurements: Xen's memory, the domains, dom0's memory.
  xl info; echo "== xl list"; xl list; echo "== free"; free -k; exit 0
fi
prefix=$(ip -o link show | sed -n 's/^[0-9]*: \(ecv[0-9a-f]*-\)[0-9]*[:@].*/\1/p' | head -1)
[ -n "$prefix" ] || { echo "probe: no instance link (start an instance first)"; exit 0; }
slot=SLOT; net=NET
hip=$net.$((4 * slot + 1)); gip=$net.$((4 * slot + 2))
name=ec-prober-$$
log=/var/log/xen/console/guest-$name.log
cat >/tmp/$name.cfg <<EOF
name = "$name"
type = "pvh"
kernel = "/ec/appliance/vmlinux"
ramdisk = "/ec/appliance/initramfs.cpio.lz4"
cmdline = "console=hvc0 quiet loglevel=1 panic=-1 ec.ip=$gip/30 ec.gw=$hip ec.reach=$targets"
memory = 64
vcpus = 1
vif = [ "ip=$gip,vifname=$prefix$slot,script=ec-vif-route" ]
on_poweroff = "preserve"
on_crash = "preserve"
EOF
for try in 1 2 3; do
  xl create /tmp/$name.cfg >/tmp/$name.create 2>&1 && break
  xl destroy $name >/dev/null 2>&1
done
i=0
while [ $i -lt 900 ] && ! grep -q "ec-init: powering off" $log 2>/dev/null; do sleep 1; i=$((i + 1)); done
grep "ec-init: reach" $log
[ $i -lt 900 ] || { echo "probe: the prober did not finish"; cat /tmp/$name.create; tail -20 $log; }
xl destroy $name >/dev/null 2>&1
"""


class XenEdge(ManagerClient):
    """One nested Xen host whose dom0 runs `ec-edge serve --runtime xen`."""

    runtime = "xen"
    cli_timeout = 300
    # A start waits for a guest that boots in minutes under nested emulation.
    http_timeout = 900

    def __init__(self, lab: Optional[Lab], workdir: Path, *, slots: int = 3, template: Optional[dict] = None,
                 boot_timeout: float = 900, memory_mb: int = 3072, run_args: tuple[str, ...] = (),
                 advertise: str = "127.0.0.1", provider_addr: Optional[str] = None, ca: Optional[Path] = None) -> None:
        """Without a `lab` (the netns testbed, experiments/netlab/edge.py):
        `template`, `ca` (the provider servers' CA) and `provider_addr`
        (where the guests reach them, host:port) are given instead.
        `advertise` is the address the manager puts in the instance URLs
        (127.0.0.1: QEMU's forwards here); `provider_addr` replaces
        10.0.2.2:<the lab's TLS port> (this machine's loopback, as QEMU's
        user network shows it to dom0) in the EPS template's `resolve`."""
        if lab is None and (template is None or ca is None or provider_addr is None):
            raise ValueError("without a lab, give template, ca and provider_addr")
        for need, how in ((EDGE_DOM0_BIN, "make build"), (APPLIANCE_DIR / "vmlinux", "make appliance")):
            if not need.exists():
                raise RuntimeError(f"{need} is missing: `{how}` makes it")
        self.lab = lab
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The operator command line reads <state>/operator.token: a folder here with the same token.
        self.state = self.workdir / "state"
        self.state.mkdir(exist_ok=True)
        token = secrets.token_hex(32)
        (self.state / "operator.token").write_text(token)
        (self.state / "operator.token").chmod(0o600)
        self.slots = slots
        base = free_port_block(3 + slots)
        self.operator_port, self.join_port, self.probe_port, self.device_port_base = base, base + 1, base + 2, base + 3
        self.console = self.workdir / "console.log"
        files = self.workdir / "dom0"
        shutil.rmtree(files, ignore_errors=True)
        files.mkdir()
        shutil.copy(Path(ca if ca is not None else lab.providers.ca).resolve(), files / "lab-ca.pem")  # type: ignore[union-attr]
        tpl = template if template is not None else lab.eps_config()  # type: ignore[union-attr]
        for k in ("listen", "management_listen", "keys", "insecure_plain_http"):
            tpl.pop(k, None)
        upstream = provider_addr or f"{HOST_FROM_DOM0}:{lab.providers.tls_port}"  # type: ignore[union-attr]
        tpl["upstream"]["resolve"] = {h: upstream for h in tpl["upstream"]["resolve"]}
        tpl["upstream"]["extra_ca_pem_files"] = ["/ec/lab-ca.pem"]
        (files / "eps-template.json").write_text(json.dumps(tpl, indent=1))
        shutil.copy(self.state / "operator.token", files / "operator.token")
        # dom0's root is its initramfs (RAM): the manager without its symbols.
        subprocess.run(["objcopy", "--strip-all", str(EDGE_DOM0_BIN), str(files / "ec-edge")], check=True)
        args = [
            "--operator-listen", f"0.0.0.0:{self.operator_port}", "--device-listen", f"0.0.0.0:{self.join_port}",
            "--advertise", advertise, "--device-port-base", str(self.device_port_base),
            "--management-port-base", "24000", "--max-slots", str(slots),
            "--runtime", "xen", "--runtimes", "xen", "--appliance-dir", "/ec/appliance",
            "--vm-subnet", "10.208.0.0/24", "--vm-disk-mib", "256", "--eps-template", "/ec/eps-template.json",
            # Guests boot in minutes, not seconds, under nested emulation on a busy machine.
            "--ready-timeout-s", "600", "--vm-probe-timeout-s", "300",
        ]
        start = files / "start"
        start.write_text(START.format(args=" ".join(args), probe_port=self.probe_port))
        start.chmod(0o755)
        probe = files / "probe"
        # The prober's slot is past the manager's, in the same /24.
        probe.write_text(PROBE.replace("SLOT", "60").replace("NET", "10.208.0"))
        probe.chmod(0o755)
        cmd = [str(XEN_HOST / "run"), "--console-log", str(self.console), "--timeout", "7200",
               "--boot-timeout", str(boot_timeout), "--memory", str(memory_mb),
               "--add", f"{start}:/ec/start", "--add", f"{probe}:/ec/probe", "--add", f"{files / 'ec-edge'}:/ec/ec-edge",
               "--add", f"{APPLIANCE_DIR / 'vmlinux'}:/ec/appliance/vmlinux",
               "--add", f"{APPLIANCE_DIR / 'initramfs.cpio.lz4'}:/ec/appliance/initramfs.cpio.lz4",
               "--add", f"{files / 'eps-template.json'}:/ec/eps-template.json",
               "--add", f"{files / 'lab-ca.pem'}:/ec/lab-ca.pem",
               "--add", f"{files / 'operator.token'}:/ec/operator.token"]
        cmd += list(run_args)
        for p in [self.operator_port, self.join_port, self.probe_port, *range(self.device_port_base, self.device_port_base + slots)]:
            cmd += ["--forward", f"{p}:{p}"]
        self.run_log = open(self.workdir / "run.log", "ab")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.run_log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(boot_timeout + 300)
        except BaseException:
            self.close()
            raise
        self.ready_seconds = time.monotonic() - self.t0

    def _wait_ready(self, timeout: float) -> None:
        """Until the manager in dom0 answers its operator API (or the host failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Xen host ended ({self.proc.returncode}) before the manager was ready:\n{self.tail()}")
            try:
                self.operator().call("GET", "/v1/instances")
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(2)
        raise RuntimeError(f"the manager in dom0 did not answer within {timeout:.0f} s:\n{self.tail()}")

    def _ask_dom0(self, line: str, timeout: float) -> str:
        """One exchange with dom0's probe service (PROBE): a line out, everything it answers back."""
        with socket.create_connection(("127.0.0.1", self.probe_port), timeout=30) as c:
            c.settimeout(timeout)
            c.sendall((line + "\n").encode())
            out = b""
            while chunk := c.recv(65536):
                out += chunk
        return out.decode(errors="replace")

    def probe(self, targets: list[str], timeout: float = 1200) -> dict[str, str]:
        """What a guest on the manager's network reaches: dom0 boots a
        prober guest (see PROBE); returns each target's verdict."""
        text = self._ask_dom0(",".join(targets), timeout)
        got = dict(re.findall(r"ec-init: reach (\S+) (\w+)", text))
        if len(got) != len(targets):
            raise AssertionError(f"the prober answered {got} for {targets}:\n{text[-3000:]}\n{self.tail()}")
        return got

    def dom0(self, command: str, timeout: float = 300) -> tuple[int, str]:
        """Runs a shell command line in dom0 (as root): its exit status and output."""
        if "\n" in command:
            raise ValueError("one line")
        text = self._ask_dom0(f"SH {command}", timeout)
        out, _, status = text.rpartition("dom0-exit=")
        if not status.strip().isdigit():
            raise AssertionError(f"dom0 did not finish `{command}`:\n{text[-3000:]}")
        return int(status), out

    def xen_info(self) -> dict[str, Any]:
        """`xl info` as a dict (free_memory, total_memory in MiB, ...), the
        domains (`xl list` rows) and dom0's `free -k` line."""
        text = self._ask_dom0("INFO", 300)
        info_part, _, rest = text.partition("== xl list")
        list_part, _, free_part = rest.partition("== free")
        info = {k.strip(): v.strip() for k, _, v in (l.partition(":") for l in info_part.splitlines()) if k.strip()}
        domains = [l.split() for l in list_part.strip().splitlines()[1:] if l.split()]
        mem = next((l.split() for l in free_part.splitlines() if l.startswith("Mem:")), [])
        return {"info": info, "domains": domains, "dom0_free_k": mem}

    def guest_ip(self, instance: str) -> str:
        """An instance's guest address, from the boot line of its log."""
        lines = self.operator().call("GET", f"/v1/instances/{instance}/logs?lines=400")["lines"]
        return re.findall(r"--- ec-edge: booting \S+ \(xen, guest ([0-9.]+),", lines)[-1]

    def console_text(self) -> str:
        try:
            return self.console.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.console_text().splitlines()[-n:])

    @property
    def operator_addr(self) -> str:
        return f"127.0.0.1:{self.operator_port}"

    @property
    def device_addr(self) -> str:
        return f"127.0.0.1:{self.join_port}"

    def close(self) -> None:
        """Keeps every instance's log (the guests' consoles) in the work
        folder, then powers the whole host off (its guests with it)."""
        if self.proc.poll() is None:
            try:
                op = self.operator()
                with open(self.workdir / "instances.log", "a") as f:
                    for i in op.call("GET", "/v1/instances")["instances"]:
                        lines = op.call("GET", f"/v1/instances/{i['id']}/logs?lines=2000")["lines"]
                        f.write(f"=== {i['id']} ({i['state']})\n{lines}\n")
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.run_log.close()

    def __enter__(self) -> "XenEdge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
