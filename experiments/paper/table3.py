#!/usr/bin/env python3
"""Table 3 of the original paper: diff time, GNU diff vs diff-match-patch vs ec-diff, 1 KB to 10 MB of text.

The measurement is experiments/bench/diff_table.py (a one-line
WordprocessingML document.xml with that much text and one typed character;
contenders interleaved in the same run, medians); this command runs it,
prints the paper's table with the paper's ec-diff times beside ours, and
writes a CSV and a PNG.

    .venv/bin/python experiments/paper/table3.py [--reps 5] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402

DIFF_TABLE = figures.REPO / "experiments" / "bench" / "diff_table.py"
PAPER_EC_DIFF = {"1KB": 0.066, "100KB": 0.173, "1MB": 0.415, "10MB": 3.54}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 KB and 100 KB only (seconds)")
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT, help="where table3.csv/.png/.json go")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "diff_table.json"
        command = [sys.executable, str(DIFF_TABLE), "--reps", str(args.reps), "--json", str(raw)]
        if args.quick:
            command.append("--quick")
        print(f"running {' '.join(command[1:])} (progress below)", file=sys.stderr, flush=True)
        done = subprocess.run(command, stdout=subprocess.DEVNULL)
        if done.returncode:
            print("table3: diff_table.py failed", file=sys.stderr)
            return done.returncode
        data = json.loads(raw.read_text())
    (args.out / "table3.json").write_text(json.dumps(data, indent=1))
    rows = [r for r in data["rows"] if r["case"] in PAPER_EC_DIFF]
    ms = figures.fmt_seconds
    columns = ["text", "part bytes", "GNU diff", "GNU diff 1 tag/line", "diff-match-patch", "ec-diff",
               "ec delta B", "paper ec-diff", "paper / ours"]
    table = [[r["case"], f"{r['part_bytes']:,}", ms(r["gnu_diff_s"]), ms(r["gnu_diff_pretty_s"]),
              ms(r["dmp_s"]) + (" (timeout)" if r["dmp_hit_timeout"] else ""), ms(r["ec_s"]),
              f"{r['ec_delta_bytes']:,}", ms(PAPER_EC_DIFF[r["case"]]), f"{PAPER_EC_DIFF[r['case']] / r['ec_s']:,.0f}x"]
             for r in rows]
    figures.print_table(f"Table 3: diff time for one typed character (median of {data['params']['reps']} runs)",
                        columns, table, notes=[
                            "GNU diff on the part files (process start included; one line, so its output is the whole "
                            "part twice); '1 tag/line' = on copies with a newline after every '>'",
                            "diff-match-patch: Python, diff_main + diff_toDelta, default 1 s timeout",
                            "ec-diff: ec_patch.diff_content in-process; every delta applied back exactly: "
                            + ("yes" if all(r["ec_ok"] for r in data["rows"]) else "NO"),
                            "paper: the original paper's ec-diff times (its hardware); paper / ours = how many times "
                            "faster ours is",
                            figures.machine_line()])
    figures.write_csv(args.out / "table3.csv", ["text", "part_bytes", "gnu_diff_s", "gnu_diff_one_tag_per_line_s",
                                                "dmp_s", "dmp_timeout", "ec_diff_s", "ec_delta_bytes", "paper_ec_diff_s"],
                      [[r["case"], r["part_bytes"], r["gnu_diff_s"], r["gnu_diff_pretty_s"], r["dmp_s"],
                        r["dmp_hit_timeout"], r["ec_s"], r["ec_delta_bytes"], PAPER_EC_DIFF[r["case"]]] for r in rows])
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r["part_bytes"] for r in rows]
    for key, label, style in (("gnu_diff_s", "GNU diff", "s-"), ("gnu_diff_pretty_s", "GNU diff, 1 tag per line", "s--"),
                              ("dmp_s", "diff-match-patch (Python)", "^-"), ("ec_s", "ec-diff (ours)", "o-")):
        ax.plot(x, [r[key] * 1000 for r in rows], style, label=label)
    ax.plot(x, [PAPER_EC_DIFF[r["case"]] * 1000 for r in rows], "x:", color="grey", label="ec-diff in the paper")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{r['case']}\n({r['part_bytes'] / 1e6:.2g} MB part)" for r in rows])
    ax.set_xlabel("text in the document (document.xml size)")
    ax.set_ylabel("time to diff one typed character (ms, log)")
    ax.set_title("Table 3: diff time, one typed character in document.xml")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "diff-match-patch stops at its 1 s timeout; medians, same run", fontsize=7, color="grey")
    fig.tight_layout()
    fig.savefig(args.out / "table3.png")
    print(f"wrote {args.out / 'table3.csv'}, {args.out / 'table3.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
