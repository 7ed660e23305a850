"""The shared data (real-document corpus, editing traces) is found through one
setting, `EC_SHARED` (testbed/shared.py), and no code names a machine path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testbed import shared


def test_default_is_the_folder_beside_the_repository(monkeypatch):
    monkeypatch.delenv(shared.ENV, raising=False)
    assert shared.root() == shared.REPO.parent / "shared"


def test_the_setting_moves_corpus_and_traces(tmp_path, monkeypatch):
    (tmp_path / "corpus" / "real" / "docx").mkdir(parents=True)
    (tmp_path / "traces" / "editing").mkdir(parents=True)
    monkeypatch.setenv(shared.ENV, str(tmp_path))
    assert shared.corpus("docx") == tmp_path / "corpus" / "real" / "docx"
    assert shared.editing_traces() == tmp_path / "traces" / "editing"


def test_a_missing_folder_fails_and_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setenv(shared.ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"shared document corpus is missing: .*nowhere.* set EC_SHARED"):
        shared.corpus()
    with pytest.raises(FileNotFoundError, match="shared editing traces is missing"):
        shared.editing_traces()


def test_the_experiments_read_the_same_setting(tmp_path):
    """figures.editing_traces() (the replay and Figs. 12-13's corpus default) follows EC_SHARED."""
    code = ("import sys; sys.path.insert(0, 'experiments/paper'); import figures; "
            "print(figures.editing_traces())")
    out = subprocess.run([sys.executable, "-c", code], cwd=shared.REPO, env={"EC_SHARED": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(tmp_path / "traces" / "editing")


def test_no_code_names_a_machine_path():
    files = subprocess.run(["git", "ls-files"], cwd=shared.REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        if name.endswith((".md", ".png", ".svg", ".csv")) or name.startswith("docs/"):
            continue  # prose and results may say where a run happened
        path = shared.REPO / name
        if not path.is_file():
            continue
        text = path.read_bytes()
        # Spelt in two pieces, so that this file does not name them itself.
        for needle in (b"/work" + b"/shared", b"/work" + b"/main"):
            if needle in text:
                offenders.append(f"{name}: {needle.decode()}")
    assert not offenders, "machine paths in code (use testbed/shared.py's EC_SHARED): " + ", ".join(offenders)
