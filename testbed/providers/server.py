"""The aiohttp application that serves every provider from one process.

A request is dispatched on its Host header (port stripped, case folded) to
one provider module, which names the route and handles it. Around every
provider request this module reads the body, consults the armed faults,
records the request log and prints one line per request:
`<provider> <route> <METHOD> <path> -> <status> [fault]`.

Requests whose path starts with `/__testbed/` go to the admin API on any host
(see `ADMIN_HELP`) and are neither logged nor faulted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .control import Control, FaultSpecError
from .dropbox import DropboxProvider
from .drive import DriveProvider
from .graph import GraphProvider
from .hashes import dropbox_content_hash, md5_hex, oc_checksum, quickxor_base64
from .store import Store, StoreError
from .webdav import WebDavProvider

log = logging.getLogger("testbed.providers")

ADMIN_HELP = {
    "GET /__testbed/health": "liveness",
    "GET /__testbed/routes": "route names per provider, for faults",
    "GET /__testbed/files": "stored files: provider, account, path, id, size, sha256, provider hash, revision",
    "GET /__testbed/log?since=N": "requests seen (seq > N), Authorization redacted",
    "GET /__testbed/faults": "armed faults and how often each fired",
    "POST /__testbed/faults": "arm a fault: {kind, provider, route, method, count, status, retry_after, delay, when, truncate_at}",
    "DELETE /__testbed/faults": "disarm all faults",
    "POST /__testbed/reset": "forget files, sessions, faults and the log",
}

# Headers never logged (credentials); their presence is logged as a flag.
SECRET_HEADERS = {"authorization", "cookie"}


@dataclass
class ServerConfig:
    state_dir: Path
    webdav_hosts: list[str] = field(default_factory=lambda: ["cloud.example.com"])
    graph_upload_host: str = "api.onedrive.com"
    graph_download_host: str = "testbed.files.1drv.com"
    # Graph's createUploadSession page: an Authorization header on the uploadUrl
    # "may result in an HTTP 401". "reject" (default) always answers 401, so the
    # EPS is held to the strict reading; "accept" ignores the header, as OneDrive
    # did for older clients such as rclone 1.60.
    graph_fragment_auth: str = "reject"
    nextcloud_min_chunk: int = 5 * 1024 * 1024
    client_max_size: int = 200 * 1024 * 1024
    quiet: bool = False


def provider_hash(provider: str, data: bytes) -> dict[str, str]:
    if provider == "dropbox":
        return {"content_hash": dropbox_content_hash(data)}
    if provider == "graph":
        return {"quickXorHash": quickxor_base64(data)}
    if provider == "drive":
        return {"md5Checksum": md5_hex(data)}
    return {"OC-Checksum": str(oc_checksum("SHA1", data))}


class Testbed:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store = Store(config.state_dir)
        self.control = Control()
        self._make_providers()

    def _make_providers(self) -> None:
        c = self.config
        self.providers = [
            DropboxProvider(self.store),
            GraphProvider(self.store, c.graph_upload_host, c.graph_download_host, c.graph_fragment_auth == "accept"),
            DriveProvider(self.store),
            WebDavProvider(self.store, c.webdav_hosts, c.nextcloud_min_chunk),
        ]

    def provider_for(self, host: str):
        for p in self.providers:
            if p.serves(host):
                return p
        return None

    # -- provider requests ---------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/__testbed/"):
            return await self.admin(request)
        host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
        host = host.lower()
        provider = self.provider_for(host)
        if provider is None:
            return web.Response(status=421, text=f"testbed: no provider serves host {host!r}\n")
        resolved = provider.resolve(host, request)
        body = await request.read()
        route, handler = resolved if resolved else ("unknown", None)
        entry = {
            "provider": provider.name,
            "route": route,
            "method": request.method,
            "host": host,
            "path": request.path_qs,
            "headers": {k: v for k, v in request.headers.items() if k.lower() not in SECRET_HEADERS},
            "authorization_present": "Authorization" in request.headers,
            "body_size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "status": None,
            "fault": None,
        }
        self.control.record(entry)
        fault = self.control.take(provider.name, route, request.method) if handler else None
        if fault:
            entry["fault"] = fault.kind
        try:
            response = await self._answer(provider, handler, request, body, fault)
        except BaseException:
            entry["status"] = "error"
            self._print(entry)
            raise
        entry["status"] = "dropped" if response is None else response.status
        self._print(entry)
        if response is None:
            raise _Dropped()
        if fault and fault.kind == "truncate":
            return await self._truncate(request, response, fault.truncate_at)
        return response

    async def _answer(self, provider, handler, request, body, fault):
        if handler is None:
            return provider.not_found(request)
        if fault and fault.kind == "delay":
            await asyncio.sleep(fault.delay)
        if fault and fault.kind in ("status", "throttle"):
            status = 429 if fault.kind == "throttle" else fault.status
            return provider.fault_response(status, fault.retry_after)
        if fault and fault.kind == "drop" and fault.when == "before":
            return None
        try:
            response = await handler(request, body)
        except StoreError as e:
            log.error("%s", e)
            return web.Response(status=500, text=f"testbed store error: {e}\n")
        if fault and fault.kind == "drop":
            return None
        return response

    async def _truncate(self, request: web.Request, response: web.Response, cut: int | None) -> web.StreamResponse:
        body = response.body if isinstance(response.body, (bytes, bytearray)) else b""
        cut = len(body) // 2 if cut is None else max(0, min(cut, len(body) - 1))
        stream = web.StreamResponse(status=response.status, headers=response.headers)
        stream.content_length = len(body)
        await stream.prepare(request)
        await stream.write(body[:cut])
        # Give the bytes a chance to leave before the connection is cut.
        await asyncio.sleep(0.05)
        if request.transport is not None:
            request.transport.abort()
        return stream

    def _print(self, entry: dict[str, Any]) -> None:
        if self.config.quiet:
            return
        fault = f" [{entry['fault']}]" if entry["fault"] else ""
        status = entry["status"] if entry["status"] is not None else "-"
        print(
            f"{entry['provider']} {entry['route']} {entry['method']} {entry['path']} -> {status}{fault}",
            file=sys.stderr,
            flush=True,
        )

    # -- admin API -----------------------------------------------------------

    async def admin(self, request: web.Request) -> web.Response:
        path, method = request.path, request.method
        if path == "/__testbed/health" and method == "GET":
            return web.json_response({"ok": True})
        if path == "/__testbed/routes" and method == "GET":
            return web.json_response({p.name: p.route_names() for p in self.providers})
        if path == "/__testbed/files" and method == "GET":
            return web.json_response(self.files_json())
        if path == "/__testbed/log" and method == "GET":
            try:
                since = int(request.query.get("since", "0"))
            except ValueError:
                return web.json_response({"error": "since must be an integer"}, status=400)
            return web.json_response([e for e in self.control.log if e["seq"] > since])
        if path == "/__testbed/faults":
            if method == "GET":
                return web.json_response(self.control.faults_json())
            if method == "DELETE":
                self.control.faults.clear()
                return web.json_response({"ok": True})
            if method == "POST":
                try:
                    spec = await request.json()
                    fault = self.control.add_fault(spec)
                except (ValueError, FaultSpecError) as e:
                    return web.json_response({"error": str(e)}, status=400)
                return web.json_response({"id": fault.id, "fault": self.control.faults_json()[-1]})
        if path == "/__testbed/reset" and method == "POST":
            self.control.reset()
            self.store.reset()
            self._make_providers()
            return web.json_response({"ok": True})
        return web.json_response({"error": f"unknown admin route {method} {path}", "routes": ADMIN_HELP}, status=404)

    def files_json(self) -> list[dict[str, Any]]:
        out = []
        for ns in self.store.namespaces():
            for rec in ns.files.values():
                data = ns.read(rec.head)
                out.append(
                    {
                        "provider": ns.provider,
                        "account": ns.account,
                        "path": rec.path,
                        "name": rec.name,
                        "id": rec.id,
                        "rev": rec.head.rev,
                        "version": rec.version,
                        "size": rec.head.size,
                        "sha256": rec.head.sha256,
                        "provider_hash": provider_hash(ns.provider, data),
                    }
                )
        return out


class _Dropped(Exception):
    """Raised to make the connection close without a response."""


@web.middleware
async def _drop_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except _Dropped:
        if request.transport is not None:
            request.transport.abort()
        # aiohttp needs a response object; the transport is gone, so none is sent.
        raise asyncio.CancelledError() from None


def build_app(config: ServerConfig) -> web.Application:
    testbed = Testbed(config)
    app = web.Application(client_max_size=config.client_max_size, middlewares=[_drop_middleware])
    app["testbed"] = testbed
    app.router.add_route("*", "/{tail:.*}", testbed.handle)
    return app
