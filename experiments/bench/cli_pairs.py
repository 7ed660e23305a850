#!/usr/bin/env python3
"""Whole-process `ecsync diff` and `ecsync apply` on every trace pair up to 1 MB.

Issue 13's goal: for files up to 1 MB, a whole `ecsync diff` process (start,
read both files, diff, the self-check that the patch applies back, write)
under 100 ms and a whole `ecsync apply` (start, read, rebuild, SHA-256
check, write) under 50 ms, on every pair, not only on average.

For each trace of the manifest whose base and new file are both at most
--max-bytes, timed with the repetitions interleaved (one round of every
contender, then the next), medians:

- `ecsync diff BASE NEW -o P` (the CLI's default: verified);
- `ecsync apply BASE P -o OUT` (and OUT compared with NEW, byte for byte);
- `ecsync apply --no-claim BASE P -o OUT2`: every changed block of a
  block-parallel member deflated by zlib, as before a cold process claimed
  the base member's layout from its block boundaries (the same-run
  baseline of that change; OUT2 compared too);
- baselines in the same rounds: `ecsync --version` (the process start
  alone, the floor of any whole-process figure), `zstd -19 --patch-from`
  and `zstd -d --patch-from` (a generic delta of the whole file).

The table lists the pairs slowest first; the goals count the pairs over
each bound. "Parallel capacity" before and after tells how many of the
machine's CPUs the run really had (the core re-deflates on all of them).

    .venv/bin/python experiments/bench/cli_pairs.py --traces .cache/traces [--reps 5] [--json out.json]
    .venv/bin/python experiments/bench/cli_pairs.py --quick    # 6 pairs, 1 round
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_bytes, fmt_time, goal, progress  # noqa: E402
from speed import parallel_capacity  # noqa: E402

DIFF_GOAL_S = 0.100
APPLY_GOAL_S = 0.050
QUICK_TRACES = 6


def pairs(traces, max_bytes):
    """(name, base path, new path, new size) of every trace whose two files fit `max_bytes`."""
    out = []
    for trace in common.load_manifest(traces)["traces"]:
        if trace["base_bytes"] <= max_bytes and trace["new_bytes"] <= max_bytes:
            out.append((trace["name"], os.path.join(traces, trace["base"]),
                        os.path.join(traces, trace["new"]), trace["new_bytes"]))
    if not out:
        raise common.BenchError(f"no trace in {traces} has both files under {fmt_bytes(max_bytes)}")
    return out


def measure_pair(name, base, new, reps, work):
    ecsync, zstd = common.tool("ecsync"), common.tool("zstd")
    patch, out = os.path.join(work, f"{name}.ecp"), os.path.join(work, f"{name}.out")
    zst, zout = os.path.join(work, f"{name}.zst"), os.path.join(work, f"{name}.zout")
    # One untimed round: the inputs of the apply steps, and warm page caches.
    common.run_timed([ecsync, "diff", base, new, "-o", patch])
    common.run_timed([zstd, "-q", "-f", "-19", f"--patch-from={base}", new, "-o", zst])

    def run(*command):
        return lambda: common.run_timed(list(command))

    times = common.interleaved({
        "start": run(ecsync, "--version"),
        "diff": run(ecsync, "diff", base, new, "-o", patch),
        "apply": run(ecsync, "apply", base, patch, "-o", out),
        "apply_zlib": run(ecsync, "apply", "--no-claim", base, patch, "-o", out + ".zlib"),
        "zstd_diff": run(zstd, "-q", "-f", "-19", f"--patch-from={base}", new, "-o", zst),
        "zstd_apply": run(zstd, "-q", "-f", "-d", f"--patch-from={base}", zst, "-o", zout),
    }, reps)
    row = {k: common.median(v) for k, v in times.items()}
    row.update(name=name, new_bytes=os.path.getsize(new), patch_bytes=os.path.getsize(patch),
               zstd_bytes=os.path.getsize(zst),
               apply_ok=common.read(out) == common.read(new) == common.read(out + ".zlib"),
               runs={k: v for k, v in times.items()})
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Progress goes to stderr; the tables to stdout.")
    parser.add_argument("--traces", default=common.DEFAULT_TRACES,
                        help="folder with manifest.json (default: .cache/traces)")
    parser.add_argument("--reps", type=int, help="rounds per pair (default 5; quick: 1)")
    parser.add_argument("--max-bytes", type=int, default=1_000_000,
                        help="largest file of a pair, base or new (default 1000000: the goal's 1 MB)")
    parser.add_argument("--only", help="comma-separated trace names (default: every trace that fits)")
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_TRACES} pairs, 1 round")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 5)
    todo = pairs(args.traces, args.max_bytes)
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        missing = wanted - {p[0] for p in todo}
        if missing:
            raise common.BenchError(f"not among the traces up to {fmt_bytes(args.max_bytes)}: {', '.join(sorted(missing))}")
        todo = [p for p in todo if p[0] in wanted]
    if args.quick:
        todo = todo[:QUICK_TRACES]

    print(common.machine_line(common.machine()))
    capacity = parallel_capacity()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cli-pairs-") as work:
        for i, (name, base, new, _) in enumerate(todo, 1):
            progress(f"cli_pairs: [{i}/{len(todo)}] {name}")
            rows.append(measure_pair(name, base, new, reps, work))
    capacity_after = parallel_capacity()

    rows.sort(key=lambda r: -r["diff"])
    table = [[r["name"], fmt_bytes(r["new_bytes"]), f"{r['patch_bytes']} B", fmt_time(r["diff"]),
              fmt_time(r["apply"]), fmt_time(r["apply_zlib"]), f"{r['apply'] / r['apply_zlib']:.2f}", fmt_time(r["start"]), fmt_time(r["zstd_diff"]), fmt_time(r["zstd_apply"]),
              "ok" if r["apply_ok"] else "WRONG"] for r in rows]
    common.table(f"Whole-process ecsync diff and apply, every trace pair up to {fmt_bytes(args.max_bytes)} "
                 f"(median of {reps} interleaved rounds), slowest diff first",
                 ["trace", "file", "patch", "ecsync diff", "ecsync apply", "apply --no-claim", "ratio", "process start",
                  "zstd -19 --patch-from", "zstd -d --patch-from", "rebuilt"], table,
                 notes=["wall-clock time of the whole process: start, read, work, write",
                        "apply --no-claim: every changed block deflated by zlib (no base layout claimed); ratio: apply / that",
                        "process start: `ecsync --version`, the floor of any whole-process time",
                        f"parallel capacity (2.0 = two free CPUs): {capacity:.2f} before, {capacity_after:.2f} after"])

    slow_diff = [r for r in rows if r["diff"] >= DIFF_GOAL_S]
    slow_apply = [r for r in rows if r["apply"] >= APPLY_GOAL_S]
    worst_apply = max(rows, key=lambda r: r["apply"])
    goals = [
        goal(f"ecsync diff < {fmt_time(DIFF_GOAL_S)} on every pair ({len(rows)})", not slow_diff,
             f"{len(slow_diff)} over; slowest {rows[0]['name']} {fmt_time(rows[0]['diff'])}"),
        goal(f"ecsync apply < {fmt_time(APPLY_GOAL_S)} on every pair ({len(rows)})", not slow_apply,
             f"{len(slow_apply)} over; slowest {worst_apply['name']} {fmt_time(worst_apply['apply'])}"),
        goal("ecsync apply rebuilds every new file exactly", all(r["apply_ok"] for r in rows),
             "ok" if all(r["apply_ok"] for r in rows) else "WRONG: " + ", ".join(r["name"] for r in rows if not r["apply_ok"])),
    ]
    common.print_goals(goals)
    common.write_json(args.json, "cli_pairs", {"reps": reps, "max_bytes": args.max_bytes, "quick": args.quick,
                                               "traces": os.path.abspath(args.traces)},
                      rows, goals, {"parallel_capacity": capacity, "parallel_capacity_after": capacity_after})
    return 0 if all(r["apply_ok"] for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.BenchError as error:
        print(f"cli_pairs: error: {error}", file=sys.stderr)
        sys.exit(2)
