#!/usr/bin/env python3
"""Check the bound "no patch is larger than `zstd -19 --patch-from` of the whole file plus 64 bytes".

Pairs checked (both files of a pair have the same format):

- every LibreOffice edit trace: its base.<ext> -> new.<ext> (the traces folder:
  --traces, else EC_TRACES, else .cache/traces; its manifest.json lists them);
- every ordered pair of distinct files of one format folder of the shared
  corpus (docx xlsx pptx odt ods odp of <shared>/corpus/real, found through
  testbed.shared, i.e. EC_SHARED): unrelated documents, the case where the
  structured patch gains least. --unordered keeps one direction of each pair.

For each pair:

- EdgeCourier: `ecsync diff BASE NEW -o PATCH` (the built binary; it verifies
  the patch applies back, as by default), its size, wall time and kind (zip or
  binary, from `ecsync inspect --json`). --compare OTHER_ECSYNC runs a second
  binary (e.g. a copy of the one before a change) on the same pair, in the
  same round, so the two diff times are comparable;
- zstd: `zstd -q -19 --patch-from=BASE NEW -c`, the file exactly as the CLI
  writes it (magic, frame header with content size, checksum). No `--long`:
  in --patch-from mode the CLI sets the window to the file's size itself and
  switches long-distance matching on by itself when the file is too large for
  level 19's match finder (`--long=27` forces it on, which costs ~80 bytes on
  a 0.8 MB .docx). Memory: the CLI raises its memory limit to the file's size
  in --patch-from mode; files over 128 MiB get `--long=<log2 of the size + 1>`
  so the window covers the whole base. --zstd-arg adds arguments;
- over = EdgeCourier - (zstd + 64): the pair breaks the bound when over > 0.

Printed: the pairs over the bound (count per group), the worst pairs, and the
diff time distribution (median, p90, p99, max) per group and patch kind.

    .venv/bin/python experiments/bench/zstd_bound.py                      # everything (long)
    .venv/bin/python experiments/bench/zstd_bound.py --formats docx --max-pairs 40
    .venv/bin/python experiments/bench/zstd_bound.py --compare /tmp/ecsync-old --json out.json
"""

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_bytes, fmt_time, progress, quantile  # noqa: E402

SLACK = 64  # bytes: the bound is zstd + SLACK
FORMATS = ("docx", "xlsx", "pptx", "odt", "ods", "odp")
BIG_FILE = 128 << 20  # above this, zstd gets --long so its window covers the base


def corpus_root():
    sys.path.insert(0, common.REPO)
    try:
        from testbed import shared
    except ImportError as error:
        raise common.BenchError(f"cannot import testbed.shared ({error})") from None
    try:
        return shared.corpus()
    except FileNotFoundError as error:
        raise common.BenchError(str(error)) from None


def corpus_pairs(formats, unordered):
    root = corpus_root()
    pairs = []
    for fmt in formats:
        folder = root / fmt
        if not folder.is_dir():
            raise common.BenchError(f"no corpus folder {folder}")
        files = sorted(p for p in folder.iterdir() if p.is_file())
        combos = itertools.combinations(files, 2) if unordered else itertools.permutations(files, 2)
        pairs += [{"group": f"corpus {fmt}", "name": f"{b.name} -> {n.name}",
                   "base": str(b), "new": str(n)} for b, n in combos]
    return pairs


def trace_pairs(traces, formats):
    manifest = common.load_manifest(traces)
    return [{"group": f"trace {t['format']}", "name": t["name"],
             "base": os.path.join(traces, t["base"]), "new": os.path.join(traces, t["new"])}
            for t in manifest["traces"] if t["format"] in formats]


def zstd_command(base, new, extra, biggest=0):
    command = [common.tool("zstd"), "-q", "-19", f"--patch-from={base}", new, "-c"]
    if biggest > BIG_FILE:
        command.insert(2, f"--long={min(31, biggest.bit_length() + 1)}")
    return command + list(extra)


def zstd_size(base, new, extra):
    start = time.perf_counter()
    biggest = max(os.path.getsize(base), os.path.getsize(new))
    result = subprocess.run(zstd_command(base, new, extra, biggest), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise common.BenchError(f"zstd failed on {base} -> {new}: {result.stderr.decode()[-500:]}")
    return len(result.stdout), elapsed


def ec_diff(ecsync, base, new, out, verify):
    command = [ecsync, "diff", base, new, "-o", out] + ([] if verify else ["--no-verify"])
    start = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise common.BenchError(f"{' '.join(command)} failed: {result.stderr.decode()[-500:]}")
    info = subprocess.run([ecsync, "inspect", "--json", out], capture_output=True, text=True)
    kind = json.loads(info.stdout).get("kind") if info.returncode == 0 else "?"
    return os.path.getsize(out), elapsed, kind


def measure(pair, args, workdir):
    row = dict(pair)
    row["file_bytes"] = os.path.getsize(pair["new"])
    row["zstd_bytes"], row["zstd_s"] = zstd_size(pair["base"], pair["new"], args.zstd_arg)
    contenders = [("ec", args.ecsync)] + ([("old", args.compare)] if args.compare else [])
    for key, binary in contenders:
        times = []
        for _ in range(args.reps):
            size, elapsed, kind = ec_diff(binary, pair["base"], pair["new"],
                                          os.path.join(workdir, f"{key}.ecp"), not args.no_verify)
            times.append(elapsed)
        row[f"{key}_bytes"], row[f"{key}_s"], row[f"{key}_kind"] = size, min(times), kind
        row[f"{key}_over"] = size - (row["zstd_bytes"] + SLACK)
    return row


def time_stats(rows, key):
    values = [r[key] for r in rows]
    return [fmt_time(quantile(values, q)) for q in (0.5, 0.9, 0.99)] + [fmt_time(max(values))]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Pairs run in a fixed order (traces, then the corpus by format); --max-pairs "
               "takes a seeded random sample of them. Progress goes to stderr.")
    parser.add_argument("--traces", default=os.environ.get("EC_TRACES") or common.DEFAULT_TRACES,
                        help="folder with the traces' manifest.json (default: EC_TRACES, "
                             "else .cache/traces)")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"comma-separated formats to check (default: {','.join(FORMATS)})")
    parser.add_argument("--no-traces", action="store_true", help="skip the edit traces")
    parser.add_argument("--no-corpus", action="store_true", help="skip the corpus pairs")
    parser.add_argument("--unordered", action="store_true",
                        help="one direction per corpus pair (default: both)")
    parser.add_argument("--max-pairs", type=int, metavar="N",
                        help="check at most N pairs in all (a seeded random sample; default: all)")
    parser.add_argument("--seed", type=int, default=13, help="sample seed for --max-pairs")
    parser.add_argument("--ecsync", default=None,
                        help="ecsync binary to check (default: .venv/bin/ecsync, else PATH)")
    parser.add_argument("--compare", metavar="ECSYNC",
                        help="a second ecsync binary (e.g. the previous build) measured on the "
                             "same pairs in the same rounds")
    parser.add_argument("--reps", type=int, default=1,
                        help="diff runs per pair and binary; the fastest counts (default: 1)")
    parser.add_argument("--no-verify", action="store_true",
                        help="pass --no-verify to ecsync diff (time the diff without its self-check)")
    parser.add_argument("--zstd-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for zstd (repeatable)")
    parser.add_argument("--worst", type=int, default=15, help="worst pairs listed (default: 15)")
    parser.add_argument("--json", metavar="FILE", help="also write every row to FILE")
    args = parser.parse_args(argv)

    args.ecsync = args.ecsync or common.tool("ecsync")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = set(formats) - set(FORMATS)
    if unknown:
        parser.error(f"unknown format(s): {', '.join(sorted(unknown))}")
    pairs = []
    if not args.no_traces:
        pairs += trace_pairs(args.traces, formats)
    if not args.no_corpus:
        pairs += corpus_pairs(formats, args.unordered)
    total = len(pairs)
    if args.max_pairs is not None and args.max_pairs < total:
        keep = sorted(random.Random(args.seed).sample(range(total), args.max_pairs))
        pairs = [pairs[i] for i in keep]
    print(common.machine_line(common.machine()))
    print(f"ecsync: {args.ecsync}" + (f"; compared with {args.compare}" if args.compare else ""))
    print(f"zstd: {' '.join(zstd_command('BASE', 'NEW', args.zstd_arg)[1:])} "
          f"(+ --long for files over {BIG_FILE >> 20} MiB)")
    print(f"pairs: {len(pairs)} of {total}\n")

    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zstd-bound-") as workdir:
        for i, pair in enumerate(pairs, 1):
            row = measure(pair, args, workdir)
            rows.append(row)
            flag = f"  OVER by {row['ec_over']} B" if row["ec_over"] > 0 else ""
            elapsed = time.perf_counter() - started
            eta = elapsed / i * (len(pairs) - i)
            progress(f"zstd_bound: [{i}/{len(pairs)}] {pair['group']}: {pair['name']}: "
                     f"EC {row['ec_bytes']} B ({row['ec_kind']}, {fmt_time(row['ec_s'])}), "
                     f"zstd {row['zstd_bytes']} B{flag}  (eta {fmt_time(eta)})")

    keys = [("ec", "EdgeCourier")] + ([("old", "compared")] if args.compare else [])
    groups = list(dict.fromkeys(r["group"] for r in rows))
    summary = []
    for group in groups + ["all"]:
        rs = [r for r in rows if group in ("all", r["group"])]
        line = [group, len(rs)]
        for key, _ in keys:
            line += [sum(r[f"{key}_over"] > 0 for r in rs), max(r[f"{key}_over"] for r in rs)]
        summary.append(line)
    columns = ["group", "pairs"]
    for _, label in keys:
        columns += [f"{label}: over bound", f"{label}: max over (B)"]
    common.table(f"Pairs whose patch exceeds zstd -19 --patch-from + {SLACK} B", columns, summary,
                 notes=["over = patch - (zstd + 64); max over <= 0: the bound holds"])

    worst = sorted(rows, key=lambda r: r["ec_over"], reverse=True)[:args.worst]
    worst_columns = ["group", "pair", "file", "zstd", "EC", "EC kind", "over", "EC diff"]
    if args.compare:
        worst_columns += ["compared", "its over", "its diff"]
    common.table(
        "Worst pairs (largest patch - zstd)", worst_columns,
        [[r["group"], r["name"], fmt_bytes(r["file_bytes"]), r["zstd_bytes"], r["ec_bytes"],
          r["ec_kind"], r["ec_over"], fmt_time(r["ec_s"])]
         + ([r["old_bytes"], r["old_over"], fmt_time(r["old_s"])] if args.compare else [])
         for r in worst])

    time_rows = []
    for group in groups + ["all"]:
        rs = [r for r in rows if group in ("all", r["group"])]
        for key, label in keys:
            for kind in sorted({r[f"{key}_kind"] for r in rs}) + ["any"]:
                ks = [r for r in rs if kind in ("any", r[f"{key}_kind"])]
                time_rows.append([group, label, kind, len(ks)] + time_stats(ks, f"{key}_s"))
        time_rows.append([group, "zstd -19", "-", len(rs)] + time_stats(rs, "zstd_s"))
    common.table("Diff time (wall, one process per diff" + ("" if args.no_verify else
                 ", self-check included") + ")",
                 ["group", "binary", "kind", "pairs", "median", "p90", "p99", "max"], time_rows)

    if args.compare:
        slower = sorted(rows, key=lambda r: r["ec_s"] - r["old_s"], reverse=True)[:args.worst]
        common.table("Largest diff-time increases (EdgeCourier vs compared)",
                     ["group", "pair", "file", "EC", "compared", "EC diff", "compared diff"],
                     [[r["group"], r["name"], fmt_bytes(r["file_bytes"]), r["ec_bytes"],
                       r["old_bytes"], fmt_time(r["ec_s"]), fmt_time(r["old_s"])] for r in slower])

    common.write_json(args.json, "zstd_bound",
                      {"traces": args.traces, "formats": formats, "unordered": args.unordered,
                       "max_pairs": args.max_pairs, "seed": args.seed, "ecsync": args.ecsync,
                       "compare": args.compare, "reps": args.reps, "no_verify": args.no_verify,
                       "zstd_args": args.zstd_arg, "slack": SLACK}, rows, [])
    over = sum(r["ec_over"] > 0 for r in rows)
    print(f"{over} of {len(rows)} pairs exceed zstd -19 --patch-from + {SLACK} B")
    return 1 if over else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.BenchError as error:
        print(f"zstd_bound: error: {error}", file=sys.stderr)
        sys.exit(2)
