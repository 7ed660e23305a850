"""The golden vectors of edit-patch/vectors/, checked through the binding."""

import hashlib
import json

import pytest

import ec_patch
from ec_patch_paths import VECTORS

MANIFEST = json.loads((VECTORS / "manifest.json").read_text())
#: Version 2's own vectors (edit-patch-v2.md §6), same layout, in v2/.
V2 = VECTORS / "v2"
MANIFEST_V2 = json.loads((V2 / "manifest.json").read_text())


#: Vectors of version 1's suite that a version 2 reader reads differently
#: (edit-patch-v2.md §6): "version byte 2" is a version 2 patch using
#: nothing of version 2, and applies.
READ_AS_V2 = {"unsupported-version"}


def test_the_committed_suite_is_version_1s_and_the_binding_reads_both():
    assert MANIFEST["format_version"] == 1
    assert ec_patch.FORMAT_VERSION == 2 and list(ec_patch.FORMAT_VERSIONS) == [2, 1]
    assert sum("error" in v["expect"] for v in MANIFEST["vectors"]) >= 20


def test_version_2s_suite():
    assert MANIFEST_V2["format_version"] == 2
    assert sum("error" not in v["expect"] for v in MANIFEST_V2["vectors"]) >= 2
    assert sum("error" in v["expect"] for v in MANIFEST_V2["vectors"]) >= 5


@pytest.mark.parametrize("root,vector",
                         [(VECTORS, v) for v in MANIFEST["vectors"]]
                         + [(V2, v) for v in MANIFEST_V2["vectors"]],
                         ids=lambda x: x["name"] if isinstance(x, dict) else x.name)
def test_vector(root, vector):
    base = (root / vector["base"]).read_bytes()
    patch = (root / vector["patch"]).read_bytes()
    expect = vector["expect"]
    if root == VECTORS and vector["name"] in READ_AS_V2:
        out = ec_patch.apply(base, patch)  # raises unless the declared SHA-256 matches
        assert out[:2] == b"PK" and out != base
        newer = bytearray(patch)
        newer[4] = 3
        with pytest.raises(ec_patch.PatchError) as e:
            ec_patch.apply(base, bytes(newer))
        assert e.value.code == "unsupported_version"
    elif "error" in expect:
        with pytest.raises(ec_patch.PatchError) as e:
            ec_patch.apply(base, patch)
        assert e.value.code == expect["error"], str(e.value)
    else:
        out = ec_patch.apply(base, patch)
        assert len(out) == expect["size"]
        assert hashlib.sha256(out).hexdigest() == expect["sha256"]
        assert out == (root / vector["target"]).read_bytes()
