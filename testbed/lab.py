"""The lab: local provider servers plus EPS instances, for tests, benchmarks
and the demo.

`Lab` starts the provider test servers (`python -m testbed.providers`) and
any number of EPS instances (the real static `ec-eps` binary from
`.venv/bin`, one process per user), each configured exactly as in
production except for two lab settings: the providers' real host names
resolve to the local servers, and the test CA is trusted. Devices talk to
an instance with the real device codec (`ec_protocol.EpsClient`).

    with Lab(tmp_path) as lab:
        eps = lab.start_eps("alice")
        client = eps.client()
        outcome = client.save_single("POST", "https://content.dropboxapi.com/2/files/upload", headers, data, None, doc)
        lab.provider_files("dropbox")      # what the provider holds, with hashes

Everything here is plain subprocess management: no part of the project is
replaced by a stand-in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
EPS_BIN = Path(os.environ.get("EC_EPS_BIN", VENV_BIN / "ec-eps"))
EPS_FAILPOINTS_BIN = VENV_BIN / "ec-eps-failpoints"
TEST_SECRET = bytes(range(32))
#: The provider host names the EPS resolves to the local servers.
PROVIDER_HOSTS = (
    "content.dropboxapi.com",
    "api.dropboxapi.com",
    "graph.microsoft.com",
    "api.onedrive.com",
    "testbed.files.1drv.com",
    "www.googleapis.com",
    "cloud.example.com",
)
WEBDAV_HOST = "cloud.example.com"


@dataclass
class Providers:
    """The running provider test servers."""

    proc: subprocess.Popen
    ready: dict[str, Any]
    tls_port: int
    plain_port: int
    state: Path
    certs: Path
    log_path: Path

    @property
    def ca(self) -> Path:
        return Path(self.ready["ca"])

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """Calls the admin API (/__testbed/) over the plain listener."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.plain_port}/__testbed/{path}",
            data=data,
            method=method,
            headers={"Host": "graph.microsoft.com", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def files(self, provider: Optional[str] = None) -> list[dict[str, Any]]:
        return [f for f in self.admin("GET", "files") if provider in (None, f["provider"])]

    def log(self) -> list[dict[str, Any]]:
        return self.admin("GET", "log")

    def fault(self, **spec: Any) -> Any:
        return self.admin("POST", "faults", spec)

    def clear_faults(self) -> Any:
        return self.admin("DELETE", "faults")


def start_providers(workdir: Path, *extra: str) -> Providers:
    """Starts the provider servers with a TLS and a plain listener on free ports."""
    state, certs = workdir / "providers-state", workdir / "providers-certs"
    log_path = workdir / "providers.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.providers", "serve", "--state", str(state), "--certs", str(certs),
         "--listen", "127.0.0.1:0", "--plain-listen", "127.0.0.1:0", "--webdav-host", WEBDAV_HOST, *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log_path, "wb"), text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"the provider servers did not start: {line!r}; log: {log_path.read_text()}")
    ready = json.loads(line[len("ready "):])
    port = lambda k: int(ready[k].rsplit(":", 1)[1])  # noqa: E731
    return Providers(proc, ready, port("https"), port("http"), state, certs, log_path)


@dataclass
class Eps:
    """One running EPS instance (one user)."""

    name: str
    state: Path
    config_path: Path
    proc: Optional[subprocess.Popen] = None
    device: str = ""
    management: str = ""
    log_path: Path = field(default_factory=Path)
    binary: Path = EPS_BIN
    #: Open-file limit (soft and hard) to start the process with; None: inherited.
    nofile: Optional[int] = None

    @property
    def url(self) -> str:
        return f"http://{self.device}"

    def bundle(self, secret: bytes = TEST_SECRET, key_id: int = 1):
        from ec_protocol.client import EnrolmentBundle

        return EnrolmentBundle(url=self.url, key_id=key_id, secret=secret, plain_http=True)

    def client(self, secret: bytes = TEST_SECRET, key_id: int = 1, **kw: Any):
        from ec_protocol.client import EpsClient

        kw.setdefault("label", self.name)
        return EpsClient(self.bundle(secret, key_id), **kw)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.management}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        """Sum of the samples of `name` whose label text contains `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name) and (line[len(name)] in " {") and labels in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def start(self, env: Optional[dict[str, str]] = None, timeout: float = 20) -> "Eps":
        """Starts the process and waits for its `ready` line."""
        self.log_path = self.state / "eps.log"
        e = dict(os.environ)
        e.update(env or {})
        limit = None
        if self.nofile is not None:
            import resource

            n = self.nofile
            limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))  # noqa: E731
        self.proc = subprocess.Popen(
            [str(self.binary), "serve", "--config", str(self.config_path)],
            stdout=subprocess.PIPE, stderr=open(self.log_path, "ab"), text=True, env=e, preexec_fn=limit,
        )
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()
        if not line.strip().startswith("{") or time.monotonic() > deadline:
            self.proc.kill()
            raise RuntimeError(f"EPS {self.name} did not start: {line!r}; log: {self.log_path.read_text()}")
        ready = json.loads(line)
        self.device, self.management = ready["device"], ready["management"]
        return self

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def sleeping_at_fail_point(self) -> bool:
        """Whether a thread of the process sleeps in nanosleep: the `sleep(ms)`
        action of a fail point (nothing else in the EPS sleeps that way;
        tokio parks in epoll or futexes)."""
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                if "nanosleep" in (task / "wchan").read_text():
                    return True
            except OSError:
                continue
        return False

    def wait_at_fail_point(self, running, timeout: float = 30) -> None:
        """Waits until the EPS sleeps at its fail point while the future
        `running` (a save in another thread) is under way; raises
        AssertionError if the save ended first (the point is not on its
        path) or the point is not reached in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sleeping_at_fail_point():
                return
            if running.done():
                raise AssertionError(f"the save ended without reaching the fail point: {running.result()!r}")
            time.sleep(0.01)
        raise AssertionError("the EPS did not reach the fail point")

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the state folder can tell."""
        self.stop(signal.SIGKILL)

    def restart(self, env: Optional[dict[str, str]] = None) -> "Eps":
        """Restarts on the same ports so clients keep their URL."""
        self.stop()
        cfg = json.loads(self.config_path.read_text())
        cfg["listen"], cfg["management_listen"] = self.device, self.management
        self.config_path.write_text(json.dumps(cfg, indent=1))
        return self.start(env)


@dataclass
class Proxy:
    """One running device proxy (`python -m ec_proxy run`)."""

    proc: subprocess.Popen
    listen: str
    state: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    @property
    def ca(self) -> Path:
        """The CA the proxy signs provider hosts with: apps must trust it."""
        return self.state / "mitmproxy" / "mitmproxy-ca-cert.pem"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Lab:
    """Provider servers plus EPS instances, stopped on exit."""

    def __init__(self, workdir: Path, provider_args: tuple[str, ...] = ()) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.providers = start_providers(self.workdir, *provider_args)
        self.instances: list[Eps] = []
        self.proxies: list[Proxy] = []

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def eps_config(self, *, accounts: Optional[list[dict[str, str]]] = None, secret: bytes = TEST_SECRET, **overrides: Any) -> dict[str, Any]:
        """A lab configuration: plain HTTP on loopback, providers resolved to the local servers."""
        addr = f"127.0.0.1:{self.providers.tls_port}"
        cfg: dict[str, Any] = {
            "listen": "127.0.0.1:0",
            "management_listen": "127.0.0.1:0",
            "insecure_plain_http": True,
            "keys": [{"id": 1, "secret_hex": secret.hex()}],
            "accounts": accounts if accounts is not None else [{"provider": "*", "account": "*"}],
            "upstream": {
                "resolve": {h: addr for h in PROVIDER_HOSTS},
                "extra_ca_pem_files": [str(self.providers.ca.resolve())],
                "webdav_hosts": [WEBDAV_HOST],
            },
        }
        upstream = overrides.pop("upstream", None)
        if upstream:
            cfg["upstream"].update(upstream)
        cfg.update(overrides)
        return cfg

    def start_eps(self, name: str, *, binary: Path = EPS_BIN, env: Optional[dict[str, str]] = None,
                  nofile: Optional[int] = None, **config: Any) -> Eps:
        """Creates a state folder for `name` and starts its EPS (`nofile`: its open-file limit)."""
        state = self.workdir / f"eps-{name}"
        state.mkdir(parents=True, exist_ok=True)
        config_path = state / "eps.json"
        config_path.write_text(json.dumps(self.eps_config(**config), indent=1))
        eps = Eps(name, state, config_path, binary=binary, nofile=nofile)
        self.instances.append(eps)
        return eps.start(env)

    def start_proxy(self, name: str, eps: Optional[Eps], *extra: str, secret: bytes = TEST_SECRET, timeout: float = 30,
                    unrouted: frozenset[str] = frozenset(), upstream_port: Optional[int] = None) -> Proxy:
        """Starts the device proxy for `eps` (None: an EPS URL nobody listens
        on, for fallback tests), routing provider hosts to the local servers
        (but the `unrouted` ones, which it would reach under their real names),
        or to `upstream_port` on the loopback (a relay in front of them)."""
        state = self.workdir / f"proxy-{name}"
        state.mkdir(parents=True, exist_ok=True)
        edge = eps.url if eps is not None else "http://127.0.0.1:9"
        command = [sys.executable, "-m", "ec_proxy", "run", "--edge", edge, "--secret", secret.hex(), "--plain-edge",
                   "--port", "0", "--state", str(state)]
        proxy, _ = self.launch_proxy(command, list(extra), state, timeout, "the device proxy did not start", unrouted,
                                     upstream_port)
        return proxy

    def launch_proxy(self, command: list[str], extra: list[str], state: Path, timeout: float, failure: str,
                     unrouted: frozenset[str] = frozenset(), upstream_port: Optional[int] = None) -> tuple[Proxy, float]:
        """Runs an `ec_proxy` command line (`run` or `join`: `command`, then
        the lab's options, then `extra`, which may override them) until its
        ready line. The lab's options: its CA, its WebDAV host, the
        byte-minimising rule, provider hosts routed to the local servers but
        the `unrouted` ones. Returns the proxy (stopped by `close()`) and the
        seconds to that line; raises `failure` with the proxy's log when it
        does not get there."""
        args = [*command, "--upstream-ca", str(self.providers.ca.resolve()), "--webdav-host", WEBDAV_HOST,
                # On loopback the link-aware rule may find a patch not worth it; the lab
                # wants a patch whenever it is smaller (pass --decision hybrid to override).
                "--decision", "bytes", *extra]
        for h in PROVIDER_HOSTS:
            if h not in unrouted:
                args += ["--lab-resolve", f"{h}=127.0.0.1:{upstream_port or self.providers.tls_port}"]
        log_path = state / "proxy.log"
        t0 = time.monotonic()
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log_path, "ab"), text=True)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                proxy = Proxy(proc, json.loads(line)["listen"][0], state, log_path)
                self.proxies.append(proxy)
                return proxy, time.monotonic() - t0
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{failure}; log: {log_path.read_text()[-3000:]}")

    def close(self) -> None:
        for x in self.proxies:
            x.stop()
        for e in self.instances:
            e.stop()
        if self.providers.proc.poll() is None:
            self.providers.proc.terminate()
            try:
                self.providers.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.providers.proc.kill()
