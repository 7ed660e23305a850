"""The Python binding as the device proxy uses it."""

import hashlib

import pytest

import ec_patch
from ec_patch_paths import CORPUS


def test_diff_apply_inspect_round_trip_on_real_documents():
    base = (CORPUS / "docx" / "word2016-win_example.docx").read_bytes()
    new = (CORPUS / "docx" / "word2010-win_bug59058.docx").read_bytes()
    patch = ec_patch.diff(base, new)
    assert ec_patch.apply(base, patch) == new
    info = ec_patch.inspect(patch, base)
    assert info["kind"] == "zip"
    assert info["target_sha256"] == hashlib.sha256(new).hexdigest()
    assert info["patch_bytes"] == len(patch)
    names = {m["name"] for m in info["rebuilt_members"]}
    assert "word/document.xml" in names
    assert info["recipes"].get("preflate", 0) > 0, "Word's deflater needs preflate"


def test_errors_carry_a_stable_code_and_a_clear_message():
    base, new = b"first version " * 100, b"second version " * 100
    patch = ec_patch.diff(base, new)
    with pytest.raises(ec_patch.PatchError) as e:
        ec_patch.apply(new, patch)
    assert e.value.code == "wrong_base"
    assert "wrong base" in str(e.value)
    with pytest.raises(ec_patch.PatchError) as e:
        ec_patch.apply(base, patch[:-3])
    assert e.value.code in {"truncated", "codec", "malformed"}
    with pytest.raises(ec_patch.PatchError) as e:
        ec_patch.inspect(b"PK\x03\x04 not a patch")
    assert e.value.code == "bad_magic"


def test_content_delta_is_small_for_a_single_character_anywhere():
    part = b"<w:p><w:r><w:t>" + b"edge courier office patch " * 40_000 + b"</w:t></w:r></w:p>"
    for at in (0, len(part) // 2, len(part)):
        edited = part[:at] + b"x" + part[at:]
        delta = ec_patch.diff_content(part, edited)
        assert len(delta) < 16
        assert ec_patch.apply_content(part, delta) == edited


def test_unverified_and_binary_modes_still_rebuild_exactly():
    base = (CORPUS / "xlsx" / "excel2008-mac_47504.xlsx").read_bytes()
    new = (CORPUS / "xlsx" / "excel2007-win_WithDrawing.xlsx").read_bytes()
    for kwargs in ({"verify": False}, {"binary": True}):
        patch = ec_patch.diff(base, new, **kwargs)
        assert ec_patch.apply(base, patch) == new
    assert ec_patch.inspect(ec_patch.diff(base, new, binary=True))["kind"] == "binary"


def test_quick_spends_no_time_for_bytes_and_still_rebuilds_exactly():
    """quick=True (the device proxy's choice unless the link is metered): no zstd level-19
    delta for unrelated versions, so the patch may be larger, never wrong."""
    base = (CORPUS / "docx" / "word2016-win_example.docx").read_bytes()
    new = (CORPUS / "docx" / "python-docx_grid_offset_error.docx").read_bytes()
    smallest, quick = ec_patch.diff(base, new), ec_patch.diff(base, new, quick=True)
    assert len(quick) > len(smallest)
    assert ec_patch.inspect(smallest)["kind"] == "binary" and ec_patch.inspect(quick)["kind"] == "zip"
    assert ec_patch.apply(base, quick) == new
