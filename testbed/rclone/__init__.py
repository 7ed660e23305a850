"""Run Debian's rclone, unmodified, against the provider test servers.

rclone cannot be pointed at other host names for Dropbox or OneDrive, so it
reaches the testbed the way an app on a phone reaches the device proxy:
through an HTTPS proxy (`HTTPS_PROXY`). `MitmRedirect` starts a plain
mitmdump with `redirect_addon.py`, which sends every connection for a
provider host to the testbed's TLS listener while keeping the real name in
the Host header and in TLS (verified against the testbed's CA). rclone trusts
mitmproxy's CA (`--ca-cert`). In issue 4 the same proxy will run the
device-proxy addon instead; `RcloneRemote` only needs its URL and CA.

`RcloneRemote` writes an rclone.conf for one backend (dropbox, onedrive,
webdav with vendor nextcloud) with credentials the testbed accepts (a bearer
token that names the account and expires far in the future, so rclone never
tries to refresh it) and runs rclone commands with timeouts, returning parsed
output. Failures raise `RcloneError` with rclone's stderr.

    with MitmRedirect(providers, workdir) as proxy:
        remote = RcloneRemote("dropbox", providers, proxy.url, proxy.ca_cert, workdir)
        remote.copyto(local_file, "Docs/a.docx", "--dropbox-chunk-size", "256k")
        remote.hashsum("dropbox", "Docs")  # {"a.docx": "..."}
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

RCLONE = shutil.which("rclone") or "/usr/bin/rclone"
MITMDUMP = Path(sys.executable).parent / "mitmdump"
ADDON = Path(__file__).with_name("redirect_addon.py")
WEBDAV_HOST = "cloud.example.com"
#: A bearer token's expiry rclone will never reach: it then never calls the token URL.
FAR_EXPIRY = "2099-01-01T00:00:00Z"
#: The hash each backend reports for the testbed's files, as rclone names it.
HASH_TYPES = {"dropbox": "dropbox", "onedrive": "quickxor", "webdav": "sha1"}


def write_save(path: Path, data: bytes, save: int) -> None:
    """Writes the app's save number `save` (0, 1, ...) of a file that rclone
    will copy, stamped a minute after the save before it, as an app's later
    save is. rclone takes a file whose size and modification time match the
    remote's as unchanged, and Dropbox keeps times to the second: two saves
    of one size written within a second (a fast machine, an edit that kept
    the size) would look the same to it, and the second would not go up."""
    path.write_bytes(data)
    stamp = time.time() - 600 + 60 * save
    os.utime(path, (stamp, stamp))


class RcloneError(Exception):
    """rclone exited non-zero (or timed out); `stderr` holds its log."""

    def __init__(self, args: Sequence[str], returncode: Optional[int], stderr: str) -> None:
        super().__init__(f"rclone {' '.join(args)} -> {returncode}: {stderr.strip()[-2000:]}")
        self.args_run, self.returncode, self.stderr = list(args), returncode, stderr


class ProxyError(Exception):
    """mitmdump did not start."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graph_drive_id(account: str) -> str:
    """The drive id the testbed gives `account` (GET /v1.0/me/drive answers it too)."""
    import hashlib

    return hashlib.sha256(account.encode()).hexdigest()[:16]


class MitmRedirect:
    """A mitmdump on 127.0.0.1 that sends provider hosts to the testbed.

    `url` is the proxy URL for `HTTPS_PROXY`; `ca_cert` is mitmproxy's CA
    (created in `workdir/mitmproxy` on first start) for rclone's `--ca-cert`.
    """

    def __init__(self, providers: Any, workdir: Path, startup_timeout: float = 20,
                 extra_args: Sequence[str] = ()) -> None:
        self.providers = providers
        #: More mitmdump arguments, e.g. ("-s", "<device-proxy addon>", "--set", "k=v"): addons
        #: load in order, and the redirect only changes where upstream sockets go.
        self.extra_args = tuple(extra_args)
        self.confdir = Path(workdir) / "mitmproxy"
        self.confdir.mkdir(parents=True, exist_ok=True)
        self.log_path = Path(workdir) / "mitmdump.log"
        self.port = _free_port()
        self.startup_timeout = startup_timeout
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def command(self) -> list[str]:
        return [
            str(MITMDUMP), "--listen-host", "127.0.0.1", "--listen-port", str(self.port),
            "--set", f"confdir={self.confdir}", "-s", str(ADDON),
            "--set", f"testbed_upstream=127.0.0.1:{self.providers.tls_port}",
            "--set", f"ssl_verify_upstream_trusted_ca={Path(self.providers.ca).resolve()}",
            # No stream_large_bodies: an addon that rewrites uploads (the device proxy) needs whole bodies.
            *self.extra_args,
        ]

    def start(self) -> "MitmRedirect":
        self.proc = subprocess.Popen(self.command(), stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProxyError(f"mitmdump exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self.ca_cert.exists():
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ProxyError(f"mitmdump did not listen on {self.port} within {self.startup_timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "MitmRedirect":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass
class RcloneRemote:
    """One rclone remote named `tb` of `kind` ("dropbox", "onedrive", "webdav")."""

    kind: str
    providers: Any
    proxy_url: str
    ca_cert: Path
    workdir: Path
    account: str = "alice"
    #: OneDrive: "business" makes rclone 1.60 use quickxor; "personal" makes it use sha1.
    onedrive_drive_type: str = "business"
    #: Passed before every command's own arguments (fail fast: no hidden retries).
    base_flags: tuple[str, ...] = ("--retries", "1", "--low-level-retries", "1", "--contimeout", "10s", "--timeout", "60s")
    timeout: float = 180

    def __post_init__(self) -> None:
        if self.kind not in HASH_TYPES:
            raise ValueError(f"unknown rclone backend {self.kind!r}; use one of {sorted(HASH_TYPES)}")
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / f"rclone-{self.kind}.conf"
        self.config_path.write_text(self.config_text())

    # -- configuration -----------------------------------------------------

    def _token(self) -> str:
        return json.dumps({"access_token": self.account, "token_type": "bearer", "expiry": FAR_EXPIRY})

    def config_text(self) -> str:
        lines = ["[tb]"]
        if self.kind == "dropbox":
            lines += ["type = dropbox", f"token = {self._token()}"]
        elif self.kind == "onedrive":
            lines += ["type = onedrive", f"token = {self._token()}", f"drive_id = {graph_drive_id(self.account)}",
                      f"drive_type = {self.onedrive_drive_type}"]
        else:
            obscured = subprocess.run([RCLONE, "obscure", "testbed-password"], capture_output=True, text=True,
                                      check=True, timeout=30).stdout.strip()
            lines += ["type = webdav", f"url = https://{WEBDAV_HOST}/remote.php/dav/files/{self.account}",
                      "vendor = nextcloud", f"user = {self.account}", f"pass = {obscured}"]
        return "\n".join(lines) + "\n"

    @property
    def hash_type(self) -> str:
        if self.kind == "onedrive" and self.onedrive_drive_type == "personal":
            return "sha1"
        return HASH_TYPES[self.kind]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and not k.startswith("RCLONE_")}
        env["HTTPS_PROXY"] = self.proxy_url
        env["HTTP_PROXY"] = self.proxy_url
        return env

    def remote(self, path: str = "") -> str:
        return "tb:" + path.lstrip("/")

    # -- running -----------------------------------------------------------

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [RCLONE, "--config", str(self.config_path), "--ca-cert", str(self.ca_cert), *self.base_flags, *args]
        try:
            done = subprocess.run(cmd, env=self.env(), capture_output=True, timeout=self.timeout)
        except subprocess.TimeoutExpired as e:
            raise RcloneError(args, None, f"timed out after {self.timeout}s: {(e.stderr or b'').decode(errors='replace')}") from e
        if check and done.returncode != 0:
            raise RcloneError(args, done.returncode, done.stderr.decode(errors="replace"))
        return done

    def copyto(self, local: Path, path: str, *flags: str) -> None:
        self.run("copyto", *flags, str(local), self.remote(path))

    def copy(self, local_dir: Path, path: str, *flags: str) -> None:
        self.run("copy", *flags, str(local_dir), self.remote(path))

    def lsjson(self, path: str = "", *flags: str) -> list[dict[str, Any]]:
        return json.loads(self.run("lsjson", "--hash", *flags, self.remote(path)).stdout)

    def hashsum(self, path: str = "", hash_type: Optional[str] = None) -> dict[str, str]:
        """{relative name: hex digest} as rclone reads them from the provider."""
        out = self.run("hashsum", hash_type or self.hash_type, self.remote(path)).stdout.decode()
        sums = {}
        for line in out.splitlines():
            if line.strip():
                digest, name = line.split(None, 1)
                sums[name] = digest
        return sums

    def cat(self, path: str) -> bytes:
        return self.run("cat", self.remote(path)).stdout

    def check(self, local_dir: Path, path: str, *flags: str) -> str:
        """`rclone check` (by hash unless --download); raises when anything differs."""
        return self.run("check", *flags, str(local_dir), self.remote(path)).stderr.decode(errors="replace")

    def deletefile(self, path: str) -> None:
        self.run("deletefile", self.remote(path))
