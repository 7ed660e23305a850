"""`ec-proxy join` / `leave`: the device asks the access point's edge
manager for its user's EPS, and proxies through it.

    python -m ec_proxy join --credential @~/.edgecourier/credential --service dropbox
    python -m ec_proxy leave [--revoke]

1. **Which manager.** `--manager HOST[:PORT]` (port 8441 by default), or
   else the manager this device joined last (kept in the state folder), or
   else the network's default gateway (`/proc/net/route`): the access point
   the device is on runs the manager. (DNS-SD `_ec-edge._tcp` is not
   implemented yet.)
2. **Is it ours.** The credential the operator issued,
   `ecu1.<user>.<secret>.<pin>`, ends with the SHA-256 pin of the manager's
   TLS public key; the connection is refused unless the manager's
   certificate has exactly that key (no CA is involved, so a rogue access
   point cannot pose as the manager). The device then authenticates with
   HTTP Basic `<user>:<secret>`.
3. **Join.** `POST /v1/join {service}`: the manager creates the user's
   instance `<user>-<service>` (or restores a revoked one, with its
   last-synced store, or starts a stopped one), waits until it is ready and
   answers with the enrolment bundle (protocol spec §3.1: EPS URL, key id,
   secret, the EPS's own pin).
4. **Kept.** The bundle, the manager's address and the credential are
   written to `<state>/edge/` in owner-only (0600) files; the secrets are
   never logged or printed.
5. **Proxy.** `join` then runs the proxy exactly as `run` would with
   `--edge/--pin/--secret/--key-id` from the bundle (unless `--no-run`);
   `run --bundle <state>/edge/enrolment.json` runs it later from the
   stored bundle.

`leave` stops the instance (`--revoke`: stops it and frees its resources
on the access point; its state stays there), and forgets the stored bundle.
The device's last-synced store stays in its state folder, and the EPS's in
the instance's state folder on the access point, so after the next `join`
the first save of a known document is a patch again.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import logging
import os
import socket
import ssl
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger("ec_proxy")

#: The manager's device listener (`ec-edge serve --device-listen`, default 0.0.0.0:8441).
DEFAULT_MANAGER_PORT = 8441
#: Options of `run` that the enrolment bundle fills in for `join`.
BUNDLE_OPTIONS = ("edge", "secret", "key_id", "pin", "plain_edge")
#: Files in <state>/edge/.
ENROLMENT_FILE = "enrolment.json"
CREDENTIAL_FILE = "credential"


class JoinError(Exception):
    """Why joining or leaving failed, in words for the user."""


# ------------------------------------------------------------------ credential


@dataclass(frozen=True)
class Credential:
    """`ecu1.<user>.<secret>.<manager pin hex>`, as `ec-edge add-user` prints it."""

    user: str
    secret: str
    pin: bytes
    text: str

    @classmethod
    def parse(cls, text: str) -> "Credential":
        text = text.strip()
        parts = text.split(".")
        if len(parts) != 4 or parts[0] != "ecu1":
            raise JoinError("a credential looks like ecu1.<user>.<secret>.<pin> (as the operator's `ec-edge add-user` prints it)")
        user, secret, pin_hex = parts[1:]
        try:
            pin = bytes.fromhex(pin_hex)
        except ValueError:
            pin = b""
        if not user or not secret or len(pin) != 32:
            raise JoinError("the credential is damaged: it needs a user, a secret and a 64-hex-digit pin")
        return cls(user, secret, pin, text)

    def __repr__(self) -> str:  # never the secret
        return f"Credential(user={self.user!r}, pin={self.pin.hex()[:12]}…)"


def read_credential(value: str) -> Credential:
    """`--credential`: the credential itself, or @FILE holding it."""
    if value.startswith("@"):
        path = Path(os.path.expanduser(value[1:]))
        try:
            value = path.read_text()
        except OSError as e:
            raise JoinError(f"cannot read the credential file {path}: {e.strerror}") from e
    return Credential.parse(value)


# ------------------------------------------------------------------ where the manager is


def default_gateway(route_file: str = "/proc/net/route") -> Optional[str]:
    """The IPv4 default gateway from the kernel's routing table, or None.
    A line: Iface Destination Gateway Flags ... (hex, little-endian)."""
    try:
        lines = Path(route_file).read_text().splitlines()[1:]
    except OSError:
        return None
    best: Optional[tuple[int, str]] = None
    for line in lines:
        f = line.split()
        if len(f) < 8 or f[1] != "00000000":
            continue
        flags, metric = int(f[3], 16), int(f[6])
        if not flags & 0x1 or not flags & 0x2:  # RTF_UP and RTF_GATEWAY
            continue
        gw = socket.inet_ntoa(struct.pack("<I", int(f[2], 16)))
        if best is None or metric < best[0]:
            best = (metric, gw)
    return best[1] if best else None


def parse_manager(value: str) -> tuple[str, int]:
    """`HOST`, `HOST:PORT`, `[v6]:PORT` or `https://HOST:PORT` → (host, port)."""
    v = value.strip()
    if "://" in v:
        scheme, v = v.split("://", 1)
        if scheme != "https":
            raise JoinError(f"--manager {value}: the manager's device listener is https://")
        v = v.split("/", 1)[0]
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        port = rest.lstrip(":")
    elif v.count(":") == 1:
        host, port = v.split(":")
    else:
        host, port = v, ""
    try:
        p = int(port) if port else DEFAULT_MANAGER_PORT
    except ValueError:
        raise JoinError(f"--manager {value}: the port is not a number") from None
    if not host or not 0 < p < 65536:
        raise JoinError(f"--manager {value}: expected HOST[:PORT]")
    return host, p


def find_manager(explicit: Optional[str], remembered: Optional[str]) -> tuple[str, int, str]:
    """(host, port, how it was found)."""
    if explicit:
        return (*parse_manager(explicit), "--manager")
    if remembered:
        return (*parse_manager(remembered), "the manager joined last")
    gw = default_gateway()
    if gw is None:
        raise JoinError("this device has no IPv4 default gateway to find the edge manager on: pass --manager HOST[:PORT]")
    return gw, DEFAULT_MANAGER_PORT, "the default gateway"


# ------------------------------------------------------------------ the manager's device API


class ManagerRefused(JoinError):
    """A 4xx / 5xx answer of the manager."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class ManagerClient:
    """The device's side of the manager's device listener: TLS whose
    certificate must carry the credential's pinned key, HTTP Basic."""

    def __init__(self, host: str, port: int, credential: Credential, timeout: float = 120) -> None:
        self.host, self.port, self.credential, self.timeout = host, port, credential, timeout

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        from ec_protocol.client import spki_sha256_of_der_certificate

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the pin check below replaces CA validation (spec §2.3)
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=ctx)
        try:
            try:
                conn.connect()
            except (OSError, ssl.SSLError) as e:
                raise JoinError(f"cannot reach an edge manager at {self.address}: {e}") from e
            der = conn.sock.getpeercert(binary_form=True)
            got = spki_sha256_of_der_certificate(der) if der else b""
            if got != self.credential.pin:
                raise JoinError(
                    f"the service at {self.address} is not the manager that issued this credential: pin mismatch: "
                    f"expected {self.credential.pin.hex()} got {got.hex() or 'no certificate'} (SHA-256 of the "
                    f"certificate's SubjectPublicKeyInfo); nothing was sent to it")
            auth = base64.b64encode(f"{self.credential.user}:{self.credential.secret}".encode()).decode()
            data = None if body is None else json.dumps(body).encode()
            headers = {"Authorization": f"Basic {auth}", "Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                conn.request(method, path, body=data, headers=headers)
                r = conn.getresponse()
                raw = r.read()
            except (OSError, http.client.HTTPException) as e:
                raise JoinError(f"the edge manager at {self.address} did not answer {method} {path}: {e}") from e
            try:
                value = json.loads(raw) if raw else None
            except ValueError:
                value = {"error": {"code": "unreadable", "message": raw[:200].decode(errors="replace")}}
            if r.status >= 400:
                err = (value or {}).get("error", {}) if isinstance(value, dict) else {}
                raise ManagerRefused(r.status, err.get("code", "error"), err.get("message", ""))
            return value
        finally:
            conn.close()


# ------------------------------------------------------------------ the state folder


def edge_dir(state: Path) -> Path:
    return state / "edge"


def write_private(path: Path, data: bytes) -> None:
    """Owner-only (0600), written to a temporary file and renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_joined(state: Path) -> Optional[dict]:
    p = edge_dir(state) / ENROLMENT_FILE
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise JoinError(f"{p}: unreadable ({e})") from e


def bundle_options(enrolment: dict) -> dict[str, Any]:
    """The `run` options an enrolment bundle stands for (checked by
    `EnrolmentBundle.from_dict`, as the proxy will)."""
    from ec_protocol.client import EnrolmentBundle

    if "manager" in enrolment:  # the file `join` writes
        if "enrolment" not in enrolment:
            raise JoinError("this device has left its EPS: join again (`ec-proxy join`)")
        enrolment = enrolment["enrolment"]
    try:
        b = EnrolmentBundle.from_dict(enrolment)
    except (KeyError, ValueError, TypeError) as e:
        raise JoinError(f"the enrolment bundle is not usable: {e}") from e
    return {"edge": b.url, "secret": b.secret.hex(), "key_id": b.key_id,
            "pin": b.spki_sha256.hex() if b.spki_sha256 else "", "plain_edge": b.plain_http}


def read_bundle_file(value: str) -> dict[str, Any]:
    """`run --bundle FILE`: a bundle as JSON (the manager's `enrolment`
    object, or the file `join` writes)."""
    path = Path(os.path.expanduser(value.lstrip("@")))
    try:
        return bundle_options(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise JoinError(f"--bundle {path}: {e}") from e


# ------------------------------------------------------------------ commands


def summary(instance: dict) -> str:
    ready = instance.get("ready_seconds")
    return (f"instance {instance.get('id')} ({instance.get('runtime')}, {instance.get('state')}"
            + (f", ready in {ready:.2f} s" if isinstance(ready, (int, float)) else "") + ")")


def credential_for(args: argparse.Namespace, state: Path) -> Credential:
    if args.credential:
        return read_credential(args.credential)
    stored = edge_dir(state) / CREDENTIAL_FILE
    if stored.exists():
        return read_credential(f"@{stored}")
    raise JoinError("no credential: pass --credential ecu1... or @FILE (the operator gives it to you; "
                    f"it is kept in {stored} after the first join)")


def join(args: argparse.Namespace) -> dict:
    """Joins and stores the bundle; returns what was stored (with secrets)."""
    state = Path(os.path.expanduser(args.state))
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    cred = credential_for(args, state)
    previous = load_joined(state) or {}
    # A manager named once is remembered; one found as the gateway is looked for again (the device may have moved).
    remembered = previous.get("manager") if previous.get("manager_from") in ("--manager", "the manager joined last") else None
    host, port, how = find_manager(args.manager, remembered)
    client = ManagerClient(host, port, cred, timeout=args.join_timeout)
    body: dict[str, Any] = {"service": args.service}
    if args.runtime:
        body["runtime"] = args.runtime
    log.info("EdgeCourier: joining the edge manager at %s (%s) as %s for %s", client.address, how, cred.user, args.service)
    t0 = time.monotonic()
    joined = client.call("POST", "/v1/join", body)
    seconds = time.monotonic() - t0
    if not isinstance(joined, dict) or "enrolment" not in joined or "instance" not in joined:
        raise JoinError(f"the edge manager at {client.address} answered the join without an enrolment bundle")
    bundle_options(joined["enrolment"])  # usable, or a clear error now rather than in mitmproxy
    record = {
        "manager": client.address,
        "manager_from": how,
        "manager_pin": cred.pin.hex(),
        "user": cred.user,
        "service": args.service,
        "instance": joined["instance"],
        "enrolment": joined["enrolment"],
        "joined_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "join_seconds": round(seconds, 3),
    }
    write_private(edge_dir(state) / ENROLMENT_FILE, json.dumps(record, indent=1).encode())
    if args.credential:
        write_private(edge_dir(state) / CREDENTIAL_FILE, (cred.text + "\n").encode())
    log.info("EdgeCourier: joined in %.2f s: %s, EPS %s (pin %s…); bundle kept in %s",
             seconds, summary(joined["instance"]), joined["enrolment"].get("url"),
             str(joined["enrolment"].get("spki_sha256", ""))[:12], edge_dir(state) / ENROLMENT_FILE)
    return record


def public(record: dict) -> dict:
    """What may be printed: no secrets."""
    out = {k: v for k, v in record.items() if k != "enrolment"}
    e = record.get("enrolment", {})
    out["eps"] = {"url": e.get("url"), "key_id": e.get("key_id"), "spki_sha256": e.get("spki_sha256")}
    return out


def leave(args: argparse.Namespace) -> dict:
    state = Path(os.path.expanduser(args.state))
    cred = credential_for(args, state)
    previous = load_joined(state) or {}
    host, port, how = find_manager(args.manager, previous.get("manager"))
    service = args.service or previous.get("service") or "default"
    client = ManagerClient(host, port, cred, timeout=args.join_timeout)
    mode = "revoke" if args.revoke else "stop"
    instance = client.call("POST", "/v1/leave", {"service": service, "mode": mode})
    if previous:  # the bundle is forgotten; where the manager is, is not
        previous.pop("enrolment", None)
        previous.update(left_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), left=mode, instance=instance)
        write_private(edge_dir(state) / ENROLMENT_FILE, json.dumps(previous, indent=1).encode())
    log.info("EdgeCourier: left the edge manager at %s: %s", client.address, summary(instance or {}))
    return instance or {}


def add_parsers(sub: argparse._SubParsersAction, run: argparse.ArgumentParser) -> None:
    """`join` (with every `run` option the bundle does not replace) and `leave`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--manager", default="", metavar="HOST[:PORT]",
                        help=f"the edge manager's device listener (default: the manager joined last, else the "
                             f"default gateway; port {DEFAULT_MANAGER_PORT})")
    common.add_argument("--credential", default="", metavar="ecu1...|@FILE",
                        help="the credential the operator issued (default: the one kept by the last join)")
    common.add_argument("--join-timeout", type=float, default=120, metavar="SECONDS",
                        help="how long to wait for the manager (a join waits until the EPS is ready; default 120)")
    j = sub.add_parser("join", parents=[common], help="join the access point's edge manager and proxy through your EPS",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    j.add_argument("--service", default="default", help="which of your instances (e.g. dropbox, onedrive; default: default)")
    j.add_argument("--runtime", default="", help="the backend if the instance is created now: process or docker (default: the manager's)")
    j.add_argument("--no-run", action="store_true", help="only join and store the bundle; print a JSON summary (no secrets)")
    for action in run._actions:
        if action.dest in BUNDLE_OPTIONS or isinstance(action, argparse._HelpAction) or action.dest == "bundle":
            continue
        j._add_action(action)
    lv = sub.add_parser("leave", parents=[common], help="stop (or revoke) your EPS on the access point",
                        description="Tell the edge manager this device leaves: its EPS is stopped, or with --revoke "
                                    "stopped and its resources freed (its state is kept on the access point).")
    lv.add_argument("--service", default="", help="the instance's service (default: the one joined last)")
    lv.add_argument("--revoke", action="store_true", help="revoke instead of stop")
    lv.add_argument("--state", default="~/.edgecourier", help="state folder (default ~/.edgecourier)")
    lv.add_argument("--json", action="store_true", help="print the manager's view of the instance as JSON")


def main(args: argparse.Namespace) -> int:
    """`join` and `leave`; for `join` without --no-run, fills the bundle's
    options into `args` and returns -1: the caller runs the proxy."""
    try:
        if args.command == "leave":
            instance = leave(args)
            print(json.dumps(instance, indent=1) if args.json else f"left: {summary(instance)}")
            return 0
        record = join(args)
    except JoinError as e:
        print(f"ec-proxy {args.command}: {e}", file=sys.stderr)
        return 2
    if args.no_run:
        print(json.dumps(public(record)), flush=True)
        return 0
    for k, v in bundle_options(record).items():
        setattr(args, k, v)
    return -1
