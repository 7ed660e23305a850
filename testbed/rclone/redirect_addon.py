"""mitmproxy addon: send the providers' real host names to the testbed.

rclone (like any app) cannot be told another host name for Dropbox or
OneDrive, but it honours `HTTPS_PROXY`. With this addon a plain mitmdump
becomes that proxy: every upstream connection to a provider host goes to the
testbed's TLS listener instead, while the request (Host header, path) and the
upstream TLS name (SNI, certificate check against the test CA) stay exactly
those of the real provider. Only the socket address changes, which is why the
rewrite happens in `server_connect` and not on the request.

    mitmdump -q --listen-host 127.0.0.1 --listen-port 0 --set confdir=<dir> \
        -s testbed/rclone/redirect_addon.py --set testbed_upstream=127.0.0.1:<tls port> \
        --set ssl_verify_upstream_trusted_ca=<testbed ca.pem>
"""

from __future__ import annotations

from mitmproxy import ctx
from mitmproxy.proxy import server_hooks

#: Names the testbed serves (testbed/README.md, "Reaching it"); suffixes cover wildcards.
DEFAULT_HOSTS = (
    "content.dropboxapi.com,api.dropboxapi.com,graph.microsoft.com,api.onedrive.com,"
    "www.googleapis.com,cloud.example.com,.sharepoint.com,.files.1drv.com"
)


class RedirectToTestbed:
    def load(self, loader) -> None:
        loader.add_option("testbed_upstream", str, "", "host:port of the testbed's TLS listener")
        loader.add_option("testbed_hosts", str, DEFAULT_HOSTS, "comma list of names (or .suffixes) to redirect")

    def _matches(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for name in filter(None, (n.strip().lower() for n in ctx.options.testbed_hosts.split(","))):
            if host == name or (name.startswith(".") and host.endswith(name)):
                return True
        return False

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        target = ctx.options.testbed_upstream
        if not target or data.server.address is None:
            return
        host = data.server.sni or data.server.address[0]
        if self._matches(host):
            addr, _, port = target.rpartition(":")
            data.server.address = (addr, int(port))


addons = [RedirectToTestbed()]
