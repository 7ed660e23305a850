#!/usr/bin/env python3
"""The original paper's diff table, re-run: GNU diff vs diff-match-patch vs ec-diff.

Input: WordprocessingML-like document.xml parts as Word and LibreOffice write
them (an XML declaration line, then the whole body on ONE line of
`<w:p><w:r><w:t>words...</w:t></w:r></w:p>` paragraphs), holding 1 KB,
100 KB, 1 MB and 10 MB of text, and the same part with one character typed
in the middle of the text. Plus two harder cases: 100 scattered edits (typed
characters, deleted characters, replaced words) in a 5 MB part, and a big
deletion (90% of 10 MB of text selected and replaced by one sentence).

Contenders, all timed in the same run, repetitions interleaved, medians:

- GNU diff on the two part files, as the paper did (`diff base.xml new.xml`,
  output to a file; process start included). GNU diff is line-based: on the
  part as written (one line) its output is the whole body twice. So it is run
  twice: on the part as is ("GNU diff"), and on a copy pretty-printed to one
  tag per line ("GNU diff, 1 tag/line": a newline after every `>`; the time
  to pretty-print is NOT included, and the result is not a byte-exact delta
  of the real part without undoing the reformatting).
- diff-match-patch (Python, default Diff_Timeout = 1.0 s): diff_main then
  diff_toDelta (the delta to send when the receiver has the base); the size
  of patch_toText (the patch with context) is reported too.
- ec-diff: ec_patch.diff_content(base_part, new_part) (trim the common
  prefix and suffix, zstd the middle against the base middle).

Every ec-diff delta and every diff-match-patch delta is applied back and
compared with the new part ("ok" column).

    .venv/bin/python experiments/bench/diff_table.py [--reps 5] [--json out.json]
    .venv/bin/python experiments/bench/diff_table.py --quick
"""

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_bytes, fmt_time, goal, progress  # noqa: E402

# The paper's ec-diff times (seconds) for 1 KB / 100 KB / 1 MB / 10 MB of text.
PAPER_EC_DIFF = {"1KB": 0.066, "100KB": 0.173, "1MB": 0.415, "10MB": 3.54}
SIZES = {"1KB": 1_000, "100KB": 100_000, "1MB": 1_000_000, "10MB": 10_000_000}
QUICK_SIZES = ("1KB", "100KB")
SCATTER_PART_BYTES = 5_000_000
QUICK_SCATTER_PART_BYTES = 200_000
SCATTER_EDITS = 100
DELETE_TEXT = 10_000_000
QUICK_DELETE_TEXT = 200_000
SCATTER_GOAL_SECONDS = 0.200
SCATTER_GOAL_BYTES = 10_000

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
HEAD = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        f'<w:document xmlns:w="{W_NS}"><w:body>')
TAIL = ('<w:sectPr><w:pgSz w:w="11906" w:h="16838"/></w:sectPr></w:body></w:document>')

WORDS = """the of and to in a is that for it as was with be by on not he this are or his
from at which but have an they you were her she there been one all we their has would
report market budget customer project meeting plan results quarter growth office supplier
contract delivery schedule review team service product network storage region revenue
forecast estimate analysis design""".split()


def paragraphs_for(text_chars, seed):
    """Paragraph texts of 300..900 characters, about `text_chars` characters in all."""
    rng = random.Random(seed)
    paragraphs, total = [], 0
    while total < text_chars:
        target = min(rng.randint(300, 900), max(1, text_chars - total))
        words = []
        while sum(len(w) + 1 for w in words) < target:
            words.append(rng.choice(WORDS))
        text = " ".join(words).capitalize()[:target].rstrip() + "."
        paragraphs.append(text)
        total += len(text)
    return paragraphs


def part(paragraphs):
    body = "".join(f"<w:p><w:r><w:t>{t}</w:t></w:r></w:p>" for t in paragraphs)
    return (HEAD + body + TAIL).encode()


def one_char_edit(paragraphs):
    """The paragraphs with one character typed at the middle of the text."""
    total = sum(map(len, paragraphs))
    at = total // 2
    for i, text in enumerate(paragraphs):
        if at <= len(text):
            return paragraphs[:i] + [text[:at] + "x" + text[at:]] + paragraphs[i + 1:]
        at -= len(text)
    raise AssertionError("unreachable")


def scattered_edits(paragraphs, count, seed):
    """`count` edits in distinct random paragraphs: typed char, deleted char, replaced word."""
    rng = random.Random(seed)
    new = list(paragraphs)
    for n, i in enumerate(sorted(rng.sample(range(len(new)), count))):
        text = new[i]
        at = rng.randrange(1, len(text) - 1)
        kind = n % 3
        if kind == 0:
            text = text[:at] + rng.choice("abcdefghijklmnopqrstuvwxyz") + text[at:]
        elif kind == 1:
            text = text[:at] + text[at + 1:]
        else:
            start = text.rfind(" ", 0, at) + 1
            end = text.find(" ", at)
            end = len(text) if end < 0 else end
            text = text[:start] + rng.choice(WORDS).upper() + text[end:]
        new[i] = text
    return new


def paragraphs_for_part_bytes(part_bytes, seed):
    overhead = len("<w:p><w:r><w:t></w:t></w:r></w:p>")
    # ~600-character paragraphs: text is part_bytes * 600 / (600 + overhead)
    return paragraphs_for(int(part_bytes * 600 / (600 + overhead)), seed)


def pretty(xml):
    """One tag per line, for a line-based diff."""
    return xml.replace(b">", b">\n")


# --------------------------------------------------------------------------

def dmp_apply_delta(dmp, base_text, delta):
    diffs = dmp.diff_fromDelta(base_text, delta)
    return "".join(text for op, text in diffs if op >= 0)


def run_case(name, base, new, reps, workdir, ec_patch, dmp_factory, true_edit_chars):
    """Time every contender on one (base, new) pair; return the row as a dict."""
    stem = "".join(c if c.isalnum() else "_" for c in name)
    paths = {}
    for role, data in (("base", base), ("new", new), ("base.pretty", pretty(base)),
                       ("new.pretty", pretty(new))):
        paths[role] = os.path.join(workdir, f"{stem}.{role}.xml")
        with open(paths[role], "wb") as file:
            file.write(data)
    out_plain = os.path.join(workdir, f"{stem}.diff")
    out_pretty = os.path.join(workdir, f"{stem}.pretty.diff")
    gnu_diff = common.tool("diff")
    base_text, new_text = base.decode(), new.decode()
    dmp = dmp_factory()
    state = {}

    def run_gnu(a, b, out):
        with open(out, "wb") as sink:
            # exit status 1 means "differences found"
            return common.run_timed([gnu_diff, a, b], stdout=sink, ok_codes=(0, 1))

    def run_dmp():
        start = time.perf_counter()
        diffs = dmp.diff_main(base_text, new_text)
        delta = dmp.diff_toDelta(diffs)
        elapsed = time.perf_counter() - start
        state["dmp_diffs"], state["dmp_delta"] = diffs, delta
        return elapsed

    def run_ec():
        start = time.perf_counter()
        delta = ec_patch.diff_content(base, new)
        elapsed = time.perf_counter() - start
        state["ec_delta"] = delta
        return elapsed

    times = common.interleaved({
        "gnu": lambda: run_gnu(paths["base"], paths["new"], out_plain),
        "gnu_pretty": lambda: run_gnu(paths["base.pretty"], paths["new.pretty"], out_pretty),
        "dmp": run_dmp,
        "ec": run_ec,
    }, reps, label=name)

    ec_delta = state["ec_delta"]
    ec_ok = ec_patch.apply_content(base, ec_delta) == new
    dmp_delta = state["dmp_delta"].encode()
    dmp_ok = dmp_apply_delta(dmp, base_text, state["dmp_delta"]) == new_text
    dmp_changed = sum(len(text) for op, text in state["dmp_diffs"] if op != 0)
    dmp_patch_text = dmp.patch_toText(dmp.patch_make(base_text, state["dmp_diffs"])).encode()
    med = {k: common.median(v) for k, v in times.items()}
    return {
        "case": name,
        "text_chars": None,
        "part_bytes": len(base),
        "gnu_diff_s": med["gnu"], "gnu_diff_bytes": os.path.getsize(out_plain),
        "gnu_diff_pretty_s": med["gnu_pretty"], "gnu_diff_pretty_bytes": os.path.getsize(out_pretty),
        "dmp_s": med["dmp"], "dmp_delta_bytes": len(dmp_delta),
        "dmp_patch_text_bytes": len(dmp_patch_text),
        "dmp_changed_chars": dmp_changed, "true_changed_chars": true_edit_chars,
        # diff-match-patch stops refining at its deadline; its answer is then
        # coarse ("delete this block, insert that block") where edits are scattered.
        "dmp_hit_timeout": med["dmp"] >= dmp.Diff_Timeout,
        "dmp_coarse": dmp_changed > 10 * true_edit_chars,
        "dmp_ok": dmp_ok,
        "ec_s": med["ec"], "ec_delta_bytes": len(ec_delta), "ec_ok": ec_ok,
        "paper_ec_s": PAPER_EC_DIFF.get(name),
        "times": times,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, help="repetitions per case (default 5; quick: 2)")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(QUICK_SIZES)} and a "
                             f"{QUICK_SCATTER_PART_BYTES // 1000} KB scattered-edit part")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 5)
    sizes = QUICK_SIZES if args.quick else tuple(SIZES)
    scatter_bytes = QUICK_SCATTER_PART_BYTES if args.quick else SCATTER_PART_BYTES

    ec_patch = common.import_ec_patch()
    from diff_match_patch import diff_match_patch

    def dmp_factory():
        dmp = diff_match_patch()
        assert dmp.Diff_Timeout == 1.0, "diff-match-patch default timeout changed"
        return dmp

    info = common.machine()
    print(common.machine_line(info) + "\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-diff-") as workdir:
        for name in sizes:
            progress(f"diff_table: {name} of text, one-character edit")
            paragraphs = paragraphs_for(SIZES[name], seed=name)
            base, new = part(paragraphs), part(one_char_edit(paragraphs))
            row = run_case(name, base, new, reps, workdir, ec_patch, dmp_factory, 1)
            row["text_chars"] = sum(map(len, paragraphs))
            rows.append(row)
        scatter_name = f"{SCATTER_EDITS} edits/{scatter_bytes / 1e6:g}MB"
        progress(f"diff_table: {SCATTER_EDITS} scattered edits in a "
                 f"{scatter_bytes / 1e6:g} MB part")
        paragraphs = paragraphs_for_part_bytes(scatter_bytes, seed="scatter")
        edited = scattered_edits(paragraphs, SCATTER_EDITS, seed="scatter")
        base, new = part(paragraphs), part(edited)
        true_changed = sum(abs(len(a) - len(b)) or 1 for a, b in zip(paragraphs, edited) if a != b)
        row = run_case(scatter_name, base, new, reps, workdir, ec_patch, dmp_factory, true_changed)
        row["text_chars"] = sum(map(len, paragraphs))
        row["scattered"] = True
        rows.append(row)
        # A big deletion: the user selects most of the document, deletes it and
        # types a sentence. Not a goal of its own; it guards against a small new
        # middle being coded against a huge base middle at a slow zstd level.
        delete_chars = QUICK_DELETE_TEXT if args.quick else DELETE_TEXT
        delete_name = f"delete 90%/{delete_chars / 1e6:g}MB"
        progress(f"diff_table: 90% of {delete_chars / 1e6:g} MB of text deleted")
        paragraphs = paragraphs_for(delete_chars, seed="delete")
        keep = max(1, len(paragraphs) // 20)
        edited = paragraphs[:keep] + ["A short paragraph typed after the deletion."] + paragraphs[-keep:]
        base, new = part(paragraphs), part(edited)
        row = run_case(delete_name, base, new, reps, workdir, ec_patch, dmp_factory,
                       len(base) - len(new))
        row["text_chars"] = sum(map(len, paragraphs))
        row["big_deletion"] = True
        rows.append(row)

    columns = ["case", "part", "GNU diff", "out", "GNU diff 1 tag/line", "out",
               "dmp", "dmp delta", "dmp patch_toText", "ec-diff", "ec delta",
               "paper ec-diff", "paper/ec", "ok"]
    table_rows = []
    for r in rows:
        dmp_note = " (timeout)" if r["dmp_hit_timeout"] else ""
        ok = "ok" if r["ec_ok"] else "EC-DIFF WRONG"
        ok += "" if r["dmp_ok"] else ", dmp wrong"
        table_rows.append([
            r["case"], fmt_bytes(r["part_bytes"]),
            fmt_time(r["gnu_diff_s"]), fmt_bytes(r["gnu_diff_bytes"]),
            fmt_time(r["gnu_diff_pretty_s"]), fmt_bytes(r["gnu_diff_pretty_bytes"]),
            fmt_time(r["dmp_s"]) + dmp_note, fmt_bytes(r["dmp_delta_bytes"]),
            fmt_bytes(r["dmp_patch_text_bytes"]),
            fmt_time(r["ec_s"]), fmt_bytes(r["ec_delta_bytes"]),
            fmt_time(r["paper_ec_s"]),
            common.fmt_ratio(r["paper_ec_s"] / r["ec_s"]) if r["paper_ec_s"] else "-",
            ok])
    common.table(
        f"Diff of one XML part (median of {reps} runs, same run for all contenders)",
        columns, table_rows,
        notes=["case = text size with one character typed in the middle; "
               f"'{SCATTER_EDITS} edits' = {SCATTER_EDITS} scattered edits in a part of that "
               "size; 'delete 90%' = 90% of that much text deleted, a sentence typed in its place",
               "GNU diff: `diff base new > out` on the part files (process start included); "
               "'1 tag/line' = on copies with a newline after every '>' (reformatting not timed)",
               "dmp = diff-match-patch diff_main + diff_toDelta (Diff_Timeout 1.0 s); "
               "'timeout' = it hit its deadline and returned what it had (coarse for scattered edits)",
               "ec-diff = ec_patch.diff_content, in-process; ok = delta applied back gives "
               "the new part (both ec-diff and dmp)",
               "paper ec-diff = the original paper's times (other hardware); paper/ec = how "
               "many times faster ec-diff is here"])

    goals = []
    scatter = next(r for r in rows if r.get("scattered"))
    goals.append(goal(
        f"{SCATTER_EDITS} scattered edits in a {scatter_bytes / 1e6:g} MB part: ec-diff "
        f"< {SCATTER_GOAL_SECONDS * 1000:.0f} ms and delta < {SCATTER_GOAL_BYTES // 1000} KB",
        scatter["ec_s"] < SCATTER_GOAL_SECONDS and scatter["ec_delta_bytes"] < SCATTER_GOAL_BYTES,
        f"{fmt_time(scatter['ec_s'])}, {scatter['ec_delta_bytes']} B "
        f"(dmp: {fmt_time(scatter['dmp_s'])}, {scatter['dmp_delta_bytes']} B"
        f"{', timed out' if scatter['dmp_hit_timeout'] else ''}"
        f"{', coarse' if scatter['dmp_coarse'] else ''})"))
    for r in rows:
        if r["paper_ec_s"] is None:
            continue
        goals.append(goal(f"{r['case']}: ec-diff faster than the paper's ec-diff "
                          f"({fmt_time(r['paper_ec_s'])})", r["ec_s"] < r["paper_ec_s"],
                          f"{fmt_time(r['ec_s'])}"))
    goals.append(goal("every ec-diff delta applies back exactly", all(r["ec_ok"] for r in rows),
                      ", ".join(f"{r['case']}: {'ok' if r['ec_ok'] else 'WRONG'}" for r in rows)))
    common.print_goals(goals)
    common.write_json(args.json, "diff_table", {"reps": reps, "quick": args.quick,
                                                "sizes": list(sizes),
                                                "scatter_part_bytes": scatter_bytes},
                      rows, goals)
    return 0 if all(r["ec_ok"] for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.BenchError as error:
        print(f"diff_table: error: {error}", file=sys.stderr)
        sys.exit(2)
