#!/usr/bin/env python3
"""Speed and memory of diff and apply on a real LibreOffice .docx, against baselines.

Cases: a .docx written by LibreOffice with 1 MB and with 10 MB of text, and
the same document with one character typed in the middle and saved again.
The 1 MB pair is the trace writer-1m-middle-docx from the traces folder; the
10 MB pair is made with the trace generator's own machinery
(experiments/traces/make_traces.py: the same prose, edit, metadata and
flat-XML -> soffice conversion, with the same checks) and cached under
.cache/bench/.

Timed, median of --reps runs, all contenders interleaved in every round:

- `ecsync diff BASE NEW -o P` (the whole job: unzip, inflate, ec-diff, the
  exact recipe, and by default the self-check that P applies back), and
  `ecsync diff --no-verify`;
- `ecsync apply BASE P -o OUT` (rebuild + SHA-256 check);
- the same through the Python module: ec_patch.diff (verify on and off) and
  ec_patch.apply on bytes already in memory;
- baselines: `ecsync --version` (process start), `unzip -p NEW word/document.xml`
  (just inflating the changed part), zipfile.read of that part in Python,
  `gzip -6` and Python's zlib level 6 deflating that part (the floor for any
  exact rebuild: the changed part must be deflated again, on one thread),
  `zstd -19 --patch-from=BASE NEW` and its decoding `zstd -d --patch-from`.

Peak RSS (`/usr/bin/time -f %M`, the largest of 3 runs) of `ecsync apply`,
`ecsync diff` and `zstd -d --patch-from`, against the goal 2 x file size + 16 MB.
Goals for diff and apply: < 50 ms with 1 MB of text, < 400 ms with 10 MB.

"Parallel capacity" (two zlib deflates on two threads against the same two
in a row; 2.0 = two free CPUs) is measured before and after: the core
rebuilds LibreOffice's block-parallel deflate streams on all CPUs, so its
times depend on whether the second CPU was free. --wait-quiet waits for it.

    .venv/bin/python experiments/bench/speed.py --traces .cache/traces [--reps 7] [--json out.json]
    .venv/bin/python experiments/bench/speed.py --traces .cache/traces --quick   # 100k trace only
"""

import argparse
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_bytes, fmt_ratio, fmt_time, goal, progress  # noqa: E402

PART = "word/document.xml"
TIME_GOALS = {"1m": 0.050, "10m": 0.400}  # seconds, for diff and for apply
RSS_SLACK = 16 << 20  # the RSS goal is 2 x file size + 16 MiB
MAKE_TRACES = os.path.join(common.REPO, "experiments", "traces", "make_traces.py")


# --------------------------------------------------------------------------
# The documents

def load_make_traces():
    spec = importlib.util.spec_from_file_location("make_traces", MAKE_TRACES)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_traces"] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


def generate_writer_middle_docx(size, cache):
    """Make (or reuse from `cache`) base/new .docx with `size` of text and a middle edit.

    Uses make_traces.py's own functions: same prose (same seed as its
    writer-<size> traces), same edit, metadata, conversion and checks.
    """
    mt = load_make_traces()
    name = f"writer-{size}-middle-docx"
    folder = os.path.join(cache, name)
    stamp_path = os.path.join(folder, "trace.json")
    soffice = mt.soffice_path()
    with tempfile.TemporaryDirectory(prefix="bench-bigdoc-") as work:
        profile = os.path.join(work, "profile0")
        stamp = {"generator_version": mt.GENERATOR_VERSION,
                 "soffice_version": mt.soffice_version(soffice, profile),
                 "name": name, "edit": "middle", "size": size}
        try:
            with open(stamp_path, encoding="utf-8") as file:
                old = json.load(file)
            if ({k: old.get(k) for k in stamp} == stamp
                    and all(os.path.getsize(os.path.join(folder, f"{role}.docx")) == old[f"{role}_bytes"]
                            for role in ("base", "new"))):
                progress(f"speed: reusing {folder}")
                return os.path.join(folder, "base.docx"), os.path.join(folder, "new.docx")
        except (OSError, ValueError, KeyError):
            pass
        progress(f"speed: making {name} with LibreOffice (once; cached in {folder}) ...")
        paragraphs = mt.prose(f"writer-{size}", mt.parse_size(size))
        edited = mt.writer_edit(paragraphs, "middle")
        base_key, new_key = f"writer-{size}", f"writer-{size}-middle"
        sources = {"writer": {base_key: mt.writer_source(paragraphs, mt.BASE_META),
                              new_key: mt.writer_source(edited.content, mt.RESAVED_META)}}
        paths = mt.write_sources(work, sources)
        base_batch = mt.Batch("base", "writer", "docx", [paths[base_key]],
                              os.path.join(work, "out", "base"))
        new_batch = mt.Batch("new", "writer", "docx", [paths[new_key]],
                             os.path.join(work, "out", "new"), after=base_batch)
        mt.run_batches(soffice, [base_batch, new_batch], [profile], progress)
        base_out, new_out = base_batch.outputs()[0], new_batch.outputs()[0]
        trace = mt.Trace("writer", "middle", size, base_key, new_key, edited.needles)
        mt.check_trace(name, "docx", trace, base_out, new_out)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for role, path in (("base", base_out), ("new", new_out)):
            shutil.copyfile(path, os.path.join(folder, f"{role}.docx"))
            stamp[f"{role}_bytes"] = os.path.getsize(path)
        with open(stamp_path, "w", encoding="utf-8") as file:
            json.dump(stamp, file, indent=1)
    return os.path.join(folder, "base.docx"), os.path.join(folder, "new.docx")


def find_case(size, traces, cache):
    """(base, new, origin) for a middle one-character edit with `size` of text."""
    name = f"writer-{size}-middle-docx"
    try:
        manifest = common.load_manifest(traces)
        for trace in manifest["traces"]:
            if trace["name"] == name:
                return (os.path.join(traces, trace["base"]), os.path.join(traces, trace["new"]),
                        f"trace {name} in {traces}")
    except common.BenchError:
        pass
    base, new = generate_writer_middle_docx(size, cache)
    return base, new, f"made with make_traces.py machinery, cached in {os.path.dirname(base)}"


# --------------------------------------------------------------------------
# Measuring

def deflate(data, level=6):
    """Raw deflate of `data` with zlib, as most ZIP writers do: what any exact rebuild
    of a changed part costs at least (single thread)."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def xml_sample():
    """About 3 MB of document-like XML: what parallel_capacity deflates by default."""
    return (b"<w:p><w:r><w:t>" + b"report market budget customer project " * 20
            + b"</w:t></w:r></w:p>") * 4000


def parallel_capacity(sample=None, reps=3):
    """How many CPUs this process really gets: time of two zlib deflates in a row
    over the time of the same two on two threads (zlib releases the GIL). About
    2.0 on an idle 2-CPU machine; about 1.0 when other work holds a CPU (CPU
    shares between cgroups ignore `nice`)."""
    sample = xml_sample() if sample is None else sample
    import threading

    def serial():
        deflate(sample)
        deflate(sample)

    def parallel():
        threads = [threading.Thread(target=deflate, args=(sample,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    times = common.interleaved({"serial": serial, "parallel": parallel}, reps)
    return common.median(times["serial"]) / common.median(times["parallel"])


def measure_case(size, base_path, new_path, reps, workdir, ec_patch):
    ecsync, zstd, unzip = common.tool("ecsync"), common.tool("zstd"), common.tool("unzip")
    gzip = common.tool("gzip")
    base, new = common.read(base_path), common.read(new_path)
    with zipfile.ZipFile(io.BytesIO(new)) as archive:
        part = archive.read(PART)
    part_bytes = len(part)
    part_path = os.path.join(workdir, f"{size}.document.xml")
    with open(part_path, "wb") as file:
        file.write(part)
    patch_path = os.path.join(workdir, f"{size}.ecp")
    patch_nv_path = os.path.join(workdir, f"{size}.noverify.ecp")
    out_path = os.path.join(workdir, f"{size}.out.docx")
    zst_path = os.path.join(workdir, f"{size}.zst")
    zout_path = os.path.join(workdir, f"{size}.zstd-out.docx")

    # One untimed run of each, to make the inputs of the apply steps and warm caches.
    common.run_timed([ecsync, "diff", base_path, new_path, "-o", patch_path])
    common.run_timed([zstd, "-q", "-f", "-19", f"--patch-from={base_path}", new_path, "-o", zst_path])
    patch = ec_patch.diff(base, new)

    def run(*command):
        return lambda: common.run_timed(list(command))

    cli = {
        "ecsync --version (process start)": run(ecsync, "--version"),
        "unzip -p NEW document.xml": run(unzip, "-p", new_path, PART),
        "ecsync diff (verified)": run(ecsync, "diff", base_path, new_path, "-o", patch_path),
        "ecsync diff --no-verify": run(ecsync, "diff", "--no-verify", base_path, new_path,
                                       "-o", patch_nv_path),
        "ecsync apply": run(ecsync, "apply", base_path, patch_path, "-o", out_path),
        "gzip -6 document.xml (re-deflate floor)": run(gzip, "-6", "-c", part_path),
        "zstd -19 --patch-from (diff)": run(zstd, "-q", "-f", "-19", f"--patch-from={base_path}",
                                           new_path, "-o", zst_path),
        "zstd -d --patch-from (apply)": run(zstd, "-q", "-f", "-d", f"--patch-from={base_path}",
                                           zst_path, "-o", zout_path),
    }
    results = {}
    python = {
        "zipfile read document.xml": lambda: zipfile.ZipFile(io.BytesIO(new)).read(PART),
        "zlib -6 deflate document.xml (floor)": lambda: deflate(part),
        "ec_patch.diff (verified)": lambda: ec_patch.diff(base, new),
        "ec_patch.diff(verify=False)": lambda: ec_patch.diff(base, new, verify=False),
        "ec_patch.apply": lambda: results.__setitem__("apply", ec_patch.apply(base, patch)),
    }
    times = common.interleaved({**{("cli", k): v for k, v in cli.items()},
                                **{("python", k): v for k, v in python.items()}},
                               reps, label=f"{size} text")

    # Correctness of what was timed.
    cli_ok = common.read(out_path) == new
    py_ok = results["apply"] == new
    zstd_ok = common.read(zout_path) == new

    rss_goal = 2 * max(len(base), len(new)) + RSS_SLACK
    rss = {}
    for label, command in (
            ("ecsync apply", [ecsync, "apply", base_path, patch_path, "-o", out_path]),
            ("ecsync diff (verified)", [ecsync, "diff", base_path, new_path, "-o", patch_path]),
            ("zstd -d --patch-from (apply)", [zstd, "-q", "-f", "-d", f"--patch-from={base_path}",
                                              zst_path, "-o", zout_path])):
        rss[label] = max(common.peak_rss_kib(command) for _ in range(3)) * 1024

    ops = []
    for (kind, label), values in times.items():
        ops.append({"interface": kind, "operation": label, "median_s": common.median(values),
                    "min_s": min(values), "max_s": max(values), "runs": values})
    return {
        "case": size, "base_bytes": len(base), "new_bytes": len(new), "part_bytes": part_bytes,
        "ec_patch_bytes": os.path.getsize(patch_path), "zstd_patch_bytes": os.path.getsize(zst_path),
        "ops": ops, "cli_apply_ok": cli_ok, "python_apply_ok": py_ok, "zstd_apply_ok": zstd_ok,
        "rss_bytes": rss, "rss_goal_bytes": rss_goal, "time_goal_s": TIME_GOALS.get(size),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=common.DEFAULT_TRACES,
                        help="folder with manifest.json (default: .cache/traces)")
    parser.add_argument("--cache", default=common.DEFAULT_CACHE,
                        help="where the generated 10 MB document is kept (default: .cache/bench)")
    parser.add_argument("--reps", type=int, help="repetitions (default 7; quick: 3)")
    parser.add_argument("--sizes", default=None,
                        help="text sizes, comma separated (default 1m,10m; quick: 100k)")
    parser.add_argument("--quick", action="store_true",
                        help="only the 100k trace, 3 runs, no LibreOffice")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="first wait up to SECONDS for two free CPUs (parallel capacity "
                             ">= 1.7), polling every 10 s (default: do not wait)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    sizes = [s.strip() for s in (args.sizes or ("100k" if args.quick else "1m,10m")).split(",")
             if s.strip()]

    ec_patch = common.import_ec_patch()
    print(common.machine_line(common.machine()))
    sample = xml_sample()
    capacity = parallel_capacity(sample)
    deadline = time.monotonic() + args.wait_quiet
    while capacity < 1.7 and time.monotonic() < deadline:
        progress(f"speed: parallel capacity {capacity:.2f}; waiting for a quieter machine")
        time.sleep(10)
        capacity = parallel_capacity(sample)
    cases = []
    with tempfile.TemporaryDirectory(prefix="bench-speed-") as workdir:
        for size in sizes:
            base, new, origin = find_case(size, args.traces, args.cache)
            progress(f"speed: {size} of text: {origin}")
            case = measure_case(size, base, new, reps, workdir, ec_patch)
            case["origin"] = origin
            cases.append(case)

    capacity_after = parallel_capacity(sample)
    print(f"parallel capacity: 2 deflates on 2 threads run {capacity:.2f}x as fast as one "
          f"after the other before the measurements, {capacity_after:.2f}x after "
          f"(2.0 = two free CPUs)"
          + ("; the machine's load changed during the run" if abs(capacity - capacity_after) > 0.3
             else "") + "\n")
    rows = []
    for case in cases:
        baseline = {kind: next(o["median_s"] for o in case["ops"] if o["interface"] == kind
                               and o["operation"].startswith(("unzip", "zipfile")))
                    for kind in ("cli", "python")}
        goal_s = case["time_goal_s"]
        for op in case["ops"]:
            timed_goal = goal_s is not None and op["operation"].startswith(("ecsync diff",
                                                                            "ecsync apply",
                                                                            "ec_patch"))
            rows.append([
                f"{case['case']} text", "CLI" if op["interface"] == "cli" else "Python",
                op["operation"], fmt_time(op["median_s"]), fmt_time(op["min_s"]),
                fmt_ratio(op["median_s"] / baseline[op["interface"]]),
                fmt_time(goal_s) if timed_goal else "",
                ("met" if op["median_s"] < goal_s else "NOT MET") if timed_goal else ""])
    common.table(
        f"Diff and apply of a one-character edit in a LibreOffice .docx (median of {reps} runs)",
        ["case", "via", "operation", "median", "min", "x unzip", "goal", "met"], rows,
        notes=[f"{c['case']} text: docx {fmt_bytes(c['new_bytes'])}, {PART} "
               f"{fmt_bytes(c['part_bytes'])}, EdgeCourier patch {c['ec_patch_bytes']} B, "
               f"zstd patch {c['zstd_patch_bytes']} B; {c['origin']}" for c in cases]
        + ["CLI times are wall-clock times of the whole process (start, read, write); Python "
           "times are calls on bytes in memory",
           "x unzip = median / median of just inflating the part (`unzip -p` for CLI rows, "
           "zipfile.read for Python rows)",
           "round trips: " + "; ".join(
               f"{c['case']}: ecsync apply {'ok' if c['cli_apply_ok'] else 'WRONG'}, "
               f"ec_patch.apply {'ok' if c['python_apply_ok'] else 'WRONG'}, "
               f"zstd {'ok' if c['zstd_apply_ok'] else 'WRONG'}" for c in cases)])

    rss_rows = []
    for case in cases:
        for label, value in case["rss_bytes"].items():
            is_goal = label == "ecsync apply"
            rss_rows.append([f"{case['case']} text", label, f"{value / 2**20:.1f} MiB",
                             f"{case['rss_goal_bytes'] / 2**20:.1f} MiB" if is_goal else "",
                             ("met" if value <= case["rss_goal_bytes"] else "NOT MET")
                             if is_goal else ""])
    common.table("Peak RSS (/usr/bin/time -f %M, largest of 3 runs)",
                 ["case", "command", "peak RSS", "goal", "met"], rss_rows,
                 notes=["goal = 2 x docx size + 16 MiB, for `ecsync apply`"])

    goals = []
    for case in cases:
        goal_s = case["time_goal_s"]
        if goal_s is None:
            continue
        for op in case["ops"]:
            if op["operation"].startswith(("ecsync diff", "ecsync apply", "ec_patch.diff",
                                           "ec_patch.apply")):
                goals.append(goal(f"{case['case']} text: {op['operation']} < {fmt_time(goal_s)}",
                                  op["median_s"] < goal_s, fmt_time(op["median_s"])))
        rss = case["rss_bytes"]["ecsync apply"]
        goals.append(goal(f"{case['case']} text: ecsync apply peak RSS <= 2 x file + 16 MiB "
                          f"({case['rss_goal_bytes'] / 2**20:.1f} MiB)",
                          rss <= case["rss_goal_bytes"], f"{rss / 2**20:.1f} MiB"))
    all_ok = all(c["cli_apply_ok"] and c["python_apply_ok"] for c in cases)
    goals.append(goal("ecsync apply and ec_patch.apply rebuild the new file exactly", all_ok,
                      "ok" if all_ok else "WRONG"))
    common.print_goals(goals)
    common.write_json(args.json, "speed", {"reps": reps, "quick": args.quick, "sizes": sizes,
                                           "traces": os.path.abspath(args.traces)},
                      cases, goals, {"parallel_capacity": capacity,
                                     "parallel_capacity_after": capacity_after})
    return 0 if all_ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.BenchError as error:
        print(f"speed: error: {error}", file=sys.stderr)
        sys.exit(2)
