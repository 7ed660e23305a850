"""Lazy upstream connections for the provider hosts only.

mitmproxy's default `connection_strategy=eager` opens the upstream
connection (TCP and TLS) to the CONNECT target as soon as the app connects,
before any request. For a provider host that costs a TCP and TLS handshake
with the cloud on the device's own link (about 7 kB per save in the paper's
Table 2 runs, docs/experiments.md) even for an upload that then goes to the
EPS as a patch and never uses that connection.

This addon makes the connections to intercepted hosts (those `allow_hosts`
lets mitmproxy decrypt: the providers, except hosts the lab routes to its
local servers, see `intercepted`) lazy: no upstream connection at
CONNECT and none at the app's TLS ClientHello; mitmproxy opens it when a
request must go to the provider (the direct path, a download, any request
EdgeCourier passes on), with the app's SNI. Every other connection keeps
the global strategy (eager by default): tunnels to other hosts, where
lazy opening would stall protocols in which the server speaks first.
"""

from __future__ import annotations

import re
import time
from typing import Optional

from mitmproxy import ctx, http
from mitmproxy.tls import ClientHelloData


def intercepted(host: Optional[str], port: Optional[int]) -> bool:
    """Whether `allow_hosts` names this host (mitmproxy's own test: a regex
    search in "host:port" or the bare host) and the lab does not route it.
    With no `allow_hosts` nothing is made lazy: which hosts are providers is
    then unknown. A host the lab routes to a local server
    (`edgecourier_resolve`, ec_proxy.routing) stays eager: the routing
    rewrites the address of each new upstream connection, and mitmproxy
    reuses an open connection only for requests to the same address, so a
    lazily opened, rewritten one would never be reused (a new upstream
    connection per request, and the sixth request on one app connection
    hung in a trial)."""
    patterns = ctx.options.allow_hosts
    if not host or not patterns:
        return False
    routed = {entry.partition("=")[0].lower() for entry in getattr(ctx.options, "edgecourier_resolve", [])}
    if host.lower() in routed:
        return False
    names = [host] if port is None else [f"{host}:{port}", host]
    return any(re.search(p, n, re.IGNORECASE) for p in patterns for n in names)


class LazyProviderConnections:
    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A CONNECT to a provider host: answered here as mitmproxy would
        answer it, which skips its eager upstream connection (it opens one
        only when no response is set yet)."""
        if flow.response is not None or ctx.options.connection_strategy != "eager":
            return
        if not intercepted(flow.request.host, flow.request.port):
            return
        now = time.time()
        flow.response = http.Response(flow.request.data.http_version, 200, b"Connection established",
                                      http.Headers(), b"", None, now, now)
        flow.metadata["edgecourier_lazy"] = True

    def tls_clienthello(self, data: ClientHelloData) -> None:
        """Runs after mitmproxy's tlsconfig, which asks for the server's TLS
        first under the eager strategy (to copy its certificate's names): not
        for a provider host, whose certificate is made from the app's SNI."""
        server = data.context.server
        host = data.client_hello.sni or (server.address[0] if server.address else None)
        port = server.address[1] if server.address else None
        if intercepted(host, port) and not server.connected:
            data.establish_server_tls_first = False
