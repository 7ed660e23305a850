"""The admin API: faults of every kind, the request log, files, reset; the CLI."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import aiohttp
import pytest

from testbed.tests.harness import ROOT, Client, start_server, stop_server

DBX = "https://content.dropboxapi.com/2/files/upload"
GRAPH = "https://graph.microsoft.com/v1.0/me/drive/root:/f.docx:/content"
DRIVE = "https://www.googleapis.com/upload/drive/v3/files?uploadType=media"
DAV = "https://cloud.example.com/remote.php/dav/files/alice/f.docx"


def dbx_upload(client, data=b"x", path="/f.docx"):
    return client.request("POST", DBX, data=data, headers={"Dropbox-API-Arg": json.dumps({"path": path, "mode": "overwrite"})})


def test_throttle_in_each_provider_shape(client):
    for provider in ("dropbox", "graph", "drive", "webdav"):
        client.fault(kind="throttle", provider=provider, retry_after=7)
    d = dbx_upload(client)
    assert d.status == 429 and d.headers["Retry-After"] == "7"
    assert d.json()["error"] == {"reason": {".tag": "too_many_requests"}, "retry_after": 7}
    g = client.request("PUT", GRAPH, data=b"x")
    assert g.status == 429 and g.headers["Retry-After"] == "7" and g.json()["error"]["code"] == "activityLimitReached"
    r = client.request("POST", DRIVE, data=b"x")
    assert r.status == 429 and r.json()["error"]["errors"][0]["reason"] == "rateLimitExceeded"
    w = client.request("PUT", DAV, data=b"x")
    assert w.status == 429 and b"<s:exception>" in w.body
    # each fault fired once; nothing was stored
    assert client.files() == []
    assert dbx_upload(client).status == 200


def test_status_fault_counts_and_route_filter(client):
    client.fault(kind="status", provider="dropbox", route="upload", status=503, count=2)
    assert dbx_upload(client).status == 503
    assert dbx_upload(client).status == 503
    assert dbx_upload(client).status == 200
    # route filter: a download is not affected by an upload fault
    client.fault(kind="status", provider="dropbox", route="upload", status=500)
    d = client.request("POST", "https://content.dropboxapi.com/2/files/download", headers={"Dropbox-API-Arg": '{"path": "/f.docx"}'})
    assert d.status == 200
    faults = client.admin("GET", "faults")
    assert [f["fired"] for f in faults] == [2, 0]


def test_delay(client):
    client.fault(kind="delay", provider="graph", delay=0.6)
    t = time.monotonic()
    assert client.request("PUT", GRAPH, data=b"x").status == 201
    assert time.monotonic() - t >= 0.6


def test_drop_before_and_after(client):
    client.fault(kind="drop", provider="dropbox", route="upload", when="before")
    with pytest.raises(aiohttp.ClientError):
        dbx_upload(client, b"lost")
    assert client.files() == []
    client.fault(kind="drop", provider="dropbox", route="upload", when="after")
    with pytest.raises(aiohttp.ClientError):
        dbx_upload(client, b"stored, answer lost")
    [f] = client.files()
    assert f["sha256"] == hashlib.sha256(b"stored, answer lost").hexdigest()
    statuses = [e["status"] for e in client.log()]
    assert statuses == ["dropped", "dropped"]


def test_truncate_response_body(client):
    data = bytes(range(256)) * 400
    assert dbx_upload(client, data).status == 200
    client.fault(kind="truncate", provider="dropbox", route="download", truncate_at=1000)
    with pytest.raises(aiohttp.ClientPayloadError):
        client.request("POST", "https://content.dropboxapi.com/2/files/download", headers={"Dropbox-API-Arg": '{"path": "/f.docx"}'})


def test_request_log_redacts_authorization(client):
    data = b"logged body"
    dbx_upload(client, data)
    client.request("PUT", "https://api.onedrive.com/rup/nonexistent", data=b"", token=None,
                   headers={"Content-Range": "bytes 0-0/1"})
    first, second = client.log()
    assert first["provider"] == "dropbox" and first["route"] == "upload" and first["method"] == "POST"
    assert first["host"] == "content.dropboxapi.com" and first["path"] == "/2/files/upload"
    assert first["authorization_present"] is True
    assert "Authorization" not in first["headers"] and "Bearer" not in json.dumps(first)
    assert first["body_size"] == len(data) and first["body_sha256"] == hashlib.sha256(data).hexdigest()
    assert first["headers"]["Dropbox-API-Arg"] == json.dumps({"path": "/f.docx", "mode": "overwrite"})
    assert first["status"] == 200
    assert second["route"] == "upload_fragment" and second["authorization_present"] is False and second["status"] == 404
    assert client.admin("GET", f"log?since={first['seq']}") == [second]


def test_bad_fault_spec_and_unknown_host(client):
    r = client.request("POST", "https://graph.microsoft.com/__testbed/faults", json_body={"kind": "explode"}, token=None)
    assert r.status == 400 and "kind" in r.json()["error"]
    r = client.request("GET", "https://localhost/anything")
    assert r.status == 421
    routes = client.admin("GET", "routes")
    assert "upload_session/finish_batch_v2" in routes["dropbox"] and "upload_fragment" in routes["graph"]


def test_plain_http_listener_and_admin(client):
    r = client.request("POST", "http://content.dropboxapi.com/2/files/upload", data=b"plain",
                       headers={"Dropbox-API-Arg": '{"path": "/p.docx"}'})
    assert r.status == 200
    # URLs handed out on the plain listener are plain too
    s = client.request("POST", "http://graph.microsoft.com/v1.0/me/drive/root:/g.docx:/createUploadSession").json()
    assert s["uploadUrl"].startswith("http://api.onedrive.com/rup/")


def test_state_survives_restart_and_ca_is_reused(tmp_path):
    srv = start_server(tmp_path)
    ca_before = (srv.certs / "ca.pem").read_bytes()
    c = Client(srv.tls_port, srv.plain_port, srv.ready["ca"])
    try:
        assert dbx_upload(c, b"persist me").status == 200
    finally:
        c.close()
        stop_server(srv)
    srv = start_server(tmp_path)
    c = Client(srv.tls_port, srv.plain_port, srv.ready["ca"])
    try:
        assert (srv.certs / "ca.pem").read_bytes() == ca_before
        d = c.request("POST", "https://content.dropboxapi.com/2/files/download", headers={"Dropbox-API-Arg": '{"path": "/f.docx"}'})
        assert d.status == 200 and d.body == b"persist me"
        log = srv.log_path.read_text()
        assert "dropbox download POST /2/files/download -> 200" in log
    finally:
        c.close()
        stop_server(srv)


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "testbed.providers", "serve", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0
    for option in ("--state", "--certs", "--listen", "--plain-listen", "--webdav-host"):
        assert option in out.stdout
