#!/usr/bin/env python3
"""Every table and figure of experiments/paper, the link check and the replay, one after the other.

Each command's table goes to stdout as it prints it; CSV and PNG files go
to --out (default .cache/paper); at the end, how long each took. Root is
needed (the netns testbed). docs/experiments.md shows the results of a run.

    .venv/bin/python experiments/paper/all.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import figures  # noqa: E402

EXPERIMENTS = HERE.parent


def commands(out: Path, quick: bool) -> list[tuple[str, list[str]]]:
    py = sys.executable
    q = ["--quick"] if quick else []
    return [
        ("link profiles", [py, str(EXPERIMENTS / "netlab" / "netlab.py"), "measure", "--wifi", "wifi-ac-near",
                           "--wan", "wan-fiber"]),
        ("delay line ceiling", [py, str(EXPERIMENTS / "netlab" / "netlab.py"), "delayline-rate",
                                "--rounds", "1" if quick else "3"]),
        ("Table 2", [py, str(HERE / "table2.py"), "--out", str(out), *q]),
        ("Table 3", [py, str(HERE / "table3.py"), "--out", str(out), *q]),
        ("Figs. 1-4", [py, str(HERE / "fig1to4.py"), "--out", str(out), *q]),
        ("Fig. 11", [py, str(HERE / "fig11.py"), "--out", str(out)]
         + (["--rates", "20", "--rtts", "4,40", "--traces", "writer-100k-middle-docx", "--reps", "1"] if quick else [])),
        ("Figs. 12-13", [py, str(HERE / "fig12_13.py"), "--out", str(out)]
         + (["--runtimes", "process", "--counts", "1,5", "--window", "5", "--period", "5"] if quick else [])),
        ("Figs. 14-15", [py, str(HERE / "fig14_15.py"), "--out", str(out)] + (["--sizes", "1", "--reps", "1"] if quick else [])),
        ("replay", [py, str(EXPERIMENTS / "replay" / "replay.py"), "clownschool_flat", "--policy", "every:60",
                    "--format", "docx", "--out", str(out)] + (["--max-saves", "3"] if quick else [])),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="smoke-sized runs of each")
    args = parser.parse_args(argv)
    timings, failed = [], []
    for name, command in commands(args.out, args.quick):
        print(f"# {name}: {' '.join(Path(c).name if c.startswith('/') else c for c in command[1:])}\n", flush=True)
        start = time.monotonic()
        done = subprocess.run(command)
        timings.append([name, f"{time.monotonic() - start:.0f} s", "ok" if done.returncode == 0 else
                        f"FAILED ({done.returncode})"])
        if done.returncode:
            failed.append(name)
        if done.returncode == 130:
            break
    figures.print_table("All experiments", ["experiment", "time", "result"], timings, notes=[figures.machine_line()])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
