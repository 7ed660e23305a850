"""The `microvm` backend beyond the end-to-end save (test_e2e.py runs that
on it too): the accelerator decided by trying, users' guests kept apart on
the network, a broken image, a state disk that does not mount, a
crashing QEMU and a guest kernel that panics. Everything is real:
`ec-edge serve` as root, QEMU (TCG on our machines), the appliance that
`make appliance` built, nftables on this host.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from testbed.edge import EdgeManager, edge_template, host_address, vm_args, wait_for

ROOT = Path(__file__).resolve().parents[2]
APPLIANCE = Path(os.environ.get("EC_APPLIANCE_DIR", ROOT / ".venv" / "share" / "edgecourier" / "appliance"))


def qemu_pids(instance: str) -> list[int]:
    pids = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = p.read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"qemu-system-x86_64") and f"ec-{instance}".encode() in cmd:
            pids.append(int(p.parent.name))
    return pids


@pytest.fixture(scope="module")
def vm(make_edge):
    if not (APPLIANCE / "vmlinux").exists():
        pytest.fail(f"no appliance in {APPLIANCE}: run `make appliance`")
    return make_edge("microvm")


def guest_ip(edge: EdgeManager, instance: str) -> str:
    log = (edge.state / "logs" / f"{instance}.log").read_text()
    return re.findall(r"--- ec-edge: booting \S+ \(microvm, \w+, guest ([0-9.]+),", log)[-1]


def start(edge: EdgeManager, user: str, service: str = "dropbox", **kw) -> dict:
    op = edge.operator()
    edge.add_user(user)
    op.call("POST", "/v1/instances", {"user": user, "service": service, **kw})
    return op.call("POST", f"/v1/instances/{user}-{service}/start")


def test_no_kvm_means_tcg_and_the_manager_says_so(vm, unique):
    log = (vm.state / "manager.log").read_text()
    kvm_works = "accel=\"kvm\"" in log or "accel=kvm" in log
    if not kvm_works:
        # Our machines: /dev/kvm may exist, nested KVM does not work; decided by trying.
        assert "KVM does not work here" in log and "using TCG" in log, log[-2000:]
    assert "appliance boots" in log
    view = start(vm, unique("accel"))
    assert view["state"] == "running" and view["runtime"] == "microvm"
    marker = (vm.state / "logs" / f"{view['id']}.log").read_text()
    assert f"(microvm, {'kvm' if kvm_works else 'tcg'}," in marker
    # The guest's console is a tty inside but a file here: no colour codes; and the EPS does not
    # warn about the management listener on all interfaces (the guest's only link, guarded by the manager).
    log = vm.state / "logs" / f"{view['id']}.log"
    marker = wait_for(lambda: "EPS ready" in (m := log.read_text()) and m, timeout=30, what="the EPS's ready line in the console")
    assert "\x1b[" not in marker and "listens on all interfaces" not in marker, marker[-2000:]


def ksm_bytes(pid: int) -> int:
    """The bytes of a process's memory that the kernel has merged with identical pages elsewhere."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("KSM:"):
            return int(line.split()[1]) * 1024
    pytest.fail("this kernel's smaps_rollup has no KSM line (Linux 6.1+ with CONFIG_KSM)")


def test_guests_share_their_identical_pages(vm, unique):
    """--vm-ksm auto (the default): the manager turned KSM on, and two users' guests
    share the pages they hold in common (the kernel and the EPS binary)."""
    log = (vm.state / "manager.log").read_text()
    assert "memory merging (KSM) turned on" in log or "memory merging (KSM) is on" in log, log[-2000:]
    assert Path("/sys/kernel/mm/ksm/run").read_text().strip() == "1"
    a, b = start(vm, unique("ksma")), start(vm, unique("ksmb"))
    [pa], [pb] = qemu_pids(a["id"]), qemu_pids(b["id"])
    # The kernel image alone is 9 MiB of identical guest memory; ksmd needs a few passes.
    merged = wait_for(lambda: (m := min(ksm_bytes(pa), ksm_bytes(pb))) >= 8 << 20 and m, timeout=120,
                      what="8 MiB of each guest merged by KSM")
    assert merged >= 8 << 20


class Listener:
    """A TCP service on every address of this host, as the access point's
    management side would be if it listened on the Wi-Fi side: a guest must
    not reach it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            c.close()


def link_of(guest: str) -> str:
    """The host's link to a guest: the one holding the guest's gateway (its /30's first address)."""
    gw = ".".join(guest.split(".")[:3] + [str(int(guest.split(".")[3]) - 1)])
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "to", f"{gw}/32"], capture_output=True, text=True).stdout
    return out.split()[1]


def prober(edge: EdgeManager, slot: int, targets: list[str], sibling: str) -> dict[str, str]:
    """Boots the appliance with `ec.reach` on a link made exactly as the
    manager makes its instances' (the name prefix of `sibling`'s link, one
    of this manager's guests; a /30 of its subnet), so the manager's rules
    apply to it; returns what each target did. Another manager on the host
    (a benchmark's) has links of its own prefix: the prefix comes from this
    manager's guest, not from any link on the host.

    The answer is the console's `reach` lines: once they are all out (or
    after 120 s), QEMU is stopped; the guest's own power-off is not waited
    for (it is the manager's business, tested elsewhere)."""
    prefix = re.match(r"(ecv[0-9a-f]{4}-)\d+$", link_of(sibling)).group(1)
    subnet = edge.extra[edge.extra.index("--vm-subnet") + 1]
    base = [int(x) for x in subnet.split("/")[0].split(".")]
    host_side = f"{base[0]}.{base[1]}.{base[2]}.{4 * slot + 1}"
    guest = f"{base[0]}.{base[1]}.{base[2]}.{4 * slot + 2}"
    link = f"{prefix}{slot}"
    subprocess.run(["ip", "link", "del", link], capture_output=True)
    subprocess.run(["ip", "tuntap", "add", "dev", link, "mode", "tap"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{host_side}/30", "dev", link], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        khz = int(float(re.search(r"cpu MHz\s*:\s*([0-9.]+)", Path("/proc/cpuinfo").read_text()).group(1)) * 1000)
        cmdline = (f"console=ttyS0 quiet loglevel=1 nokaslr mitigations=off no_timer_check panic=-1 tsc=reliable "
                   f"tsc_early_khz={khz} ec.ip={guest}/30 ec.gw={host_side} ec.reach={','.join(targets)}")
        qemu = subprocess.Popen(
            ["qemu-system-x86_64", "-M", "microvm,rtc=on", "-accel", "tcg,tb-size=16", "-cpu", "max", "-m", "64",
             "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
             "-kernel", str(APPLIANCE / "vmlinux"), "-initrd", str(APPLIANCE / "initramfs.cpio.lz4"),
             "-append", cmdline, "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
             "-netdev", f"tap,id=n0,ifname={link},script=no,downscript=no", "-device", "virtio-net-device,netdev=n0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace")
        console: list[str] = []
        reader = threading.Thread(target=lambda: console.extend(qemu.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and qemu.poll() is None:
            if sum("ec-init: reach " in line for line in list(console)) == len(targets):
                break
            time.sleep(0.1)
        qemu.kill()
        qemu.wait()
        reader.join(5)
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    text = "".join(console)
    got = dict(re.findall(r"ec-init: reach (\S+) (\w+)", text))
    assert len(got) == len(targets), f"the probe guest gave {len(got)} of {len(targets)} answers in 120 s; its console:\n{text[-4000:]}"
    return got


def test_users_guests_cannot_reach_each_other_nor_the_management_side(vm, unique):
    a = start(vm, unique("isoa"))
    a_ip = guest_ip(vm, a["id"])
    # A answers from the host, on its device port (DNAT) and its management port (the manager's view).
    assert socket.create_connection(("127.0.0.1", int(a["device_url"].rsplit(":", 1)[1].split("/")[0])), 5)
    side = Listener()
    host = host_address()
    provider = next(a for a in vm.extra if a.startswith(host) and ":" in a)
    targets = [
        f"{a_ip}:8443",            # another user's EPS, device listener
        f"{a_ip}:9100",            # and its management listener
        f"{host}:{side.port}",     # a host service on every address (the management side)
        provider,                  # control: the one service guests may reach
    ]
    got = prober(vm, vm.slots - 1, targets, sibling=a_ip)
    assert got[f"{a_ip}:8443"] == "timeout" and got[f"{a_ip}:9100"] == "timeout", got
    assert got[f"{host}:{side.port}"] == "timeout" and side.accepted == 0, got
    assert got[provider] == "open", got  # the prober's network works: what it could not reach is blocked


def test_a_guest_that_crashes_is_seen_and_restarted(vm, unique):
    view = start(vm, unique("crash"))
    op = vm.operator()
    [pid] = qemu_pids(view["id"])
    os.kill(pid, signal.SIGKILL)
    after = wait_for(lambda: (i := op.call("GET", f"/v1/instances/{view['id']}"))["crashes"] >= 1 and i["state"] == "running" and i,
                     timeout=60, what="crash seen and restarted")
    assert "killed by signal 9" in after["last_exit"]["reason"], after["last_exit"]
    assert after["starts"] == view["starts"] + 1
    [new] = qemu_pids(view["id"])
    assert new != pid


def qmp(path: str, command: str) -> dict:
    """One command on a QEMU monitor (QMP): the greeting, capabilities, the command's answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        f = s.makefile("rwb")
        assert "QMP" in json.loads(f.readline())
        for cmd in ("qmp_capabilities", command):
            f.write(json.dumps({"execute": cmd}).encode() + b"\n")
            f.flush()
            while "event" in (answer := json.loads(f.readline())):
                pass
        return answer


def test_a_guest_kernel_that_panics_is_seen_and_restarted(vm, unique):
    """A real crash of the guest's kernel, not of QEMU: an NMI through the instance's
    QEMU monitor panics it (the appliance's kernel runs with unknown_nmi_panic)."""
    view = start(vm, unique("panic"))
    op = vm.operator()
    [pid] = qemu_pids(view["id"])
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    sock = cmd[cmd.index(b"-qmp") + 1].decode().removeprefix("unix:").split(",")[0]
    assert qmp(sock, "inject-nmi") == {"return": {}}
    log_path = vm.state / "logs" / f"{view['id']}.log"
    try:
        after = wait_for(lambda: (i := op.call("GET", f"/v1/instances/{view['id']}"))["crashes"] >= 1 and i["state"] == "running" and i,
                         timeout=60, what="the kernel's crash seen and the guest restarted")
    except AssertionError as e:
        now = op.call("GET", f"/v1/instances/{view['id']}")
        raise AssertionError(f"{e}: {now}\n{log_path.read_text()[-3000:]}") from None
    reason = after["last_exit"]["reason"]
    assert reason.startswith("the guest's kernel crashed: Kernel panic - not syncing: NMI"), after["last_exit"]
    assert after["starts"] == view["starts"] + 1
    log = log_path.read_text()
    assert "Kernel panic - not syncing: NMI" in log and log.count("--- ec-edge: booting") >= 2, log[-3000:]
    [new] = qemu_pids(view["id"])
    assert new != pid


def test_an_instance_whose_eps_cannot_start_is_reported_with_the_guest_console(vm, unique):
    user = unique("badcfg")
    vm.add_user(user)
    op = vm.operator()
    inst = op.call("POST", "/v1/instances", {"user": user, "service": "dropbox", "restart": "never"})
    cfg_path = vm.state / "instances" / inst["id"] / "eps.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tls"]["cert_pem"] = "tls/missing.pem"
    cfg_path.write_text(json.dumps(cfg))
    t0 = time.monotonic()
    status, body = op.raw("POST", f"/v1/instances/{inst['id']}/start")
    assert status == 503, body
    msg = body["error"]["message"]
    assert "the guest powered off: the EPS ended by itself" in msg, msg
    assert "missing.pem" in msg, msg  # the EPS's own error, from the guest's console
    assert time.monotonic() - t0 < 60


def test_a_state_disk_that_does_not_mount_is_reported_and_kept(vm, unique):
    """An instance whose state disk is not a file system: the start fails
    (503) with the guest init's own words, and the disk is left exactly as
    it was (the manager never formats over a user's disk)."""
    import hashlib

    user = unique("baddisk")
    vm.add_user(user)
    op = vm.operator()
    inst = op.call("POST", "/v1/instances", {"user": user, "service": "dropbox", "restart": "never"})
    disk = vm.state / "instances" / inst["id"] / "store.img"
    disk.write_bytes(os.urandom(8 << 20))
    digest = hashlib.sha256(disk.read_bytes()).hexdigest()
    t0 = time.monotonic()
    status, body = op.raw("POST", f"/v1/instances/{inst['id']}/start")
    assert status == 503, body
    msg = body["error"]["message"]
    assert "the guest powered off" in msg and "mount /dev/vda on /state/store (ext4)" in msg, msg
    assert time.monotonic() - t0 < 60
    assert hashlib.sha256(disk.read_bytes()).hexdigest() == digest
    assert op.call("GET", f"/v1/instances/{inst['id']}")["state"] == "crashed"


def test_a_kernel_that_does_not_boot_is_reported_within_bounded_time(lab, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "vmlinux").write_bytes((APPLIANCE / "vmlinux").read_bytes())
    (broken / "initramfs.cpio.gz").write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(4096))  # not an archive: no /init
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        EdgeManager(lab, tmp_path / "edge", runtime="microvm", template=edge_template(lab, "microvm"),
                    extra=(*vm_args(lab), "--appliance-dir", str(broken)))
    took = time.monotonic() - t0
    text = str(e.value)
    assert "did not reach its init" in text and "console's last lines" in text, text[-3000:]
    assert "Kernel panic" in text or "No working init" in text or "not syncing" in text, text[-3000:]
    assert took < 60, took


@pytest.mark.parametrize("flag,value,says", [("--vm-ksm", "maybe", "--vm-ksm maybe: auto, on or off"),
                                             ("--vm-tcg-cache-mib", "0", "--vm-tcg-cache-mib 0: from 1 to 1024")])
def test_bad_microvm_settings_are_named_before_anything_starts(tmp_path, flag, value, says):
    """A wrong --vm-ksm or translation-cache size stops the manager with the setting named,
    before it boots anything or changes the host's KSM setting."""
    ksm_before = Path("/sys/kernel/mm/ksm/run").read_text()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "ec-edge"), "--state", str(tmp_path / "state"), "serve",
                           "--runtime", "microvm", "--runtimes", "microvm", "--operator-listen", "127.0.0.1:0",
                           "--device-listen", "127.0.0.1:0", flag, value], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "state").exists(), "nothing is made before the settings are checked"
    assert Path("/sys/kernel/mm/ksm/run").read_text() == ksm_before
