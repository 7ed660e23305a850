"""End to end through the real device proxy: an app (here: the request shapes
of the providers' mobile apps, sent through the proxy as HTTPS_PROXY
clients send them) -> `ec-proxy` (mitmproxy + the addon) -> the real
`ec-eps` -> the provider test servers.

Checks the issue's promises: the provider holds exactly the bytes the app
uploaded after every save; a one-character edit costs at most 1,000 bytes
on the device-EPS link (HTTP framing included); the app is served directly
when the EPS is away; other hosts pass as opaque tunnels.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from pathlib import Path

import pytest

import app_client as app
from testbed.lab import Lab

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".cache" / "traces"


def dropbox_upload(proxy, token: str, path: str, data: bytes):
    return app.dropbox_upload(app.through(proxy), token, path, data)


def onedrive_put(proxy, token: str, path: str, data: bytes):
    return app.onedrive_put(app.through(proxy), token, path, data)


def held(lab: Lab, provider: str, path: str) -> dict:
    files = [f for f in lab.providers.files(provider) if f["path"].lower() == path.lower()]
    assert files, f"the {provider} server holds no {path}"
    return files[0]


status = app.proxy_status
sha = app.sha
via_proxy = app.via_proxy


def trace(name: str) -> tuple[bytes, bytes]:
    d = TRACES / name
    if not (d / "base.docx").exists():
        pytest.fail(f"trace {name} missing: run `make traces`")
    return (d / "base.docx").read_bytes(), (d / "new.docx").read_bytes()


ONE_CHAR = [f"writer-{size}-{where}-docx" for size in ("1k", "100k", "1m") for where in ("start", "middle", "end")]


@pytest.mark.parametrize("name", ONE_CHAR)
def test_one_character_edit_costs_at_most_1000_bytes_on_the_link(lab, eps, proxy, name):
    base, new = trace(name)
    path = f"/bytes/{name}.docx"
    token = "bytes-user"
    status_code, _, body = dropbox_upload(proxy, token, path, base)
    assert status_code == 200, body
    def sent() -> int:
        docs = [d for d in status(proxy)["documents"] if d["ref"].lower() == path.lower()]
        return docs[0]["sent_bytes"] if docs else 0

    before, arrived_before = sent(), eps.metric("ec_eps_device_bytes_total")
    status_code, headers, body = dropbox_upload(proxy, token, path, new)
    assert status_code == 200, body
    f = held(lab, "dropbox", path)
    assert f["sha256"] == sha(new) and f["size"] == len(new)
    assert json.loads(body)["content_hash"] == f["provider_hash"]["content_hash"]
    link = sent() - before  # both directions, HTTP framing included, as the proxy counted them
    arrived = eps.metric("ec_eps_device_bytes_total") - arrived_before  # what the EPS read (no framing)
    print(f"{name}: file {len(new)} bytes, device link {link} bytes, EPS read {arrived} bytes")
    assert 0 < arrived < link <= 1000, f"{link} bytes on the device link for a one-character edit of {name}"
    assert len(new) > 4000


def test_the_first_save_after_an_oauth_refresh_is_a_patch(lab, eps, proxy):
    """The device knows a Dropbox or OneDrive account by its bearer token
    (the key's account is a digest of it), and apps refresh their tokens
    (OneDrive's last an hour): the same document then has a new key. Before,
    its first save under the new token found no base and went whole (380 kB
    here); now the new key borrows the base of the same document under the
    old token, and the save is a patch. The provider (whose account is the
    user's, not the token's: `<x>~<n>` in the testbed) holds the new bytes."""
    base, new = trace("writer-1m-middle-docx")
    path = "/refresh/report.docx"
    code, _, body = dropbox_upload(proxy, "refresh-user", path, base)
    assert code == 200, body
    code, _, body = dropbox_upload(proxy, "refresh-user~2", path, new)
    assert code == 200, body
    f = held(lab, "dropbox", path)
    assert f["sha256"] == sha(new) and f["account"] == "refresh-user"
    docs = [d for d in status(proxy)["documents"] if d["ref"].lower() == path]
    assert len(docs) == 2, docs  # one key per token
    how = sorted((d["last_how"], d["sent_bytes"]) for d in docs)
    print(f"before and after the refresh (how, bytes to the EPS): {how}")
    assert [h for h, _ in how] == ["full", "patch"] and how[1][1] < 2000, how


def test_onedrive_simple_put_sequence(lab, proxy):
    token = "od-user"
    path = "/Documents/report.docx"
    versions = [trace("writer-100k-start-docx")[0], trace("writer-100k-start-docx")[1], trace("writer-100k-end-docx")[1]]
    for v in versions:
        code, _, body = onedrive_put(proxy, token, path, v)
        assert code in (200, 201), body
        f = held(lab, "graph", path)
        assert f["sha256"] == sha(v)
        assert json.loads(body)["file"]["hashes"]["quickXorHash"] == f["provider_hash"]["quickXorHash"]


def save_twice_then_stop(lab: Lab, proxy, token: str, path: str) -> None:
    """Saves writer-1k-middle-docx's two versions through `proxy` (each held
    by the provider, byte for byte, once answered), then stops the proxy."""
    try:
        for v in trace("writer-1k-middle-docx"):
            code, _, body = dropbox_upload(proxy, token, path, v)
            assert code == 200, body
            assert held(lab, "dropbox", path)["sha256"] == sha(v)
    finally:
        proxy.stop()


def test_eps_away_means_the_app_is_served_directly(lab):
    """No EPS listening: every save goes to the provider directly and whole, and succeeds."""
    save_twice_then_stop(lab, lab.start_proxy("no-eps", None), "direct-user", "/direct/a.docx")


def test_stdout_carries_the_ready_line_alone(lab, eps):
    """The log goes to stderr only: stdout holds the ready line and nothing
    after it, so a supervisor that reads the ready line and then leaves the
    pipe alone (the lab's `start_proxy`, the netlab, scripts) never sees
    the proxy block on a full pipe. mitmproxy's termlog printed every log
    record on stdout as well (twice the work per record), and a proxy of
    the lab stopped answering once about 64 KiB of them had piled up."""
    proxy = lab.start_proxy("stdout-laptop", eps)
    save_twice_then_stop(lab, proxy, "stdout-user", "/stdout/a.docx")
    assert proxy.proc.stdout.read() == "", "log lines on stdout after the ready line"
    log = proxy.log_path.read_text()
    assert "/stdout/a.docx saved via the EPS as a patch" in log and "client connect" in log, log[-2000:]


def test_provider_errors_reach_the_app_unchanged(lab, proxy, clean_faults):
    base, new = trace("writer-1k-start-docx")
    assert dropbox_upload(proxy, "err-user", "/err/a.docx", base)[0] == 200
    lab.providers.fault(provider="dropbox", route="upload", method="*", count=1, kind="throttle", retry_after=7)
    code, headers, body = dropbox_upload(proxy, "err-user", "/err/a.docx", new)
    assert code == 429 and headers.get("retry-after") == "7", (code, headers, body)
    assert held(lab, "dropbox", "/err/a.docx")["sha256"] == sha(base)
    # The next save (the app's retry) goes through, as a patch against the version the provider accepted.
    assert dropbox_upload(proxy, "err-user", "/err/a.docx", new)[0] == 200
    assert held(lab, "dropbox", "/err/a.docx")["sha256"] == sha(new)


def test_other_hosts_pass_as_opaque_tunnels(lab, proxy, tmp_path):
    """A TLS server the proxy does not intercept: the client sees the server's
    own certificate (not one made by the proxy's CA), so the tunnel was not
    decrypted."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("other.example.org")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nopaque")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    host, pport = proxy.listen.rsplit(":", 1)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)  # trusts ONLY the server's own CA, not the proxy's
    conn = http.client.HTTPSConnection(host, int(pport), context=client_ctx, timeout=30)
    conn.set_tunnel("127.0.0.1", port, headers={"Host": f"other.example.org:{port}"})
    # The name the certificate is for: connect by address, check the name.
    conn._tunnel_host = "127.0.0.1"
    try:
        client_ctx.check_hostname = False
        conn.request("GET", "/", headers={"Host": "other.example.org"})
        peer = conn.sock.getpeercert(binary_form=True)
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"opaque"
    finally:
        conn.close()
        listener.close()
    from cryptography import x509

    issuer = x509.load_der_x509_certificate(peer).issuer.rfc4514_string()
    assert "mitmproxy" not in issuer.lower(), f"the proxy decrypted a non-provider connection (issuer {issuer})"


def upload_directly(lab: Lab, token: str, path: str, data: bytes) -> None:
    """Another device changes the file: straight to the provider, not through this proxy."""
    context = ssl.create_default_context(cafile=str(lab.providers.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", lab.providers.tls_port, context=context, timeout=60)
    try:
        conn.putrequest("POST", "/2/files/upload", skip_host=True)
        for name, value in (("Host", "content.dropboxapi.com"), ("Authorization", f"Bearer {token}"),
                            ("Dropbox-API-Arg", json.dumps({"path": path, "mode": "overwrite"})),
                            ("Content-Type", "application/octet-stream"), ("Content-Length", str(len(data)))):
            conn.putheader(name, value)
        conn.endheaders(data)
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
    finally:
        conn.close()


def test_downloads_come_back_as_patches(lab, eps, proxy):
    """The device holds v0 (it uploaded it); another device uploads v1; the
    download through the proxy is a FETCH answered with a patch, rebuilt to
    exactly v1."""
    base, new = trace("writer-1m-middle-docx")
    token, path = "dl-user", "/dl/report.docx"
    assert dropbox_upload(proxy, token, path, base)[0] == 200
    upload_directly(lab, token, path, new)
    before = eps.metric("ec_eps_device_bytes_total", 'direction="out",kind="patch"')
    code, headers, body = via_proxy(proxy, "POST", "https://content.dropboxapi.com/2/files/download",
                                    {"Authorization": f"Bearer {token}", "Dropbox-API-Arg": json.dumps({"path": path})})
    assert code == 200 and body == new, (code, len(body))
    assert json.loads(headers["dropbox-api-result"])["content_hash"] == held(lab, "dropbox", path)["provider_hash"]["content_hash"]
    sent = eps.metric("ec_eps_device_bytes_total", 'direction="out",kind="patch"') - before
    assert 0 < sent < len(new) / 100, f"the download's patch was {sent} bytes for a {len(new)}-byte file"
    # The downloaded version is now the device's base: the next edit saves as a patch.
    status_code, _, _ = dropbox_upload(proxy, token, path, base)
    assert status_code == 200 and held(lab, "dropbox", path)["sha256"] == sha(base)
