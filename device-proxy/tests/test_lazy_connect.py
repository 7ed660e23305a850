"""Issue 13: an upload that goes to the EPS opens no connection from the
device to the provider. mitmproxy's default eager strategy opened the
upstream TCP and TLS connection at the app's CONNECT (about 7 kB per save
on the device's link, docs/experiments.md); `ec_proxy.lazy` makes provider
hosts lazy while other hosts keep the eager strategy (their tunnels are
tested in test_proxy_e2e, the direct path with the EPS away too)."""

from __future__ import annotations

import io
import zipfile

import app_client as app


def docx(text: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", f"<w:document><w:body><w:t>{text}</w:t></w:body></w:document>")
    return buf.getvalue()


def test_saves_through_the_eps_open_no_connection_to_the_provider(lab, eps):
    proxy = lab.start_proxy("lazy", eps, unrouted=frozenset({"content.dropboxapi.com"}))
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
