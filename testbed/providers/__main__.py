"""Command line: `python -m testbed.providers serve ...` (see --help)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from aiohttp import web

from . import tls
from .server import ServerConfig, build_app


def _hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.providers",
        description="Local Dropbox / Microsoft Graph / Google Drive / WebDAV-Nextcloud test servers "
        "in one process, reached under the providers' real host names through a test CA. "
        "See testbed/README.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the servers",
        description="Serve every provider over TLS (and optionally plain HTTP), dispatching on the Host header. "
        "Prints one line 'ready {json}' on stdout when listening; one log line per request on stderr. "
        "Admin API under /__testbed/ on any host.",
    )
    serve.add_argument("--state", type=Path, required=True, help="folder for stored files (per provider/account); kept across restarts")
    serve.add_argument("--certs", type=Path, required=True, help="folder for the test CA (ca.pem, reused if present), bundle.pem and server.pem")
    serve.add_argument("--listen", type=_hostport, default=("127.0.0.1", 8443), metavar="HOST:PORT", help="TLS listener (port 0: any free port; default 127.0.0.1:8443)")
    serve.add_argument("--plain-listen", type=_hostport, metavar="HOST:PORT", help="also listen with plain HTTP here")
    serve.add_argument("--webdav-host", action="append", metavar="NAME", help="host name(s) of the WebDAV/Nextcloud server (repeatable; default cloud.example.com)")
    serve.add_argument("--graph-upload-host", default="api.onedrive.com", help="host of Graph uploadUrl values (default api.onedrive.com)")
    serve.add_argument("--graph-download-host", default="testbed.files.1drv.com", help="host of Graph pre-authenticated download URLs (default testbed.files.1drv.com)")
    serve.add_argument("--graph-fragment-auth", choices=("reject", "accept"), default="reject",
                       help="an Authorization header on a Graph uploadUrl fragment: 401 (reject, default) or ignored (accept; rclone 1.60 sends one)")
    serve.add_argument("--nextcloud-min-chunk", type=int, default=5 * 1024 * 1024, help="smallest chunk but the last in Nextcloud chunking v2, bytes (default 5 MiB; 0 to allow any)")
    serve.add_argument("--quiet", action="store_true", help="no per-request log lines")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    webdav_hosts = [h.lower() for h in (args.webdav_host or ["cloud.example.com"])]
    config = ServerConfig(
        state_dir=args.state,
        webdav_hosts=webdav_hosts,
        graph_upload_host=args.graph_upload_host.lower(),
        graph_download_host=args.graph_download_host.lower(),
        nextcloud_min_chunk=args.nextcloud_min_chunk,
        graph_fragment_auth=args.graph_fragment_auth,
        quiet=args.quiet,
    )
    ssl_ctx, cert_paths = tls.prepare(args.certs, tls.server_names(webdav_hosts, config.graph_upload_host))
    runner = web.AppRunner(build_app(config), access_log=None, handle_signals=False)
    await runner.setup()
    tls_site = web.TCPSite(runner, args.listen[0], args.listen[1], ssl_context=ssl_ctx)
    await tls_site.start()
    ready = {"https": _bound(tls_site), **cert_paths, "state": str(args.state), "webdav_hosts": webdav_hosts}
    if args.plain_listen:
        plain_site = web.TCPSite(runner, args.plain_listen[0], args.plain_listen[1])
        await plain_site.start()
        ready["http"] = _bound(plain_site)
    print("ready " + json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def _bound(site: web.TCPSite) -> str:
    sock = site._server.sockets[0]  # the bound port, for --listen with port 0
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
