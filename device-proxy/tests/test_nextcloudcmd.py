"""Nextcloud's desktop client (`nextcloudcmd` from Debian's
nextcloud-desktop-cmd, unmodified) syncing a folder to the testbed's
Nextcloud through ec-proxy and the real EPS, and through a plain mitmproxy
for comparison.

The client first asks `status.php` and the OCS capabilities and user
(issue 11: it stopped at "Error connecting to server" without them), then
PROPFINDs and PUTs with `OC-Checksum`. Three syncs of a LibreOffice
document: the provider holds exactly the file, the client's own journal
agrees, the syncs after the first travel as patches, and nothing but the
document enters the device's store (status.php was stored as one).
`--trust` makes the client accept the proxy's certificate (it has no
option for a CA file).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time

import pytest

from app_client import proxy_status
from sdk_lab import LINK_BOUND, ROUTES, SdkLab, documents, sdk_lab

NEXTCLOUDCMD = shutil.which("nextcloudcmd") or "/usr/bin/nextcloudcmd"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not os.path.exists(NEXTCLOUDCMD):
        pytest.fail("nextcloudcmd is not installed (scripts/setup-system installs Debian's nextcloud-desktop-cmd)")
    yield from sdk_lab(tmp_path_factory, "nextcloudcmd")


def sync(lab: SdkLab, route: str, user: str, local, home) -> str:
    out = subprocess.run([NEXTCLOUDCMD, "--non-interactive", "--trust", "--httpproxy", lab.route(route).url,
                          "--max-sync-retries", "1", "-u", user, "-p", "secret", str(local), "https://cloud.example.com"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(home)))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


@pytest.mark.parametrize("route", ROUTES)
def test_nextcloudcmd_syncs_a_folder(lab: SdkLab, route: str, tmp_path):
    user = f"nc-{route}"
    local, home = tmp_path / "local", tmp_path / "home"
    local.mkdir()
    home.mkdir()
    v = documents()
    sent = []
    for i, version in enumerate((v.v0, v.v1, v.v2)):
        doc = local / "Report.docx"
        doc.write_bytes(version)
        stamp = time.time() - 300 + i * 60  # a newer mtime each time, and not "just now" (the client waits out files still being written)
        os.utime(doc, (stamp, stamp))
        before = lab.sent("/report.docx") if route == "edgecourier" else 0
        log = sync(lab, route, user, local, home)
        assert "Error connecting to server" not in log
        held = lab.held("webdav", user)
        assert held["/Report.docx"]["sha256"] == hashlib.sha256(version).hexdigest(), i
        sent.append((lab.sent("/report.docx") if route == "edgecourier" else 0) - before)
    if route == "edgecourier":
        assert sent[0] > len(v.v0) / 2 and all(0 < s < LINK_BOUND for s in sent[1:]), sent
        refs = [d["ref"] for d in proxy_status(lab.proxy)["documents"] if d["account"].startswith(user)]
        assert refs == ["/Report.docx"], refs  # status.php, OCS answers and folders are not documents
