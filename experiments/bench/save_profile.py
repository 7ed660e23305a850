#!/usr/bin/env python3
"""Where the milliseconds of one save go, piece by piece, in one process.

The pieces of a one-character save through ec-proxy and the EPS that are
CPU or disk work (the exchanges themselves are timed by proxy_bench.py and
the EPS's own histograms):

- device: `ec_patch.diff(base, new, verify=False)` (the proxy's call),
  and the device store's work on the save path (`base` read and check,
  `pending` blob write with its fsyncs, `accepted`, `record_save`);
- EPS: `ec_patch.apply` (the core of the EPS's rebuild: inflate the changed
  parts, apply the edit, re-deflate byte-exactly, SHA-256 of the result);
- for scale: one zlib level-6 deflate of the largest changed part.

The diff and the apply are timed three ways: "cold", with nothing learnt
about the base (the first save after a start, or after a FULL); "warm", in
a chain of saves base -> new -> base -> ..., where the layout of each
version's compressed blocks was learnt when it was made (issue 13), so
that from the third save on the new version is one the process has seen
before; and "novel", what a real chain of edits costs: the base learnt
(`ec_patch.learn`, as after the save that made it) and a new version this
process has never seen. Real edits make a new version every time, so
"novel" is the everyday figure and "warm" a floor. The novel versions are
the trace's siblings (the same LibreOffice base edited at the start, middle
and end: `writer-1m-*-docx`), each diffed in a fresh process (one per
--novel-runs, after one unrelated diff so that the process's own first-call
costs are not counted) and applied in another, as the device and the EPS
are two processes. Medians over --reps (novel: over runs x siblings).

Both ways of checking the recipe run in the same process, interleaved
(issue 13's same-run baseline): "full", `ec_patch.diff(..., verify=False)`
as before, every re-deflated block compared; and "spot",
`spot_check=True` as the device proxy calls it on unmetered links (the
first changed block and the last one compared, the others claimed, the
EPS's SHA-256 check the judge; the last contents kept). Every spot patch is
applied and checked; a wrong claim would be counted in "spot wrong".

    .venv/bin/python experiments/bench/save_profile.py [--traces DIR] [--reps 15] [--novel-runs 4] [--json FILE] [TRACE ...]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DEFAULT = ["writer-1m-middle-docx", "writer-1m-end-docx", "writer-1m-start-docx", "writer-100k-middle-docx",
           "writer-1k-middle-docx", "writer-1m-middle-odt"]


def pair(traces: str, name: str) -> tuple[bytes, bytes]:
    d = os.path.join(traces, name)
    files = sorted(os.listdir(d)) if os.path.isdir(d) else []
    base = [f for f in files if f.startswith("base.")]
    new = [f for f in files if f.startswith("new.")]
    if not base or not new:
        raise common.BenchError(f"trace {name} missing in {traces} (run `make traces`)")
    return open(os.path.join(d, base[0]), "rb").read(), open(os.path.join(d, new[0]), "rb").read()


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def profile(ec_patch, name: str, base: bytes, new: bytes, reps: int) -> dict:
    import hashlib

    out: dict = {"trace": name, "file_bytes": len(new)}

    def timed(fn):
        t = time.perf_counter()
        r = fn()
        return time.perf_counter() - t, r

    wrong = 0

    def spot(a: bytes, b: bytes):
        nonlocal wrong
        d, p = timed(lambda: bytes(ec_patch.diff(a, b, verify=False, spot_check=True)))
        try:
            ok = ec_patch.apply(a, p) == b
        except ec_patch.PatchError:
            ok = False
        wrong += not ok
        return d, p

    # Cold: a fresh process would know nothing; the memo holds 32 layouts, so
    # unrelated files (one per round) push these out. Simplest honest cold
    # figure: the first diff and apply of this pair in this process. The spot
    # check's cold diff first: what it learns (claims, contents) is not used
    # by the full check or by apply.
    cold_s, spot_patch = spot(base, new)
    cold_d, patch = timed(lambda: bytes(ec_patch.diff(base, new, verify=False)))
    cold_a, rebuilt = timed(lambda: ec_patch.apply(base, patch))
    assert rebuilt == new
    diffs, spots, applies = [], [], []
    same = spot_patch == patch
    versions = [base, new]
    for i in range(reps):
        a, b = versions[i % 2], versions[(i + 1) % 2]
        if i % 2:
            s, sp = spot(a, b)
            d, p = timed(lambda: bytes(ec_patch.diff(a, b, verify=False)))
        else:
            d, p = timed(lambda: bytes(ec_patch.diff(a, b, verify=False)))
            s, sp = spot(a, b)
        same = same and sp == p
        t, r = timed(lambda: ec_patch.apply(a, p))
        assert r == b
        diffs.append(d)
        spots.append(s)
        applies.append(t)
    out.update(diff_cold=cold_d, apply_cold=cold_a, diff_warm=statistics.median(diffs[1:] or diffs),
               apply_warm=statistics.median(applies[1:] or applies), patch_bytes=len(patch),
               spot_cold=cold_s, spot_warm=statistics.median(spots[1:] or spots), spot_wrong=wrong,
               spot_same_patches=same)
    out["sha256"] = statistics.median(timed(lambda: hashlib.sha256(new).digest())[0] for _ in range(5))
    z = zipfile.ZipFile(io.BytesIO(new))
    big = max(z.infolist(), key=lambda i: i.file_size)
    content = z.read(big.filename)
    out["largest_part"] = big.filename
    out["largest_part_bytes"] = len(content)
    out["deflate_largest"] = statistics.median(timed(lambda: zlib.compress(content, 6))[0] for _ in range(3))

    # The device store on the save path (a real DeviceStore in a temp folder on the same disk as .cache).
    from ec_proxy.store import DeviceStore
    import ec_protocol as ecp

    with tempfile.TemporaryDirectory(dir=common.DEFAULT_CACHE) as tmp:
        store = DeviceStore(tmp, 1 << 30)
        doc = ecp.DocKey(ecp.DROPBOX, b"bench", f"/{name}".encode())
        tok = store.pending(doc, base)
        store.accepted(tok, at_edge=True)
        rows = {"base": [], "pending": [], "accepted": [], "record_save": []}
        for i in range(reps):
            data = versions[(i + 1) % 2]
            t, _ = timed(lambda: store.edge_base(doc))  # the proxy's call: the base of a patch to the EPS
            rows["base"].append(t)
            t, tok = timed(lambda: store.pending(doc, data))
            rows["pending"].append(t)
            t, _ = timed(lambda: store.accepted(tok, at_edge=True))  # a patched save
            rows["accepted"].append(t)
            t, _ = timed(lambda: store.record_save(doc, 500, len(data), "patch", "patch_smaller"))
            rows["record_save"].append(t)
        store.close()
    for k, v in rows.items():
        out[f"store_{k}"] = statistics.median(v)
    return out


def siblings(traces: str, name: str) -> list[tuple[bytes, bytes]]:
    """The (base, new) pairs of `name` and of the traces made from the same
    base with other edits (writer-1m-middle-docx: -start-, -end-, -multi-),
    no-edit saves left out."""
    parts = name.split("-")
    out = []
    for entry in sorted(os.listdir(traces)):
        p = entry.split("-")
        if len(p) == len(parts) and p[:2] == parts[:2] and p[-1] == parts[-1] and p[2] != "noedit" \
                and os.path.isdir(os.path.join(traces, entry)):
            out.append(pair(traces, entry))
    bases = {b for b, _ in out}
    if len(bases) != 1:
        raise common.BenchError(f"the siblings of {name} in {traces} do not share one base")
    return out


def _novel_worker(kind: str, warm: tuple[bytes, bytes], base: bytes, items: list[bytes]) -> list:
    """In a fresh process: learn the base, one unrelated diff, then each item
    timed: kind "diff" diffs base -> item (the proxy's call on an unmetered
    link) and returns (seconds, patch); "apply" applies the patch item."""
    ec_patch = common.import_ec_patch()
    ec_patch.learn(base)
    ec_patch.diff(warm[0], warm[1], verify=False, spot_check=True)
    out = []
    for item in items:
        t = time.perf_counter()
        if kind == "diff":
            r = bytes(ec_patch.diff(base, item, verify=False, quick=True, spot_check=True))
        else:
            r = ec_patch.apply(base, item)
        out.append((time.perf_counter() - t, r))
    return out


def novel(traces: str, name: str, runs: int) -> dict:
    """Diff and apply of versions the process has not seen (see the module's doc)."""
    import multiprocessing

    pairs = siblings(traces, name)
    base = pairs[0][0]
    news = [n for _, n in pairs]
    warm = pair(traces, "writer-1k-middle-docx")
    spawn = multiprocessing.get_context("spawn")
    diffs, applies = [], []
    for _ in range(runs):
        with spawn.Pool(1) as pool:
            made = pool.apply(_novel_worker, ("diff", warm, base, news))
        with spawn.Pool(1) as pool:
            rebuilt = pool.apply(_novel_worker, ("apply", warm, base, [p for _, p in made]))
        for (d, _), (a, r), n in zip(made, rebuilt, news):
            if r != n:
                raise common.BenchError(f"{name}: a novel version's patch rebuilt other bytes")
            diffs.append(d)
            applies.append(a)
    return {"spot_novel": statistics.median(diffs), "apply_novel": statistics.median(applies),
            "novel_samples": len(diffs), "novel_versions": len(news)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces_named", nargs="*", metavar="TRACE", help=f"trace names (default: {' '.join(DEFAULT)})")
    parser.add_argument("--traces", default=os.environ.get("EC_TRACES", common.DEFAULT_TRACES))
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--novel-runs", type=int, default=4,
                        help="fresh device and EPS processes for the novel columns, each diffing and applying "
                             "every sibling version once (default 4; 0: no novel columns)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    ec_patch = common.import_ec_patch()
    os.makedirs(common.DEFAULT_CACHE, exist_ok=True)
    rows = []
    for name in args.traces_named or DEFAULT:
        common.progress(f"profiling {name}")
        base, new = pair(args.traces, name)
        rows.append(profile(ec_patch, name, base, new, args.reps))
        if args.novel_runs:
            rows[-1].update(novel(args.traces, name, args.novel_runs))
    common.table(
        f"Where a one-character save's CPU and disk time goes (medians of {args.reps} saves in a chain)",
        ["trace", "file", "diff cold", "diff warm", "spot cold", "spot warm", "spot novel", "spot wrong", "apply cold",
         "apply warm", "apply novel",
         "SHA-256", "deflate largest part", "store base", "store pending", "store accepted", "store record_save"],
        [[r["trace"], common.fmt_bytes(r["file_bytes"]), ms(r["diff_cold"]), ms(r["diff_warm"]), ms(r["spot_cold"]),
          ms(r["spot_warm"]), ms(r["spot_novel"]) if "spot_novel" in r else "-",
          f"{r['spot_wrong']}{'' if r['spot_same_patches'] else ' (other patches)'}", ms(r["apply_cold"]),
          ms(r["apply_warm"]), ms(r["apply_novel"]) if "apply_novel" in r else "-", ms(r["sha256"]), f"{ms(r['deflate_largest'])} ({common.fmt_bytes(r['largest_part_bytes'])})",
          ms(r["store_base"]), ms(r["store_pending"]), ms(r["store_accepted"]), ms(r["store_record_save"])] for r in rows],
        notes=["diff: ec_patch.diff(verify=False), every re-deflated block checked (the proxy's call before issue 13, "
               "and in mode metered); spot: the same with spot_check=True (the proxy's call on unmetered links), "
               "interleaved with diff in one chain; spot wrong: spot patches that failed apply's SHA-256 check "
               "(\"other patches\": not byte-identical to diff's)",
               "apply: ec_patch.apply, the core of the EPS's rebuild (the EPS also reads the base from its store and "
               "hashes the result)",
               "cold: the first diff/apply of the pair in this process (nothing learnt about the base); warm: saves "
               "base -> new -> base ..., each version's block layout learnt when it was made, the new version seen "
               "before from the third save on; novel: the base learnt, a new version the process has never seen "
               "(the trace's siblings, same base, other edits; fresh processes, device and EPS apart; medians of "
               + ", ".join(f"{r['novel_samples']}" for r in rows if "novel_samples" in r) + " samples): what a real "
               "chain of edits costs",
               "deflate largest part: one zlib level-6 pass over the largest part, single thread, for scale",
               "store: the device's last-synced store (ec_proxy.store.DeviceStore) on the save path, each with its fsyncs",
               f"1-minute load average at the end: {os.getloadavg()[0]:.2f} (2 CPUs)"])
    if args.json:
        common.write_json(args.json, "save_profile", {"reps": args.reps, "novel_runs": args.novel_runs}, rows, [])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except common.BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
