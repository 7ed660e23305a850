"""Tests of the provider test servers (run: .venv/bin/python -m pytest testbed/tests -q)."""
