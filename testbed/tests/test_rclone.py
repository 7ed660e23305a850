"""rclone (Debian's 1.60, webdav backend, vendor nextcloud) against the WebDAV
server: real office documents go up and come back byte-exact, rclone's TLS
verification uses only the test CA, and the name cloud.example.com resolves to
127.0.0.1 inside a private mount namespace (a bind-mounted /etc/hosts), so
nothing on the machine changes. Skipped when rclone or `unshare` is missing
or the test is not running as root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.shared import corpus

CORPUS = corpus()
DOCS = ["docx/word-web_office365.docx", "docx/libreoffice7.1-win_conversion.docx"]

pytestmark = pytest.mark.skipif(
    shutil.which("rclone") is None or shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs rclone (apt-get install rclone), unshare and root",
)


def _docs() -> list[Path]:
    found = [CORPUS / d for d in DOCS if (CORPUS / d).exists()]
    for sub in ("xlsx", "odt"):
        found += sorted((CORPUS / sub).glob("*"))[:1] if (CORPUS / sub).is_dir() else []
    return found


def rclone(server, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    hosts = tmp / "hosts"
    if not hosts.exists():
        hosts.write_text(Path("/etc/hosts").read_text() + "\n127.0.0.1 cloud.example.com\n")
    obscured = subprocess.run(["rclone", "obscure", "secret"], capture_output=True, text=True, check=True).stdout.strip()
    env = {
        **os.environ,
        "RCLONE_CONFIG": str(tmp / "rclone.conf"),
        "RCLONE_WEBDAV_URL": f"https://cloud.example.com:{server.tls_port}/remote.php/dav/files/alice",
        "RCLONE_WEBDAV_VENDOR": "nextcloud",
        "RCLONE_WEBDAV_USER": "alice",
        "RCLONE_WEBDAV_PASS": obscured,
    }
    (tmp / "rclone.conf").touch()
    cmd = ["rclone", "--ca-cert", server.ready["ca"], *args]
    script = f"mount --bind {hosts} /etc/hosts && exec \"$@\""
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *cmd], env=env, capture_output=True, text=True, timeout=120)


def test_rclone_copies_real_documents_up_and_back(server, client, tmp_path):
    docs = _docs()
    assert docs, f"no documents under {CORPUS}"
    src, back = tmp_path / "src", tmp_path / "back"
    src.mkdir()
    for d in docs:
        shutil.copy(d, src / d.name)
    up = rclone(server, tmp_path, "copy", str(src), ":webdav:Sync")
    assert up.returncode == 0, up.stderr

    stored = {Path(f["path"]).name: f for f in client.files("webdav")}
    for d in docs:
        assert stored[d.name]["sha256"] == hashlib.sha256(d.read_bytes()).hexdigest()
    puts = [e for e in client.log() if e["method"] == "PUT"]
    assert len(puts) == len(docs)
    for e in puts:
        assert e["authorization_present"]
        name = e["path"].rsplit("/", 1)[-1]
        sha1 = hashlib.sha1((src / name).read_bytes()).hexdigest()
        # rclone's nextcloud vendor sends the SHA1 as OC-Checksum; the server checked it
        # (the log keeps header names as sent: Go writes "Oc-Checksum")
        headers = {k.lower(): v for k, v in e["headers"].items()}
        assert headers.get("oc-checksum", "").lower() == f"sha1:{sha1}"

    down = rclone(server, tmp_path, "copy", ":webdav:Sync", str(back))
    assert down.returncode == 0, down.stderr
    for d in docs:
        assert (back / d.name).read_bytes() == d.read_bytes()

    # rclone reads the checksums back from PROPFIND (oc:checksums)
    sums = rclone(server, tmp_path, "sha1sum", ":webdav:Sync")
    assert sums.returncode == 0, sums.stderr
    listed = dict(reversed(line.split(None, 1)) for line in sums.stdout.splitlines() if line.strip())
    for d in docs:
        assert listed[d.name] == hashlib.sha1(d.read_bytes()).hexdigest()
