"""Shared by the one-command-per-table scripts of experiments/paper: a
progress bar on stderr, CSV output, and matplotlib set up for files (no
display). Tables go to stdout; progress and warnings to stderr."""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from testbed import shared  # noqa: E402  (the shared folder's one setting)
DEFAULT_OUT = REPO / ".cache" / "paper"
#: The shared folder's one setting (testbed/shared.py): the editing traces (CC BY 4.0) are in
#: <shared>/traces/editing, the real-document corpus in <shared>/corpus/real.
TRACES_ENV = shared.ENV
ATTRIBUTION = ("Editing traces: josephg/editing-traces by Joseph Gentle and contributors, "
               "CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/)")


def editing_traces() -> Path:
    return shared.root() / "traces" / "editing"


class Progress:
    """`[#####.....] 5/9 label  12 s` on stderr, redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, title: str) -> None:
        self.total, self.title, self.done = total, title, 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        width = 24
        filled = width * self.done // max(self.total, 1)
        line = (f"{self.title} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label}"
                f"  {time.monotonic() - self.start:.0f} s")
        print(("\r" + line[:150].ljust(150)) if self.tty else line, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)
        self.done += 1

    def finish(self) -> None:
        self.done = self.total
        self.step("done")
        if self.tty:
            print(file=sys.stderr)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(rows)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 10, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()) -> None:
    """A Markdown table (pastes into docs as is)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print(f"## {title}")
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |")
    print("|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|")
    for row in cells:
        print("| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |")
    for note in notes:
        print(f"  {note}")
    print(flush=True)


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def machine_line() -> str:
    import platform

    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"machine: {os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}, "
            f"load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
