"""The edge manager in the lab: a real `ec-edge serve` with its launcher
and the real static `ec-eps`, its instances configured like the lab's EPS
instances (provider host names resolved to the local test servers, the
test CA trusted), plus a small client for its two listeners.

    with Lab(tmp) as lab, EdgeManager(lab, tmp / "edge") as edge:
        cred = edge.add_user("alice")                  # ecu1.alice.<secret>.<pin>
        dev = edge.device(cred)                        # the user's device: TLS pinned to the manager
        joined = dev.call("POST", "/v1/join", {"service": "dropbox"})
        bundle = EnrolmentBundle.from_dict(joined["enrolment"])

Nothing is replaced by a stand-in: the client is `http.client` over TLS
with the pin check a device does.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import hashlib
import http.client
import json
import os
import queue
import shutil
import secrets
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from testbed.lab import EPS_BIN, VENV_BIN, Lab, Proxy

EDGE_BIN = Path(os.environ.get("EC_EDGE_BIN", VENV_BIN / "ec-edge"))
LAUNCHER_BIN = Path(os.environ.get("EC_LAUNCHER_BIN", VENV_BIN / "ec-launcher"))


def free_port_block(n: int, start: int = 20000, end: int = 32000) -> int:
    """A port `p` such that p .. p+n-1 are free now (a lab manager's slots)."""
    import random

    for _ in range(200):
        base = random.randrange(start, end - n)
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free block of ports")


class ApiError(Exception):
    """A 4xx/5xx answer of the manager."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body

    @property
    def code(self) -> str:
        return self.body.get("error", {}).get("code", "")


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    h = dict(headers)
    if data is not None:
        h["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    raw = r.read()
    ctype = r.getheader("content-type", "")
    value: Any = json.loads(raw) if raw and "json" in ctype else raw.decode(errors="replace")
    return r.status, value


class _Client:
    """`call` is `raw` that raises ApiError on a 4xx/5xx answer."""

    def raw(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        raise NotImplementedError

    def call(self, method: str, path: str, body: Any = None) -> Any:
        status, value = self.raw(method, path, body)
        if status >= 400:
            raise ApiError(status, value if isinstance(value, dict) else {"raw": value})
        return value


class Operator(_Client):
    """The operator's client: plain HTTP on loopback, bearer token."""

    def __init__(self, addr: str, token: str, timeout: float = 120) -> None:
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.token = token
        self.timeout = timeout

    def raw(self, method: str, path: str, body: Any = None, headers: Optional[dict[str, str]] = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            return _request(conn, method, path, body, {"Authorization": f"Bearer {self.token}", **(headers or {})})
        finally:
            conn.close()



def parse_credential(credential: str) -> tuple[str, str, bytes]:
    """`ecu1.<user>.<secret>.<manager pin hex>` → (user, secret, pin)."""
    parts = credential.strip().split(".")
    if len(parts) != 4 or parts[0] != "ecu1":
        raise ValueError("a credential looks like ecu1.<user>.<secret>.<pin>")
    return parts[1], parts[2], bytes.fromhex(parts[3])


class Device(_Client):
    """A user's device: TLS to the manager's device listener, the
    certificate checked against the pin in the credential, HTTP Basic."""

    def __init__(self, addr: str, credential: str, timeout: float = 120) -> None:
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.user, self.secret, self.pin = parse_credential(credential)
        self.timeout = timeout

    def raw(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        from ec_protocol.client import spki_sha256_of_der_certificate

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the pin below replaces CA validation
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=ctx)
        try:
            conn.connect()
            der = conn.sock.getpeercert(binary_form=True)
            if der is None or spki_sha256_of_der_certificate(der) != self.pin:
                raise ssl.SSLError("the manager's certificate does not match the credential's pin")
            auth = base64.b64encode(f"{self.user}:{self.secret}".encode()).decode()
            return _request(conn, method, path, body, {"Authorization": f"Basic {auth}"})
        finally:
            conn.close()



def wait_for(pred, timeout: float = 20, what: str = "condition", every: float = 0.1):
    """Polls `pred` every `every` s until it returns something true, which is returned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


class StartPool:
    """Instance starts (joins) on `workers` threads, like a
    `concurrent.futures.ThreadPoolExecutor`, except that nothing waits for
    a start under way once its caller walks away from it.

    A ThreadPoolExecutor's threads are joined when the interpreter exits
    (`concurrent.futures.thread._python_exit`), even after
    `shutdown(wait=False)`: an interrupted run then hangs at its very end
    until every join, first save or guest boot under way has timed out
    (minutes; the testbed it talks to is gone by then). These threads are
    daemons: an interrupted run stops its manager and testbed, and exits.

        pool = StartPool(4, initializer=netlab.enter_netns, initargs=(ns,))
        futures = [pool.submit(start, i) for i in range(n)]
        ...
        pool.shutdown(wait=not interrupted, cancel_futures=interrupted)
    """

    def __init__(self, workers: int, initializer: Any = None, initargs: tuple = ()) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._initializer, self._initargs = initializer, initargs
        self._pending: list[Any] = []
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"start-{k}")
                         for k in range(max(1, workers))]
        for t in self._threads:
            t.start()

    def submit(self, fn: Any, *args: Any) -> "cf.Future[Any]":
        future: "cf.Future[Any]" = cf.Future()
        self._pending.append(future)
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        try:
            if self._initializer is not None:
                self._initializer(*self._initargs)
        except BaseException as error:  # noqa: BLE001 - every start this thread takes fails with it
            while (item := self._queue.get()) is not None:
                if item[0].set_running_or_notify_cancel():
                    item[0].set_exception(error)
            return
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it began
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 - handed to the caller's result()
                future.set_exception(error)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Ends the threads once the queue drains; `cancel_futures` drops the
        starts not begun; `wait` waits for those under way (never do that
        when interrupted)."""
        if cancel_futures:
            for future in self._pending:
                future.cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()


def host_address() -> str:
    """An address of this host that a container reaches it on (docker0's, else the default route's source)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True)
    for word in out.stdout.split():
        if "/" in word and word[0].isdigit():
            return word.split("/")[0]
    out = subprocess.run(["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True)
    words = out.stdout.split()
    if "src" in words:
        return words[words.index("src") + 1]
    raise RuntimeError("no host address a container could reach the provider test servers on")


def edge_template(lab: "Lab", runtime: str) -> dict[str, Any]:
    """The instances' configuration beyond what the manager writes: the
    provider host names resolved to the lab's servers, the lab CA trusted
    (the manager copies the CA file into each instance's folder). A
    container does not see the host's loopback: it reaches the servers at
    the host's address."""
    cfg = lab.eps_config()
    if runtime in ("docker", "microvm"):
        addr = f"{host_address()}:{lab.providers.tls_port}"
        cfg["upstream"]["resolve"] = {h: addr for h in cfg["upstream"]["resolve"]}
    return cfg


def vm_args(lab: "Lab") -> tuple[str, ...]:
    """A microvm manager's network for a lab: a /24 of its own (64 slots;
    random, so that concurrent managers differ), and the provider servers
    on this host as the one host service its guests may reach."""
    return ("--vm-subnet", f"10.209.{secrets.randbelow(256)}.0/24",
            "--vm-allow-host", f"{host_address()}:{lab.providers.tls_port}")


class ManagerClient:
    """What a test does with a running manager, wherever it runs: a class
    with `operator_addr`, `device_addr` and `state` (the folder holding
    `operator.token`) gets its clients and its operator command line."""

    state: Path
    #: Seconds the operator command line may take.
    cli_timeout: float = 120
    #: Seconds one operator API request may take (a start waits for the EPS).
    http_timeout: float = 120

    @property
    def token(self) -> str:
        return (self.state / "operator.token").read_text().strip()

    def operator(self) -> Operator:
        return Operator(self.operator_addr, self.token, self.http_timeout)  # type: ignore[attr-defined]

    def device(self, credential: str) -> Device:
        return Device(self.device_addr, credential)  # type: ignore[attr-defined]

    def add_user(self, user: str, **kw: Any) -> str:
        return self.operator().call("POST", "/v1/users", {"user": user, **kw})["credential"]

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """The operator's command line (this machine's ec-edge) against this manager."""
        return subprocess.run([str(EDGE_BIN), "--state", str(self.state), "--manager", f"http://{self.operator_addr}", *args],  # type: ignore[attr-defined]
                              capture_output=True, text=True, timeout=self.cli_timeout)


class EdgeManager(ManagerClient):
    """One running `ec-edge serve` with its state folder."""

    def __init__(self, lab: Lab, state: Path, *, runtime: str = "process", slots: int = 16, extra: tuple[str, ...] = (), template: Optional[dict] = None) -> None:
        self.lab = lab
        # Instances run as their own uids and must traverse every folder above
        # their state; pytest keeps its base folder 0700 (and resets it), so the
        # manager's state lives in a folder of its own under /tmp, linked from `state`.
        self.state = Path(tempfile.mkdtemp(prefix="ec-edge-lab-"))
        self.state.chmod(0o711)
        link = Path(state)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(self.state)
        self.runtime = runtime
        self.slots = slots
        self.extra = extra
        tpl = lab.eps_config() if template is None else template
        for k in ("listen", "management_listen", "keys", "insecure_plain_http"):
            tpl.pop(k, None)
        (self.state / "eps-template.json").write_text(json.dumps(tpl, indent=1))
        base = free_port_block(2 * slots)
        self.device_port_base, self.management_port_base = base, base + slots
        # Uids of their own too, so that two lab managers never share one.
        self.uid_base = 300000 + (base % 10000) * 100
        self.proc: Optional[subprocess.Popen] = None
        self.ready: dict[str, Any] = {}
        self.start()

    def args(self) -> list[str]:
        return [
            str(EDGE_BIN), "--state", str(self.state), "serve",
            # A restart keeps the addresses, so that clients keep their URLs.
            "--operator-listen", self.ready.get("operator", "127.0.0.1:0"), "--device-listen", self.ready.get("device", "127.0.0.1:0"),
            "--advertise", "127.0.0.1",
            "--device-port-base", str(self.device_port_base), "--management-port-base", str(self.management_port_base),
            "--max-slots", str(self.slots), "--runtime", self.runtime, "--uid-base", str(self.uid_base),
            "--eps-binary", str(EPS_BIN), "--launcher", str(LAUNCHER_BIN),
            "--eps-template", str(self.state / "eps-template.json"), *self.extra,
        ]

    def start(self, timeout: float = 30) -> "EdgeManager":
        log = open(self.state / "manager.log", "ab")
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.PIPE, stderr=log, text=True)
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()
        if not line.startswith("{") or time.monotonic() > deadline:
            self.proc.kill()
            raise RuntimeError(f"ec-edge did not start: {line!r}; log: {(self.state / 'manager.log').read_text()[-3000:]}")
        self.ready = json.loads(line)
        return self

    def kill(self) -> None:
        """SIGKILL: the manager dies; its instances do not."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> "EdgeManager":
        self.kill()
        return self.start()

    @property
    def operator_addr(self) -> str:
        return self.ready["operator"]

    @property
    def device_addr(self) -> str:
        return self.ready["device"]

    def close(self) -> None:
        """Deletes every instance (so none outlives the test), then stops."""
        if self.proc and self.proc.poll() is None:
            op = self.operator()
            try:
                for i in op.call("GET", "/v1/instances")["instances"]:
                    op.raw("DELETE", f"/v1/instances/{i['id']}")
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        self.stop()
        # A test that failed half-way may leave instances of a dead manager: none outlives the lab.
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and str(self.state).encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                continue
        shutil.rmtree(self.state, ignore_errors=True)

    def __enter__(self) -> "EdgeManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def join_proxy(lab: Lab, manager_addr: str, name: str, credential: Optional[str], *extra: str, service: str = "dropbox",
               timeout: float = 120) -> tuple[Proxy, float]:
    """A device joins through the real command, `python -m ec_proxy join`,
    and proxies through the EPS it was given (the lab's routing options as
    `Lab.start_proxy`). `credential` None: the one the device kept from its
    last join. Returns the proxy (stopped by `lab.close()`) and the seconds
    from the command's start to its ready line (join + proxy start)."""
    import sys

    state = lab.workdir / f"proxy-{name}"
    state.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "ec_proxy", "join", "--manager", manager_addr, "--service", service,
               "--port", "0", "--state", str(state)]
    extra_args = list(extra)
    if credential is not None:
        cred_file = state / "credential.given"
        cred_file.write_text(credential)
        cred_file.chmod(0o600)
        extra_args += ["--credential", f"@{cred_file}"]
    return lab.launch_proxy(command, extra_args, state, timeout, "`ec_proxy join` did not start a proxy")


def leave(lab: Lab, name: str, *, revoke: bool = False) -> dict:
    """`python -m ec_proxy leave [--revoke] --json` for the device `name` of `join_proxy`."""
    import sys

    from testbed.lab import ROOT

    state = lab.workdir / f"proxy-{name}"
    out = subprocess.run([sys.executable, "-m", "ec_proxy", "leave", "--state", str(state), "--json", *(["--revoke"] if revoke else [])],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"ec_proxy leave: {out.stderr.strip()}")
    return json.loads(out.stdout)
