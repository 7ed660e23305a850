"""Shared fixtures: the repository, the vectors, the LibreOffice traces."""

import json
import os
from pathlib import Path

import pytest

from ec_patch_paths import REPO


@pytest.fixture(scope="session")
def traces():
    """The LibreOffice edit traces (`make traces`); required, never skipped."""
    root = Path(os.environ.get("EC_TRACES", REPO / ".cache" / "traces"))
    manifest = root / "manifest.json"
    assert manifest.is_file(), f"no traces at {root}: run `make traces` (or set EC_TRACES)"
    data = json.loads(manifest.read_text())
    return [
        dict(t, base_bytes=(root / t["base"]).read_bytes(), new_bytes=(root / t["new"]).read_bytes())
        for t in data["traces"]
    ]
