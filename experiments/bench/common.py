"""Shared helpers of the EdgeCourier benchmarks: timing, tables, JSON, tools.

Every benchmark times EdgeCourier and its baselines in the same run, with
the repetitions interleaved (one round of every contender, then the next
round), and reports medians: the machines this runs on are noisy, and the
ratios between contenders are what count.
"""

import datetime
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
DEFAULT_TRACES = os.path.join(REPO, ".cache", "traces")
DEFAULT_CACHE = os.path.join(REPO, ".cache", "bench")


class BenchError(Exception):
    """A failure the user must see (a missing tool, a missing trace, a wrong result)."""


def progress(message):
    """Progress goes to stderr, so stdout stays the tables."""
    print(message, file=sys.stderr, flush=True)


def tool(name):
    """Path of an external tool; ecsync is looked up in the repository's .venv first."""
    if name == "ecsync":
        for candidate in (os.path.join(os.path.dirname(sys.executable), "ecsync"),
                          os.path.join(VENV_BIN, "ecsync")):
            if os.access(candidate, os.X_OK):
                return candidate
    path = shutil.which(name)
    if not path:
        raise BenchError(f"`{name}` not found on PATH (run `make setup`)")
    return path


def import_ec_patch():
    try:
        import ec_patch
    except ImportError as error:
        raise BenchError(f"cannot import ec_patch ({error}); run `make build` and use "
                         f"{VENV_BIN}/python") from None
    return ec_patch


def median(values):
    return statistics.median(values) if values else None


def timed(fn, *args, **kwargs):
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def run_timed(command, stdout=subprocess.DEVNULL, check=True, ok_codes=(0,)):
    """Wall time of one run of an external command (process start included)."""
    start = time.perf_counter()
    result = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if check and result.returncode not in ok_codes:
        raise BenchError(f"{' '.join(map(str, command))} failed with status "
                         f"{result.returncode}: {result.stderr.decode(errors='replace')[-2000:]}")
    return elapsed


def peak_rss_kib(command):
    """Peak resident set size of a command in KiB, as `/usr/bin/time -f %M` reports it."""
    time_bin = "/usr/bin/time"
    if not os.access(time_bin, os.X_OK):
        raise BenchError("/usr/bin/time not found (Debian package `time`)")
    result = subprocess.run([time_bin, "-f", "%M", *command], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode:
        raise BenchError(f"{' '.join(command)} failed: {result.stderr[-2000:]}")
    return int(result.stderr.strip().splitlines()[-1])


def interleaved(contenders, reps, label=""):
    """Run every contender `reps` times, round-robin; return {name: [seconds...]}.

    `contenders` maps a name to a function of no arguments returning seconds
    (for external commands) or None (then the call itself is timed).
    """
    times = {name: [] for name in contenders}
    for rep in range(reps):
        if label:
            progress(f"  {label}: round {rep + 1}/{reps}")
        for name, fn in contenders.items():
            start = time.perf_counter()
            result = fn()
            elapsed = time.perf_counter() - start
            times[name].append(result if isinstance(result, float) else elapsed)
    return times


# --------------------------------------------------------------------------
# Formatting

def fmt_time(seconds):
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.3g} s"


def fmt_bytes(n):
    if n is None:
        return "-"
    n = round(n)
    if n < 10_000:
        return f"{n} B"
    if n < 10_000_000:
        return f"{n / 1e3:.1f} kB" if n < 100_000 else f"{n / 1e3:.0f} kB"
    return f"{n / 1e6:.1f} MB"


def fmt_ratio(x):
    if x is None:
        return "-"
    if x < 0.1:
        return f"{x:.2f}x"
    return f"{x:.1f}x" if x < 100 else f"{x:.0f}x"


def table(title, columns, rows, notes=()):
    """Print an aligned table: `columns` is a list of names, `rows` lists of strings.

    Layout (the smoke test relies on it): a title line `## <title>`, the header
    row with the columns separated by ` | `, a Markdown rule (`--- | --:`), the rows,
    notes, a blank line.
    """
    rows = [[str(cell) if cell not in (None, "") else "-" for cell in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    # Numbers are right-aligned, text left-aligned.
    right = [i > 0 and all(re.match(r"[\d.]", r[i]) or r[i] in ("", "-") for r in rows)
             for i in range(len(columns))]

    def line(cells):
        return " | ".join(cell.rjust(w) if right[i] else cell.ljust(w)
                          for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    # The rule marks right-aligned columns as Markdown does, so a table pasted
    # into a .md file renders as is.
    rule = " | ".join("-" * (w - 1) + ":" if right[i] else "-" * w
                      for i, w in enumerate(widths))
    out = [f"## {title}", line(columns), rule]
    out += [line(r) for r in rows]
    out += [f"  {note}" for note in notes]
    print("\n".join(out) + "\n", flush=True)


def print_goals(goals):
    """Goals as `[met]` / `[NOT MET]` lines."""
    if not goals:
        return
    print("Goals:")
    for goal in goals:
        mark = "met" if goal["met"] else "NOT MET"
        print(f"  [{mark}] {goal['goal']}: {goal['detail']}")
    print(flush=True)


def goal(text, met, detail):
    return {"goal": text, "met": bool(met), "detail": detail}


# --------------------------------------------------------------------------
# Machine description and JSON

def _first_line(command):
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


@functools.lru_cache(maxsize=None)
def machine():
    cpu = None
    try:
        with open("/proc/cpuinfo") as file:
            cpu = next((line.split(":", 1)[1].strip() for line in file
                        if line.startswith("model name")), None)
    except OSError:
        pass
    commit = _first_line(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    dirty = _first_line(["git", "-C", REPO, "status", "--porcelain", "--", "edit-patch/core",
                         "edit-patch/cli", "edit-patch/python", "Cargo.toml", "Cargo.lock"])
    try:
        ecsync_version = _first_line([tool("ecsync"), "--version"])
    except BenchError:
        ecsync_version = None
    warnings = build_staleness()
    for warning in warnings:
        progress(f"warning: {warning}")
    return {
        "build_warnings": warnings,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "loadavg_1min": round(os.getloadavg()[0], 2),
        "ecsync": ecsync_version,
        "repo_commit": commit,
        "edit_patch_uncommitted_changes": bool(dirty),
    }


def build_staleness():
    """Warnings when the installed ecsync / ec_patch look older than the core's sources."""
    warnings = []
    try:
        ecsync_mtime = os.path.getmtime(tool("ecsync"))
        ec_patch = import_ec_patch()
        so = [os.path.join(os.path.dirname(ec_patch.__file__), f)
              for f in os.listdir(os.path.dirname(ec_patch.__file__)) if f.endswith(".so")]
        module_mtime = max(map(os.path.getmtime, so)) if so else None
    except (BenchError, OSError):
        return warnings
    newest_source = 0.0
    for folder, _, files in os.walk(os.path.join(REPO, "edit-patch")):
        if "/target" in folder or "/fuzz" in folder:
            continue
        for name in files:
            if name.endswith((".rs", ".toml")):
                newest_source = max(newest_source, os.path.getmtime(os.path.join(folder, name)))
    for label, mtime in (("ecsync", ecsync_mtime), ("ec_patch", module_mtime)):
        if mtime is not None and mtime < newest_source:
            warnings.append(f"{label} is older than the edit-patch sources: run `make build`")
    if module_mtime is not None and abs(module_mtime - ecsync_mtime) > 600:
        warnings.append("ecsync and ec_patch were built more than 10 minutes apart")
    return warnings


def machine_line(info):
    return (f"machine: {info['cpus']} CPUs ({info['cpu_model']}), Python {info['python']}, "
            f"{info['ecsync']}, repo {info['repo_commit']}"
            f"{' + uncommitted edit-patch changes' if info['edit_patch_uncommitted_changes'] else ''}"
            f", load {info['loadavg_1min']}, {info['date']}"
            + "".join(f"\nWARNING: {w}" for w in info["build_warnings"]))


def write_json(path, name, params, rows, goals, extra=None):
    if not path:
        return
    data = {"benchmark": name, "machine": dict(machine()), "params": params, "rows": rows,
            "goals": goals}
    data.update(extra or {})
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        json.dump(data, file, indent=1)
        file.write("\n")
    os.replace(path + ".tmp", path)


def load_manifest(traces):
    path = os.path.join(traces, "manifest.json")
    try:
        with open(path, encoding="utf-8") as file:
            manifest = json.load(file)
    except FileNotFoundError:
        raise BenchError(f"no {path}: make the traces first (`make traces`, or "
                         f"experiments/traces/make_traces.py --out {traces})") from None
    return manifest


def read(path):
    with open(path, "rb") as file:
        return file.read()


def trace_pair(traces, name):
    """(base, new) bytes of the trace `name`."""
    for trace in load_manifest(traces)["traces"]:
        if trace["name"] == name:
            return read(os.path.join(traces, trace["base"])), read(os.path.join(traces, trace["new"]))
    raise BenchError(f"trace {name} not in {traces}/manifest.json (run `make traces`)")


def quantile(values, q):
    """Nearest-rank quantile (p99 of 100 samples is the 99th smallest); None for no samples."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))
    return ordered[int(rank) - 1]


def ratio_interval(a, b, level=0.95, resamples=2000, seed=0):
    """Percentile-bootstrap interval of median(a) / median(b) for paired
    rounds (a[i] and b[i] timed in the same round): the rounds are resampled
    with replacement, pairs kept together. With 10 rounds it says whether a
    ratio of 1.03 is a difference this run can tell from none."""
    import random

    if len(a) != len(b) or len(a) < 2:
        raise ValueError("ratio_interval needs two paired series of at least 2 rounds")
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(resamples):
        pick = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median(a[i] for i in pick) / statistics.median(b[i] for i in pick))
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * resamples)], ratios[min(resamples - 1, int((1 - tail) * resamples))]


def lab_module():
    """`testbed.lab` (provider servers, EPS instances, device proxies), with a
    clear error when the environment or the EPS binary is missing."""
    try:
        from testbed import lab
    except ImportError as error:
        raise BenchError(f"cannot import the lab ({error}); run `make build` and use {VENV_BIN}/python") from None
    if not os.access(lab.EPS_BIN, os.X_OK):
        raise BenchError(f"no EPS binary at {lab.EPS_BIN}: run `make build`")
    return lab


def cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads so far: the scheduler's nanosecond
    count (/proc/PID/task/*/schedstat) where the kernel keeps it, else
    utime + stime in clock ticks (10 ms: too coarse for a 1 MB transfer)."""
    total, found = 0, False
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
            found = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    if found:
        return total / 1e9
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
