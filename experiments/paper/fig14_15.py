#!/usr/bin/env python3
"""Figs. 14 and 15 of the original paper: other traffic through the device proxy, time and CPU time (the energy proxy).

Transfers that are not provider saves pass ec-proxy as an opaque tunnel
(CONNECT; it does not decrypt hosts it does not handle). On the netns
testbed (default wifi-ac-near: 340 Mbit/s, and wan-fiber: 300 Mbit/s), curl
on the device downloads and uploads N MB over HTTPS from a server in the
cloud (Python's http.server with TLS, a certificate from its own CA that
only curl trusts: a decrypting proxy would fail), directly and through
ec-proxy, interleaved, the order reversed every round. Time: curl's own
time_total. CPU time: curl's (user + system, from the kernel's accounting
of the finished child) plus, through the proxy, what ec-proxy's process
used meanwhile (the scheduler's count, /proc/<pid>/task/*/schedstat): the CPU a phone would spend, the
paper's energy proxy.

    .venv/bin/python experiments/paper/fig14_15.py [--sizes 1,10,100] [--reps 3] [--wifi wifi-ac-near] [--out DIR]
"""

from __future__ import annotations

import argparse
import http.server
import os
import resource
import ssl
import statistics
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))
sys.path.insert(0, str(HERE.parent / "netlab"))
import figures  # noqa: E402
from common import cpu_seconds  # noqa: E402
import netlab  # noqa: E402
import profiles  # noqa: E402

SERVER = netlab.ADDR["cloud"]


def start_server(bed, workdir: Path, nbytes: int):
    """An HTTPS server in the cloud namespace: GET /download sends nbytes, PUT /upload reads a body."""
    import trustme
    from proxy_bench import _BulkHandler

    ca = trustme.CA()
    cert = ca.issue_cert(SERVER)
    ca_path = workdir / "bulk-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    handler = type("Handler", (_BulkHandler,), {"payload": os.urandom(nbytes)})

    def make():
        server = http.server.ThreadingHTTPServer((SERVER, 0), handler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return server

    server = bed.call("cloud", make)  # its sockets, and the ones it accepts, live in the cloud namespace
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, ca_path


def curl(bed, server, ca_path: Path, kind: str, nbytes: int, upload_file: Path, proxy: str | None) -> tuple[float, float]:
    """(seconds, curl's CPU seconds) of one transfer."""
    url = f"https://{SERVER}:{server.server_address[1]}/{kind}"
    command = ["curl", "--silent", "--show-error", "--fail", "--cacert", str(ca_path), "--noproxy",
               "" if proxy else "*", "-o", "/dev/null", "-w", "%{http_code} %{time_total} %{size_download} %{size_upload}"]
    if proxy:
        command += ["--proxy", proxy]
    if kind == "upload":
        command += ["-T", str(upload_file), "-H", "Expect:"]
    command.append(url)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = bed.run_cmd("device", command, capture_output=True, text=True, env=env, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise SystemExit(f"fig14_15: curl {kind} failed ({out.returncode}): {out.stderr[-500:]}")
    code, seconds, down, up = out.stdout.split()
    moved = int(float(down if kind == "download" else up))
    if code != "200" or moved != nbytes:
        raise SystemExit(f"fig14_15: curl {kind}: status {code}, {moved} bytes of {nbytes}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(seconds), cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,10,100", help="transfer sizes in MB")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--wifi", default="wifi-ac-near")
    parser.add_argument("--wan", default="wan-fiber")
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT)
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    progress = figures.Progress(len(sizes) * 2 + 1, "fig14_15")
    with tempfile.TemporaryDirectory(prefix="ec-fig14-") as tmp, netlab.Testbed(args.wifi, args.wan) as bed:
        from system import PROXY_PORT, EdgeCourier

        progress.step(f"starting the system on testbed {bed.run}")
        ec = EdgeCourier(bed, Path(tmp) / "system")
        ec.start()
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        for size in sizes:
            nbytes = int(size * 1_000_000)
            server, ca_path = start_server(bed, Path(tmp), nbytes)
            upload_file = Path(tmp) / "upload.bin"
            upload_file.write_bytes(os.urandom(nbytes))
            for kind in ("download", "upload"):
                progress.step(f"{size:g} MB {kind}")
                times = {"direct": [], "proxy": []}
                cpus = {"direct": [], "proxy": []}
                for rep in range(args.reps):
                    for path in (("direct", "proxy") if rep % 2 == 0 else ("proxy", "direct")):
                        proxy_cpu = cpu_seconds(ec.proxy_pid)
                        seconds, cpu = curl(bed, server, ca_path, kind, nbytes, upload_file,
                                            proxy if path == "proxy" else None)
                        if path == "proxy":
                            cpu += cpu_seconds(ec.proxy_pid) - proxy_cpu
                        times[path].append(seconds)
                        cpus[path].append(cpu)
                rows.append({"mb": size, "kind": kind, **{f"{p}_s": statistics.median(v) for p, v in times.items()},
                             **{f"{p}_cpu_s": statistics.median(v) for p, v in cpus.items()}})
            server.shutdown()
            server.server_close()
        progress.finish()
    wifi, wan = profiles.PROFILES[args.wifi], profiles.PROFILES[args.wan]
    table = [[f"{r['mb']:g}", r["kind"], f"{r['direct_s']:.3f}", f"{r['proxy_s']:.3f}", f"{r['proxy_s'] / r['direct_s']:.2f}x",
              f"{r['mb'] * 8 / r['proxy_s']:.0f}", f"{r['direct_cpu_s']:.3f}", f"{r['proxy_cpu_s']:.3f}",
              f"{r['proxy_cpu_s'] / max(r['direct_cpu_s'], 1e-3):.1f}x"] for r in rows]
    figures.print_table(f"Figs. 14-15: HTTPS transfers that are not saves, direct vs through ec-proxy (median of {args.reps})",
                        ["MB", "direction", "direct s", "via proxy s", "time x", "via proxy Mbit/s", "direct CPU s",
                         "via proxy CPU s", "CPU x"], table,
                        notes=[f"testbed: {wifi.describe()}; {wan.describe()}",
                               "CPU: curl's user + system time, plus ec-proxy's during the transfer (the tunnel: "
                               "mitmproxy relays the TLS bytes without decrypting them)", figures.machine_line()])
    figures.write_csv(args.out / "fig14_15.csv", ["mb", "kind", "direct_s", "proxy_s", "direct_cpu_s", "proxy_cpu_s"],
                      [[r["mb"], r["kind"], round(r["direct_s"], 4), round(r["proxy_s"], 4), round(r["direct_cpu_s"], 4),
                        round(r["proxy_cpu_s"], 4)] for r in rows])
    plt = figures.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    labels = [f"{r['mb']:g} MB\n{r['kind']}" for r in rows]
    xs = range(len(rows))
    for ax, key, title, ylabel in ((axes[0], "s", "Fig. 14: transfer time", "seconds (median, log)"),
                                   (axes[1], "cpu_s", "Fig. 15: CPU time on the device (energy proxy)",
                                    "CPU seconds (median, log)")):
        ax.bar([x - 0.2 for x in xs], [r[f"direct_{key}"] for r in rows], 0.38, label="direct", color="#d62728")
        ax.bar([x + 0.2 for x in xs], [r[f"proxy_{key}"] for r in rows], 0.38,
               label="through ec-proxy (tunnel)", color="#1f77b4")
        ax.set_yscale("log")
        # Labels on the 2 and 5 ticks too: a decade or two of log axis with one label is unreadable.
        from matplotlib.ticker import LogLocator, FuncFormatter
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.text(0.01, 0.01, f"curl over HTTPS to a non-provider host; {args.wifi} + {args.wan}", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(args.out / "fig14_15.png")
    print(f"wrote {args.out / 'fig14_15.csv'}, {args.out / 'fig14_15.png'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
