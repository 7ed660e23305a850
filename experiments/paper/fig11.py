#!/usr/bin/env python3
"""Fig. 11 of the original paper: sync time of a one-character edit and its breakdown, over Wi-Fi speeds and RTTs.

On the netns testbed (experiments/netlab), for each Wi-Fi rate (a testbed
each) and round-trip time (changed on the running delay line), an app on
the device saves LibreOffice .docx documents with one character typed
(writer-{100k,1m}-middle-docx of `make traces`, alternating base and new so
that every save is a one-character edit) to Dropbox over one kept-open TLS
connection, as apps do (experiments/bench/proxy_bench.py's App, the Dropbox
upload request), through two paths in the same run, interleaved:

- direct: a plain mitmdump on the device that only forwards to the cloud;
- EdgeCourier: ec-proxy (with its link-aware patch-or-whole rule,
  `--decision hybrid`, unless --decision bytes) -> the EPS on the AP ->
  the cloud.

Breakdown of the EdgeCourier time from the EPS's own histograms (means):
rebuild (patch applied, SHA-256 checked; a streamed save's rebuild runs
during its upload, so only what the EPS's save time leaves beyond the
provider request counts), EPS -> provider request (the WAN and the
provider), the rest of the EPS's handling; the device's share (the
diff, the proxy, the Wi-Fi link) is the total minus the EPS's. Which way
the rule sent each save (patch / whole file to the EPS / direct) comes
from ec-proxy's counters. Every save is checked (status 200 and the
provider's content_hash of the app's bytes).

    .venv/bin/python experiments/paper/fig11.py [--rates 5,20,100,340] [--rtts 4,20,60] [--reps 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))
sys.path.insert(0, str(HERE.parent / "netlab"))
import figures  # noqa: E402
import netlab  # noqa: E402
from profiles import LinkProfile  # noqa: E402

PAPER_ADDED_SECONDS = 0.5  # "EdgeCourier added about 0.5 s" (the paper's Fig. 11)
TRACES = ("writer-100k-middle-docx", "writer-1m-middle-docx")
PARTS = [("device", "device: diff, proxy, Wi-Fi link", "#1f77b4"), ("rebuild", "EPS: rebuild (beyond its overlap with the upload)", "#2ca02c"),
         ("eps_other", "EPS: other (incl. receiving a whole file)", "#98df8a"), ("provider", "EPS -> provider (WAN, cloud)", "#9467bd")]


def eps_means(bed, ec, before: str) -> tuple[str, dict]:
    import eps_bench

    def get() -> str:
        with urllib.request.urlopen(ec.eps_metrics_url, timeout=10) as response:
            return response.read().decode()

    after = bed.call("ap", get)
    means = {}
    for metric in ("ec_eps_save_seconds", "ec_eps_rebuild_seconds", "ec_eps_provider_request_seconds"):
        delta = eps_bench.histogram_delta(eps_bench.histograms(before, metric), eps_bench.histograms(after, metric))
        count = sum(h["count"] for h in delta.values())
        means[metric] = sum(h["mean"] * h["count"] for h in delta.values()) / count if count else 0.0
    return after, means


def plot(rows: list[dict], reps: int, path: Path) -> None:
    plt = figures.pyplot()
    names = list(dict.fromkeys(r["trace"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        rs = [r for r in rows if r["trace"] == name]
        xs = range(len(rs))
        ax.bar([x - 0.2 for x in xs], [r["direct_s"] for r in rs], 0.38, color="#d62728", label="direct (total)")
        bottom = [0.0] * len(rs)
        for key, label, color in PARTS:
            values = [r["parts"][key] for r in rs]
            ax.bar([x + 0.2 for x in xs], values, 0.38, bottom=bottom, color=color, label=f"EdgeCourier: {label}")
            bottom = [b + v for b, v in zip(bottom, values)]
        for x, r in zip(xs, rs):
            sent = "P" if r["how"]["patch"] == reps else ("W" if r["how"]["patch"] == 0 else "mix")
            ax.text(x + 0.2, bottom[x], sent, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), [f"{r['rate_mbit']:g}M\n{r['rtt_ms']:g}ms" for r in rs], fontsize=7)
        ax.set_xlabel("Wi-Fi rate (Mbit/s each way) and round-trip time")
        ax.set_ylabel("time of one save (s, median)")
        ax.set_title(f"{name} ({rs[0]['file_bytes'] / 1000:.0f} kB)")
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.suptitle("Fig. 11: one-character save, direct vs EdgeCourier (P = sent as a patch, W = whole file)")
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="5,20,100,340", help="Wi-Fi rates in Mbit/s, each way, comma separated (default %(default)s)")
    parser.add_argument("--rtts", default="4,20,60", help="Wi-Fi round-trip times in ms, comma separated (default %(default)s)")
    parser.add_argument("--traces", default=",".join(TRACES),
                        help="trace names of `make traces` (.cache/traces), comma separated (default %(default)s)")
    parser.add_argument("--reps", type=int, default=3, help="saves per path, document, rate and RTT (default %(default)s)")
    parser.add_argument("--decision", default="hybrid", choices=("hybrid", "bytes"),
                        help="ec-proxy's rule: hybrid (its default: the shortest wait) or bytes (a patch whenever smaller)")
    parser.add_argument("--wan", default="wan-fiber",
                        help="link profile between the access point and the cloud (experiments/netlab/profiles.py; default %(default)s)")
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT,
                        help="folder for fig11.json, .csv and .png (default .cache/paper)")
    parser.add_argument("--plot-from", type=Path, metavar="JSON", help="only redraw the PNG from a run's fig11.json")
    args = parser.parse_args(argv)
    if args.plot_from:
        rows = json.loads(args.plot_from.read_text())
        plot(rows, len(rows[0]["times"]["direct"]), args.out / "fig11.png")
        return 0
    rates = [float(r) for r in args.rates.split(",")]
    rtts = [float(r) for r in args.rtts.split(",")]
    names = args.traces.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    from proxy_bench import App

    sys.path.insert(0, str(HERE))
    from table2 import trace_files, traces_dir

    docs = {n: tuple(p.read_bytes() for p in trace_files(traces_dir(), n)) for n in names}
    rows = []
    progress = figures.Progress(len(rates) * len(rtts) * len(names), "fig11")
    with tempfile.TemporaryDirectory(prefix="ec-fig11-") as tmp:
        for rate in rates:
            wifi = LinkProfile(f"wifi-{rate:g}m", "wifi", rate, rate, rtts[0], 0.0, "Fig. 11 sweep")
            with netlab.Testbed(wifi, args.wan) as bed:
                from system import DIRECT_PORT, PROXY_PORT, EdgeCourier

                ec = EdgeCourier(bed, Path(tmp) / f"r{rate:g}", decision=args.decision)
                ec.start()

                class Proxy:  # what proxy_bench.App needs of a proxy
                    def __init__(self, port, ca):
                        self.listen, self.ca = f"127.0.0.1:{port}", ca

                apps = {"direct": App("alice", proxy=Proxy(DIRECT_PORT, ec.direct_conf / "mitmproxy-ca-cert.pem")),
                        "edgecourier": App("alice", proxy=Proxy(PROXY_PORT, ec.proxy_state / "mitmproxy" /
                                                                "mitmproxy-ca-cert.pem"))}
                metrics = bed.call("ap", lambda: urllib.request.urlopen(ec.eps_metrics_url,
                                                                        timeout=10).read().decode())
                for rtt in rtts:
                    bed.set_rtt("air", rtt)
                    for name in names:
                        progress.step(f"{rate:g} Mbit/s, {rtt:g} ms, {name}")
                        base, new = docs[name]
                        paths = {k: f"/fig11/{k}/{name}.docx" for k in apps}
                        for key, app in apps.items():  # both sides learn the base; connections open
                            bed.call("device", lambda: app.upload(paths[key], base))
                        metrics, _ = eps_means(bed, ec, metrics)
                        totals = ec.proxy_totals()
                        times = {k: [] for k in apps}
                        for rep in range(args.reps):
                            data = (new, base)[rep % 2]
                            for key in (list(apps) if rep % 2 == 0 else list(reversed(apps))):
                                start = time.perf_counter()
                                bed.call("device", lambda: apps[key].upload(paths[key], data))
                                times[key].append(time.perf_counter() - start)
                        metrics, means = eps_means(bed, ec, metrics)
                        after = ec.proxy_totals()
                        how = {k: after[f"{k}_saves"] - totals[f"{k}_saves"] for k in ("patch", "full", "direct")}
                        ec_total = statistics.median(times["edgecourier"])
                        save, rebuild, provider = (means["ec_eps_save_seconds"], means["ec_eps_rebuild_seconds"],
                                                   means["ec_eps_provider_request_seconds"])
                        # A streamed save (spec §5.6) rebuilds while it uploads: only the rebuild
                        # beyond the provider exchange adds to the save, so the parts add up to it.
                        rebuild = min(rebuild, max(0.0, save - provider))
                        rows.append({"rate_mbit": rate, "rtt_ms": rtt, "trace": name, "file_bytes": len(new),
                                     "direct_s": statistics.median(times["direct"]), "edgecourier_s": ec_total,
                                     "times": times, "how": how,
                                     "parts": {"device": max(0.0, ec_total - save), "rebuild": rebuild,
                                               "eps_other": max(0.0, save - rebuild - provider),
                                               "provider": provider}})
                for app in apps.values():
                    app.close()
        progress.finish()
    table = []
    for r in rows:
        p, how = r["parts"], r["how"]
        table.append([f"{r['rate_mbit']:g}", f"{r['rtt_ms']:g}", r["trace"].split("-")[1],
                      f"{r['direct_s'] * 1000:.0f}", f"{r['edgecourier_s'] * 1000:.0f}",
                      f"{(r['edgecourier_s'] - r['direct_s']) * 1000:+.0f}",
                      *(f"{p[k] * 1000:.0f}" for k, _, _ in PARTS),
                      " ".join(f"{k} {n}" for k, n in how.items() if n)])
    figures.print_table(f"Fig. 11: time of a one-character save (median of {args.reps}), ms",
                        ["Wi-Fi Mbit/s", "RTT ms", "text", "direct", "EdgeCourier", "EC - direct",
                         "device", "EPS rebuild", "EPS other", "EPS->provider", "sent as"], table,
                        notes=[f"WAN {args.wan}; ec-proxy --decision {args.decision}; one kept-open TLS connection "
                               "per path; saves alternate base/new (each a one-character edit); every save checked at "
                               "the provider",
                               "breakdown (EdgeCourier): the EPS's own histograms (means); device = total - the EPS's "
                               "save time (diff, proxy, the Wi-Fi link both ways)",
                               f"paper: EdgeCourier added about {PAPER_ADDED_SECONDS} s", figures.machine_line()])
    figures.write_csv(args.out / "fig11.csv",
                      ["rate_mbit", "rtt_ms", "trace", "file_bytes", "direct_s", "edgecourier_s", "device_s",
                       "eps_rebuild_s", "eps_other_s", "eps_provider_s", "patch_saves", "full_saves", "direct_saves"],
                      [[r["rate_mbit"], r["rtt_ms"], r["trace"], r["file_bytes"], round(r["direct_s"], 4),
                        round(r["edgecourier_s"], 4), *(round(r["parts"][k], 4) for k, _, _ in PARTS),
                        r["how"]["patch"], r["how"]["full"], r["how"]["direct"]] for r in rows])
    (args.out / "fig11.json").write_text(json.dumps(rows, indent=1))
    plot(rows, args.reps, args.out / "fig11.png")
    print(f"wrote {args.out / 'fig11.csv'}, {args.out / 'fig11.png'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
