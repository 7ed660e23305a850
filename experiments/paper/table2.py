#!/usr/bin/env python3
"""Table 2 of the original paper: bytes on the device's link per one-character edit, direct vs EdgeCourier.

On the netns testbed (experiments/netlab: the device behind an emulated
Wi-Fi link, the AP with the user's EPS, the cloud with the provider
servers behind an emulated WAN), an unmodified rclone saves LibreOffice
.docx documents with about 1 KB, 100 KB and 1 MB of text (the
writer-{1k,100k,1m}-{start,middle,end}-docx traces of `make traces`: one
character typed at the start, middle or end) to Dropbox twice: the base,
then the edited version. Two paths, interleaved per document:

- direct: rclone -> a plain mitmdump that only forwards (testbed/rclone's
  redirect addon) -> the cloud, over the Wi-Fi link and the WAN: what a
  cloud client does today;
- EdgeCourier: rclone -> ec-proxy (the device) -> the user's EPS over TLS
  (the AP) -> the cloud.

The bytes are the kernel's counters of the device's interface for the
second save (Ethernet frames both ways: everything rclone's save cost on
the device's link, its API calls and TLS included); "upload" is ec-proxy's
own count of the save's request and response to the EPS. Each save is
checked at the provider (SHA-256 of what it holds against the file).

    .venv/bin/python experiments/paper/table2.py [--wifi wifi-ac-far] [--wan wan-fiber] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "netlab"))
import figures  # noqa: E402
import netlab  # noqa: E402
import profiles  # noqa: E402

# The original paper's Table 2 (bytes per one-character edit).
PAPER_DIRECT = {"1k": 8_621, "100k": 83_551, "1m": 763_894}
PAPER_EDGECOURIER = 1_538
SIZES = ("1k", "100k", "1m")
WHERES = ("start", "middle", "end")
LABEL = {"1k": "1 KB", "100k": "100 KB", "1m": "1 MB"}


def traces_dir() -> Path:
    return Path(os.environ.get("EC_TRACES") or figures.REPO / ".cache" / "traces")


def trace_files(traces: Path, name: str) -> tuple[Path, Path]:
    manifest = json.loads((traces / "manifest.json").read_text())
    for t in manifest["traces"]:
        if t["name"] == name:
            return traces / t["base"], traces / t["new"]
    raise SystemExit(f"table2: trace {name} not in {traces} (make traces, or set EC_TRACES)")


def save(bed, ec, path: str, local: Path, remote: str, data: bytes) -> dict:
    """One rclone save; the device link's bytes and the time, checked at the provider."""
    app = ec.app(path)
    totals = ec.proxy_totals() if path == "edgecourier" else None
    before = bed.link_bytes("device")
    start = time.perf_counter()
    local.write_bytes(data)
    local.chmod(0o644)
    app.copyto(local, remote, "--no-check-dest")
    seconds = time.perf_counter() - start
    link = bed.link_bytes("device") - before
    held = ec.provider_file("/" + remote)
    ok = held is not None and held["sha256"] == hashlib.sha256(data).hexdigest()
    row = {"link_bytes": link, "seconds": seconds, "provider_ok": ok}
    if totals is not None:
        after = ec.proxy_totals()
        row["upload_bytes"] = after["sent_bytes"] - totals["sent_bytes"]
        row["how"] = after["last_how"]
    return row


def plot(rows: list, wifi: str, wan: str, path: Path) -> None:
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.16
    xs = range(len(rows))
    series = [("direct (ours)", [r["direct"]["second"]["link_bytes"] for r in rows], "#d62728", None),
              ("direct (paper)", [PAPER_DIRECT[r["size"]] for r in rows], "#ff9896", "//"),
              ("EdgeCourier (ours)", [r["edgecourier"]["second"]["link_bytes"] for r in rows], "#1f77b4", None),
              ("EdgeCourier (paper)", [PAPER_EDGECOURIER for r in rows], "#aec7e8", "//"),
              ("EdgeCourier, the patch upload alone (ours)", [r["edgecourier"]["second"]["upload_bytes"] for r in rows],
               "#2ca02c", None)]
    for i, (label, values, color, hatch) in enumerate(series):
        ax.bar([x + (i - 2) * width for x in xs], values, width, label=label, color=color, hatch=hatch,
               edgecolor="white" if hatch else None)
    ax.set_yscale("log")
    ax.set_ylim(100, 2e7)  # room above the bars for the legend
    ax.set_xticks(list(xs), [f"{LABEL[r['size']]}\n{r['where']}" for r in rows])
    ax.set_xlabel("text in the .docx, and where the character was typed")
    ax.set_ylabel("bytes on the device's link per save (log)")
    ax.set_title(f"Table 2: one typed character, saved by rclone ({wifi}, {wan})")
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    fig.text(0.01, 0.01, "ours: whole rclone save, Ethernet frames both ways on the device's interface "
             "(the upload alone: ec-proxy's count); provider SHA-256 checked", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wifi", default=profiles.DEFAULT_WIFI, help="Wi-Fi link profile (netlab.py profiles)")
    parser.add_argument("--wan", default=profiles.DEFAULT_WAN, help="WAN link profile")
    parser.add_argument("--quick", action="store_true", help="1 KB and 100 KB, middle edit only")
    parser.add_argument("--transparent", action="store_true",
                        help="the device as a rooted phone: no proxy setting in the app, nftables sends its HTTPS "
                             "to ec-proxy in transparent mode")
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT)
    parser.add_argument("--plot-from", type=Path, metavar="JSON", help="only redraw the PNG from a run's table2.json")
    args = parser.parse_args(argv)
    if args.plot_from:
        data = json.loads(args.plot_from.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        plot(data["rows"], data["wifi"], data["wan"], args.out / "table2.png")
        return 0
    traces = traces_dir()
    sizes = ("1k", "100k") if args.quick else SIZES
    wheres = ("middle",) if args.quick else WHERES
    cases = [(s, w) for s in sizes for w in wheres]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    progress = figures.Progress(len(cases) + 1, "table2")
    with tempfile.TemporaryDirectory(prefix="ec-table2-") as tmp, netlab.Testbed(args.wifi, args.wan) as bed:
        from system import EdgeCourier

        progress.step(f"starting providers, EPS and ec-proxy on testbed {bed.run}")
        Path(tmp).chmod(0o755)  # the app may run as its own uid (--transparent)
        ec = EdgeCourier(bed, Path(tmp) / "system", transparent=args.transparent)
        ec.start()
        for size, where in cases:
            name = f"writer-{size}-{where}-docx"
            progress.step(name)
            base_path, new_path = trace_files(traces, name)
            base, new = base_path.read_bytes(), new_path.read_bytes()
            row = {"trace": name, "size": size, "where": where, "file_bytes": len(new)}
            for path in ("direct", "edgecourier"):
                local = Path(tmp) / path / f"{name}.docx"
                local.parent.mkdir(exist_ok=True)
                local.parent.chmod(0o755)  # the app may run as its own uid (--transparent)
                remote = f"table2/{path}/{name}.docx"
                first = save(bed, ec, path, local, remote, base)
                second = save(bed, ec, path, local, remote, new)
                row[path] = {"first": first, "second": second}
            rows.append(row)
        progress.finish()
    ok = all(r[p][s]["provider_ok"] for r in rows for p in ("direct", "edgecourier") for s in ("first", "second"))
    table = []
    for r in rows:
        d, e = r["direct"]["second"], r["edgecourier"]["second"]
        table.append([LABEL[r["size"]], r["where"], f"{r['file_bytes']:,}", f"{d['link_bytes']:,}", f"{e['link_bytes']:,}",
                      f"{e['upload_bytes']:,}", e["how"], f"{d['link_bytes'] / e['link_bytes']:.1f}x",
                      f"{PAPER_DIRECT[r['size']]:,}", f"{PAPER_EDGECOURIER:,}",
                      f"{d['seconds']:.2f} / {e['seconds']:.2f}"])
    wifi, wan = profiles.PROFILES[args.wifi], profiles.PROFILES[args.wan]
    figures.print_table(
        "Table 2: bytes on the device's link for one typed character (rclone save of a LibreOffice .docx)",
        ["text", "edit", "file B", "direct B", "EdgeCourier B", "of which upload B", "sent as", "direct / EC",
         "paper direct B", "paper EC B", "time direct / EC s"], table,
        notes=[f"testbed: {wifi.describe()}; {wan.describe()}; device: "
               + ("transparent (nftables redirect of the app's uid to ec-proxy, no HTTPS_PROXY)" if args.transparent
                  else "HTTPS_PROXY=ec-proxy"),
               "direct / EdgeCourier: kernel counters of the device's interface during the second save (Ethernet "
               "frames both ways: rclone's API calls, TLS and TCP/IP included)",
               "of which upload: ec-proxy's count of the save's request and response to the EPS (HTTP over TLS "
               "payload; the rest is rclone's metadata calls, which the proxy passes to the cloud)",
               "paper: the original paper's Table 2 (its own documents and client)",
               "provider check (SHA-256 of every saved file at the provider): " + ("all equal" if ok else "MISMATCH"),
               figures.machine_line()])
    columns = ["trace", "text", "edit", "file_bytes", "direct_link_bytes", "edgecourier_link_bytes",
               "edgecourier_upload_bytes", "sent_as", "direct_seconds", "edgecourier_seconds", "paper_direct_bytes",
               "paper_edgecourier_bytes", "provider_ok"]
    figures.write_csv(args.out / "table2.csv", columns, [
        [r["trace"], r["size"], r["where"], r["file_bytes"], r["direct"]["second"]["link_bytes"],
         r["edgecourier"]["second"]["link_bytes"], r["edgecourier"]["second"]["upload_bytes"],
         r["edgecourier"]["second"]["how"], round(r["direct"]["second"]["seconds"], 3),
         round(r["edgecourier"]["second"]["seconds"], 3), PAPER_DIRECT[r["size"]], PAPER_EDGECOURIER,
         r["direct"]["second"]["provider_ok"] and r["edgecourier"]["second"]["provider_ok"]] for r in rows])
    (args.out / "table2.json").write_text(json.dumps({"wifi": args.wifi, "wan": args.wan,
                                                      "transparent": args.transparent, "rows": rows}, indent=1))

    plot(rows, args.wifi, args.wan, args.out / "table2.png")
    print(f"wrote {args.out / 'table2.csv'}, {args.out / 'table2.png'}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
