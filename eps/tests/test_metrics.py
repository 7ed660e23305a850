"""Health and metrics (spec §12), and credentials in flight only (spec §8):
`/healthz` answers `ok\\n` on both listeners, `/metrics` (management listener
only) has every metric the spec lists, and a marker credential used as the
app's token in saves, a fetch and a provider error appears nowhere the EPS
writes: not in the metrics, not in its log, not in any file of its state
folder.
"""

from __future__ import annotations

import urllib.request

import pytest

import ec_protocol as p

from .e2e import Uploader, download_request, trace_sequences

MARKER = "EC-TEST-CREDENTIAL-0f1e2d3c"
SPEC_METRICS = (
    "ec_eps_requests_total", "ec_eps_provider_requests_total", "ec_eps_provider_request_seconds", "ec_eps_save_seconds",
    "ec_eps_device_bytes_total", "ec_eps_provider_bytes_total", "ec_eps_base_unknown_total", "ec_eps_target_mismatch_total",
    "ec_eps_idempotent_replays_total", "ec_eps_provider_hash_disagreements_total", "ec_eps_sessions", "ec_eps_contexts",
    "ec_eps_inflight", "ec_eps_store_bytes", "ec_eps_store_documents", "ec_eps_store_evictions_total",
    "ec_eps_kept_content_bytes", "ec_eps_rebuild_blocks_copied_total", "ec_eps_learnt_members_total",
    "ec_eps_blocks_from_base_parse_total",
)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_healthz_on_both_listeners(eps):
    for listener in (eps.device, eps.management):
        assert get(f"http://{listener}/healthz") == (200, b"ok\n")


@pytest.fixture(scope="module")
def marked_traffic(lab, eps):
    """Saves (FULL, PATCH, an upload session), a fetch and a provider error, all with the marker as the app's token."""
    versions = trace_sequences()["docx"][0]
    client = eps.client()
    for provider, style in (("dropbox", "single"), ("dropbox", "session"), ("webdav", "put")):
        up = Uploader(provider, style, token=MARKER)
        for base, data in ((None, versions[0]), (versions[0], versions[1])):
            out = up.save(client, f"marked-{style}.docx", data, base)
            assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    got = client.fetch(download_request("dropbox", "marked-single.docx", token=MARKER), Uploader("dropbox", "single", token=MARKER).doc("marked-single.docx"), versions[0])
    assert isinstance(got, p.FetchResponse), got
    lab.providers.fault(kind="status", status=401, provider="dropbox", route="*", method="*", count=1)
    out = Uploader("dropbox", "single", token=MARKER).save(client, "marked-single.docx", versions[2], versions[1])
    assert isinstance(out, p.ProviderResponse) and out.status == 401
    lab.providers.clear_faults()
    client.close()


def test_metrics_names_and_labels(eps, marked_traffic):
    text = eps.metrics()
    # Declared families (a labelled family with no sample yet, such as the
    # hash disagreements, has only its # TYPE line; OpenMetrics-style counter
    # families are declared without the _total of their samples).
    families = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    for name in SPEC_METRICS:
        family = name[: -len("_total")] if name.endswith("_total") else name
        assert family in families, f"{name} missing from /metrics"
        if name.endswith("_total"):
            assert families[family] == "counter", name
    assert eps.metric("ec_eps_requests_total", 'endpoint="save"') >= 7
    # Labels never hold document keys, accounts, paths, URLs or credentials (§12).
    for forbidden in ("marked-", "/e2e/", "alice", "dropboxapi", "cloud.example.com", MARKER):
        assert forbidden not in text
    status, _ = get(f"http://{eps.device}/metrics")
    assert status == 404, "no metrics on the device listener"


def test_marker_credential_is_never_written(eps, marked_traffic):
    marker = MARKER.encode()
    assert marker not in eps.metrics().encode()
    log = eps.log_path.read_bytes()
    assert log, "the EPS logged something"
    assert marker not in log
    files = [f for f in eps.state.rglob("*") if f.is_file()]
    assert any("store" in f.parts for f in files)
    for f in files:
        assert marker not in f.read_bytes(), f


def test_provider_requests_counted_each_with_its_own_status(lab, eps):
    """A Dropbox session save is two provider calls here (start with the
    whole file, then finish); when the finish fails with 503, the start's 200
    is counted as 2xx and the finish as 5xx (issue 11: every call carried the
    last call's status)."""
    versions = trace_sequences()["docx"][0]
    client = eps.client()
    labels = 'provider="dropbox",procedure="DROPBOX_SESSION",status_class="{}"'

    def counts():
        return {c: eps.metric("ec_eps_provider_requests_total", labels.format(c)) for c in ("2xx", "5xx")}

    before = counts()
    lab.providers.fault(kind="status", status=503, provider="dropbox", route="upload_session/finish", method="*", count=1)
    try:
        out = Uploader("dropbox", "session", token="metrics-calls").save(client, "calls.docx", versions[0], None)
    finally:
        lab.providers.clear_faults()
        client.close()
    assert isinstance(out, p.ProviderResponse) and out.status == 503, out
    after = counts()
    assert (after["2xx"] - before["2xx"], after["5xx"] - before["5xx"]) == (1, 1), (before, after)
