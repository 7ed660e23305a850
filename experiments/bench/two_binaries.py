#!/usr/bin/env python3
"""Two `ecsync` binaries on every trace pair: patch sizes and diff time.

For a change to the encoder, the same-run comparison the benchmarks pages
report: every trace pair of the manifest is diffed by the OLD and the NEW
binary (each patch applied back by its own binary and compared with the new
file), and each format's median patch is printed for both, with the pairs
that got larger. Then whole-process `ecsync diff` is timed, the two binaries
interleaved pair by pair and round by round (--reps rounds), and the medians
are summed over the pairs.

    .venv/bin/python experiments/bench/two_binaries.py --old OLD/ecsync [--new .venv/bin/ecsync] [--reps 3] [--json out.json]
    .venv/bin/python experiments/bench/two_binaries.py --old .venv/bin/ecsync --quick   # the 6 smallest pairs, 1 round

An old binary is made from an earlier commit with, for example,
`git worktree add /tmp/old COMMIT && cargo build --release -p ecsync
--manifest-path /tmp/old/Cargo.toml`.
"""

import argparse
import collections
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_time, progress  # noqa: E402

QUICK_TRACES = 6


def diff_size(binary, base, new, work, tag):
    """Size of BINARY's patch from BASE to NEW, and whether it applies back to NEW exactly."""
    patch, out = os.path.join(work, f"{tag}.ecp"), os.path.join(work, f"{tag}.out")
    common.run_timed([binary, "diff", base, new, "-o", patch])
    common.run_timed([binary, "apply", base, patch, "-o", out])
    return os.path.getsize(patch), common.read(out) == common.read(new)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the baseline ecsync binary")
    parser.add_argument("--new", help="the ecsync binary measured (default: the repository's .venv/bin/ecsync)")
    parser.add_argument("--traces", default=common.DEFAULT_TRACES, help=f"trace folder (default {common.DEFAULT_TRACES})")
    parser.add_argument("--reps", type=int, help="timing rounds (default 3; quick: 1)")
    parser.add_argument("--quick", action="store_true", help=f"the {QUICK_TRACES} smallest pairs, 1 round")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    args = parser.parse_args(argv)
    new_bin = args.new or common.tool("ecsync")
    reps = args.reps or (1 if args.quick else 3)
    traces = common.load_manifest(args.traces)["traces"]
    if args.quick:
        traces = sorted(traces, key=lambda t: t["new_bytes"])[:QUICK_TRACES]
    print(common.machine_line(common.machine()))

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-two-binaries-") as work:
        for i, t in enumerate(traces, 1):
            progress(f"two_binaries: sizes [{i}/{len(traces)}] {t['name']}")
            base, new = os.path.join(args.traces, t["base"]), os.path.join(args.traces, t["new"])
            old_bytes, old_ok = diff_size(args.old, base, new, work, "old")
            new_bytes, new_ok = diff_size(new_bin, base, new, work, "new")
            rows.append({"name": t["name"], "format": t["format"], "base": base, "new": new,
                         "old_bytes": old_bytes, "new_bytes": new_bytes, "old_ok": old_ok, "new_ok": new_ok})
        for i, r in enumerate(rows, 1):
            progress(f"two_binaries: time [{i}/{len(rows)}] {r['name']}")
            patch = os.path.join(work, "t.ecp")
            times = common.interleaved({b: (lambda b=b: common.run_timed([b, "diff", r["base"], r["new"], "-o", patch]))
                                        for b in (args.old, new_bin)}, reps)
            r["old_diff_s"], r["new_diff_s"] = common.median(times[args.old]), common.median(times[new_bin])

    by_format = collections.defaultdict(list)
    for r in rows:
        by_format[r["format"]].append(r)
    table = []
    for fmt in sorted(by_format):
        rs = by_format[fmt]
        table.append([fmt, len(rs), f"{common.median([r['old_bytes'] for r in rs]):g} B",
                      f"{common.median([r['new_bytes'] for r in rs]):g} B",
                      sum(r["new_bytes"] < r["old_bytes"] for r in rs), sum(r["new_bytes"] > r["old_bytes"] for r in rs)])
    old_total, new_total = sum(r["old_bytes"] for r in rows), sum(r["new_bytes"] for r in rows)
    old_time, new_time = sum(r["old_diff_s"] for r in rows), sum(r["new_diff_s"] for r in rows)
    common.table(f"Patch sizes of two ecsync binaries on {len(rows)} trace pairs, median per format",
                 ["format", "pairs", "median old", "median new", "smaller", "larger"], table,
                 notes=[f"all pairs: {old_total} B old, {new_total} B new",
                        f"whole-process ecsync diff, medians of {reps} interleaved rounds summed: "
                        f"{fmt_time(old_time)} old, {fmt_time(new_time)} new ({new_time / old_time:.3f}x)",
                        f"old: {args.old}; new: {new_bin}"])
    larger = [r["name"] for r in rows if r["new_bytes"] > r["old_bytes"]]
    wrong = [r["name"] for r in rows if not (r["old_ok"] and r["new_ok"])]
    goals = [
        common.goal("no patch larger with the new binary", not larger, ", ".join(larger) or f"none of {len(rows)}"),
        common.goal("every patch applies back exactly", not wrong, ", ".join(wrong) or "all"),
    ]
    common.print_goals(goals)
    common.write_json(args.json, "two_binaries", {"old": args.old, "new": new_bin, "reps": reps, "traces": args.traces},
                      [{k: v for k, v in r.items() if k not in ("base", "new")} for r in rows], goals,
                      {"old_total_bytes": old_total, "new_total_bytes": new_total,
                       "old_diff_s": old_time, "new_diff_s": new_time})
    return 0 if not wrong else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (common.BenchError, subprocess.CalledProcessError) as error:
        print(f"two_binaries: {error}", file=sys.stderr)
        sys.exit(2)
