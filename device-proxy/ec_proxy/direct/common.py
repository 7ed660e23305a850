"""What every provider's direct replay shares: the sender's shape and a
default sender over `http.client`, the chunk sizes, the errors, and the
helpers that run one step of a sequence and build its head fields.
Nothing here knows a provider.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Callable, Optional
from urllib.parse import urlsplit, urlunsplit

from ..recognise.common import AppRequest, Header
from ..sessions.common import HOP_FIELDS, Answer, GatheredUpload

#: send(method, url, headers, body) -> (status, reason, headers, body)
Sender = Callable[[str, str, list[Header], bytes], tuple[int, str, list[Header], bytes]]


@dataclass(frozen=True)
class ChunkSizes:
    """Request sizes of the replayed sequences (the EPS's defaults, §6)."""

    dropbox: int = 64 * 1024 * 1024
    graph: int = 10 * 1024 * 1024  # a multiple of 320 KiB
    drive: int = 64 * 1024 * 1024  # a multiple of 256 KiB
    nextcloud: int = 10 * 1024 * 1024  # at least 5 MiB


class DirectError(Exception):
    """The replay could not be performed as the provider's protocol says."""


class DirectProtocolError(DirectError):
    """A provider answered a step with a status the sequence does not expect
    (below 400), or without the session URL it must return. Answer the app
    502, as the EPS does for `provider_protocol`."""

    def __init__(self, step: str, message: str, response: Optional[Answer] = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step, self.response = step, response


# -- running steps -------------------------------------------------------------------


def inherit_headers(req: AppRequest, drop: tuple[str, ...] = (), set_: list[Header] = ()) -> list[Header]:
    """The app request's fields minus hop-by-hop and `drop` and the ones being
    set, then the set ones: "inherit except what the procedure sets" (§6.0)."""
    setting = {n.lower() for n, _ in set_}
    kept = [(n, v) for n, v in req.headers if n.lower() not in HOP_FIELDS and n.lower() not in drop and n.lower() not in setting]
    return kept + list(set_)


def set_header(headers: list[Header], name: str, value: str) -> list[Header]:
    """`name` set to `value` in place of its first occurrence (order kept)."""
    out, done = [], False
    for n, v in headers:
        if n.lower() == name:
            if not done:
                out.append((n, value))
                done = True
            continue
        out.append((n, v))
    if not done:
        out.append((name, value))
    return out


class Run:
    def __init__(self, send: Sender) -> None:
        self._send = send

    def send(self, method: str, url: str, headers: list[Header], body: bytes) -> Answer:
        status, reason, rh, rb = self._send(method, url, headers, body)
        return Answer(status, reason, tuple(rh), rb)

    def step(self, name: str, method: str, url: str, headers: list[Header], body: bytes, expected: tuple[int, ...]) -> tuple[bool, Answer]:
        """(go on, response): False with the response when it stops the sequence."""
        resp = self.send(method, url, headers, body)
        if resp.status in expected:
            return True, resp
        if resp.status >= 400:
            return False, resp
        raise DirectProtocolError(name, f"status {resp.status} where {expected} was due", resp)

    def cancel(self, method: str, url: str, headers: list[Header]) -> None:
        try:  # best effort: its outcome changes nothing that is returned
            self.send(method, url, headers, b"")
        except Exception:  # noqa: BLE001 - the sequence's own answer matters, not this one
            pass


#: One provider procedure: performs the sequence, returns the final response.
Procedure = Callable[[Run, GatheredUpload, ChunkSizes], Answer]


def chunked(data: bytes, size: int) -> list[tuple[int, bytes]]:
    """(offset, piece) of `data` in pieces of `size`; one empty piece for no data."""
    if not data:
        return [(0, b"")]
    return [(a, data[a : a + size]) for a in range(0, len(data), size)]


def response_header(resp: Answer, name: str) -> Optional[str]:
    return next((v for n, v in resp.headers if n.lower() == name), None)


def json_field(resp: Answer, name: str) -> Optional[str]:
    try:
        value = json.loads(resp.body).get(name)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


# -- a default sender ------------------------------------------------------------------


class HttpSender:
    """`send` over `http.client`, one connection per request.

    `resolve` maps a host name to the (address, port) to connect to, keeping
    the name for SNI, certificate checks and the Host field (the lab's
    provider servers). Header values given as str are sent as UTF-8 with
    surrogateescape, which gives back the bytes mitmproxy received.
    """

    def __init__(self, context: Optional[ssl.SSLContext] = None, resolve: Optional[dict[str, tuple[str, int]]] = None,
                 timeout: float = 120.0) -> None:
        self.context = context or ssl.create_default_context()
        self.resolve = {k.lower(): v for k, v in (resolve or {}).items()}
        self.timeout = timeout

    def __call__(self, method: str, url: str, headers: list[Header], body: bytes) -> tuple[int, str, list[Header], bytes]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addr, aport = self.resolve.get(host.lower(), (host, port))
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = _ResolvedHTTPS(host, addr, aport, self.context, self.timeout)
        else:
            conn = http.client.HTTPConnection(addr, aport, timeout=self.timeout)
        try:
            path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", parts.netloc)
            for n, v in headers:
                if n.lower() not in HOP_FIELDS:
                    conn.putheader(n, v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v)
            if body or method not in ("GET", "HEAD", "DELETE"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, list(resp.getheaders()), data
        finally:
            conn.close()


class _ResolvedHTTPS(http.client.HTTPSConnection):
    def __init__(self, name: str, addr: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(addr, port, timeout=timeout, context=context)
        self._name = name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._name)
