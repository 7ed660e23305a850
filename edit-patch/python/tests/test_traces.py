"""Exactness and size on real LibreOffice edit traces (experiments/traces).

The sizes asserted here are the goals of the edit-patch issue: they are
properties of the format and encoder (deterministic), not timings.
"""

import statistics
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import ec_patch


def zstd_patch_from(base: bytes, new: bytes) -> int:
    with tempfile.TemporaryDirectory() as d:
        b, n = Path(d, "base"), Path(d, "new")
        b.write_bytes(base)
        n.write_bytes(new)
        out = subprocess.run(["zstd", "-19", "-q", "-c", f"--patch-from={b}", str(n)], check=True, capture_output=True)
        return len(out.stdout)


def test_every_trace_rebuilds_exactly(traces):
    assert len(traces) >= 40
    for t in traces:
        patch = ec_patch.diff(t["base_bytes"], t["new_bytes"])
        assert ec_patch.apply(t["base_bytes"], patch) == t["new_bytes"], t["name"]


def test_one_character_docx_edits_cost_at_most_300_bytes(traces):
    edits = [t for t in traces if t["format"] == "docx" and t["edit"] in ("start", "middle", "end")]
    assert {t["size"] for t in edits} == {"1k", "100k", "1m"} and len(edits) == 9
    for t in edits:
        size = len(ec_patch.diff(t["base_bytes"], t["new_bytes"]))
        assert size <= 300, f"{t['name']}: {size} bytes"


def test_a_save_with_no_edit_costs_under_200_bytes(traces):
    for t in (t for t in traces if t["edit"] == "noedit"):
        size = len(ec_patch.diff(t["base_bytes"], t["new_bytes"]))
        assert size < 200, f"{t['name']}: {size} bytes"


def test_median_patch_is_20_times_smaller_than_zstd_patch_from(traces):
    ratios = defaultdict(list)
    for t in traces:
        ours = len(ec_patch.diff(t["base_bytes"], t["new_bytes"]))
        ratios[t["format"]].append(zstd_patch_from(t["base_bytes"], t["new_bytes"]) / ours)
    assert set(ratios) == {"docx", "odt", "xlsx", "ods", "pptx", "odp"}
    for fmt, r in ratios.items():
        assert statistics.median(r) >= 20, f"{fmt}: median ratio {statistics.median(r):.1f} ({sorted(round(x, 1) for x in r)})"
