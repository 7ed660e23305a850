"""`ec-proxy`: the EdgeCourier device proxy for a laptop.

    python -m ec_proxy run --edge http://192.168.50.1:8443 --secret @~/.edgecourier/secret \\
        --port 8080 --state ~/.edgecourier
    python -m ec_proxy status --state ~/.edgecourier
    python -m ec_proxy join --credential @~/.edgecourier/credential --service dropbox --port 8080
    python -m ec_proxy leave [--revoke]

`run` starts mitmproxy (embedded, regular proxy mode by default) with the
EdgeCourier addon. Point the apps at it (`HTTPS_PROXY=http://127.0.0.1:8080`)
and make them trust the CA mitmproxy writes into `<state>/mitmproxy/`
(`mitmproxy-ca-cert.pem`). Only the providers' hosts are decrypted
(mitmproxy's `allow_hosts`); every other connection passes as an opaque
tunnel. `--mode transparent` is for a rooted Android phone (see
device-proxy/README.md). `join` asks the access point's edge manager for
the user's EPS and then runs the proxy through it (ec_proxy.join).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

#: Hosts whose traffic is decrypted and examined; everything else is tunnelled.
PROVIDER_HOST_PATTERNS = (
    r"^(api|content)\.dropboxapi\.com(:\d+)?$",
    r"^graph\.microsoft\.com(:\d+)?$",
    r"^api\.onedrive\.com(:\d+)?$",
    r"^[a-z0-9-]+\.sharepoint\.com(:\d+)?$",
    r"^[a-z0-9-]+\.files\.1drv\.com(:\d+)?$",
    r"^www\.googleapis\.com(:\d+)?$",
)


def host_pattern(host: str) -> str:
    """An allow_hosts regex for one extra (WebDAV) host name."""
    import re

    return rf"^{re.escape(host.lower())}(:\d+)?$"


def read_secret(value: str) -> str:
    """`--secret`: 64 hex digits, or @FILE holding them."""
    text = Path(os.path.expanduser(value[1:])).read_text().strip() if value.startswith("@") else value.strip()
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise SystemExit("ec-proxy: the secret must be 64 hex digits (32 bytes), or @FILE holding them")
    return text.lower()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ec-proxy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the proxy", description="Start the device proxy (mitmproxy + the EdgeCourier addon).")
    run.add_argument("--bundle", default="", metavar="FILE",
                     help="the enrolment bundle as JSON (e.g. <state>/edge/enrolment.json, written by `join`) "
                          "instead of --edge/--secret/--key-id/--pin")
    run.add_argument("--edge", default="", help="the user's EPS, e.g. https://192.168.50.1:8443 (http:// only with --plain-edge)")
    run.add_argument("--secret", default="", help="the instance secret from the enrolment bundle: 64 hex digits or @FILE")
    run.add_argument("--key-id", type=int, default=1, help="the key id of the enrolment bundle (default 1)")
    run.add_argument("--pin", default="", help="SHA-256 (hex) of the EPS certificate's SubjectPublicKeyInfo, for https:// edges")
    run.add_argument("--plain-edge", action="store_true", help="lab only: talk to the EPS over plain HTTP (test credentials only)")
    run.add_argument("--listen-host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0 picks one)")
    run.add_argument("--state", default="~/.edgecourier", help="state folder: last-synced store, statistics, mitmproxy CA (default ~/.edgecourier)")
    run.add_argument("--max-store", type=int, default=1 << 30, help="bound on the last-synced store, bytes (default 1 GiB)")
    run.add_argument("--webdav-host", action="append", default=[], help="a WebDAV / Nextcloud host to intercept (repeatable)")
    run.add_argument("--mode", default="regular", help="mitmproxy mode: regular (default) or transparent (rooted phone)")
    run.add_argument("--lab-resolve", action="append", default=[], metavar="HOST=ADDR:PORT",
                     help="lab only: send a provider host to a local test server (repeatable)")
    run.add_argument("--upstream-ca", default="", help="lab only: PEM of the CA the provider servers' certificates chain to")
    run.add_argument("--decision", choices=("hybrid", "metered", "bytes"), default="hybrid",
                     help="patch or whole: hybrid (default; the shortest wait, from the link's measured speed and "
                          "round-trip time, the diff and the EPS's rebuild time) or metered (the fewest bytes: a patch "
                          "whenever it is smaller; 'bytes' is its older name, used by labs on loopback)")
    run.add_argument("--spot-check", choices=("auto", "on", "off"), default="auto",
                     help="check a block-parallel part's recipe on a sample of its blocks instead of every block "
                          "(a faster diff; the EPS's SHA-256 check of the rebuilt file confirms it, and a wrong one "
                          "costs a whole-file resend): auto (default: on unless --decision is metered), on, off")
    run.add_argument("--eps-retry-window", type=int, default=30, metavar="SECONDS",
                     help="how long to keep asking the EPS about a save whose outcome is unknown (the connection "
                          "failed after the save was sent) before answering the app 504; such a save is never "
                          "uploaded directly (spec §7.1; default 30)")
    run.add_argument("--keep-idle", type=float, default=60.0, metavar="SECONDS",
                     help="after this long without a save or download, let go of the document contents the diffs "
                          "keep for the next save (up to 80 MB; the next diff inflates them again; default 60)")
    run.add_argument("--graph-fragment-auth", choices=("reject", "accept"), default="reject",
                     help="Graph upload fragments that carry Authorization: reject with 401 as OneDrive does (default), "
                          "or accept (OneDrive accounts that take them, e.g. for rclone 1.60)")
    run.add_argument("--verbose", "-v", action="store_true", help="log each decision (default: one line per save)")
    from ec_proxy import join

    join.add_parsers(sub, run)
    st = sub.add_parser("status", help="what the proxy saved, per document", description="Print the proxy's statistics.")
    st.add_argument("--state", default="~/.edgecourier", help="state folder (default ~/.edgecourier)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def mitmproxy_addons() -> list:
    """The mitmproxy addons `ec-proxy run` runs besides its own, in
    mitmproxy's order: the proxy itself (Core, Proxyserver, NextLayer with
    `allow_hosts`, TlsConfig and its CA), Block (`block_global`: no clients
    from public addresses), DisableH2C (h2c upgrades mitmproxy cannot carry)
    and ErrorCheck (a startup error, such as a port in use, ends the
    command). mitmdump also loads about 25 addons for features this command
    exposes no option for (playback, map and modify rules, flow files, the
    onboarding app, cookies, export): mitmproxy visits every addon on every
    event of every intercepted request, about 0.08 ms per event with them
    and 0.02 ms without (experiments/bench/mitm_addons.py; docs/benchmarks.md,
    "mitmproxy's addons"), four or more events per request. `mitmdump -s device-proxy/ec_proxy/addon.py`
    still runs the addon among all of mitmdump's."""
    from mitmproxy.addons import block, core, disable_h2c, errorcheck, next_layer, proxyserver, tlsconfig

    return [core.Core(), block.Block(), disable_h2c.DisableH2C(), proxyserver.Proxyserver(), next_layer.NextLayer(),
            tlsconfig.TlsConfig(), errorcheck.ErrorCheck()]


async def run_proxy(args: argparse.Namespace) -> None:
    from mitmproxy import master as mitm_master
    from mitmproxy import options

    from ec_proxy.addon import EdgeCourier
    from ec_proxy.lazy import LazyProviderConnections
    from ec_proxy.routing import LabRouting

    state = Path(os.path.expanduser(args.state))
    (state / "mitmproxy").mkdir(parents=True, exist_ok=True)
    opts = options.Options(listen_host=args.listen_host, listen_port=args.port, mode=[args.mode], confdir=str(state / "mitmproxy"))
    # No termlog: mitmproxy's records reach the root logger's one handler (stderr, `main`) with
    # the addon's. Its termlog printed each of them a second time, on stdout: twice the work per
    # record on every save, and a supervisor that reads only the ready line (stdout) saw the pipe
    # fill and the proxy block on its next log line, tens of saves later.
    master = mitm_master.Master(opts, with_termlog=False)
    master.addons.add(*mitmproxy_addons())
    master.addons.add(LabRouting(), LazyProviderConnections(), EdgeCourier())
    updates = dict(
        allow_hosts=list(PROVIDER_HOST_PATTERNS) + [host_pattern(h) for h in args.webdav_host],
        edgecourier_edge=args.edge,
        edgecourier_secret=read_secret(args.secret),
        edgecourier_key_id=args.key_id,
        edgecourier_pin=args.pin,
        edgecourier_plain_edge=args.plain_edge,
        edgecourier_state=str(state),
        edgecourier_max_store=args.max_store,
        edgecourier_webdav_hosts=list(args.webdav_host),
        edgecourier_resolve=list(args.lab_resolve),
        edgecourier_mode=args.decision,
        edgecourier_spot_check=args.spot_check,
        edgecourier_retry_window=args.eps_retry_window,
        edgecourier_keep_idle=args.keep_idle,
        edgecourier_graph_fragment_auth=args.graph_fragment_auth,
    )
    if args.upstream_ca:
        updates["ssl_verify_upstream_trusted_ca"] = os.path.abspath(args.upstream_ca)
    from mitmproxy import exceptions

    try:
        opts.update(**updates)
    except exceptions.OptionsError as e:  # a value the addon refuses: say which, not a traceback
        raise SystemExit(f"ec-proxy run: {e}") from None
    await master.run()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "status":
        from ec_proxy import status

        # The addon keeps its store in <state>/store (beside mitmproxy's files).
        return status.main(["--state", os.path.join(os.path.expanduser(args.state), "store")] + (["--json"] if args.json else []))
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.command in ("join", "leave"):
        from ec_proxy import join

        rc = join.main(args)
        if rc >= 0:
            return rc
    elif args.bundle:
        from ec_proxy import join

        try:
            for k, v in join.read_bundle_file(args.bundle).items():
                setattr(args, k, v)
        except join.JoinError as e:
            raise SystemExit(f"ec-proxy: {e}") from None
    if not args.edge or not args.secret:
        raise SystemExit("ec-proxy run: give the EPS with --edge and --secret (and --pin), or --bundle FILE, "
                         "or use `ec-proxy join` to get them from the access point's edge manager")
    try:
        asyncio.run(run_proxy(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
