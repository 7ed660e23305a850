"""Issue 8, item 6: a wrong pin must not silently turn EdgeCourier off.

The real EPS serves the device listener over TLS with a fresh self-signed
certificate; the real proxy (`ec-proxy`) is started with the right pin, a
wrong pin, or an EPS nobody runs. A wrong pin is safe (nothing reaches the
EPS, saves go directly to the provider) but must be noticed: an ERROR line
in the proxy's log naming the cause with both pins (public hashes, never a
secret), `python -m ec_proxy status` showing the EPS as "pin mismatch" with
the reason, and a counter that grows with every attempt.
"""

from __future__ import annotations

import datetime
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app_client import dropbox_upload, proxy_status, sha, through
from testbed.lab import TEST_SECRET, Eps, Lab, Proxy


def make_cert(folder: Path) -> tuple[Path, Path, bytes]:
    """A self-signed P-256 certificate: (cert.pem, key.pem, SPKI SHA-256 pin)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eps.lab")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return cert_path, key_path, hashlib.sha256(spki).digest()


@pytest.fixture(scope="module")
def tls_eps(lab, tmp_path_factory) -> tuple[Eps, bytes]:
    cert, key, pin = make_cert(tmp_path_factory.mktemp("eps-tls"))
    eps = lab.start_eps("health-tls", insecure_plain_http=False,
                        tls={"cert_pem": str(cert.resolve()), "key_pem": str(key.resolve())})
    return eps, pin


def start_tls_proxy(lab: Lab, name: str, eps: Eps, pin: bytes) -> Proxy:
    return lab.start_proxy(name, eps, "--edge", f"https://{eps.device}", "--pin", pin.hex())


def wait_eps_state(proxy: Proxy, state: str, timeout: float = 20) -> dict:
    """The `eps` part of the proxy's status once its state is `state` (the start probe)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = proxy_status(proxy).get("eps")
        if last and last["state"] == state:
            return last
        time.sleep(0.2)
    raise AssertionError(f"the proxy's status never showed the EPS as {state}: {last}")


def status_text(proxy: Proxy) -> str:
    out = subprocess.run([sys.executable, "-m", "ec_proxy", "status", "--state", str(proxy.state)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_wrong_pin_is_logged_shown_and_counted(lab, small, tls_eps):
    eps, pin = tls_eps
    wrong = hashlib.sha256(b"a certificate that is not the EPS's").digest()
    proxy = start_tls_proxy(lab, "health-wrong-pin", eps, wrong)
    try:
        # At start, before any save: the probe finds the mismatch.
        st = wait_eps_state(proxy, "pin_mismatch")
        assert f"pin mismatch: expected {wrong.hex()} got {pin.hex()}" in st["reason"], st
        assert st["counts"]["pin_mismatch"] == 1 and st["url"] == f"https://{eps.device}", st
        log = proxy.log_path.read_text(errors="replace")
        lines = [ln for ln in log.splitlines() if f"pin mismatch: expected {wrong.hex()} got {pin.hex()}" in ln]
        assert lines and all(" ERROR " in ln for ln in lines), lines
        text = status_text(proxy)
        assert "PIN MISMATCH" in text and f"expected {wrong.hex()} got {pin.hex()}" in text, text
        assert "1 pin mismatch" in text, text

        # A save is safe: it goes directly and lands; the counter grows.
        token, path = "health-wrong-pin", "/health/pinned.docx"
        r = dropbox_upload(through(proxy), token, path, small.v0)
        assert 200 <= r[0] < 300, r
        assert any(f["path"].lower() == path and f["sha256"] == sha(small.v0) for f in lab.providers.files("dropbox"))
        st = proxy_status(proxy)
        assert st["eps"]["state"] == "pin_mismatch" and st["eps"]["counts"]["pin_mismatch"] == 2, st["eps"]
        assert st["documents"][0]["last_how"] == "direct" and st["documents"][0]["last_reason"] == "eps_pin_mismatch"
        # Nothing secret in the log or the status.
        log = proxy.log_path.read_text(errors="replace")
        assert TEST_SECRET.hex() not in log and TEST_SECRET.hex() not in text
    finally:
        proxy.stop()


def test_right_pin_is_shown_ok_and_saves_go_through_the_eps(lab, small, tls_eps):
    eps, pin = tls_eps
    proxy = start_tls_proxy(lab, "health-right-pin", eps, pin)
    try:
        st = wait_eps_state(proxy, "ok")
        assert st["counts"] == {"pin_mismatch": 0, "unreachable": 0, "auth_failed": 0, "outcome_unknown": 0}, st
        token, path = "health-right-pin", "/health/ok.docx"
        send = through(proxy)
        for v in (small.v0, small.v1):
            r = dropbox_upload(send, token, path, v)
            assert 200 <= r[0] < 300, r
        doc = proxy_status(proxy)["documents"][0]
        assert doc["last_how"] == "patch", doc
        assert "EPS https://" in status_text(proxy)
    finally:
        proxy.stop()


def test_eps_not_running_is_shown_unreachable(lab):
    proxy = lab.start_proxy("health-no-eps", None)
    try:
        st = wait_eps_state(proxy, "unreachable")
        assert "cannot connect to the EPS" in st["reason"] and st["counts"]["unreachable"] >= 1, st
        assert "UNREACHABLE" in status_text(proxy)
    finally:
        proxy.stop()
