#!/usr/bin/env python3
"""Patch sizes on the LibreOffice edit traces: EdgeCourier vs zstd, xdelta3 and rsync.

For every trace (base, new) in the manifest:

- file: the size of the new file;
- EdgeCourier: len(ec_patch.diff(base, new)) (verified), and the patch is
  applied back with ec_patch.apply and compared with new ("ok");
- zstd: `zstd -19 --patch-from=base new` (zstd's own delta mode);
- xdelta3: `xdelta3 -e -9 -s base new`;
- rsync: `rsync -r -I --no-whole-file --only-write-batch=BATCH src/ dst/`
  with new in src and base in dst (both local; --no-whole-file forces the
  delta algorithm rsync uses over a network). Reported: the literal data
  rsync sends, and the batch file (literal data + block references + protocol
  overhead: what the sender sends). The block signatures the receiver sends
  first are not counted;
- zstd/EC: how many times bigger zstd's delta is than EdgeCourier's patch.

Then a per-format summary over the edited traces (noedit traces are listed
on their own): medians, and the goals: median zstd/EC ratio >= 20x per
format, a save with no edit < 200 bytes, a one-character .docx edit
(1k/100k/1m of text) <= 300 bytes.

    .venv/bin/python experiments/bench/patch_sizes.py --traces .cache/traces [--json out.json]
    .venv/bin/python experiments/bench/patch_sizes.py --traces .cache/traces --quick
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_bytes, fmt_ratio, goal, progress  # noqa: E402

RATIO_GOAL = 20.0
NOEDIT_GOAL = 200  # bytes, exclusive
ONE_CHAR_DOCX_GOAL = 300  # bytes, inclusive
ONE_CHAR_EDITS = ("start", "middle", "end")
FORMAT_ORDER = ("docx", "odt", "xlsx", "ods", "pptx", "odp")


def zstd_size(base, new, out):
    subprocess.run([common.tool("zstd"), "-q", "-f", "-19", f"--patch-from={base}", new,
                    "-o", out], check=True, stderr=subprocess.DEVNULL)
    return os.path.getsize(out)


def xdelta3_size(base, new, out):
    subprocess.run([common.tool("xdelta3"), "-f", "-e", "-9", "-s", base, new, out], check=True)
    return os.path.getsize(out)


def rsync_sizes(base, new, workdir):
    """(literal data, batch file bytes, signature bytes received) of an rsync delta."""
    src, dst = os.path.join(workdir, "rsync-src"), os.path.join(workdir, "rsync-dst")
    for folder in (src, dst):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    shutil.copyfile(new, os.path.join(src, "file"))
    shutil.copyfile(base, os.path.join(dst, "file"))
    batch = os.path.join(workdir, "rsync.batch")
    for leftover in (batch, batch + ".sh"):
        if os.path.exists(leftover):
            os.remove(leftover)
    result = subprocess.run([common.tool("rsync"), "-r", "-I", "--no-whole-file",
                             f"--only-write-batch={batch}", "--stats", src + "/", dst + "/"],
                            capture_output=True, text=True, check=True)

    def stat(label):
        match = re.search(rf"^{label}: ([\d,]+)", result.stdout, re.M)
        if not match:
            raise common.BenchError(f"rsync --stats printed no '{label}':\n{result.stdout}")
        return int(match[1].replace(",", ""))

    return stat("Literal data"), os.path.getsize(batch), stat("Total bytes received")


def measure(trace, traces_dir, workdir, ec_patch):
    base_path = os.path.join(traces_dir, trace["base"])
    new_path = os.path.join(traces_dir, trace["new"])
    base, new = common.read(base_path), common.read(new_path)
    patch = ec_patch.diff(base, new)
    ok = ec_patch.apply(base, patch) == new
    summary = ec_patch.inspect(patch, base=base)
    literal, batch, signatures = rsync_sizes(base_path, new_path, workdir)
    row = {
        "name": trace["name"], "format": trace["format"], "app": trace["app"],
        "edit": trace["edit"], "size": trace.get("size"),
        "file_bytes": len(new), "base_bytes": len(base),
        "ec_bytes": len(patch), "ec_ok": ok, "ec_kind": summary.get("kind"),
        "ec_sections": summary.get("sections"),
        "zstd_bytes": zstd_size(base_path, new_path, os.path.join(workdir, "z.zst")),
        "xdelta3_bytes": xdelta3_size(base_path, new_path, os.path.join(workdir, "x.vcdiff")),
        "rsync_literal_bytes": literal, "rsync_batch_bytes": batch,
        "rsync_signature_bytes": signatures,
    }
    row["zstd_over_ec"] = row["zstd_bytes"] / row["ec_bytes"]
    row["recipes"] = recipes(summary)
    return row


def recipes(summary):
    """{member: "recipe (bytes), middle kind (bytes)"} for the rebuilt members."""
    return {m.get("name"): f"{m.get('recipe')} {m.get('recipe_bytes')} B, "
                           f"{m.get('middle')} middle {m.get('middle_bytes')} B"
            for m in summary.get("rebuilt_members") or [] if isinstance(m, dict)}


def smallest_size_per_app(traces):
    """The traces of each app's smallest document size (by median base file size)."""
    by_app_size = {}
    for t in traces:
        by_app_size.setdefault(t["app"], {}).setdefault(t.get("size"), []).append(t)
    keep = set()
    for sizes in by_app_size.values():
        smallest = min(sizes, key=lambda size: statistics.median(
            t.get("base_bytes", 0) for t in sizes[size]))
        keep.update(t["name"] for t in sizes[smallest])
    return [t for t in traces if t["name"] in keep]


def is_one_char_docx(row):
    return row["format"] == "docx" and row["app"] == "writer" and row["edit"] in ONE_CHAR_EDITS


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=common.DEFAULT_TRACES,
                        help="folder with manifest.json (default: .cache/traces)")
    parser.add_argument("--quick", action="store_true",
                        help="only each app's smallest document size (Writer 1k, ...)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    args = parser.parse_args(argv)

    ec_patch = common.import_ec_patch()
    manifest = common.load_manifest(args.traces)
    traces = manifest["traces"]
    if args.quick:
        traces = smallest_size_per_app(traces)
    print(common.machine_line(common.machine()))
    print(f"traces: {args.traces} ({manifest.get('soffice_version')}), {len(traces)} traces\n")

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sizes-") as workdir:
        for i, trace in enumerate(traces, 1):
            progress(f"patch_sizes: [{i}/{len(traces)}] {trace['name']}")
            rows.append(measure(trace, args.traces, workdir, ec_patch))

    common.table(
        "Patch sizes per trace (bytes; smaller is better)",
        ["trace", "file", "EdgeCourier", "zstd -19 patch-from", "xdelta3 -9",
         "rsync literal", "rsync batch", "zstd/EC", "ok"],
        [[r["name"], r["file_bytes"], r["ec_bytes"], r["zstd_bytes"], r["xdelta3_bytes"],
          r["rsync_literal_bytes"], r["rsync_batch_bytes"], fmt_ratio(r["zstd_over_ec"]),
          "ok" if r["ec_ok"] else "APPLY WRONG"] for r in rows],
        notes=["EdgeCourier = ec_patch.diff (verified); ok = ec_patch.apply gives the new "
               "file byte for byte",
               "rsync literal = literal data; rsync batch = --only-write-batch file (literal + "
               "block matches + overhead); the receiver's block signatures are extra"])

    formats = [f for f in FORMAT_ORDER if any(r["format"] == f for r in rows)]
    summary_rows, summary = [], {}
    for fmt in formats:
        edited = [r for r in rows if r["format"] == fmt and r["edit"] != "noedit"]
        noedit = [r for r in rows if r["format"] == fmt and r["edit"] == "noedit"]
        med = lambda key, rs=edited: statistics.median(r[key] for r in rs) if rs else None  # noqa: E731
        s = {
            "edited_traces": len(edited),
            "median_ec_bytes": med("ec_bytes"), "median_zstd_bytes": med("zstd_bytes"),
            "median_xdelta3_bytes": med("xdelta3_bytes"),
            "median_rsync_batch_bytes": med("rsync_batch_bytes"),
            "median_zstd_over_ec": med("zstd_over_ec"),
            "median_zstd_over_ec_all": med("zstd_over_ec", edited + noedit),
            "noedit_ec_bytes": {r["name"]: r["ec_bytes"] for r in noedit},
        }
        summary[fmt] = s
        summary_rows.append([
            fmt, len(edited), fmt_bytes(s["median_ec_bytes"]), fmt_bytes(s["median_zstd_bytes"]),
            fmt_bytes(s["median_xdelta3_bytes"]), fmt_bytes(s["median_rsync_batch_bytes"]),
            fmt_ratio(s["median_zstd_over_ec"]), fmt_ratio(s["median_zstd_over_ec_all"]),
            ", ".join(str(v) for v in s["noedit_ec_bytes"].values()) or "-"])
    common.table(
        "Per format: medians over the edited traces",
        ["format", "edits", "EdgeCourier", "zstd", "xdelta3", "rsync batch", "zstd/EC",
         "zstd/EC incl. noedit", "noedit EC patch(es), B"],
        summary_rows,
        notes=["medians over the traces with an edit; 'zstd/EC incl. noedit' = median ratio "
               "over all traces of the format, saves with no edit included",
               f"goal: median zstd/EC >= {RATIO_GOAL:g}x; noedit patch < {NOEDIT_GOAL} B"])

    one_char = [r for r in rows if is_one_char_docx(r)]
    if one_char:
        common.table(
            "One-character edits in .docx (goal <= 300 B)",
            ["trace", "text", "edit", "EdgeCourier", "zstd", "zstd/EC", "goal"],
            [[r["name"], r["size"], r["edit"], r["ec_bytes"], r["zstd_bytes"],
              fmt_ratio(r["zstd_over_ec"]),
              "met" if r["ec_bytes"] <= ONE_CHAR_DOCX_GOAL else "NOT MET"] for r in one_char])

    goals = []
    for fmt in formats:
        ratio = summary[fmt]["median_zstd_over_ec"]
        if ratio is not None:
            goals.append(goal(f"{fmt}: median zstd/EdgeCourier >= {RATIO_GOAL:g}x (edited traces)",
                              ratio >= RATIO_GOAL,
                              f"{fmt_ratio(ratio)} (incl. noedit saves: "
                              f"{fmt_ratio(summary[fmt]['median_zstd_over_ec_all'])})"))
    noedit = [r for r in rows if r["edit"] == "noedit"]
    if noedit:
        worst = max(noedit, key=lambda r: r["ec_bytes"])
        goals.append(goal(f"a save with no edit costs < {NOEDIT_GOAL} B",
                          worst["ec_bytes"] < NOEDIT_GOAL,
                          f"largest {worst['ec_bytes']} B ({worst['name']}); over: "
                          + (", ".join(f"{r['name']} {r['ec_bytes']} B" for r in noedit
                                       if r["ec_bytes"] >= NOEDIT_GOAL) or "none")))
    for size in dict.fromkeys(r["size"] for r in one_char):
        sized = [r for r in one_char if r["size"] == size]
        goals.append(goal(f"one-character .docx edit, {size} of text: patch <= "
                          f"{ONE_CHAR_DOCX_GOAL} B",
                          all(r["ec_bytes"] <= ONE_CHAR_DOCX_GOAL for r in sized),
                          ", ".join(f"{r['edit']} {r['ec_bytes']} B" for r in sized)))
    goals.append(goal("every patch applies back exactly", all(r["ec_ok"] for r in rows),
                      f"{sum(r['ec_ok'] for r in rows)}/{len(rows)}"))
    common.print_goals(goals)
    common.write_json(args.json, "patch_sizes",
                      {"traces": os.path.abspath(args.traces), "quick": args.quick,
                       "soffice_version": manifest.get("soffice_version")},
                      rows, goals, {"per_format": summary})
    return 0 if all(r["ec_ok"] for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.BenchError as error:
        print(f"patch_sizes: error: {error}", file=sys.stderr)
        sys.exit(2)
