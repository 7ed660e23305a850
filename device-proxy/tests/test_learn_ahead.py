"""Issue 13: a version that became a document's base without being diffed
(its first save, which goes whole through the EPS) is learnt ahead of its
next diff, after the app's answer (`ec_patch.learn` on a thread of its own),
so that the next save's diff is as quick as one against a patched version.
A proxy of its own: nothing learnt before."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import app_client as app

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / ".cache" / "traces" / "writer-1m-middle-docx"


@pytest.fixture(scope="module")
def proxy(lab, eps):
    return lab.start_proxy("learn-laptop", eps)  # the lab's default rule: a patch whenever smaller


def test_a_version_saved_whole_is_learnt_ahead_of_the_next_diff(lab, eps, proxy):
    if not (TRACE / "base.docx").exists():
        pytest.fail(f"trace {TRACE.name} missing: run `make traces`")
    base, new = (TRACE / "base.docx").read_bytes(), (TRACE / "new.docx").read_bytes()
    token, path = "learn-user", "/learn/report.docx"
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, base)
    assert code == 200, body
    line = f"{path}: learnt 1 block-parallel member(s) of this version ahead of its next diff"
    deadline = time.monotonic() + 60
    while line not in proxy.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the version saved whole was not learnt"
        time.sleep(0.05)
    # The next save is a patch against it, and exact.
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, new)
    assert code == 200, body
    held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
    assert held and held[0]["sha256"] == app.sha(new)
    doc = [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == path][0]
    assert doc["last_how"] == "patch", doc
