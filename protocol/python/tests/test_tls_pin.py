"""TLS with the SubjectPublicKeyInfo pin of §2.3, against the scripted EPS
stand-in (tests/scripted_eps.py) served over TLS with a fresh self-signed
certificate: the right pin works without any CA; a wrong pin sends nothing."""

import datetime
import hashlib
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import ec_protocol as p
from scripted_eps import SECRET, ScriptedEps, serve

DOC = p.DocKey(p.WEBDAV, b"user@dav.example", b"/a.docx")


@pytest.fixture(scope="module")
def cert_files(tmp_path_factory):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eps.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    d = tmp_path_factory.mktemp("tls")
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return d / "cert.pem", d / "key.pem", hashlib.sha256(spki).digest(), cert


@pytest.fixture
def tls_eps(cert_files):
    cert, key, pin, _ = cert_files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    eps = ScriptedEps()
    server = serve(eps, ctx)
    eps.url = f"https://127.0.0.1:{server.server_address[1]}"
    yield eps, pin
    server.shutdown()
    server.server_close()


def test_pin_of_certificate(cert_files):
    _, _, pin, cert = cert_files
    assert p.spki_sha256_of_der_certificate(cert.public_bytes(serialization.Encoding.DER)) == pin


def test_right_pin_saves_over_tls(tls_eps):
    eps, pin = tls_eps
    c = p.EpsClient(p.EnrolmentBundle(eps.url, 1, SECRET, spki_sha256=pin))
    out = c.save_single("PUT", "https://dav.example/remote.php/dav/files/u/a.docx", [("Authorization", "Basic x")], b"new", None, DOC)
    assert isinstance(out, p.ProviderResponse) and out.status == 200


def test_wrong_pin_sends_nothing(tls_eps):
    eps, pin = tls_eps
    wrong = bytes([pin[0] ^ 1]) + pin[1:]
    c = p.EpsClient(p.EnrolmentBundle(eps.url, 1, SECRET, spki_sha256=wrong))
    out = c.save_single("PUT", "https://dav.example/a.docx", [], b"new", None, DOC)
    # The cause is named (issue 8): a pin mismatch, with both pins (public values).
    assert isinstance(out, p.Fallback) and out.reason == "eps_pin_mismatch"
    assert c.pin_mismatch == (wrong.hex(), pin.hex())
    assert wrong.hex() in out.error.detail and pin.hex() in out.error.detail
    assert eps.received == 0


def test_right_pin_after_a_wrong_one_clears_the_mismatch(tls_eps):
    eps, pin = tls_eps
    wrong = bytes(32)
    c = p.EpsClient(p.EnrolmentBundle(eps.url, 1, SECRET, spki_sha256=wrong))
    assert c.hello().reason == "eps_pin_mismatch" and c.pin_mismatch is not None
    c._transport.pin = pin  # the enrolment fixed
    assert isinstance(c.hello(), p.HelloOk) and c.pin_mismatch is None


def test_kept_alive_tls_connection_is_reused(tls_eps):
    """The check for a connection the EPS closed (a readable idle socket)
    must not mistake TLS session tickets for a close: saves share one
    connection."""
    eps, pin = tls_eps
    c = p.EpsClient(p.EnrolmentBundle(eps.url, 1, SECRET, spki_sha256=pin))
    for n in range(3):
        out = c.save_single("PUT", "https://dav.example/remote.php/dav/files/u/a.docx", [("Authorization", "Basic x")],
                            b"new %d" % n, None, DOC)
        assert isinstance(out, p.ProviderResponse) and out.status == 200
    assert c._transport.requests_on_conn == 4  # HELLO and three saves on one connection

