"""The edge manager's API on the process backend: authentication, users
kept apart, bad input, limits, crashes, the manager's own restart, metrics
and the operator's status page. Everything is real: `ec-edge serve` as root
with `ec-launcher`, real `ec-eps` instances in their own cgroups and uids,
the provider test servers behind them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import hashlib

from ec_protocol.client import EnrolmentBundle, EpsClient, Fallback, ProviderResponse
from eps.tests.e2e import Uploader
from testbed.edge import EDGE_BIN, EdgeManager, wait_for
from testbed.lab import Lab


@pytest.fixture(scope="module")
def lab_api(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("edge-api")) as lab:
        yield lab


@pytest.fixture(scope="module")
def mgr(lab_api):
    with EdgeManager(lab_api, lab_api.workdir / "edge", slots=12, extra=("--docker-image", "edgecourier/eps:not-built-here")) as m:
        yield m


@pytest.fixture(scope="module")
def alice(mgr):
    return mgr.device(mgr.add_user("alice", max_instances=2))


@pytest.fixture(scope="module")
def bob(mgr):
    return mgr.device(mgr.add_user("bob"))


def eps_pids(uid: int) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                status = (p / "status").read_text()
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            if int(uid_line.split()[1]) == uid and b"ec-eps" in cmd:
                pids.append(int(p.name))
    return pids


def uid_of(mgr: EdgeManager, instance_id: str) -> int:
    state = json.loads((mgr.state / "manager.json").read_text())
    return state["instances"][instance_id]["uid"]


# ------------------------------------------------------------------ authentication


def test_operator_api_needs_the_operator_token(mgr):
    op = mgr.operator()
    op.token = "0" * 64
    status, body = op.raw("GET", "/v1/instances")
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    status, _ = mgr.operator().raw("GET", "/v1/instances", headers={"Authorization": "Basic YWxpY2U6eA=="})
    assert status == 401


def test_device_with_a_wrong_secret_or_unknown_user_is_refused(mgr, alice):
    user, secret, pin = alice.user, alice.secret, alice.pin
    wrong = mgr.device(f"ecu1.{user}.{'0' * 48}.{pin.hex()}")
    assert wrong.raw("GET", "/v1/instances")[0] == 401
    nobody = mgr.device(f"ecu1.mallory.{secret}.{pin.hex()}")
    assert nobody.raw("GET", "/v1/instances")[0] == 401


def test_device_checks_the_managers_pin(mgr, alice):
    import ssl

    fake = mgr.device(f"ecu1.{alice.user}.{alice.secret}.{'ab' * 32}")
    with pytest.raises(ssl.SSLError):
        fake.raw("GET", "/v1/instances")


# ------------------------------------------------------------------ one user, one instance


def test_join_creates_starts_and_enrols_an_instance_that_serves_the_device(mgr, alice, lab_api):
    t0 = time.monotonic()
    joined = alice.call("POST", "/v1/join", {"service": "dropbox"})
    took = time.monotonic() - t0
    inst = joined["instance"]
    assert inst["id"] == "alice-dropbox" and inst["state"] == "running" and inst["runtime"] == "process"
    assert took < 10, took
    bundle = EnrolmentBundle.from_dict(joined["enrolment"])
    assert bundle.url.startswith("https://") and not bundle.plain_http
    # The bundle works: a real save through the instance, over TLS with the pin.
    client = EpsClient(bundle, label="alice-laptop")
    up = Uploader("dropbox", "single")
    data = b"PK\x03\x04 not really a zip, saved whole " * 40
    outcome = up.save(client, "notes.docx", data, None)
    assert isinstance(outcome, ProviderResponse) and outcome.succeeded, outcome
    assert up.held(lab_api, "notes.docx")["sha256"] == hashlib.sha256(data).hexdigest()


def test_instance_runs_in_its_own_cgroup_and_uid_with_its_limits(mgr, alice):
    uid = uid_of(mgr, "alice-dropbox")
    pids = eps_pids(uid)
    assert len(pids) == 1, pids
    cg = (Path("/proc") / str(pids[0]) / "cgroup").read_text()
    assert f"edgecourier/alice-dropbox-u{uid}" in cg
    inst = mgr.operator().call("GET", "/v1/instances/alice-dropbox")
    v1 = Path(f"/sys/fs/cgroup/memory/edgecourier/alice-dropbox-u{uid}/memory.limit_in_bytes")
    v2 = Path(f"/sys/fs/cgroup/edgecourier/alice-dropbox-u{uid}/memory.max")
    limit = int((v1 if v1.exists() else v2).read_text())
    assert limit == inst["limits"]["memory_bytes"]
    pids_max = Path(f"/sys/fs/cgroup/pids/edgecourier/alice-dropbox-u{uid}/pids.max")
    pids_max = pids_max if pids_max.exists() else Path(f"/sys/fs/cgroup/edgecourier/alice-dropbox-u{uid}/pids.max")
    assert int(pids_max.read_text()) == inst["limits"]["pids"]
    mode = (mgr.state / "instances" / "alice-dropbox").stat()
    assert mode.st_uid == uid and (mode.st_mode & 0o077) == 0


# ------------------------------------------------------------------ what the operator sees


def test_metrics_count_instances_starts_and_ready_time(mgr, alice):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    status, text = mgr.operator().raw("GET", "/metrics")
    assert status == 200
    assert 'ec_edge_instances{runtime="process",state="running"}' in text
    assert "ec_edge_start_to_ready_seconds_count" in text and "ec_edge_starts_total" in text
    wait_for(lambda: 'ec_edge_instance_memory_bytes{instance="alice-dropbox"' in mgr.operator().raw("GET", "/metrics")[1], what="memory gathered")
    wait_for(lambda: 'ec_edge_instance_saves{instance="alice-dropbox",runtime="process"} 1' in mgr.operator().raw("GET", "/metrics")[1]
             or 'ec_edge_instance_saves{instance="alice-dropbox",runtime="process"}' in mgr.operator().raw("GET", "/metrics")[1], what="saves gathered")


def test_logs_are_plain_text(mgr, alice):
    """Log files carry no terminal colour codes (the EPS's and the manager's), and the
    EPS's own log has no warning about its configuration the manager wrote."""
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    text = wait_for(lambda: "EPS ready" in (t := mgr.operator().call("GET", "/v1/instances/alice-dropbox/logs?lines=200")["lines"]) and t,
                    what="the EPS's ready line in its log")
    assert "\x1b[" not in text, text[-2000:]
    assert "\x1b[" not in (mgr.state / "manager.log").read_text()


def test_status_page_in_headless_chromium(mgr, alice, tmp_path):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is installed by scripts/setup-system"
    url = f"http://{mgr.operator_addr}/"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert "alice-dropbox" in dom.stdout and "EdgeCourier edge manager" in dom.stdout, dom.stderr[-2000:]
    assert 'class="running"' in dom.stdout
    shot = tmp_path / "status.png"
    subprocess.run([chromium, *flags, "--window-size=1280,600", f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 5000
    out = os.environ.get("EC_SCREENSHOT_DIR")
    if out:
        shutil.copy(shot, Path(out) / "edge-manager-status.png")


# ------------------------------------------------------------------ users kept apart


def test_bob_cannot_see_drive_or_enrol_into_alices_instance(mgr, alice, bob):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    assert [i["id"] for i in bob.call("GET", "/v1/instances")["instances"]] == []
    for method, path in [("GET", "/v1/instances/alice-dropbox"), ("POST", "/v1/instances/alice-dropbox/stop"),
                         ("POST", "/v1/instances/alice-dropbox/revoke"), ("POST", "/v1/instances/alice-dropbox/start"),
                         ("DELETE", "/v1/instances/alice-dropbox"), ("GET", "/v1/instances/alice-dropbox/logs"),
                         ("GET", "/v1/instances/alice-dropbox/enrolment"), ("GET", "/v1/instances/nobody-at-all")]:
        status, body = bob.raw(method, path)
        # Invisible, not refused: the same answer as for an id that does not exist.
        assert status == 404 and body["error"]["code"] == "not_found", (method, path, status, body)
    status, body = bob.raw("POST", "/v1/instances", {"user": "alice", "service": "evil"})
    assert status == 403
    # The user administration does not exist for a device.
    assert bob.raw("GET", "/v1/users")[0] == 404
    assert bob.raw("POST", "/v1/users", {"user": "bob2"})[0] == 404
    assert mgr.operator().call("GET", "/v1/instances/alice-dropbox")["state"] == "running"


def test_bobs_keys_do_not_open_alices_instance(mgr, alice, bob):
    a = alice.call("POST", "/v1/join", {"service": "dropbox"})["enrolment"]
    b = bob.call("POST", "/v1/join", {"service": "dropbox"})["enrolment"]
    assert a["url"] != b["url"] and a["secret"] != b["secret"] and a["spki_sha256"] != b["spki_sha256"]
    # Bob's secret against Alice's address and pin: the EPS refuses (auth_failed).
    forged = EnrolmentBundle.from_dict({**a, "secret": b["secret"]})
    client = EpsClient(forged, label="bob-laptop")
    answer = client.hello()
    assert isinstance(answer, Fallback) and "auth_failed" in str(answer.error), answer


def test_an_instance_cannot_read_anothers_state_folder(mgr, alice, bob):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    bob.call("POST", "/v1/join", {"service": "dropbox"})
    alice_uid = uid_of(mgr, "alice-dropbox")
    bob_config = mgr.state / "instances" / "bob-dropbox" / "eps.json"
    probe = subprocess.run(
        ["python3", "-c", f"import os; os.setgid({alice_uid}); os.setgroups([]); os.setuid({alice_uid}); open({str(bob_config)!r}).read()"],
        capture_output=True, text=True)
    assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe.stderr


# ------------------------------------------------------------------ bad input and limits


@pytest.mark.parametrize("body,status,code", [
    (b"{not json", 400, "bad_request"),
    (b'{"user": "alice", "service": "x", "colour": "red"}', 400, "bad_request"),
    (b'{"user": "Alice!", "service": "x"}', 400, "bad_request"),
    (b'{"user": "alice", "service": "UPPER"}', 400, "bad_request"),
    (b'{"user": "nobody", "service": "x"}', 404, "not_found"),
    (b'{"service": "x"}', 400, "bad_request"),
    (b'{"user": "alice", "service": "x", "runtime": "vmware"}', 400, "bad_request"),
    (b'{"user": "alice", "service": "x", "limits": {"memory_bytes": -1}}', 400, "bad_request"),
])
def test_malformed_requests_get_a_clear_4xx(mgr, body, status, code):
    got, answer = mgr.operator().raw("POST", "/v1/instances", body)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert answer["error"]["message"]


@pytest.mark.parametrize("limits,name", [
    ({"memory_bytes": 64 << 30}, "memory_bytes"),
    ({"memory_bytes": 1 << 20}, "memory_bytes"),
    ({"cpu_millis": 64000}, "cpu_millis"),
    ({"pids": 100000}, "pids"),
])
def test_over_limit_requests_name_the_limit(mgr, limits, name):
    got, answer = mgr.operator().raw("POST", "/v1/instances", {"user": "bob", "service": "big", "limits": limits})
    assert got == 422 and answer["error"]["limit"] == name and name in answer["error"]["message"], answer


def test_instances_per_user_are_limited(mgr, alice):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    assert alice.raw("POST", "/v1/instances", {"service": "onedrive"})[0] == 400, "the user must be named"
    alice.call("POST", "/v1/instances", {"user": "alice", "service": "onedrive"})
    status, answer = alice.raw("POST", "/v1/instances", {"user": "alice", "service": "gdrive"})
    assert status == 422 and answer["error"]["limit"] == "max_instances", answer
    mgr.operator().call("DELETE", "/v1/instances/alice-onedrive")


def test_a_backend_this_host_lacks_is_named(mgr):
    status, answer = mgr.operator().raw("POST", "/v1/instances", {"user": "bob", "service": "box", "runtime": "docker"})
    assert status == 501 and answer["error"]["code"] == "runtime_unavailable"
    assert "docker" in answer["error"]["message"] and "not-built-here" in answer["error"]["message"], answer


def test_unknown_routes_big_bodies_and_bad_queries(mgr, alice):
    op = mgr.operator()
    assert op.raw("GET", "/v1/nothing")[0] == 404
    assert op.raw("POST", "/v1/instances/alice-dropbox/explode")[0] == 404
    assert op.raw("POST", "/v1/users", b"{" + b" " * (128 << 10) + b"}")[0] == 400
    assert op.raw("GET", "/v1/instances/alice-dropbox/logs?lines=0")[0] == 400
    # The operator cannot take the bundle: it is the user's device's only.
    assert op.raw("GET", "/v1/instances/alice-dropbox/enrolment")[0] == 403


def test_operator_cli_speaks_json_for_scripts(mgr, alice):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    out = mgr.cli("--json", "list")
    assert out.returncode == 0, out.stderr
    ids = [i["id"] for i in json.loads(out.stdout)["instances"]]
    assert "alice-dropbox" in ids
    bad = mgr.cli("create", "nobody")
    assert bad.returncode == 1 and "no user nobody" in bad.stderr


def test_operator_cli_into_a_reader_that_has_gone_ends_as_unix_tools_do(mgr, alice):
    """`ec-edge logs x | head`: once the reader has gone, the command ends
    as cat does (SIGPIPE, no words); it panicked with a backtrace."""
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    for args in (("list",), ("--json", "list"), ("logs", "alice-dropbox")):
        r, w = os.pipe()
        os.close(r)
        try:
            out = subprocess.run([str(EDGE_BIN), "--state", str(mgr.state), "--manager", f"http://{mgr.operator_addr}", *args],
                                 stdout=w, stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(w)
        assert out.returncode == -signal.SIGPIPE and out.stderr == "", (args, out.returncode, out.stderr)


# ------------------------------------------------------------------ crashes and restarts


def test_a_crashed_instance_is_reported_and_restarted_by_its_policy(mgr, alice):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    uid = uid_of(mgr, "alice-dropbox")
    [pid] = eps_pids(uid)
    before = mgr.operator().call("GET", "/v1/instances/alice-dropbox")
    os.kill(pid, signal.SIGKILL)
    after = wait_for(lambda: (i := mgr.operator().call("GET", "/v1/instances/alice-dropbox"))["crashes"] > before["crashes"] and i["state"] == "running" and i, what="crash detected and restart")
    assert "signal 9" in after["last_exit"]["reason"]
    assert "EPS ready" in after["last_exit"]["log_tail"]
    assert after["starts"] == before["starts"] + 1
    assert len(eps_pids(uid)) == 1


def test_restart_policy_never_leaves_it_crashed(mgr, bob):
    op = mgr.operator()
    op.call("POST", "/v1/instances", {"user": "bob", "service": "fragile", "restart": "never"})
    op.call("POST", "/v1/instances/bob-fragile/start")
    [pid] = eps_pids(uid_of(mgr, "bob-fragile"))
    os.kill(pid, signal.SIGKILL)
    inst = wait_for(lambda: (i := op.call("GET", "/v1/instances/bob-fragile"))["state"] == "crashed" and i, what="crashed")
    time.sleep(1.5)
    assert op.call("GET", "/v1/instances/bob-fragile")["state"] == "crashed" and inst["starts"] == 1
    uid = uid_of(mgr, "bob-fragile")
    op.call("DELETE", "/v1/instances/bob-fragile")
    assert not (mgr.state / "instances" / "bob-fragile").exists()
    assert not Path(f"/sys/fs/cgroup/memory/edgecourier/bob-fragile-u{uid}").exists()


def test_manager_killed_and_restarted_readopts_running_instances(mgr, alice):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    uid = uid_of(mgr, "alice-dropbox")
    [pid] = eps_pids(uid)
    mgr.restart()
    inst = mgr.operator().call("GET", "/v1/instances/alice-dropbox")
    assert inst["state"] == "running"
    assert eps_pids(uid) == [pid], "re-adopted, not started twice"
    # Still watched after adoption: a crash is seen and restarted.
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(eps_pids(uid)) == 1 and eps_pids(uid) != [pid], what="restart after adoption")


def test_manager_killed_mid_start_leaves_no_orphan_and_no_twin(mgr, bob):
    op = mgr.operator()
    op.call("POST", "/v1/instances", {"user": "bob", "service": "midstart"})
    uid = uid_of(mgr, "bob-midstart")
    import threading

    t = threading.Thread(target=lambda: op.raw("POST", "/v1/instances/bob-midstart/start"), daemon=True)
    t.start()
    wait_for(lambda: eps_pids(uid), timeout=10, what="the launch")
    mgr.kill()
    t.join(5)
    mgr.start()
    inst = wait_for(lambda: (i := mgr.operator().call("GET", "/v1/instances/bob-midstart"))["state"] in ("running", "stopped") and i, what="a settled state")
    pids = eps_pids(uid)
    assert (inst["state"] == "running" and len(pids) == 1) or (inst["state"] == "stopped" and pids == []), (inst, pids)
    mgr.operator().call("DELETE", "/v1/instances/bob-midstart")
    assert eps_pids(uid) == []


# ------------------------------------------------------------------ revoke and restore


def test_revoke_frees_resources_and_restore_keeps_the_state(mgr, alice):
    alice.call("POST", "/v1/join", {"service": "dropbox"})
    uid = uid_of(mgr, "alice-dropbox")
    store = mgr.state / "instances" / "alice-dropbox" / "store"
    before = sorted(p.name for p in store.rglob("*") if p.is_file() and "tmp" not in p.parts)
    revoked = alice.call("POST", "/v1/leave", {"service": "dropbox", "mode": "revoke"})
    assert revoked["state"] == "revoked" and revoked["device_url"] is None
    assert eps_pids(uid) == [] and not Path(f"/sys/fs/cgroup/memory/edgecourier/alice-dropbox-u{uid}").exists()
    assert alice.raw("GET", "/v1/instances/alice-dropbox/enrolment")[0] == 409
    joined = alice.call("POST", "/v1/join", {"service": "dropbox"})
    assert joined["instance"]["state"] == "running"
    after = sorted(p.name for p in store.rglob("*") if p.is_file() and "tmp" not in p.parts and p.name != "LOCK")
    assert set(b for b in before if b != "LOCK") <= set(after)
