#!/usr/bin/env python3
"""Run every EdgeCourier benchmark: diff_table, patch_sizes, speed, eps_bench, proxy_bench (`make bench`).

Each benchmark runs as its own process with this Python, prints its tables
to stdout (progress to stderr), and with --json its numbers are gathered in
one file: {"machine": ..., "benchmarks": {name: <that benchmark's JSON>}}.

    .venv/bin/python experiments/bench/run_all.py --traces .cache/traces [--quick] [--json out.json]

The exit status is non-zero if any benchmark failed or a round trip was
wrong; unmet performance goals are reported, not treated as failures.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ("diff_table", "patch_sizes", "speed", "eps_bench", "proxy_bench")


def command_for(name, args, json_path):
    command = [sys.executable, os.path.join(HERE, f"{name}.py"), "--json", json_path]
    if args.quick:
        command.append("--quick")
    if name in ("patch_sizes", "speed", "eps_bench", "proxy_bench"):
        command += ["--traces", args.traces]
    if name == "speed" and args.cache:
        command += ["--cache", args.cache]
    if name in ("speed", "eps_bench") and args.wait_quiet:
        command += ["--wait-quiet", str(args.wait_quiet)]
    return command


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=common.DEFAULT_TRACES,
                        help="folder with the traces' manifest.json (default: .cache/traces)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and few repetitions (seconds, not minutes)")
    parser.add_argument("--only", action="append", choices=BENCHMARKS,
                        help="run only this benchmark (repeatable)")
    parser.add_argument("--cache", help="cache folder for speed.py's generated documents")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="speed.py and eps_bench.py wait up to SECONDS for two free CPUs before timing")
    parser.add_argument("--json", metavar="FILE", help="write all the numbers to FILE")
    args = parser.parse_args(argv)

    info = common.machine()
    print(f"# EdgeCourier benchmarks{' (quick)' if args.quick else ''}")
    print(common.machine_line(info))
    print(f"traces: {os.path.abspath(args.traces)}\n", flush=True)

    results, failed = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-all-") as workdir:
        for name in args.only or BENCHMARKS:
            json_path = os.path.join(workdir, f"{name}.json")
            command = command_for(name, args, json_path)
            print(f"# {name}\n", flush=True)
            common.progress(f"run_all: {' '.join(command)}")
            started = time.monotonic()
            status = subprocess.run(command).returncode
            common.progress(f"run_all: {name} finished in {time.monotonic() - started:.0f} s "
                            f"(status {status})")
            if status:
                failed.append(f"{name} (status {status})")
            try:
                with open(json_path, encoding="utf-8") as file:
                    results[name] = json.load(file)
            except (OSError, ValueError):
                results[name] = None

    goals = [(name, g) for name, data in results.items() if data for g in data.get("goals", [])]
    print("# Summary of goals")
    for name, g in goals:
        print(f"  [{'met' if g['met'] else 'NOT MET'}] {name}: {g['goal']}: {g['detail']}")
    met = sum(g["met"] for _, g in goals)
    print(f"  {met} of {len(goals)} goals met" + (f"; FAILED: {', '.join(failed)}" if failed else ""))

    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"machine": info, "quick": args.quick, "benchmarks": results,
                       "failed": failed}, file, indent=1)
            file.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
