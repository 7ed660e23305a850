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


def test_an_inserted_row_costs_a_row_not_the_rest_of_the_sheet(traces):
    rows = [t for t in traces if t["edit"] == "row-middle"]
    assert {t["size"] for t in rows} == {"200rows", "5000rows"}
    for t in rows:
        patch = ec_patch.diff(t["base_bytes"], t["new_bytes"])
        assert len(patch) < 600, f"{t['name']}: {len(patch)} bytes"
        modes = {m["content_mode"] for m in ec_patch.inspect(patch)["rebuilt_members"]}
        assert "inflate-rows" in modes, t["name"]


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


# LibreOffice writes 13 fresh random GUIDs (date, footer and slide-number
# fields of the master and 12 layouts, 36 hex characters each) into every
# .pptx save: at least 208 bytes of pure entropy no patch can avoid.
PPTX_GUID_TEXT = 13 * 36


def test_a_save_with_no_edit_costs_under_200_bytes(traces):
    noedits = [t for t in traces if t["edit"] == "noedit"]
    assert {t["format"] for t in noedits} == {"docx", "odt", "xlsx", "ods", "pptx", "odp"}
    for t in noedits:
        size = len(ec_patch.diff(t["base_bytes"], t["new_bytes"]))
        bound = 200 + (PPTX_GUID_TEXT if t["format"] == "pptx" else 0)
        assert size < bound, f"{t['name']}: {size} bytes"


# The goal is a median ratio of at least 20 for every format. It is
# met for all but .odp, whose median is guarded here against regressions:
# the 5-slide decks are 17 KB and zstd's whole delta of them is already only
# 1 to 3 KB, against a patch floor of about 100 bytes (two SHA-256s);
# docs/edit-patch.md explains it.
MEDIAN_RATIO_FLOOR = {"docx": 20, "odt": 20, "pptx": 20, "xlsx": 20, "ods": 20, "odp": 9}


def test_median_patch_against_zstd_patch_from(traces):
    ratios = defaultdict(list)
    for t in traces:
        ours = len(ec_patch.diff(t["base_bytes"], t["new_bytes"]))
        ratios[t["format"]].append(zstd_patch_from(t["base_bytes"], t["new_bytes"]) / ours)
    assert set(ratios) == set(MEDIAN_RATIO_FLOOR)
    for fmt, r in ratios.items():
        median = statistics.median(r)
        assert median >= MEDIAN_RATIO_FLOOR[fmt], f"{fmt}: median ratio {median:.1f} ({sorted(round(x, 1) for x in r)})"


def test_spot_checked_patches_of_every_trace_are_the_full_checks_patches(traces):
    """spot_check=True (the device proxy's call on unmetered links) on
    LibreOffice's own saves: the same patch bytes as every block checked, in
    both directions (the second diff of a pair finds the layouts and
    contents the first one left), each rebuilding exactly."""
    for t in traces:
        base, new = t["base_bytes"], t["new_bytes"]
        for a, b in ((base, new), (new, base)):
            full = ec_patch.diff(a, b, verify=False)
            spot = ec_patch.diff(a, b, verify=False, spot_check=True)
            assert spot == full, t["name"]
            assert ec_patch.diff(a, b, spot_check=True) == full, t["name"]
    assert len(traces) >= 40


def test_kept_contents_are_counted_and_let_go_of(traces):
    """A spot-check diff keeps the large contents it inflated, and an apply
    the contents it made, for the next save of the same document;
    `forget_kept` lets go of them all and later diffs and applies are still
    exact."""
    t = next(t for t in traces if t["name"] == "writer-1m-middle-docx")
    base, new = t["base_bytes"], t["new_bytes"]
    ec_patch.forget_kept()
    assert ec_patch.kept_bytes() == 0
    patch = ec_patch.diff(base, new, spot_check=True)
    assert ec_patch.apply(base, patch) == new
    # word/document.xml: 1.78 MB of XML, kept by the diff (both versions) and by the apply (what it made).
    kept = ec_patch.kept_bytes()
    assert kept > 3_000_000, kept
    assert ec_patch.forget_kept() == kept
    assert ec_patch.kept_bytes() == 0
    again = ec_patch.diff(base, new, spot_check=True)
    assert again == patch and ec_patch.apply(base, again) == new
    ec_patch.forget_kept()


def test_a_version_learnt_ahead_keeps_its_content_for_the_next_diff(traces):
    """`learn` (the device proxy's, after a save that went whole or a
    download): the version's block-parallel member is inflated and its layout
    claimed ahead of the next diff, which then needs neither; asked again it
    learns nothing more (until the content is let go of); the next diffs are
    the same patches, exact. The process may know the layouts already from
    the tests before: each count follows a `forget_kept`."""
    t = next(t for t in traces if t["name"] == "writer-1m-middle-docx")
    base, new = t["base_bytes"], t["new_bytes"]
    ec_patch.forget_kept()
    assert ec_patch.learn(b"not a zip", spot_check=True) == 0
    assert ec_patch.learn(base, spot_check=True) == 1  # word/document.xml
    assert ec_patch.kept_bytes() > 1_500_000, ec_patch.kept_bytes()
    assert ec_patch.learn(base, spot_check=True) == 0
    patch = ec_patch.diff(base, new, spot_check=True)
    assert patch == ec_patch.diff(base, new) and ec_patch.apply(base, patch) == new
    ec_patch.forget_kept()
    assert ec_patch.learn(new) == 1  # every block checked: a layout (and content) apply uses too
    assert ec_patch.learn(new) == 0
    ec_patch.forget_kept()
