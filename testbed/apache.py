"""A real WebDAV server that nobody here wrote: Debian's Apache httpd with
mod_dav and mod_dav_fs, over TLS with a certificate from the testbed's CA.

`ApacheDav(workdir, ca_dir, host)` writes a self-contained configuration
(its own ServerRoot, modules loaded from Debian's
/usr/lib/apache2/modules, one TLS listener on a free loopback port, a `Dav
On` folder at `/dav/`, no authentication: Apache ignores the Basic
credentials rclone sends) and runs `apache2 -DFOREGROUND`. The files
written by clients are plain files in `root`. Clients reach it under
`host` through the lab's name routing (`--lab-resolve`, the EPS's
`resolve`), exactly like the provider test servers.

    with ApacheDav(work, lab.providers.ca.parent, "dav.example.org") as dav:
        dav.url  # https://dav.example.org/dav/ ; dav.port on 127.0.0.1
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

APACHE = shutil.which("apache2") or "/usr/sbin/apache2"
MODULES = Path("/usr/lib/apache2/modules")
#: mod_dav, its filesystem provider and TLS, plus what the configuration itself needs.
NEEDED = ("mpm_event", "authz_core", "authn_core", "dav", "dav_fs", "ssl", "socache_shmcb", "mime", "dir", "alias", "setenvif")


def available() -> Optional[str]:
    """None when Apache with mod_dav can run here, else what is missing."""
    if not Path(APACHE).exists():
        return "apache2 is not installed (scripts/setup-system installs Debian's apache2)"
    missing = [m for m in NEEDED if not (MODULES / f"mod_{m}.so").exists()]
    return f"Apache modules missing: {missing}" if missing else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApacheDav:
    def __init__(self, workdir: Path, ca_dir: Path, host: str = "dav.example.org") -> None:
        self.workdir = Path(workdir).resolve()
        self.ca_dir = Path(ca_dir)
        self.host = host
        self.port = _free_port()
        # Apache's workers run as www-data, which cannot enter pytest's
        # owner-only folders: the served tree and the lock database live in
        # a world-traversable folder of their own, removed by stop().
        self.shared = Path(tempfile.mkdtemp(prefix="ec-apache-"))
        self.shared.chmod(0o755)
        self.root = self.shared / "dav"
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"https://{self.host}/dav/"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"

    def _certificate(self) -> tuple[Path, Path]:
        import trustme

        ca = trustme.CA.from_pem((self.ca_dir / "ca.pem").read_bytes(), (self.ca_dir / "ca-key.pem").read_bytes())
        leaf = ca.issue_cert(self.host, "127.0.0.1")
        cert, key = self.workdir / "server.crt", self.workdir / "server.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        key.chmod(0o600)
        return cert, key

    def config(self, cert: Path, key: Path, user: str) -> str:
        modules = "\n".join(f"LoadModule {m}_module {MODULES}/mod_{m}.so" for m in NEEDED)
        return f"""ServerRoot "{self.workdir}"
ServerName {self.host}
PidFile "{self.workdir}/httpd.pid"
ErrorLog "{self.error_log}"
LogLevel warn
{modules}
User {user}
Group {user}
Listen 127.0.0.1:{self.port}
TypesConfig /etc/mime.types
DavLockDB "{self.shared}/lock/davlock"
DocumentRoot "{self.root}"
SSLEngine on
SSLCertificateFile "{cert}"
SSLCertificateKeyFile "{key}"
SSLSessionCache "shmcb:{self.workdir}/ssl_scache(512000)"
Mutex file:{self.workdir}/lock default
<Directory />
    AllowOverride None
    Require all denied
</Directory>
Alias /dav "{self.root}"
<Directory "{self.root}">
    Dav On
    Require all granted
</Directory>
"""

    def start(self, timeout: float = 20) -> "ApacheDav":
        problem = available()
        if problem:
            raise RuntimeError(problem)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.shared / "lock").mkdir(exist_ok=True)
        (self.workdir / "lock").mkdir(exist_ok=True)  # the parent's mutexes
        self.root.mkdir(exist_ok=True)
        cert, key = self._certificate()
        user = "www-data" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:  # the worker processes run as www-data and write the files and the lock database
            entry = pwd.getpwnam(user)
            for p in (self.root, self.shared / "lock"):
                os.chown(p, entry.pw_uid, entry.pw_gid)
        conf = self.workdir / "httpd.conf"
        conf.write_text(self.config(cert, key, user))
        self.proc = subprocess.Popen([APACHE, "-f", str(conf), "-DFOREGROUND"], stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / "stderr.log", "ab"), env={"PATH": os.environ.get("PATH", "")})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"apache2 exited {self.proc.returncode}: "
                                   f"{(self.workdir / 'stderr.log').read_text()[-1500:]} {self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"apache2 did not listen on {self.port}: {self._log_tail()}")

    def mkdir(self, rel: str) -> Path:
        """A collection under the DAV root, writable by Apache's workers."""
        path = self.root / rel
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            entry = pwd.getpwnam("www-data")
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    def _log_tail(self) -> str:
        return self.error_log.read_text()[-1500:] if self.error_log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the parent stops its workers
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.shared, ignore_errors=True)

    def __enter__(self) -> "ApacheDav":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
