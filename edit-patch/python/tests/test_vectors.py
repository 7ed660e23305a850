"""The golden vectors of edit-patch/vectors/, checked through the binding."""

import hashlib
import json

import pytest

import ec_patch
from ec_patch_paths import VECTORS

MANIFEST = json.loads((VECTORS / "manifest.json").read_text())


def test_manifest_matches_the_binding_version():
    assert MANIFEST["format_version"] == ec_patch.FORMAT_VERSION
    assert sum("error" in v["expect"] for v in MANIFEST["vectors"]) >= 20


@pytest.mark.parametrize("vector", MANIFEST["vectors"], ids=lambda v: v["name"])
def test_vector(vector):
    base = (VECTORS / vector["base"]).read_bytes()
    patch = (VECTORS / vector["patch"]).read_bytes()
    expect = vector["expect"]
    if "error" in expect:
        with pytest.raises(ec_patch.PatchError) as e:
            ec_patch.apply(base, patch)
        assert e.value.code == expect["error"], str(e.value)
    else:
        out = ec_patch.apply(base, patch)
        assert len(out) == expect["size"]
        assert hashlib.sha256(out).hexdigest() == expect["sha256"]
        assert out == (VECTORS / vector["target"]).read_bytes()
