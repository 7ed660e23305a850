"""Test harness for the testbed tests: the provider server in a subprocess and
a client that reaches it under the providers' real host names.

The client is aiohttp's, with a resolver that sends every name to 127.0.0.1
and port 443 to the server's TLS port (80 to its plain port), so URLs carry
no port, the Host header is exactly what a client of the real cloud sends,
and TLS is verified against the test CA for the real name (SNI included).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from multidict import CIMultiDictProxy

from testbed.lab import Providers, start_providers

ROOT = Path(__file__).resolve().parents[2]


class TestbedResolver(AbstractResolver):
    def __init__(self, tls_port: int, plain_port: int) -> None:
        self.ports = {443: tls_port, 80: plain_port}

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET):
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": self.ports.get(port, port),
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass


@dataclass
class Resp:
    status: int
    headers: CIMultiDictProxy
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Client:
    """A blocking facade over an aiohttp session running on its own loop thread."""

    def __init__(self, tls_port: int, plain_port: int, ca_path: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.ssl_ctx = ssl.create_default_context(cafile=ca_path)

        async def make() -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(resolver=TestbedResolver(tls_port, plain_port), ssl=self.ssl_ctx, force_close=True)
            return aiohttp.ClientSession(connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=60))

        self.session = self._run(make())

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None, json_body: Any = None, token: str | None = "alice", chunked: bool = False) -> Resp:
        hdrs = dict(headers or {})
        if token is not None and "Authorization" not in hdrs:
            hdrs["Authorization"] = f"Bearer {token}"
        if json_body is not None:
            data = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")

        async def go() -> Resp:
            body_arg: Any = data
            if chunked and data is not None:
                # An async generator makes aiohttp send Transfer-Encoding: chunked, as Dropbox clients often do.
                async def pieces():
                    for i in range(0, len(data), 65536):
                        yield data[i : i + 65536]

                body_arg = pieces()
            async with self.session.request(method, url, headers=hdrs, data=body_arg, allow_redirects=False) as r:
                body = await r.read()
                return Resp(r.status, r.headers, body)

        return self._run(go())

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        r = self.request(method, "https://graph.microsoft.com/__testbed/" + path, json_body=body, token=None)
        assert r.status == 200, r.text
        return r.json()

    def fault(self, **spec: Any) -> dict[str, Any]:
        return self.admin("POST", "faults", spec)

    def files(self, provider: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.admin("GET", "files") if provider in (None, f["provider"])]

    def log(self) -> list[dict[str, Any]]:
        return self.admin("GET", "log")

    def close(self) -> None:
        self._run(self.session.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


# The server process is started the same way everywhere (tests, lab, demo).
Server = Providers


def start_server(tmp: Path, *extra: str) -> Server:
    return start_providers(tmp, *extra)


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()


