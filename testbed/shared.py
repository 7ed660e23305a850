"""Where the shared data lives: the corpus of real office documents and the
keystroke-level editing traces (CC BY 4.0) that tests, benchmarks and
experiments read but the repository does not carry.

One setting: `EC_SHARED` names the folder; by default it is `shared` beside
the repository's own folder (`../shared` from the checkout), as CI places it.
The Rust tests read the same variable (`edit-patch/core/tests/common`).

    from testbed.shared import corpus
    docx = corpus("docx")          # <shared>/corpus/real/docx, or a clear failure
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = "EC_SHARED"


def root() -> Path:
    """The shared folder (`EC_SHARED`, else `../shared` beside the repository)."""
    return Path(os.environ.get(ENV) or REPO.parent / "shared")


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"{what} is missing: {path} does not exist. Put the shared folder beside the repository "
            f"(../shared) or set {ENV} to it."
        )
    return path


def corpus(sub: str = "") -> Path:
    """The real-document corpus (`<shared>/corpus/real`), or one folder or file of it."""
    return _need(root() / "corpus" / "real" / sub, "the shared document corpus")


def editing_traces() -> Path:
    """The keystroke-level editing traces (`<shared>/traces/editing`)."""
    return _need(root() / "traces" / "editing", "the shared editing traces")
