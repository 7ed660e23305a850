"""End to end through the edge manager, nothing replaced: Debian's rclone
(dropbox backend) → `ec-proxy`, started by `python -m ec_proxy join` with
the credential the operator issued → the user's EPS, which the real
`ec-edge` started on the `process`, `docker`, `microvm` (the appliance
under QEMU, TCG on our machines) or `xen` backend (the appliance as a Xen
PVH guest; the manager in dom0 of a Xen host nested under QEMU, see
`testbed/xenhost.py`: marked slow, minutes, and run by `make test` all the
same) → the provider test server. For each backend:

1. the device joins (the manager creates the instance in its default
   runtime and starts it) and gets its enrolment bundle, kept owner-only
   and never logged;
2. rclone uploads four LibreOffice documents, then their edits: the
   provider holds exactly the device's bytes (SHA-256 and rclone's own
   content_hash check), and the edits travelled as patches;
3. the device leaves with `--revoke` (the instance is stopped and its
   resources freed), joins again (the manager restores it), and the next
   save of each document travels as a patch: both last-synced stores, the
   device's and the EPS's (in the instance's state folder), survived.

The nested Xen host takes minutes to boot, so the xen backend's own checks
share it and come last in this module: its guests' isolation, a guest
destroyed behind the manager's back (seen, booted again), a state disk that
does not mount, and an appliance that does not boot (a second manager in
the same dom0). The microvm backend's are in `test_microvm.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.edge import ApiError, join_proxy, leave, wait_for
from testbed.rclone import RcloneRemote
from testbed.xenhost import HOST_FROM_DOM0, XenEdge

ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("EC_TRACES", ROOT / ".cache" / "traces"))
#: One trace per format, as the device proxy's rclone test.
DOCS = ("writer-100k-middle-docx", "writer-100k-end-odt", "calc-200rows-cell-xlsx", "impress-5slides-title-pptx")
SERVICE = "dropbox"
#: What the runs measured, printed at the end of the module (pytest -s) and by the report.
MEASURED: dict[str, dict] = {}


def traces() -> dict[str, tuple[bytes, bytes]]:
    manifest = TRACES / "manifest.json"
    if not manifest.exists():
        pytest.fail("no traces: run `make traces`")
    by_name = {t["name"]: t for t in json.loads(manifest.read_text())["traces"]}
    out = {}
    for want in DOCS:
        t = by_name[want]
        out[f"{t['name']}.{t['format']}"] = ((TRACES / t["base"]).read_bytes(), (TRACES / t["new"]).read_bytes())
    return out


def processes_naming(word: str) -> list[int]:
    """Pids of the processes whose command line holds `word`."""
    found = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if word.encode() in p.read_bytes():
                found.append(int(p.parent.name))
        except OSError:
            continue
    return found


def proxy_totals(proxy) -> dict:
    out = subprocess.run([sys.executable, "-m", "ec_proxy", "status", "--state", str(proxy.state), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def delta(before: dict, after: dict) -> dict:
    """What one round cost (rclone's Dropbox batch mode makes one save of all the files of a `copy`)."""
    keys = ("saves", "patch_saves", "full_saves", "direct_saves", "sent_bytes", "whole_bytes")
    return {k: after["total"][k] - before["total"][k] for k in keys}


def sync(lab, remote, local: Path, docs: dict, pick: int, account: str) -> None:
    """rclone copies the `pick` versions; the provider must hold exactly them."""
    for name, versions in docs.items():
        (local / name).write_bytes(versions[pick])
    remote.copy(local, "Sync")
    report = remote.check(local, "Sync")  # rclone's own comparison, with Dropbox's content_hash
    assert f"{len(docs)} matching files" in report and "0 differences found" in report, report
    held = {f["path"].rsplit("/", 1)[-1]: f["sha256"] for f in lab.providers.files("dropbox") if f["account"] == account}
    assert held == {n: hashlib.sha256(v[pick]).hexdigest() for n, v in docs.items()}


@pytest.fixture(scope="module")
def xen_edge(lab):
    """The manager in dom0 of a nested Xen host (minutes to boot; one per module)."""
    with XenEdge(lab, lab.workdir / "edge-xen") as edge:
        yield edge


@pytest.fixture(scope="module", params=["process", "docker", "microvm", pytest.param("xen", marks=pytest.mark.slow)])
def edge(request, make_edge):
    if request.param == "xen":
        return request.getfixturevalue("xen_edge")
    return make_edge(request.param)


def join_timeout(edge) -> tuple[float, tuple[str, ...]]:
    """How long a join may take: a guest of the nested Xen host boots in minutes on a busy machine."""
    return (900.0, ("--join-timeout", "900")) if edge.runtime == "xen" else (120.0, ())


@pytest.fixture(scope="module")
def device(edge, lab, tmp_path_factory):
    """Alice's laptop, joined through the real command; the first two
    rounds synced (base, then the edits). Yields what the tests check."""
    if shutil.which("rclone") is None:
        pytest.fail("rclone is not installed: `make setup` installs it from Debian")
    import secrets

    user = f"e2e{edge.runtime[0]}{secrets.token_hex(3)}"
    instance = f"{user}-{SERVICE}"
    credential = edge.add_user(user)
    name = f"{edge.runtime}-laptop"
    timeout, extra = join_timeout(edge)
    proxy, join_seconds = join_proxy(lab, edge.device_addr, name, credential, *extra, timeout=timeout)
    work = tmp_path_factory.mktemp(f"e2e-{edge.runtime}")
    local = work / "local"
    local.mkdir()
    account = f"acct-{user}"
    remote = RcloneRemote("dropbox", lab.providers, proxy.url, proxy.ca, work / "rclone", account=account)
    docs = traces()
    rounds = []
    for pick in (0, 1):
        before = proxy_totals(proxy)
        sync(lab, remote, local, docs, pick, account)
        rounds.append(delta(before, proxy_totals(proxy)))
    yield dict(user=user, instance=instance, credential=credential, name=name, proxy=proxy, join_seconds=join_seconds,
               remote=remote, local=local, docs=docs, account=account, rounds=rounds)


def test_join_gives_the_device_its_own_running_instance(edge, device):
    view = edge.operator().call("GET", f"/v1/instances/{device['instance']}")
    assert view["runtime"] == edge.runtime and view["state"] == "running" and view["user"] == device["user"], view
    stored = device["proxy"].state / "edge" / "enrolment.json"
    for f in (stored, device["proxy"].state / "edge" / "credential"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    record = json.loads(stored.read_text())
    assert record["enrolment"]["url"] == view["device_url"] and record["enrolment"]["url"].startswith("https://")
    # Neither the instance secret nor the credential's secret is ever logged.
    logged = device["proxy"].log_path.read_text()
    assert record["enrolment"]["secret"] not in logged and device["credential"].split(".")[2] not in logged
    assert "joined in" in logged
    # The operator's command line shows it.
    listing = edge.cli("list")
    assert listing.returncode == 0 and device["instance"] in listing.stdout, listing
    MEASURED.setdefault(edge.runtime, {}).update(join_and_proxy_start_s=round(device["join_seconds"], 2),
                                                 join_s=record["join_seconds"], ready_s=view["ready_seconds"])


def test_edits_saved_through_the_managed_eps_travel_as_patches(edge, device):
    first, edit = device["rounds"]
    # Nothing to patch against at first: whole files, through the EPS.
    assert first["full_saves"] >= 1 and first["patch_saves"] == first["direct_saves"] == 0, first
    assert first["sent_bytes"] >= first["whole_bytes"] * 0.9, first
    assert edit["patch_saves"] >= 1 and edit["full_saves"] == edit["direct_saves"] == 0, edit
    assert 0 < edit["sent_bytes"] < edit["whole_bytes"] / 10, edit
    # The EPS counted them too (the manager gathers its counters now and then): at least one SAVE a
    # round. The EPS counts SAVE exchanges, and a Dropbox batch of files is one; the device counts
    # each file of it as a save of its own document (ec-proxy status), so the two need not be equal.
    deadline = time.monotonic() + 15
    while True:
        view = edge.operator().call("GET", f"/v1/instances/{device['instance']}")
        if view["saves"] >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert 2 <= view["saves"] <= first["saves"] + edit["saves"] and view["bytes_saved"] > 0, view
    MEASURED.setdefault(edge.runtime, {}).update(edit_round=edit, first_round=first)


def test_revoke_then_join_again_keeps_both_stores(edge, lab, device):
    device["proxy"].stop()
    left = leave(lab, device["name"], revoke=True)
    assert left["state"] == "revoked" and left["device_url"] is None, left
    if edge.runtime == "docker":
        names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout.split()
        assert f"ec-{device['instance']}" not in names  # its resources are freed
    if edge.runtime == "microvm":
        assert not processes_naming(f"ec-{device['instance']}")  # no QEMU left
    stored = json.loads((device["proxy"].state / "edge" / "enrolment.json").read_text())
    assert "enrolment" not in stored  # the bundle is forgotten on leave
    # Joining again: no credential on the command line (the device kept it); the manager restores the instance.
    timeout, extra = join_timeout(edge)
    proxy, seconds = join_proxy(lab, edge.device_addr, device["name"], None, *extra, timeout=timeout)
    view = edge.operator().call("GET", f"/v1/instances/{device['instance']}")
    assert view["state"] == "running" and view["starts"] >= 2, view
    before = proxy_totals(proxy)
    # The user reverts each edit: a new save of every document, against the last-synced edit.
    device["remote"].proxy_url = proxy.url
    sync(lab, device["remote"], device["local"], device["docs"], 0, device["account"])
    d = delta(before, proxy_totals(proxy))
    # A patch, so the EPS still had the base: an EPS without it answers "base unknown" and the file goes whole.
    assert d["patch_saves"] >= 1 and d["full_saves"] == d["direct_saves"] == 0, d
    assert 0 < d["sent_bytes"] < d["whole_bytes"] / 10, d
    MEASURED.setdefault(edge.runtime, {}).update(after_restore=d, rejoin_and_proxy_start_s=round(seconds, 2))
    print(f"\n{edge.runtime}: {json.dumps(MEASURED[edge.runtime])}")


def test_a_wrong_pin_or_secret_is_refused_before_anything_is_sent(edge, lab, unique, tmp_path):
    user = unique("pin")
    good = edge.add_user(user)
    prefix, u, secret, pin = good.split(".")
    state = tmp_path / "dev"
    for cred, says in ((f"{prefix}.{u}.{secret}.{'00' * 32}", "pin mismatch"),
                       (f"{prefix}.{u}.{'x' * len(secret)}.{pin}", "401")):
        out = subprocess.run([sys.executable, "-m", "ec_proxy", "join", "--no-run", "--manager", edge.device_addr,
                              "--credential", cred, "--state", str(state)], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and says in out.stderr, out
        assert secret not in out.stderr
    with pytest.raises(ApiError) as e:
        edge.operator().call("GET", f"/v1/instances/{user}-default")
    assert e.value.status == 404  # nothing was created


def a_running_instance(edge, user: str) -> dict:
    """An instance the earlier tests left running (a guest boots in minutes
    here), or a new one of `user`."""
    op = edge.operator()
    running = [i for i in op.call("GET", "/v1/instances")["instances"] if i["state"] == "running"]
    if running:
        return running[0]
    edge.add_user(user)
    op.call("POST", "/v1/instances", {"user": user, "service": "dropbox"})
    return op.call("POST", f"/v1/instances/{user}-dropbox/start")


@pytest.mark.slow
def test_xen_guests_cannot_reach_each_other_nor_dom0(xen_edge, lab):
    """A guest on the Xen manager's network (a prober: the appliance with
    `ec.reach`, on a vif named and addressed like the manager's own) cannot
    reach another user's EPS (device or management port) nor dom0's
    management side (the operator API, on every address of dom0), but it
    reaches the provider (the control: its network works). Runs last in
    this module: the other user's guest is the one the `xen` case above
    left running, or a new one."""
    running = [a_running_instance(xen_edge, "isoxen")]
    other = xen_edge.guest_ip(running[0]["id"])
    gateway = other.rsplit(".", 1)[0] + "." + str(4 * 60 + 1)  # the prober's own gateway: dom0
    provider = f"{HOST_FROM_DOM0}:{lab.providers.tls_port}"
    # The other guest directly; through dom0's device-port DNAT; dom0's operator API on both its addresses.
    through_dnat = f"{gateway}:{running[0]['device_url'].rsplit(':', 1)[1].split('/')[0]}"
    targets = [f"{other}:8443", f"{other}:9100", through_dnat, f"{gateway}:{xen_edge.operator_port}",
               f"10.0.2.15:{xen_edge.operator_port}", provider]
    got = xen_edge.probe(targets)
    assert got[f"{other}:8443"] == "timeout" and got[f"{other}:9100"] == "timeout" and got[through_dnat] == "timeout", got
    assert got[f"{gateway}:{xen_edge.operator_port}"] == "timeout" and got[f"10.0.2.15:{xen_edge.operator_port}"] == "timeout", got
    assert got[provider] == "open", got


@pytest.mark.slow
def test_a_xen_guest_that_ends_later_is_seen_and_restarted(xen_edge):
    """A running guest destroyed behind the manager's back (`xl destroy`,
    as a crash of the domain looks from dom0) is recorded as a crash, with
    its reason, and booted again by the restart policy; the user's store
    disk is the same file."""
    op = xen_edge.operator()
    view = a_running_instance(xen_edge, "crashxen")
    status, out = xen_edge.dom0(f"ls -i /state/instances/{view['id']}/store.img && xl destroy ec-{view['id']}")
    assert status == 0, out
    inode = out.split()[0]
    after = wait_for(lambda: (i := op.call("GET", f"/v1/instances/{view['id']}"))["crashes"] > view["crashes"]
                     and i["state"] == "running" and i, timeout=900, what="the crash seen and the guest booted again", every=2)
    assert "gone" in after["last_exit"]["reason"], after["last_exit"]
    assert after["starts"] == view["starts"] + 1, after
    status, out = xen_edge.dom0(f"ls -i /state/instances/{view['id']}/store.img && xl list ec-{view['id']}")
    assert status == 0 and out.split()[0] == inode, out


@pytest.mark.slow
def test_a_xen_guest_kernel_that_panics_is_seen_and_restarted(xen_edge):
    """A real crash of the guest's kernel: an NMI sent by the toolstack
    (`xl trigger <domain> nmi`) panics it (the appliance's kernel runs with
    unknown_nmi_panic); the manager records the crash with the kernel's own
    panic line, and boots the guest again."""
    op = xen_edge.operator()
    view = a_running_instance(xen_edge, "panicxen")
    status, out = xen_edge.dom0(f"xl trigger ec-{view['id']} nmi")
    assert status == 0, out
    after = wait_for(lambda: (i := op.call("GET", f"/v1/instances/{view['id']}"))["crashes"] > view["crashes"]
                     and i["state"] == "running" and i, timeout=900, what="the panic seen and the guest booted again", every=2)
    # Xen's reason is "crashed" when the kernel's Xen panic notifier ran, "rebooted" when panic=-1 came first.
    assert re.match(r"the guest (crashed|rebooted): Kernel panic - not syncing: NMI", after["last_exit"]["reason"]), after["last_exit"]
    assert after["starts"] == view["starts"] + 1, after


@pytest.mark.slow
def test_a_xen_state_disk_that_does_not_mount_is_reported_and_kept(xen_edge):
    """An instance whose state disk is not a file system: the start fails
    (503) once the guest's init says so, with the init's own words from the
    console; the disk is left exactly as it was (the manager never formats
    over a user's disk)."""
    op = xen_edge.operator()
    xen_edge.add_user("diskxen")
    inst = op.call("POST", "/v1/instances", {"user": "diskxen", "service": "dropbox", "restart": "never"})
    disk = f"/state/instances/{inst['id']}/store.img"
    status, out = xen_edge.dom0(f"head -c 8388608 /dev/urandom > {disk} && sha256sum {disk}")
    assert status == 0, out
    digest = out.split()[0]
    t0 = time.monotonic()
    status, body = op.raw("POST", f"/v1/instances/{inst['id']}/start")
    took = time.monotonic() - t0
    assert status == 503, body
    msg = body["error"]["message"]
    assert "the guest powered off" in msg and "mount /dev/xvda on /state/store (ext4)" in msg, msg
    assert took < 600, took  # the guest's boot, not the manager's ready timeout
    status, out = xen_edge.dom0(f"sha256sum {disk}")
    assert status == 0 and out.split()[0] == digest, out
    assert op.call("GET", f"/v1/instances/{inst['id']}")["state"] == "crashed"


@pytest.mark.slow
def test_a_xen_appliance_that_does_not_boot_is_reported_within_bounded_time(xen_edge):
    """A manager in dom0 given a kernel whose initramfs is garbage refuses
    the xen backend at start: its check boot ends in a kernel panic, which
    is not booted again, and the error carries the guest console's last
    lines."""
    broken = "/tmp/broken-appliance"
    cmd = (f"rm -rf {broken} /tmp/broken-state && mkdir -p {broken} && cp /ec/appliance/vmlinux {broken}/ "
           f"&& head -c 65536 /dev/urandom > {broken}/initramfs.cpio.lz4 "
           f"&& s=$(date +%s) && timeout 900 /ec/ec-edge --state /tmp/broken-state serve --runtime xen --runtimes xen "
           f"--appliance-dir {broken} --operator-listen 127.0.0.1:0 --device-listen 127.0.0.1:0 --vm-subnet 10.209.0.0/24 "
           f"--vm-probe-timeout-s 300 </dev/null; echo \"manager-exit=$? after $(( $(date +%s) - s )) s\"")
    _, out = xen_edge.dom0(cmd, timeout=1200)
    exit_line = re.search(r"manager-exit=(\d+) after (\d+) s", out)
    assert exit_line, out[-3000:]
    assert exit_line.group(1) == "1", out[-3000:]
    assert int(exit_line.group(2)) < 400, out[-3000:]  # one boot: a panic is not booted again
    assert "ec-edge: the xen runtime is not available on this host" in out, out[-3000:]
    assert "the check guest" in out and "console's last lines" in out, out[-3000:]
    assert "Kernel panic" in out or "No working init" in out, out[-3000:]


def test_the_device_finds_the_manager_and_reads_its_bundle(tmp_path):
    """`join`'s own rules, without a network: the default gateway from the
    kernel's routing table, --manager forms, credentials, the stored bundle."""
    from ec_proxy import join

    route = tmp_path / "route"
    route.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "wlan0\t0032A8C0\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0\n"
        "eth0\t00000000\t0101A8C0\t0003\t0\t0\t700\t00000000\t0\t0\t0\n"
        "wlan0\t00000000\t0132A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n")
    assert join.default_gateway(str(route)) == "192.168.50.1"  # the default route with the lowest metric
    assert join.default_gateway(str(tmp_path / "none")) is None
    assert join.parse_manager("192.168.50.1") == ("192.168.50.1", 8441)
    assert join.parse_manager("https://ap.local:9000/") == ("ap.local", 9000)
    assert join.parse_manager("[fe80::1]:8441") == ("fe80::1", 8441)
    for bad in ("http://ap:1", "ap:x", "ap:0"):
        with pytest.raises(join.JoinError):
            join.parse_manager(bad)
    cred = join.Credential.parse(f"ecu1.alice.s3cret.{'ab' * 32}\n")
    assert (cred.user, cred.pin) == ("alice", bytes.fromhex("ab" * 32)) and "s3cret" not in repr(cred)
    for bad in ("ecu1.alice.s3cret", f"ecu2.alice.s.{'ab' * 32}", "ecu1.alice.s.abcd"):
        with pytest.raises(join.JoinError):
            join.Credential.parse(bad)
    enrolment = {"url": "https://192.168.50.1:20000", "key_id": 1, "secret": "11" * 32, "spki_sha256": "22" * 32, "plain_http": False}
    record = {"manager": "192.168.50.1:8441", "enrolment": enrolment}
    assert join.bundle_options(record) == {"edge": enrolment["url"], "secret": "11" * 32, "key_id": 1, "pin": "22" * 32, "plain_edge": False}
    assert "secret" not in json.dumps(join.public(record)["eps"])
    with pytest.raises(join.JoinError, match="left"):
        join.bundle_options({"manager": "192.168.50.1:8441"})
    with pytest.raises(join.JoinError):  # https without a pin
        join.bundle_options({**enrolment, "spki_sha256": None})
