"""The app side of the device proxy's end-to-end tests: HTTPS requests sent
through `ec-proxy` as an app configured with HTTPS_PROXY sends them, or
straight to the provider test servers with no EdgeCourier at all, in the
request shapes of the providers' mobile apps. (A module of its own, not
`conftest`: several test folders of the repository have a conftest.)"""

from __future__ import annotations

import hashlib
import http.client
import json
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlsplit

from testbed.lab import Lab, Proxy

TRACES = Path(__file__).resolve().parents[2] / ".cache" / "traces"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- the app


Reply = tuple[int, dict, bytes]


def via_proxy(proxy: Proxy, method: str, url: str, headers: dict[str, str], body: bytes = b"") -> Reply:
    """One HTTPS request through the proxy (CONNECT), trusting the proxy's
    CA, as an app configured with HTTPS_PROXY sends it."""
    parts = urlsplit(url)
    host, port = proxy.listen.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(proxy.ca))
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=120)
    conn.set_tunnel(parts.hostname, parts.port or 443)
    try:
        conn.request(method, parts.path + ("?" + parts.query if parts.query else ""), body=body, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def direct(lab: Lab, method: str, url: str, headers: dict[str, str], body: bytes = b"") -> Reply:
    """The same request sent to the provider with no EdgeCourier at all."""
    parts = urlsplit(url)
    context = ssl.create_default_context(cafile=str(lab.providers.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", lab.providers.tls_port, context=context, timeout=120)
    try:
        conn.request(method, parts.path + ("?" + parts.query if parts.query else ""), body=body,
                     headers={"Host": parts.hostname, **headers})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


Send = Callable[[str, str, dict[str, str], bytes], Reply]


def through(proxy: Proxy) -> Send:
    return lambda method, url, headers, body=b"": via_proxy(proxy, method, url, headers, body)


def straight(lab: Lab) -> Send:
    return lambda method, url, headers, body=b"": direct(lab, method, url, headers, body)


DROPBOX_UPLOAD = "https://content.dropboxapi.com/2/files/upload"


def dropbox_upload(send: Send, token: str, path: str, data: bytes, mode: object = "overwrite") -> Reply:
    """The Dropbox mobile apps' shape: one /2/files/upload with the whole file."""
    arg = json.dumps({"path": path, "mode": mode, "autorename": False, "mute": False})
    return send("POST", DROPBOX_UPLOAD,
                {"Authorization": f"Bearer {token}", "Dropbox-API-Arg": arg, "Content-Type": "application/octet-stream"}, data)


def graph_url(path: str, query: str = "") -> str:
    return f"https://graph.microsoft.com/v1.0/me/drive/root:{path}:/content" + (f"?{query}" if query else "")


def onedrive_put(send: Send, token: str, path: str, data: bytes, if_match: Optional[str] = None) -> Reply:
    """The OneDrive apps' simple upload: PUT /me/drive/root:/{path}:/content."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    if if_match is not None:
        headers["If-Match"] = if_match
    return send("PUT", graph_url(path), headers, data)


def proxy_status(proxy: Proxy) -> dict:
    """`python -m ec_proxy status --json` of a running proxy."""
    out = subprocess.run([sys.executable, "-m", "ec_proxy", "status", "--state", str(proxy.state), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@dataclass(frozen=True)
class Versions:
    """Three successive LibreOffice saves of one document: the last-synced
    one (v0), the save that meets the fault (v1) and the next edit (v2)."""

    v0: bytes
    v1: bytes
    v2: bytes

    def name(self, digest: Optional[str]) -> str:
        return {sha(self.v0): "v0", sha(self.v1): "v1", sha(self.v2): "v2"}.get(digest, f"other ({digest})")


def trace_versions(first: str, second: str) -> Versions:
    """v0 and v1: the base and the edit of trace `first`; v2: the edit of trace `second`."""
    d, e = TRACES / first, TRACES / second
    return Versions((d / "base.docx").read_bytes(), (d / "new.docx").read_bytes(), (e / "new.docx").read_bytes())
