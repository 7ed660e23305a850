"""The test CA and the server certificate, made with trustme.

The CA is kept in the certificates folder (`ca.pem` and `ca-key.pem`) and
reused on the next start, so clients configured once (the EPS trust store, a
mitmproxy upstream bundle, rclone `--ca-cert`) keep working across restarts.
Written files:

- `ca.pem`: the test CA certificate; give it to clients.
- `bundle.pem`: the system's CA bundle followed by the test CA, for clients
  that take a single trust file and also need real CAs.
- `server.pem`: the server key and certificate chain, for all provider names.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme

SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def server_names(webdav_hosts: list[str], graph_upload_host: str) -> list[str]:
    names = [
        "content.dropboxapi.com",
        "api.dropboxapi.com",
        "graph.microsoft.com",
        graph_upload_host,
        "api.onedrive.com",
        "*.sharepoint.com",
        "*.files.1drv.com",
        "www.googleapis.com",
        *webdav_hosts,
        "localhost",
        "127.0.0.1",
    ]
    return list(dict.fromkeys(names))


def prepare(cert_dir: Path, names: list[str]) -> tuple[ssl.SSLContext, dict[str, str]]:
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = cert_dir / "ca.pem", cert_dir / "ca-key.pem"
    if ca_cert.exists() and ca_key.exists():
        ca = trustme.CA.from_pem(ca_cert.read_bytes(), ca_key.read_bytes())
    else:
        ca = trustme.CA(organization_name="EdgeCourier testbed")
        ca.cert_pem.write_to_path(str(ca_cert))
        ca.private_key_pem.write_to_path(str(ca_key))
        ca_key.chmod(0o600)
    leaf = ca.issue_cert(*names)
    server_pem = cert_dir / "server.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    server_pem.chmod(0o600)
    system = next((Path(p) for p in SYSTEM_BUNDLES if Path(p).exists()), None)
    bundle = (system.read_bytes() if system else b"") + b"\n" + ca_cert.read_bytes()
    (cert_dir / "bundle.pem").write_bytes(bundle)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(server_pem))
    return ctx, {"ca": str(ca_cert), "bundle": str(cert_dir / "bundle.pem"), "server": str(server_pem)}
