"""Lab routing: send the providers' real host names to local test servers.

The real clouds cannot be reached from our machines. In the lab the proxy
still intercepts `content.dropboxapi.com` and friends under their real
names (the app's TLS ends at the proxy, as in production), but the
connection the proxy opens for the direct path goes to the address the
`edgecourier_resolve` option names, with the original name as SNI and in
the Host header, verified against `ssl_verify_upstream_trusted_ca` (the
lab's test CA). With the option empty (production) this addon does
nothing.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from mitmproxy import ctx, exceptions
from mitmproxy.proxy import server_hooks

log = logging.getLogger(__name__)


def parse_resolve(entries: Sequence[str]) -> dict[str, tuple[str, int]]:
    """`host=addr:port` entries -> {host: (addr, port)}; raises ValueError on a bad entry."""
    table: dict[str, tuple[str, int]] = {}
    for entry in entries:
        host, sep, target = entry.partition("=")
        addr, colon, port = target.rpartition(":")
        if not sep or not colon or not host or not addr or not port.isdigit():
            raise ValueError(f"resolve entry {entry!r} is not host=address:port")
        table[host.lower()] = (addr, int(port))
    return table


class LabRouting:
    """Rewrites the address of upstream connections to provider hosts."""

    def __init__(self) -> None:
        self.table: dict[str, tuple[str, int]] = {}

    def load(self, loader) -> None:
        loader.add_option(
            "edgecourier_resolve", Sequence[str], [],
            "Lab only: host=address:port entries sending a provider's host name to a local test server "
            "(SNI and Host keep the real name).",
        )

    def configure(self, updated: set[str]) -> None:
        if "edgecourier_resolve" in updated:
            try:
                self.table = parse_resolve(ctx.options.edgecourier_resolve)
            except ValueError as e:
                raise exceptions.OptionsError(str(e)) from e

    def target(self, host: Optional[str]) -> Optional[tuple[str, int]]:
        return self.table.get((host or "").lower()) if self.table else None

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        host = server.sni or (server.address[0] if server.address else None)
        target = self.target(host)
        if target is None:
            return
        if server.sni is None:
            server.sni = host
        log.debug("lab routing: %s -> %s:%d", host, *target)
        server.address = target
