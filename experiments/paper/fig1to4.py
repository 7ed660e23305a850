#!/usr/bin/env python3
"""Figs. 1-4 of the original paper: what a one-edit sync of an office document costs with today's sync methods.

Figs. 1-3 plot TPOFS, the traffic of one sync over the file's size, and
Fig. 4 the binary difference between the two versions. For every
LibreOffice edit trace (`make traces`: the six formats; Writer with about
1 KB, 100 KB and 1 MB of text; one small edit and a save) this computes
the bytes a sync would send with:

- whole file: today's cloud clients;
- rsync: the delta rsync sends (`--only-write-batch`, literal data plus
  block references; the receiver's block signatures not counted), from
  experiments/bench/patch_sizes.py;
- CDC dedup (Seafile-like): content-defined chunks (a gear rolling hash,
  FastCDC-style normalised chunking), average 1 MiB (min 256 KiB, max
  4 MiB; Seafile's own chunker is Rabin-based with configurable sizes: the
  parameters here are an assumption), and the same with 8 KiB chunks; the
  chunks the server lacks plus a 32-byte hash per chunk;
- 4 MiB-block dedup (Dropbox-like): fixed 4 MiB blocks, the changed blocks
  plus a 32-byte hash per block;
- zstd -19 --patch-from (a whole-file delta), from patch_sizes.py;
- EdgeCourier: the edit patch (verified to rebuild the new file exactly).

Binary difference (Fig. 4): the share of the new file between the first
and the last byte that differ from the old one (a deflated part changes
from the edit onward), and the share of bytes that differ at the same
offset.

    .venv/bin/python experiments/paper/fig1to4.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))
import figures  # noqa: E402
import patch_sizes  # noqa: E402  (rsync, zstd: the benchmark's own measurements)

FORMATS = ("docx", "odt", "xlsx", "ods", "pptx", "odp")
HASH_BYTES = 32
METHODS = [("whole", "whole file"), ("rsync", "rsync"), ("cdc_1m", "CDC dedup, 1 MiB (Seafile-like)"),
           ("cdc_8k", "CDC dedup, 8 KiB"), ("block_4m", "4 MiB-block dedup (Dropbox-like)"),
           ("zstd", "zstd --patch-from"), ("ec", "EdgeCourier")]


def _gear_table() -> list[int]:
    return [int.from_bytes(hashlib.sha256(bytes([i])).digest()[:8], "little") for i in range(256)]


GEAR = _gear_table()
MASK64 = (1 << 64) - 1


def cdc_chunks(data: bytes, average: int) -> list[bytes]:
    """FastCDC-style chunking: a gear hash, a stricter mask before the average size, a looser one after."""
    minimum, maximum = average // 4, average * 4
    bits = average.bit_length() - 1
    strict, loose = ((1 << (bits + 1)) - 1) << (64 - bits - 1), ((1 << (bits - 1)) - 1) << (64 - bits + 1)
    chunks, start, n = [], 0, len(data)
    while start < n:
        end = min(n, start + maximum)
        if end - start <= minimum:
            chunks.append(data[start:end])
            break
        h, i, cut = 0, start + minimum, end
        normal = min(end, start + average)
        while i < end:
            h = ((h << 1) + GEAR[data[i]]) & MASK64
            if not (h & (strict if i < normal else loose)):
                cut = i + 1
                break
            i += 1
        chunks.append(data[start:cut])
        start = cut
    return chunks


def dedup_traffic(base_chunks: list[bytes], new_chunks: list[bytes]) -> int:
    have = {hashlib.sha256(c).digest() for c in base_chunks}
    return sum(len(c) for c in new_chunks if hashlib.sha256(c).digest() not in have) + HASH_BYTES * len(new_chunks)


def blocks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def binary_difference(base: bytes, new: bytes) -> tuple[float, float]:
    prefix = 0
    limit = min(len(base), len(new))
    while prefix < limit and base[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and base[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    span = (len(new) - prefix - suffix) / len(new)
    same_offset = sum(a != b for a, b in zip(base, new)) + abs(len(new) - len(base))
    return span, same_offset / len(new)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="only the 1k Writer and the Calc/Impress 'cell'/'title' traces")
    args = parser.parse_args(argv)
    traces = Path(os.environ.get("EC_TRACES") or figures.REPO / ".cache" / "traces")
    manifest = json.loads((traces / "manifest.json").read_text())
    selected = [t for t in manifest["traces"] if t["edit"] != "noedit"]
    if args.quick:
        selected = [t for t in selected if t.get("size") == "1k" or t["edit"] in ("cell", "title")]
    import ec_patch

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    progress = figures.Progress(len(selected), "fig1to4")
    with tempfile.TemporaryDirectory() as work:
        for trace in selected:
            progress.step(trace["name"])
            measured = patch_sizes.measure(trace, str(traces), work, ec_patch)
            if not measured["ec_ok"]:
                raise SystemExit(f"fig1to4: the EdgeCourier patch of {trace['name']} does not rebuild the file")
            base = (traces / trace["base"]).read_bytes()
            new = (traces / trace["new"]).read_bytes()
            span, same_offset = binary_difference(base, new)
            rows.append({
                "trace": trace["name"], "format": trace["format"], "edit": trace["edit"], "size": trace.get("size"),
                "file_bytes": len(new), "whole": len(new), "rsync": measured["rsync_batch_bytes"],
                "cdc_1m": dedup_traffic(cdc_chunks(base, 1 << 20), cdc_chunks(new, 1 << 20)),
                "cdc_8k": dedup_traffic(cdc_chunks(base, 8 << 10), cdc_chunks(new, 8 << 10)),
                "block_4m": dedup_traffic(blocks(base, 4 << 20), blocks(new, 4 << 20)),
                "zstd": measured["zstd_bytes"], "ec": measured["ec_bytes"],
                "changed_span": span, "changed_same_offset": same_offset})
        progress.finish()
    keys = ["trace", "format", "edit", "size", "file_bytes"] + [k for k, _ in METHODS] + ["changed_span", "changed_same_offset"]
    figures.write_csv(args.out / "fig1to4.csv", keys, [[r[k] for k in keys] for r in rows])
    table = [[r["trace"], f"{r['file_bytes']:,}"] + [f"{r[k] / r['file_bytes']:.3f}" for k, _ in METHODS[1:]]
             + [f"{100 * r['changed_span']:.0f}%", f"{100 * r['changed_same_offset']:.0f}%"] for r in rows]
    figures.print_table("Figs. 1-3: TPOFS (bytes one sync sends / file size) after one small edit, and Fig. 4",
                        ["trace", "file B"] + [label for _, label in METHODS[1:]] + ["differing span", "differing bytes"],
                        table,
                        notes=["TPOFS 1.000 = the whole file; differing span = share of the new file between the "
                               "first and the last byte that differ from the old one (ZIP timestamps make it ~100%); "
                               "differing bytes = share of bytes that differ at the same offset",
                               "every EdgeCourier patch rebuilt its file exactly", figures.machine_line()])
    by_format = {f: [r for r in rows if r["format"] == f] for f in FORMATS}
    by_format = {f: rs for f, rs in by_format.items() if rs}
    median = lambda rs, k: statistics.median(r[k] / r["file_bytes"] for r in rs)  # noqa: E731
    figures.print_table("Median TPOFS per format", ["format", "traces"] + [label for _, label in METHODS[1:]]
                        + ["differing bytes"],
                        [[f, len(rs)] + [f"{median(rs, k):.4f}" for k, _ in METHODS[1:]]
                         + [f"{100 * statistics.median(r['changed_same_offset'] for r in rs):.0f}%"]
                         for f, rs in by_format.items()])
    plt = figures.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 1.2]})
    width = 0.8 / (len(METHODS) - 1)
    for i, (key, label) in enumerate(METHODS[1:]):
        ax.bar([x + (i - (len(METHODS) - 2) / 2) * width for x in range(len(by_format))],
               [median(rs, key) for rs in by_format.values()], width, label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_ylim(top=40)  # room for the legend above the whole-file line
    ax.set_xticks(range(len(by_format)), list(by_format))
    ax.set_ylabel("TPOFS: sync traffic / file size (median, log)")
    ax.set_title("Figs. 1-3: one small edit, synced (1.0 = whole file)")
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    bx.bar(range(len(by_format)), [100 * statistics.median(r["changed_same_offset"] for r in rs)
                                   for rs in by_format.values()], color="#7f7f7f")
    bx.set_xticks(range(len(by_format)), list(by_format))
    bx.set_ylim(0, 100)
    bx.set_ylabel("% of bytes differing at the same offset (median)")
    bx.set_title("Fig. 4: binary difference")
    fig.text(0.01, 0.01, "LibreOffice 7.4 edit traces (make traces); medians over the traces of each format",
             fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(args.out / "fig1to4.png")
    print(f"wrote {args.out / 'fig1to4.csv'}, {args.out / 'fig1to4.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
