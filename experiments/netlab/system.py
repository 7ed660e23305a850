"""EdgeCourier on the netns testbed: the real parts, each in its host.

- cloud: the provider test servers (`python -m testbed.providers serve`) on
  10.77.30.2:443 under the providers' real host names, with their test CA.
- ap: the edge manager (`ec-edge serve`, experiments/netlab/edge.py), which
  starts the user's EPS (the static `ec-eps`, process backend) when the
  device joins with the user's credential (`ec_proxy join` over the Wi-Fi
  link; the enrolment bundle pins the EPS's certificate); it uploads to the
  cloud over the WAN. With eps="direct", an `ec-eps` started by hand on
  10.77.10.2:8443 with a key made for the run.
- device: `ec-proxy` (mitmproxy and the EdgeCourier addon) and the app, an
  unmodified Debian rclone that reaches it through `HTTPS_PROXY`; and for
  the direct path (what a save costs today) a plain mitmdump with the
  testbed's redirect addon (testbed/rclone), so the same rclone uploads the
  whole file straight to the cloud.

Every process runs inside its namespace (`ip netns exec`) and is stopped
with the testbed. Bytes on the device's link are the kernel's counters of
the device's interface (Ethernet frames both ways: TCP/IP headers, TLS and
rclone's own API calls included).

    with Testbed("wifi-ac-far", "wan-fiber") as bed, EdgeCourier(bed, workdir) as ec:
        ec.app("edgecourier").copyto(path, "Docs/a.docx")
"""

from __future__ import annotations

import datetime
import hashlib
import json
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

from netlab import ADDR, REPO, NetlabError, Testbed

sys.path.insert(0, str(REPO))
from testbed.lab import PROVIDER_HOSTS, WEBDAV_HOST  # noqa: E402
from testbed.rclone import ADDON as REDIRECT_ADDON  # noqa: E402
from testbed.rclone import MITMDUMP, RCLONE, RcloneError, RcloneRemote  # noqa: E402

VENV_BIN = REPO / ".venv" / "bin"
PYTHON = VENV_BIN / "python"
CLOUD_TLS = f"{ADDR['cloud']}:443"
CLOUD_PLAIN = f"{ADDR['cloud']}:80"
EPS_LISTEN = f"{ADDR['ap']}:8443"
PROXY_PORT = 8080  # in the device's own namespace: always free
#: The app's user in transparent mode (Android gives every app a uid of its own from 10000).
APP_UID = 10123
DIRECT_PORT = 8081


def _read_json_line(proc: subprocess.Popen, what: str, log: Path, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        line = line.strip()
        if line.startswith("ready "):
            line = line[len("ready "):]
        if line.startswith("{"):
            return json.loads(line)
    proc.kill()
    raise NetlabError(f"{what} did not start; log {log}: {log.read_text()[-2000:] if log.exists() else ''}")


def _eps_certificate(folder: Path) -> bytes:
    """A self-signed P-256 certificate for the EPS's address; returns the SPKI pin (32 bytes)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "EdgeCourier EPS (netlab)")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ADDR["ap"]))]), False)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()


class NsRclone(RcloneRemote):
    """testbed.rclone's RcloneRemote, run inside a namespace (the device); with
    `uid`, as that unprivileged user and with no proxy setting at all (the
    transparent device: nftables sends its HTTPS to ec-proxy)."""

    netns: str = ""
    uid: Optional[int] = None

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.uid is not None:
            for key in [k for k in env if k.upper().endswith("_PROXY")]:
                del env[key]
            env["HOME"] = str(self.workdir)
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        user = [] if self.uid is None else ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}",
                                             "--clear-groups", "--"]
        cmd = ["ip", "netns", "exec", self.netns, *user, RCLONE, "--config", str(self.config_path), "--ca-cert",
               str(self.ca_cert), *self.base_flags, *args]
        try:
            done = subprocess.run(cmd, env=self.env(), capture_output=True, timeout=self.timeout)
        except subprocess.TimeoutExpired as e:
            raise RcloneError(args, None, f"timed out after {self.timeout}s") from e
        if check and done.returncode != 0:
            raise RcloneError(args, done.returncode, done.stderr.decode(errors="replace"))
        return done


class EdgeCourier:
    """Providers in the cloud, an EPS on the AP, ec-proxy and a direct proxy on the device."""

    def __init__(self, bed: Testbed, workdir: Path, decision: str = "bytes", account: str = "alice",
                 transparent: bool = False, eps: str = "manager") -> None:
        """transparent: the device as a rooted phone runs it: ec-proxy in mitmproxy's
        transparent mode, the app's HTTPS (uid APP_UID, port 443) redirected to it
        by nftables, provider names resolved by the device's /etc/hosts, and
        no proxy setting in the app.

        eps: "manager" (default): the AP's edge manager (edge.ApManager, the
        process backend) starts the user's EPS when the device joins with its
        user's credential (`ec_proxy join`, over the Wi-Fi link), as on a real
        access point; "direct": ec-eps started by hand on the AP with a key
        made here (the setup before the manager existed)."""
        if eps not in ("manager", "direct"):
            raise ValueError(eps)
        self.bed, self.workdir, self.decision, self.account = bed, Path(workdir), decision, account
        self.transparent = transparent
        self.eps = eps
        self.manager: Any = None
        #: The EPS's Prometheus metrics, reachable from the AP's namespace.
        self.eps_metrics_url = "http://127.0.0.1:9100/metrics"
        self.secret = secrets.token_bytes(32)
        self.ready: dict[str, Any] = {}

    def __enter__(self) -> "EdgeCourier":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        pass  # the testbed stops every process it started

    def start(self) -> None:
        w, bed = self.workdir, self.bed
        w.mkdir(parents=True, exist_ok=True)
        log = w / "providers.log"
        proc = bed.popen("cloud", [str(PYTHON), "-m", "testbed.providers", "serve", "--state", str(w / "providers-state"),
                                   "--certs", str(w / "providers-certs"), "--listen", CLOUD_TLS, "--plain-listen",
                                   CLOUD_PLAIN, "--webdav-host", WEBDAV_HOST],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True)
        self.ready["providers"] = _read_json_line(proc, "the provider servers", log)
        self.ca = Path(self.ready["providers"]["ca"]).resolve()

        if self.eps == "manager":
            self._start_manager()
        else:
            self._start_eps()

        lab_resolve = [a for h in PROVIDER_HOSTS for a in ("--lab-resolve", f"{h}={CLOUD_TLS}")]
        mode = []
        if self.transparent:
            mode = ["--mode", "transparent", "--listen-host", "127.0.0.1"]
            bed.hosts_file("device", {h: ADDR["cloud"] for h in PROVIDER_HOSTS})
            # Only the app's connections: the proxy's own and the direct baseline's go out untouched.
            rules = (f"table ip ec_device {{\n chain output {{\n  type nat hook output priority -100; policy accept;\n"
                     f"  meta skuid {APP_UID} tcp dport 443 redirect to :{PROXY_PORT}\n }}\n}}\n")
            bed.run_cmd("device", ["nft", "-f", "-"], input=rules, text=True, check=True)
            # The app's uid reads its configuration, the CA and the documents below w
            # (every folder above w must let it through too: the caller's business).
            w.chmod(0o755)

        log = w / "proxy.log"
        self.proxy_state = w / "proxy-state"
        if self.eps == "manager":
            # The device's own flow: join the AP's manager with the user's credential (over
            # the Wi-Fi link, TLS pinned to the manager), get the enrolment bundle, proxy.
            edge = ["join", "--manager", self.manager.device_listen, "--credential", f"@{self.credential_file}",
                    "--service", "dropbox"]
        else:
            edge = ["run", "--edge", f"https://{EPS_LISTEN}", "--pin", self.pin.hex(), "--secret", self.secret.hex()]
        proc = bed.popen("device", [str(PYTHON), "-m", "ec_proxy", *edge, "--port", str(PROXY_PORT),
                                    "--state", str(self.proxy_state), "--upstream-ca", str(self.ca),
                                    "--webdav-host", WEBDAV_HOST, "--decision", self.decision, *lab_resolve, *mode],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True)
        self.ready["proxy"] = _read_json_line(proc, "ec-proxy", log, timeout=180)
        self.proxy_pid = proc.pid  # `ip netns exec` execs the proxy: the same process
        if self.eps == "manager":
            instance = self.manager.operator_call("GET", "/v1/instances")["instances"][0]
            self.ready["eps"] = instance
            self.eps_metrics_url = f"http://{self.manager.management_addr(instance)}/metrics"
        self._start_direct()

    def _start_manager(self) -> None:
        """The AP's edge manager, and a user whose credential the device holds."""
        from edge import ApManager

        w = self.workdir
        ca = w / "providers-ca.pem"  # the manager copies it into each instance's folder
        shutil.copy(self.ca, ca)
        ca.chmod(0o644)
        w.chmod(0o711)  # instances run as their own uids below the manager's folder, not this one
        self.manager = ApManager(self.bed, "process", 4, ca, f"s{self.bed.run[-6:]}")
        credential = self.manager.add_user(f"s{self.bed.run[-6:]}{self.account}"[:32])
        self.credential_file = w / "credential"
        self.credential_file.write_text(credential)
        self.credential_file.chmod(0o600)

    def _start_eps(self) -> None:
        w, bed = self.workdir, self.bed
        self.pin = _eps_certificate(w / "eps-tls")
        config = {
            "listen": EPS_LISTEN, "management_listen": "127.0.0.1:9100",
            "tls": {"cert_pem": str(w / "eps-tls" / "cert.pem"), "key_pem": str(w / "eps-tls" / "key.pem")},
            "keys": [{"id": 1, "secret_hex": self.secret.hex()}],
            "accounts": [{"provider": "*", "account": "*"}],
            "upstream": {"resolve": {h: CLOUD_TLS for h in PROVIDER_HOSTS}, "extra_ca_pem_files": [str(self.ca)],
                         "webdav_hosts": [WEBDAV_HOST]},
        }
        (w / "eps").mkdir(exist_ok=True)  # the EPS keeps its state beside its configuration
        (w / "eps" / "eps.json").write_text(json.dumps(config, indent=1))
        log = w / "eps.log"
        proc = bed.popen("ap", [str(VENV_BIN / "ec-eps"), "serve", "--config", str(w / "eps" / "eps.json")],
                         stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True)
        self.ready["eps"] = _read_json_line(proc, "ec-eps", log)

    def _start_direct(self) -> None:
        w, bed = self.workdir, self.bed
        self.direct_conf = w / "direct-mitmproxy"
        log = w / "direct.log"
        bed.popen("device", [str(MITMDUMP), "--listen-host", "127.0.0.1", "--listen-port", str(DIRECT_PORT),
                             "--set", f"confdir={self.direct_conf}", "-s", str(REDIRECT_ADDON),
                             "--set", f"testbed_upstream={CLOUD_TLS}",
                             "--set", f"ssl_verify_upstream_trusted_ca={self.ca}"],
                  stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (self.direct_conf / "mitmproxy-ca-cert.pem").exists() or not self._listening(DIRECT_PORT):
            if time.monotonic() > deadline:
                raise NetlabError(f"the direct mitmdump did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _listening(self, port: int) -> bool:
        import socket

        def probe() -> bool:
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(("127.0.0.1", port)) == 0

        return self.bed.call("device", probe)

    def app(self, path: str, name: Optional[str] = None) -> NsRclone:
        """rclone (Dropbox backend) through ec-proxy (path "edgecourier") or straight to the cloud ("direct")."""
        if path == "edgecourier":
            url, ca = f"http://127.0.0.1:{PROXY_PORT}", self.proxy_state / "mitmproxy" / "mitmproxy-ca-cert.pem"
        elif path == "direct":
            url, ca = f"http://127.0.0.1:{DIRECT_PORT}", self.direct_conf / "mitmproxy-ca-cert.pem"
        else:
            raise ValueError(path)
        remote = NsRclone("dropbox", None, url, ca, self.workdir / f"rclone-{name or path}", account=self.account)
        remote.netns = self.bed.ns("device")
        if path == "edgecourier" and self.transparent:
            import os

            remote.uid = APP_UID
            for folder in (remote.workdir, ca.parent, ca.parent.parent):
                folder.chmod(0o755)
            os.chown(remote.workdir, APP_UID, APP_UID)
        return remote

    def admin(self, path: str) -> Any:
        def get() -> Any:
            request = urllib.request.Request(f"http://{CLOUD_PLAIN}/__testbed/{path}",
                                             headers={"Host": "graph.microsoft.com"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())

        return self.bed.call("cloud", get)

    def provider_file(self, path: str) -> Optional[dict[str, Any]]:
        """What the Dropbox server holds at `path` (sha256, provider_hash), or None."""
        for f in self.admin("files"):
            if f["provider"] == "dropbox" and f["path"].lower() == path.lower():
                return f
        return None

    def proxy_totals(self) -> dict[str, Any]:
        out = self.bed.run_cmd("device", [str(PYTHON), "-m", "ec_proxy", "status", "--state", str(self.proxy_state),
                                          "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
        if out.returncode:
            raise NetlabError(f"ec_proxy status failed: {out.stderr[-1000:]}")
        return json.loads(out.stdout)["total"]
