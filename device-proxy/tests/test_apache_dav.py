"""A real WebDAV server nobody here wrote as the provider: Debian's Apache
httpd with mod_dav (`testbed.apache.ApacheDav`), and Debian's rclone
(webdav backend, vendor other) saving three versions of LibreOffice
documents to it through ec-proxy and the real EPS; and the same saves
straight to Apache with no proxy at all, for comparison.

Checked: rclone's own check (by content, `--download`: plain WebDAV has no
hash), Apache's files holding exactly rclone's bytes, and the saves after
the first travelling as patches.
"""

from __future__ import annotations

import hashlib
import shutil

import pytest

from link_tap import LinkTap, breakdown
from sdk_lab import LINK_BOUND, Tapped, documents, report
from testbed import apache
from testbed.lab import PROVIDER_HOSTS, WEBDAV_HOST, Lab
from testbed.rclone import RCLONE, RcloneRemote

DAV_HOST = "dav.example.org"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    problem = apache.available()
    if problem:
        pytest.fail(problem)
    if shutil.which("rclone") is None:
        pytest.fail("rclone is not installed: `make setup` installs it from Debian")
    work = tmp_path_factory.mktemp("apache-dav")
    with Lab(work) as lab:
        with apache.ApacheDav(work / "apache", lab.providers.ca.parent, DAV_HOST) as dav:
            here = f"127.0.0.1:{lab.providers.tls_port}"
            eps = lab.start_eps("apache-user", upstream={
                "resolve": {**{h: here for h in PROVIDER_HOSTS}, DAV_HOST: f"127.0.0.1:{dav.port}"},
                "webdav_hosts": [WEBDAV_HOST, DAV_HOST],
            })
            tap = LinkTap(eps.device).start()  # the device link, for its bytes per save
            proxy = lab.start_proxy("apache-laptop", Tapped(tap.url), "--webdav-host", DAV_HOST,
                                    "--lab-resolve", f"{DAV_HOST}=127.0.0.1:{dav.port}")
            try:
                yield lab, dav, eps, proxy, tap
            finally:
                report(tap, "apache-dav")
                tap.stop()


def remote(work, proxy_url: str, ca, url: str) -> RcloneRemote:
    r = RcloneRemote("webdav", None, proxy_url, ca, work)
    import subprocess

    obscured = subprocess.run([RCLONE, "obscure", "x"], capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    r.config_path.write_text(f"[tb]\ntype = webdav\nurl = {url}\nvendor = other\nuser = alice\npass = {obscured}\n")
    return r


@pytest.mark.parametrize("route", ["edgecourier", "direct"])
def test_rclone_to_apache_mod_dav(setup, route, tmp_path):
    lab, dav, eps, proxy, tap = setup
    if route == "edgecourier":
        r = remote(tmp_path / "rclone", proxy.url, proxy.ca, f"https://{DAV_HOST}/dav/{route}")
    else:  # no proxy: Apache's own address, its certificate from the testbed CA
        r = remote(tmp_path / "rclone", "", lab.providers.ca, f"https://127.0.0.1:{dav.port}/dav/{route}")
    dav.mkdir(route)
    v = documents()
    local = tmp_path / "local"
    local.mkdir()
    patch_before = eps.metric("ec_eps_device_bytes_total", 'kind="patch"')
    mark = tap.mark()
    for version in (v.v0, v.v1, v.v2):
        (local / "Report.docx").write_bytes(version)
        r.copy(local, "Docs", "--ignore-times")
        report = r.check(local, "Docs", "--download")
        assert "0 differences found" in report and "1 matching files" in report, report
        held = (dav.root / route / "Docs" / "Report.docx").read_bytes()
        assert hashlib.sha256(held).digest() == hashlib.sha256(version).digest()
        assert r.cat("Docs/Report.docx") == version
    patch_bytes = eps.metric("ec_eps_device_bytes_total", 'kind="patch"') - patch_before
    if route == "edgecourier":
        assert 0 < patch_bytes < 2 * LINK_BOUND, f"{patch_bytes} patch bytes for two one-word edits"
        saves = [breakdown(ex) for ex in tap.exchanges(mark) if ex.path == "/ec/1/save"]
        patched = [b.total for b in saves if any("payload (patch)" in p.name for p in b.parts)]
        # the device link of each save after the first, both directions, HTTP framing included
        assert len(patched) == 2 and all(t < LINK_BOUND for t in patched), [b.total for b in saves]
    else:
        assert patch_bytes == 0
