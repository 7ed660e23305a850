"""`ec-eps check-config` (issue 8 item 6): a secret anyone can guess is
refused, a management listener on all interfaces is warned about unless the
configuration says so on purpose, and the connection settings and the
protocol and patch limits are checked. `ec-eps check-store` reports a store
as JSON. Both end as Unix tools do when their reader has gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from testbed.lab import EPS_BIN, TEST_SECRET


def check(tmp_path, **overrides) -> subprocess.CompletedProcess:
    cfg = {
        "listen": "127.0.0.1:0",
        "management_listen": "127.0.0.1:0",
        "insecure_plain_http": True,
        "keys": [{"id": 1, "secret_hex": TEST_SECRET.hex()}],
        "accounts": [{"provider": "*", "account": "*"}],
    }
    cfg.update(overrides)
    path = tmp_path / "eps.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([str(EPS_BIN), "check-config", "--config", str(path)], capture_output=True, text=True, timeout=30)


def test_a_good_configuration_passes_without_a_word(tmp_path):
    r = check(tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("secret", [bytes(32), b"\x01" * 32, bytes([0, 1]) * 16], ids=["zero", "one-byte", "pattern"])
def test_a_guessable_secret_is_refused(tmp_path, secret):
    r = check(tmp_path, keys=[{"id": 1, "secret_hex": secret.hex()}])
    assert r.returncode == 2, r
    assert "distinct byte values" in r.stderr and "random" in r.stderr


@pytest.mark.parametrize("addr", ["0.0.0.0:9100", "[::]:9100"])
def test_management_on_all_interfaces_is_warned_about(tmp_path, addr):
    r = check(tmp_path, management_listen=addr)
    assert r.returncode == 0
    assert "warning" in r.stderr and "all interfaces" in r.stderr and "allow_public_management" in r.stderr
    r = check(tmp_path, management_listen=addr, allow_public_management=True)
    assert r.returncode == 0 and r.stderr == ""


def test_connection_settings_are_checked(tmp_path):
    assert check(tmp_path, connections={"max": 0}).returncode == 2
    assert check(tmp_path, connections={"header_timeout_s": 0}).returncode == 2
    assert check(tmp_path, connections={"max_conns": 5}).returncode == 2  # unknown key
    assert check(tmp_path, patch_limits={"max_parts": 5}).returncode == 2  # unknown patch limit
    assert check(tmp_path, patch_limits={"max_part_size": 1 << 40}).returncode == 2  # only lowered
    assert check(tmp_path, limits={"max_inflight": 1000}).returncode == 2
    r = check(tmp_path, connections={"idle_timeout_s": 30})
    assert r.returncode == 0 and "120" in r.stderr
    r = check(tmp_path, connections={"max": 64, "tls_handshake_timeout_s": 5}, memory_limit_bytes=256 << 20,
              patch_limits={"max_part_size": 1 << 20})
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_wrongly_typed_value_is_named_by_its_key(tmp_path):
    r = check(tmp_path, connections={"max": "many"})
    assert r.returncode == 2 and "at `connections.max`" in r.stderr, r.stderr
    r = check(tmp_path, keys=[{"id": 1, "secret_hex": 7}])
    assert r.returncode == 2 and "at `keys[0].secret_hex`" in r.stderr, r.stderr


def test_the_kept_content_idle_time_is_checked(tmp_path):
    for bad in (-1, 86_401, "30"):
        r = check(tmp_path, kept_content_idle_s=bad)
        assert r.returncode == 2 and "kept_content_idle_s" in r.stderr, (bad, r.stderr)
    for good in (0, 2.5, 600):
        r = check(tmp_path, kept_content_idle_s=good)
        assert r.returncode == 0 and r.stderr == "", (good, r.stderr)


def test_check_store_reports_an_empty_store_as_consistent(tmp_path):
    r = subprocess.run([str(EPS_BIN), "check-store", "--state", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["consistent"] is True and report["documents"] == 0 and report["problems"] == []


@pytest.mark.parametrize("command", ["check-store", "check-config"])
def test_a_check_into_a_reader_that_has_gone_ends_as_unix_tools_do(tmp_path, command):
    """`ec-eps check-store --state s | head -c0`: the check ends by SIGPIPE and
    says nothing, as cat does. Before, println! panicked with a backtrace
    (exit 101)."""
    path = tmp_path / "eps.json"
    check(tmp_path)  # writes a good configuration to eps.json
    args = ["--state", str(tmp_path)] if command == "check-store" else ["--config", str(path)]
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([str(EPS_BIN), command, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=30)
    finally:
        os.close(write)
    assert r.returncode == -signal.SIGPIPE, (r.returncode, r.stderr)
    assert r.stderr == ""
