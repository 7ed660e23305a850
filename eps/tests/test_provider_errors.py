"""Provider errors reach the app as the provider sent them: a 409, 429
(with Retry-After) or 503 comes back inside a SAVE_RESULT unchanged, once
(no hidden retries), and the provider keeps the old version while the next
save succeeds; a provider that never answers is `provider_timeout` at stage
1 (the app gets 504, no direct path), a dropped connection stage 1 (502),
and a refused connection stage 0 (the device takes the direct path)
(issue 3, "Must show": provider 5xx / 429 / timeouts).
"""

from __future__ import annotations

import json

import pytest

import ec_protocol as p

from testbed.lab import PROVIDER_HOSTS

from .e2e import Uploader, log_seq, provider_requests_since, sha256, trace_sequences


@pytest.fixture(scope="module")
def versions():
    return trace_sequences()["xlsx"][0]


FAULTS = [
    # (provider, style, route, fault, expected status)
    ("dropbox", "single", "upload", {"kind": "status", "status": 503, "retry_after": 7}, 503),
    ("dropbox", "single", "upload", {"kind": "status", "status": 409}, 409),
    ("dropbox", "single", "upload", {"kind": "throttle", "retry_after": 3}, 429),
    ("graph", "single", "*", {"kind": "throttle", "retry_after": 5}, 429),
    ("drive", "media", "*", {"kind": "status", "status": 500}, 500),
    ("webdav", "put", "*", {"kind": "status", "status": 507}, 507),
    ("dropbox", "session", "upload_session/start", {"kind": "status", "status": 503, "retry_after": 2}, 503),
    ("webdav", "chunked", "*", {"kind": "throttle", "retry_after": 4}, 429),
]


@pytest.mark.parametrize("provider,style,route,fault,status", FAULTS, ids=[f"{f[0]}-{f[1]}-{f[4]}" for f in FAULTS])
def test_provider_status_reaches_the_app(lab, eps, client, clean_faults, versions, provider, style, route, fault, status):
    up = Uploader(provider, style)
    name = f"errors-{provider}-{style}-{status}.xlsx"
    v0, v1 = versions[0], versions[1]
    out = up.save(client, name, v0, None)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out

    lab.providers.fault(provider=provider, route=route, method="*", count=1, **fault)
    seq = log_seq(lab)
    out = up.save(client, name, v1, v0)
    assert isinstance(out, p.ProviderResponse), out
    assert out.status == status, (out.status, out.body[:200])
    calls = provider_requests_since(lab, seq)
    faulted = [c for c in calls if c["fault"]]
    assert len(faulted) == 1 and faulted[0]["status"] == status, "no hidden retry"
    headers = dict(out.headers)
    if "retry_after" in fault:
        assert headers.get("retry-after") == str(fault["retry_after"]).encode()
    assert out.body, "the provider's error body is handed back"
    if status == 429 and provider == "dropbox":
        assert json.loads(out.body)["error"]["reason"][".tag"] == "too_many_requests"
    held = up.held(lab, name)
    assert held["sha256"] == sha256(v0), "the provider still holds the old version"

    # The app retries: a new save, which succeeds against the same base.
    out = up.save(client, name, v1, v0)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    assert up.held(lab, name)["sha256"] == sha256(v1)


@pytest.fixture(scope="module")
def impatient(start_eps):
    return start_eps("impatient", upstream={"response_timeout_s": 2, "op_timeout_s": 5})


def test_provider_that_never_answers(lab, impatient, clean_faults, versions):
    client = impatient.client()
    up = Uploader("dropbox", "single")
    lab.providers.fault(kind="delay", delay=8, provider="dropbox", route="upload", method="*", count=1)
    out = up.save(client, "slow.xlsx", versions[0], None)
    assert isinstance(out, p.AppError), out
    assert out.status == 504 and out.error.code == "provider_timeout" and out.error.stage == 1, out
    client.close()


def test_dropped_connection(lab, eps, client, clean_faults, versions):
    up = Uploader("dropbox", "single")
    lab.providers.fault(kind="drop", when="before", provider="dropbox", route="upload", method="*", count=1)
    out = up.save(client, "dropped.xlsx", versions[0], None)
    assert isinstance(out, p.AppError), out
    assert out.status == 502 and out.error.stage == 1, out
    assert up.held(lab, "dropped.xlsx") is None


def test_truncated_response(lab, eps, client, clean_faults, versions):
    up = Uploader("dropbox", "single")
    lab.providers.fault(kind="truncate", truncate_at=10, provider="dropbox", route="upload", method="*", count=1)
    out = up.save(client, "truncated.xlsx", versions[0], None)
    assert isinstance(out, p.AppError), out
    assert out.status == 502 and out.error.code == "provider_truncated" and out.error.stage == 1, out


def test_connection_refused_means_direct_path(start_eps, versions):
    # Every provider host resolves to a port nobody listens on.
    refused = start_eps("refused", upstream={"resolve": {h: "127.0.0.1:9" for h in PROVIDER_HOSTS}})
    client = refused.client()
    out = Uploader("dropbox", "single").save(client, "refused.xlsx", versions[0], None)
    assert isinstance(out, p.Fallback), out
    assert out.error is not None and out.error.code == "provider_unreachable" and out.error.stage == 0, out
    client.close()
