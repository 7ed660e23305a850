"""Shared fixtures for the testbed tests: a provider server in a subprocess and
a client that reaches it under the providers' real host names through the test CA."""

from __future__ import annotations

import sys
from pathlib import Path

# `python -m pytest testbed/tests` from the repository root puts the root on
# sys.path; this keeps plain `pytest` working too.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
