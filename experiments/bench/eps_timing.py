#!/usr/bin/env python3
"""Where a streamed EPS save's wall time goes: one EPS started with
EC_EPS_LOG=debug, the latency benchmark's saves (writer-1m-middle-docx, one
character typed, base -> new -> base ...), then the medians of the EPS's own
`streamed save` and `pointer written` debug lines (docs/benchmarks.md, "An
EPS save, millisecond by millisecond"). The first PATCH save is cold and left
out.

    .venv/bin/python experiments/bench/eps_timing.py [--reps 30] [--traces DIR] [--workdir DIR]
"""

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import common  # noqa: E402
import eps_bench  # noqa: E402

KEYS = ("base_ms", "rebuild_ms", "verified_at_ms", "stored_at_ms", "answered_at_ms", "pointer_ms")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--traces", default=common.DEFAULT_TRACES)
    parser.add_argument("--trace", default="writer-1m-middle-docx")
    parser.add_argument("--workdir", help="kept afterwards (default: a temporary folder)")
    args = parser.parse_args(argv)
    p, lab_mod = eps_bench.lab_modules()
    base, new = common.trace_pair(args.traces, args.trace)
    path = "/bench/timing.docx"
    doc = p.DocKey(p.DROPBOX, b"bench", path.encode())
    headers = eps_bench.dropbox_headers("bench", path)
    items = [p.make_item((base, new)[(i + 1) % 2], doc, (base, new)[i % 2]) for i in range(2)]
    request = p.ProviderRequest("POST", eps_bench.UPLOAD_URL, headers)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or tmp
        with lab_mod.Lab(os.path.join(workdir, "timing")) as lab:
            eps = lab.start_eps("timing", env={"EC_EPS_LOG": "debug"})
            client = eps.client()
            client.save_single("POST", eps_bench.UPLOAD_URL, headers, base, None, doc)
            times = []
            for rep in range(args.reps):
                start = time.perf_counter()
                outcome = client.save(p.SINGLE, [request], [items[rep % 2]])
                times.append(time.perf_counter() - start)
                if not isinstance(outcome, p.ProviderResponse) or outcome.status != 200:
                    raise common.BenchError(f"save {rep} failed: {outcome!r}")
            client.close()
            log = eps.log_path.read_text(encoding="utf-8", errors="replace")
    values = {k: [float(m.group(1)) for line in log.splitlines() for m in [re.search(k + r"=([\d.]+)", line)] if m]
              for k in KEYS}
    print(f"{args.trace}, {args.reps} saves, 1-minute load {os.getloadavg()[0]:.2f}")
    print(f"device round trip, median: {statistics.median(times) * 1e3:.1f} ms")
    for k in KEYS:
        warm = values[k][1:]
        if warm:
            print(f"{k:16} median {statistics.median(warm):7.2f} ms  (n={len(warm)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
