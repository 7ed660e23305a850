"""Issue 13: an upload that goes to the EPS opens no connection from the
device to the provider. mitmproxy's default eager strategy opened the
upstream TCP and TLS connection at the app's CONNECT (about 7 kB per save
on the device's link, docs/experiments.md); `ec_proxy.lazy` makes provider
hosts lazy while other hosts keep the eager strategy (their tunnels are
tested in test_proxy_e2e, the direct path with the EPS away too)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import zipfile

import app_client as app
from testbed.lab import PROVIDER_HOSTS, ROOT, TEST_SECRET, WEBDAV_HOST, Proxy


def start_proxy(lab, eps, name: str, unrouted: set[str]) -> Proxy:
    """ec-proxy as `Lab.start_proxy` starts it, except that the `unrouted`
    provider hosts are not routed to the lab's servers: as in production,
    the proxy would reach them under their real names (which do not resolve
    here), and lazy connections apply to them (ec_proxy.lazy.intercepted)."""
    state = lab.workdir / f"proxy-{name}"
    state.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "ec_proxy", "run", "--edge", eps.url, "--secret", TEST_SECRET.hex(), "--plain-edge",
            "--port", "0", "--state", str(state), "--upstream-ca", str(lab.providers.ca.resolve()),
            "--webdav-host", WEBDAV_HOST, "--decision", "bytes"]
    for h in PROVIDER_HOSTS:
        if h not in unrouted:
            args += ["--lab-resolve", f"{h}=127.0.0.1:{lab.providers.tls_port}"]
    log_path = state / "proxy.log"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log_path, "ab"), text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            proxy = Proxy(proc, json.loads(line)["listen"][0], state, log_path)
            lab.proxies.append(proxy)
            return proxy
    proc.kill()
    raise RuntimeError(f"the device proxy did not start; log: {log_path.read_text()[-2000:]}")


def docx(text: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", f"<w:document><w:body><w:t>{text}</w:t></w:body></w:document>")
    return buf.getvalue()


def test_saves_through_the_eps_open_no_connection_to_the_provider(lab, eps):
    proxy = start_proxy(lab, eps, "lazy", {"content.dropboxapi.com"})
    try:
        text = " ".join(f"word{i}" for i in range(20_000))
        versions = [docx(text), docx(text + " one"), docx(text + " one two")]
        for n, v in enumerate(versions):
            # A new connection per save, as rclone makes (a new process each time).
            code, _, body = app.dropbox_upload(app.through(proxy), "lazy-user", "/lazy/a.docx", v)
            assert code == 200, (n, body)
            held = [f for f in lab.providers.files("dropbox") if f["path"] == "/lazy/a.docx"]
            assert held and held[0]["sha256"] == app.sha(v)
        docs = [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == "/lazy/a.docx"]
        assert docs, "the proxy recorded the saves"
        # The EPS performed every upload on its own (wired) side; the device's
        # proxy never tried to connect to the provider host (eagerly it would
        # have, at every CONNECT, and the app would have got a 502: the name
        # does not resolve here).
        log = proxy.log_path.read_text()
        assert "server connect" not in log and "Cannot connect" not in log, log[-3000:]
    finally:
        proxy.stop()
