"""Where the binding's tests find their inputs (a module of its own, not
`conftest`: several test folders of the repository have a conftest, and
pytest imports each as the same top-level name)."""

from pathlib import Path

from testbed import shared

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "edit-patch" / "vectors"
CORPUS = shared.root() / "corpus" / "real"
