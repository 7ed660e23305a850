"""Issue 8, item 4: a retry after an EPS crash never uploads twice.

The EPS (the fail-point build) is SIGKILLed right after the provider
accepted a save, and restarted after 0, 0.5, 5 and 20 s, with the real
device proxy (`ec-proxy`, mitmproxy) in front and an app (`http.client`
through the proxy) saving with the providers' conditional requests: a
Graph simple upload with `If-Match` (the v0 eTag) and a Dropbox upload in
`update` mode (the v0 rev). The proxy's connection to the EPS fails after
the save was sent; its retries (same request id, spec §7.1) meet refused
connections until the EPS is back, then:

- killed at `eps::after_provider` (the provider answered, the EPS had not
  recorded the outcome; its in-flight marker survives): the restarted EPS
  answers "outcome unknown" (provider_timeout, stage 1) and the app gets 504;
- killed at `store::pointer_before_dir_fsync` (the outcome record is on
  disk with the document's pointer): the restarted EPS answers from the
  record (REPLAYED) and the app gets the provider's own 2xx.

In every case the provider receives the upload exactly once (its request
log), and the app never gets a 412 / 409 for its own save. Before issue 8
the proxy took the direct path on the first refused retry: a second upload,
and Graph answered the app 412.

All cases share one EPS and one proxy (the EPS restarts between them on the
same ports), so the test costs the sum of the delays plus a few seconds.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest

from app_client import Reply, Send, Versions, dropbox_upload, onedrive_put, sha, through, trace_versions
from testbed.lab import EPS_FAILPOINTS_BIN, Eps, Lab, Proxy

#: How long a fail point holds the save: far longer than any test waits.
HOLD_MS = 60_000
#: Restart delays of the issue.
DELAYS = [0.0, 0.5, 5.0, 20.0]


@pytest.fixture(scope="module")
def docs() -> Versions:
    return trace_versions("writer-100k-middle-docx", "writer-100k-end-docx")


@pytest.fixture(scope="module")
def crash_eps(lab) -> Eps:
    assert EPS_FAILPOINTS_BIN.exists(), "needs .venv/bin/ec-eps-failpoints (make eps-failpoints)"
    return lab.start_eps("crash-retry-user", binary=EPS_FAILPOINTS_BIN)


@pytest.fixture(scope="module")
def crash_proxy(lab, crash_eps) -> Proxy:
    # The default retry window (30 s) is what the 20 s restart needs.
    return lab.start_proxy("crash-retry-laptop", crash_eps)


def uploads_of(lab: Lab, mark: int, body: bytes) -> int:
    """Provider requests after log entry `mark` that carried the whole of `body`."""
    want = sha(body)
    return sum(1 for e in lab.providers.log() if e["seq"] > mark and e.get("body_sha256") == want)


def log_seq(lab: Lab) -> int:
    entries = lab.providers.log()
    return entries[-1]["seq"] if entries else 0


def held(lab: Lab, provider: str, token: str, path: str):
    for f in lab.providers.files(provider):
        if f["account"] == token and f["path"].lower() == path.lower():
            return f["sha256"]
    return None


# ---------------------------------------------------------------- conditional saves, as the apps make them


def graph_conditional(send: Send, token: str, path: str, v0: bytes, v1: bytes) -> tuple[Reply, Callable[[], Reply]]:
    """Creates v0; returns its reply and the save of v1 conditional on v0's eTag."""
    r = onedrive_put(send, token, path, v0)
    etag = json.loads(r[2])["eTag"] if 200 <= r[0] < 300 else ""
    return r, lambda: onedrive_put(send, token, path, v1, if_match=etag)


def dropbox_conditional(send: Send, token: str, path: str, v0: bytes, v1: bytes) -> tuple[Reply, Callable[[], Reply]]:
    """Creates v0; returns its reply and the save of v1 in `update` mode on v0's rev."""
    r = dropbox_upload(send, token, path, v0)
    rev = json.loads(r[2])["rev"] if 200 <= r[0] < 300 else ""
    return r, lambda: dropbox_upload(send, token, path, v1, mode={".tag": "update", "update": rev})


SHAPES = {"graph-if-match": ("graph", graph_conditional), "dropbox-update": ("dropbox", dropbox_conditional)}

#: (fail point, what the restarted EPS answers the proxy's retry, what the app gets)
POINTS = {
    "eps::after_provider": "504",
    "store::pointer_before_dir_fsync": "2xx",
}

CASES = [(p, d, s) for p in ["eps::after_provider"] for d in DELAYS for s in SHAPES]
# The recorded-outcome path once per shape (its restart delay does not change what the record answers).
CASES += [("store::pointer_before_dir_fsync", 0.5, s) for s in SHAPES]


@pytest.mark.parametrize("point,delay,shape", CASES, ids=[f"{p.split('::')[1]}-{d:g}s-{s}" for p, d, s in CASES])
def test_eps_killed_after_the_provider_accepted_is_never_uploaded_twice(lab, docs, crash_eps, crash_proxy, point, delay, shape):
    provider, conditional = SHAPES[shape]
    send = through(crash_proxy)
    token = f"retry-{shape}"
    path = f"/retry/{point.split('::')[1]}-{delay:g}s.docx"
    if crash_eps.proc is None or crash_eps.proc.poll() is not None:
        crash_eps.restart()
    created, save_v1 = conditional(send, token, path, docs.v0, docs.v1)
    assert 200 <= created[0] < 300, created
    assert held(lab, provider, token, path) == sha(docs.v0)

    crash_eps.restart(env={"FAILPOINTS": f"{point}=sleep({HOLD_MS})"})
    mark = log_seq(lab)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(save_v1)
        crash_eps.wait_at_fail_point(running)
        # The provider has accepted v1 and the EPS is about to die.
        assert held(lab, provider, token, path) == sha(docs.v1)
        crash_eps.kill()
        killed_at = time.monotonic()
        if delay:
            time.sleep(delay)
        assert not running.done(), f"the app was answered while the EPS was down: {running.result()[0]}"
        crash_eps.restart()
        answer = running.result(timeout=120)
        waited = time.monotonic() - killed_at
    status, _, body = answer
    uploads = uploads_of(lab, mark, docs.v1)
    print(f"{shape} killed at {point}, restarted after {delay:g} s: app got {status} after {waited:.1f} s; "
          f"provider received v1 {uploads} time(s)")
    assert uploads == 1, f"the provider received the save {uploads} times"
    assert held(lab, provider, token, path) == sha(docs.v1)
    assert status not in (409, 412), f"the app was told {status} for its own save: {body[:200]!r}"
    if POINTS[point] == "504":
        # The EPS's in-flight marker: "outcome unknown", and the app retries by itself.
        assert status == 504 and body == b"", answer
    else:
        # The outcome record persisted with the pointer answers the retry: the provider's own answer.
        assert 200 <= status < 300, answer
        assert json.loads(body)["size"] == len(docs.v1), body[:300]
