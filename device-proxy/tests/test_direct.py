"""ec_proxy.direct against the real provider test servers: an app's upload
session is answered and gathered by the SessionBook, then replayed with the
default sender; the provider must then hold exactly the app's file."""

from __future__ import annotations

import hashlib
import json
import ssl

import pytest

import ec_protocol as ecp
from ec_proxy.direct import ChunkSizes, DirectProtocolError, HttpSender, replay
from ec_proxy.recognise import recognise
from ec_proxy.sessions import GatheredUpload, SessionBook
from testbed import lab

SIZES = ChunkSizes(dropbox=100_000, graph=327_680, drive=262_144, nextcloud=5 * 1024 * 1024)


@pytest.fixture(scope="module")
def providers(tmp_path_factory):
    p = lab.start_providers(tmp_path_factory.mktemp("direct"))
    yield p
    p.proc.terminate()
    p.proc.wait(10)


@pytest.fixture
def send(providers):
    providers.admin("POST", "reset")
    ctx = ssl.create_default_context(cafile=str(providers.ca))
    return HttpSender(ctx, {h: ("127.0.0.1", providers.tls_port) for h in lab.PROVIDER_HOSTS})


def office_bytes(n: int, seed: bytes) -> bytes:
    out = bytearray(b"PK\x03\x04")
    while len(out) < n:
        out += hashlib.sha256(seed + len(out).to_bytes(8, "big")).digest()
    return bytes(out[:n])


def feed(book: SessionBook, method, url, headers, body):
    rec = recognise(method, url, headers, body, webdav_hosts=[lab.WEBDAV_HOST])
    assert rec is not None
    return book.feed(rec)


def held(providers, provider: str, sha: str) -> list[dict]:
    return [f for f in providers.files(provider) if f["sha256"] == sha]


def test_dropbox_session_replayed(providers, send):
    data = office_bytes(250_000, b"dbx")
    book, auth = SessionBook(), ("Authorization", "Bearer alice")
    url = "https://content.dropboxapi.com/2/files/upload_session/"
    a = feed(book, "POST", url + "start", [auth, ("Dropbox-API-Arg", '{"close": false}')], data[:120_000])
    sid = json.loads(a.body)["session_id"]
    arg = json.dumps({"cursor": {"session_id": sid, "offset": 120_000}, "close": False})
    assert feed(book, "POST", url + "append_v2", [auth, ("Dropbox-API-Arg", arg)], data[120_000:200_000]).status == 200
    # raw UTF-8 in the header, and the last bytes carried by finish itself
    finish_arg = json.dumps({"cursor": {"session_id": sid, "offset": 200_000},
                             "commit": {"path": "/Bericht Über.docx", "mode": "overwrite"}}, ensure_ascii=False)
    g = feed(book, "POST", url + "finish", [auth, ("Dropbox-API-Arg", finish_arg)], data[200_000:])
    assert isinstance(g, GatheredUpload) and g.procedure == ecp.DROPBOX_SESSION
    resp = replay(g, send, SIZES)
    assert resp.status == 200, resp.body
    assert json.loads(resp.body)["path_display"] == "/Bericht Über.docx"
    assert held(providers, "dropbox", hashlib.sha256(data).hexdigest())


def test_dropbox_batch_replayed(providers, send):
    book, auth = SessionBook(), ("Authorization", "Bearer alice")
    files = {f"/batch/{i}.xlsx": office_bytes(150_000 + i, bytes([i])) for i in range(2)}
    entries = []
    for path, data in files.items():
        a = feed(book, "POST", "https://content.dropboxapi.com/2/files/upload_session/start",
                 [auth, ("Dropbox-API-Arg", '{"close": true}')], data)
        entries.append({"cursor": {"session_id": json.loads(a.body)["session_id"], "offset": len(data)},
                        "commit": {"path": path, "mode": "add"}})
    body = json.dumps({"entries": entries}).encode()
    g = feed(book, "POST", "https://api.dropboxapi.com/2/files/upload_session/finish_batch_v2",
             [auth, ("Content-Type", "application/json")], body)
    assert isinstance(g, GatheredUpload) and g.procedure == ecp.DROPBOX_BATCH and len(g.files) == 2
    resp = replay(g, send, SIZES)
    assert resp.status == 200
    assert [e[".tag"] for e in json.loads(resp.body)["entries"]] == ["success", "success"]
    for data in files.values():
        assert held(providers, "dropbox", hashlib.sha256(data).hexdigest())


def test_graph_session_replayed(providers, send):
    data = office_bytes(700_000, b"graph")
    book = SessionBook()
    a = feed(book, "POST", "https://graph.microsoft.com/v1.0/me/drive/root:/Docs/Plan.pptx:/createUploadSession",
             [("Authorization", "Bearer bob"), ("User-Agent", "app/1"), ("Content-Type", "application/json")],
             b'{"item": {"@microsoft.graph.conflictBehavior": "replace"}}')
    upload_url = json.loads(a.body)["uploadUrl"]
    unit = 327_680
    for start in range(0, len(data), unit * 2):
        piece = data[start:start + unit * 2]
        out = feed(book, "PUT", upload_url, [("Content-Range", f"bytes {start}-{start + len(piece) - 1}/{len(data)}")], piece)
    assert isinstance(out, GatheredUpload) and out.procedure == ecp.GRAPH_SESSION
    resp = replay(out, send, SIZES)
    assert resp.status == 201, resp.body
    assert json.loads(resp.body)["name"] == "Plan.pptx"
    assert held(providers, "graph", hashlib.sha256(data).hexdigest())
    # three fragments, none of them with a token
    frags = [e for e in providers.log() if e["route"] == "upload_fragment"]
    assert len(frags) == 3 and not any(e["authorization_present"] for e in frags)


def test_drive_resumable_replayed(providers, send):
    data = office_bytes(600_000, b"drive")
    book = SessionBook()
    a = feed(book, "POST", "https://www.googleapis.com/upload/drive/v3/files?uploadType=resumable&fields=id,name,md5Checksum",
             [("Authorization", "Bearer carol"), ("Content-Type", "application/json; charset=UTF-8"),
              ("X-Upload-Content-Type", "application/vnd.oasis.opendocument.text"), ("X-Upload-Content-Length", str(len(data)))],
             b'{"name": "notes.odt"}')
    location = dict(a.headers)["Location"]
    out = feed(book, "PUT", location, [("Authorization", "Bearer carol"), ("Content-Range", f"bytes 0-{len(data) - 1}/{len(data)}")], data)
    assert isinstance(out, GatheredUpload) and out.procedure == ecp.DRIVE_RESUMABLE
    resp = replay(out, send, SIZES)
    assert resp.status == 200, resp.body
    assert json.loads(resp.body)["md5Checksum"] == hashlib.md5(data).hexdigest()
    assert held(providers, "drive", hashlib.sha256(data).hexdigest())


def test_nextcloud_chunked_replayed(providers, send):
    data = office_bytes(5 * 1024 * 1024 + 1000, b"nc")
    book = SessionBook()
    auth = ("Authorization", "Basic " + __import__("base64").b64encode(b"dave:pw").decode())
    dest = ("Destination", "https://cloud.example.com/remote.php/dav/files/dave/Big.docx")
    folder = "https://cloud.example.com/remote.php/dav/uploads/dave/transfer-1"
    assert feed(book, "MKCOL", folder, [auth, dest], b"").status == 201
    half = len(data) // 2  # the app's own chunking need not be the replay's
    assert feed(book, "PUT", folder + "/00001", [auth, dest, ("OC-Total-Length", str(len(data)))], data[:half]).status == 201
    assert feed(book, "PUT", folder + "/00002", [auth, dest, ("OC-Total-Length", str(len(data)))], data[half:]).status == 201
    g = feed(book, "MOVE", folder + "/.file", [auth, dest, ("OC-Total-Length", str(len(data)))], b"")
    assert isinstance(g, GatheredUpload) and g.procedure == ecp.NEXTCLOUD_CHUNKED
    resp = replay(g, send, SIZES)
    assert resp.status == 201, resp.body
    assert held(providers, "webdav", hashlib.sha256(data).hexdigest())


def test_provider_error_stops_and_is_returned(providers, send):
    data = office_bytes(100, b"x")
    book = SessionBook()
    a = feed(book, "POST", "https://graph.microsoft.com/v1.0/me/drive/root:/a.docx:/createUploadSession",
             [("Authorization", "Bearer expired-token")], b"")
    g = feed(book, "PUT", json.loads(a.body)["uploadUrl"], [("Content-Range", "bytes 0-99/100")], data)
    resp = replay(g, send, SIZES)
    assert resp.status == 401 and json.loads(resp.body)["error"]["code"]
    assert not providers.files("graph")


def test_unexpected_status_is_a_protocol_error():
    book = SessionBook()
    a = feed(book, "POST", "https://www.googleapis.com/upload/drive/v3/files?uploadType=resumable",
             [("Authorization", "Bearer c")], b"")
    g = feed(book, "PUT", dict(a.headers)["Location"], [("Authorization", "Bearer c"), ("Content-Range", "bytes 0-2/3")], b"abc")

    def redirecting(method, url, headers, body):
        return 302, "Found", [("Location", "https://elsewhere.example/")], b""

    with pytest.raises(DirectProtocolError):
        replay(g, redirecting, SIZES)


def test_dropbox_session_with_per_call_hashes_replayed(providers, send):
    """The Dropbox SDK's finish carries the content_hash of its own body; the
    replay sends that finish with no body, so the hash is dropped (Dropbox
    would answer content_hash_mismatch), every other byte of the argument kept."""
    from ec_proxy.recognise.dropbox import content_hash

    data = office_bytes(150_000, b"dbx-sdk")
    book, auth = SessionBook(), ("Authorization", "Bearer sdk")
    url = "https://content.dropboxapi.com/2/files/upload_session/"
    a = feed(book, "POST", url + "start", [auth, ("Dropbox-API-Arg", json.dumps({"content_hash": content_hash(b"")}))], b"")
    sid = json.loads(a.body)["session_id"]
    finish_arg = json.dumps({"cursor": {"session_id": sid, "offset": 0}, "commit": {"path": "/sdk.docx", "mode": "overwrite"},
                             "content_hash": content_hash(data)})
    g = feed(book, "POST", url + "finish", [auth, ("Dropbox-API-Arg", finish_arg)], data)
    assert isinstance(g, GatheredUpload)
    resp = replay(g, send, SIZES)
    assert resp.status == 200, resp.body
    assert json.loads(resp.body)["content_hash"] == content_hash(data)
    assert held(providers, "dropbox", hashlib.sha256(data).hexdigest())
