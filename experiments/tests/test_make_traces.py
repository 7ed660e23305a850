"""make_traces.py with the real LibreOffice: a conversion on which soffice
aborts (LibreOffice 7.4 headless now and then dies with signal 6 on a
conversion it does the next time: a fresh machine's `make build` stopped on
it) is converted again, and a soffice that keeps failing is still an error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "experiments" / "traces" / "make_traces.py"

# On PATH before the real soffice: aborts like LibreOffice does (exit status 134) on the first N
# conversions, counted in a file, then is the real soffice.
CRASHING_SOFFICE = """#!/bin/sh
case "$*" in *--convert-to*) ;; *) exec {real} "$@" ;; esac
n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}
if [ "$n" -lt {crashes} ]; then echo "Fatal exception: Signal 6" >&2; exit 134; fi
exec {real} "$@"
"""


def make(tmp: Path, crashes: int) -> subprocess.CompletedProcess:
    bindir = tmp / "bin"
    bindir.mkdir()
    fake = bindir / "soffice"
    fake.write_text(CRASHING_SOFFICE.format(real=shutil.which("soffice"), count=tmp / "count", crashes=crashes))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp / "traces"), "--only", "impress",
                           "--jobs", "1"], capture_output=True, text=True, timeout=600, env=env)


def test_a_conversion_on_which_soffice_aborts_is_made_again(tmp_path):
    done = make(tmp_path, crashes=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "soffice crashed (exit status 134, attempt 1 of 3); converting again" in done.stdout + done.stderr
    manifest = json.loads((tmp_path / "traces" / "manifest.json").read_text())
    traces = manifest["traces"] if isinstance(manifest, dict) and "traces" in manifest else manifest
    assert traces, manifest
    for path in (tmp_path / "traces").glob("*/*.p*"):
        assert zipfile.ZipFile(path).testzip() is None, path


def test_a_soffice_that_keeps_aborting_is_an_error(tmp_path):
    done = make(tmp_path, crashes=99)
    assert done.returncode != 0
    assert "soffice made no" in done.stderr and "exit status 134" in done.stderr, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "attempt 2 of 3); converting again" in log and "attempt 3 of 3" not in log, "three attempts, then the error"
    assert not (tmp_path / "traces" / "manifest.json").exists()
