"""Dropbox v2 routes, driven over TLS under the real host names."""

from __future__ import annotations

import hashlib
import json


from testbed.providers.hashes import dropbox_content_hash

CONTENT = "https://content.dropboxapi.com/2/files/"
API = "https://api.dropboxapi.com/2/files/"


def upload(client, path, data, token="alice", **arg):
    return client.request("POST", CONTENT + "upload", data=data, token=token, headers={
        "Dropbox-API-Arg": json.dumps({"path": path, **arg}),
        "Content-Type": "application/octet-stream",
    })


def download(client, path, token="alice"):
    return client.request("POST", CONTENT + "download", token=token, headers={"Dropbox-API-Arg": json.dumps({"path": path})})


def test_upload_then_download_round_trip(client):
    data = b"PK\x03\x04" + bytes(range(256)) * 100
    r = upload(client, "/Docs/Report.docx", data, mode="add")
    assert r.status == 200, r.text
    meta = r.json()
    assert meta["size"] == len(data)
    assert meta["content_hash"] == dropbox_content_hash(data)
    assert meta["path_display"] == "/Docs/Report.docx" and meta["path_lower"] == "/docs/report.docx"
    assert meta["id"].startswith("id:") and meta["rev"]
    for path in ("/docs/REPORT.docx", meta["id"], "rev:" + meta["rev"]):
        d = download(client, path)
        assert d.status == 200
        assert d.body == data
        assert json.loads(d.headers["Dropbox-API-Result"])["content_hash"] == meta["content_hash"]
    [stored] = client.files("dropbox")
    assert stored["sha256"] == hashlib.sha256(data).hexdigest()
    assert stored["account"] == "alice"
    assert stored["provider_hash"]["content_hash"] == meta["content_hash"]


def test_raw_utf8_in_api_arg(client):
    # aiohttp's client writes header values as UTF-8: raw UTF-8 on the wire, as Dropbox clients send.
    arg = json.dumps({"path": "/Dokumente/Übersicht – ü.xlsx", "mode": "add"}, ensure_ascii=False)
    r = client.request("POST", CONTENT + "upload", data=b"x", headers={"Dropbox-API-Arg": arg})
    assert r.status == 200, r.text
    d = download(client, "/dokumente/übersicht – ü.xlsx")
    assert d.status == 200 and d.body == b"x"
    # The result header is ASCII, non-ASCII escaped as JSON \u sequences.
    assert d.headers["Dropbox-API-Result"].isascii()
    assert json.loads(d.headers["Dropbox-API-Result"])["name"] == "Übersicht – ü.xlsx"


def test_write_modes_and_conflicts(client):
    first = upload(client, "/a.docx", b"one", mode="add").json()
    # add, different content: conflict in UploadError shape
    r = upload(client, "/a.docx", b"two", mode="add")
    assert r.status == 409
    body = r.json()
    assert body["error_summary"].startswith("path/conflict/file/")
    assert body["error"][".tag"] == "path"
    assert body["error"]["reason"] == {".tag": "conflict", "conflict": {".tag": "file"}}
    # add, same content: no conflict, no new revision
    same = upload(client, "/a.docx", b"one", mode="add").json()
    assert same["rev"] == first["rev"]
    # autorename
    renamed = upload(client, "/a.docx", b"two", mode="add", autorename=True).json()
    assert renamed["path_display"] == "/a (1).docx"
    # update with the right rev: new rev; with a stale rev: conflict
    updated = upload(client, "/a.docx", b"three", mode={".tag": "update", "update": first["rev"]}).json()
    assert updated["rev"] != first["rev"] and updated["id"] == first["id"]
    stale = upload(client, "/a.docx", b"four", mode={".tag": "update", "update": first["rev"]})
    assert stale.status == 409 and stale.json()["error_summary"].startswith("path/conflict/file/")
    # overwrite always wins; old revisions stay downloadable by rev
    assert upload(client, "/a.docx", b"five", mode="overwrite").status == 200
    assert download(client, "/a.docx").body == b"five"
    assert download(client, "rev:" + first["rev"]).body == b"one"
    # strict_conflict: identical content is a conflict for add
    strict = upload(client, "/a.docx", b"five", mode="add", strict_conflict=True)
    assert strict.status == 409


def test_content_hash_argument_is_checked(client):
    r = upload(client, "/h.bin", b"abc", content_hash="0" * 64)
    assert r.status == 409 and r.json()["error"][".tag"] == "content_hash_mismatch"
    ok = upload(client, "/h.bin", b"abc", content_hash=dropbox_content_hash(b"abc"))
    assert ok.status == 200


def start(client, data, close=False, token="alice"):
    return client.request("POST", CONTENT + "upload_session/start", data=data, token=token,
                          headers={"Dropbox-API-Arg": json.dumps({"close": close}), "Content-Type": "application/octet-stream"})


def append(client, sid, offset, data, close=False):
    return client.request("POST", CONTENT + "upload_session/append_v2", data=data, headers={
        "Dropbox-API-Arg": json.dumps({"cursor": {"session_id": sid, "offset": offset}, "close": close}),
        "Content-Type": "application/octet-stream"})


def test_upload_session_offsets_and_finish(client):
    data = bytes(range(256)) * 40000  # 10,240,000 bytes: crosses two 4 MiB blocks
    parts = [data[:4194304], data[4194304:8388608], data[8388608:]]
    sid = start(client, parts[0]).json()["session_id"]
    # wrong offset: incorrect_offset with the correct one
    bad = append(client, sid, 5, parts[1])
    assert bad.status == 409
    assert bad.json()["error"] == {".tag": "incorrect_offset", "correct_offset": 4194304}
    assert bad.json()["error_summary"].startswith("incorrect_offset/")
    assert append(client, sid, 4194304, parts[1]).status == 200
    assert append(client, sid, 8388608, parts[2], close=True).status == 200
    # appending to a closed session
    closed = append(client, sid, len(data), b"more")
    assert closed.status == 409 and closed.json()["error"][".tag"] == "closed"
    # finish with a wrong offset: lookup_failed/incorrect_offset
    wrong = client.request("POST", CONTENT + "upload_session/finish", headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid, "offset": 1}, "commit": {"path": "/big.xlsx", "mode": "add"}})})
    assert wrong.status == 409
    assert wrong.json()["error"] == {".tag": "lookup_failed", "lookup_failed": {".tag": "incorrect_offset", "correct_offset": len(data)}}
    fin = client.request("POST", CONTENT + "upload_session/finish", headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid, "offset": len(data)}, "commit": {"path": "/big.xlsx", "mode": "add"}})})
    assert fin.status == 200, fin.text
    assert fin.json()["content_hash"] == dropbox_content_hash(data)
    assert download(client, "/big.xlsx").body == data
    # the session is consumed
    again = client.request("POST", CONTENT + "upload_session/finish", headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid, "offset": len(data)}, "commit": {"path": "/big.xlsx", "mode": "add"}})})
    assert again.json()["error"] == {".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}}


def test_finish_conflict_uses_write_error_shape(client):
    upload(client, "/c.docx", b"old", mode="add")
    sid = start(client, b"new", close=True).json()["session_id"]
    r = client.request("POST", CONTENT + "upload_session/finish", headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid, "offset": 3}, "commit": {"path": "/c.docx", "mode": "add"}})})
    assert r.status == 409
    assert r.json()["error"] == {".tag": "path", "path": {".tag": "conflict", "conflict": {".tag": "file"}}}


def test_finish_batch_v2_per_entry_results(client):
    upload(client, "/taken.docx", b"x", mode="add")
    s1 = start(client, b"first file", close=True).json()["session_id"]
    s2 = start(client, b"second", close=True).json()["session_id"]
    s3 = start(client, b"not closed").json()["session_id"]
    body = {"entries": [
        {"cursor": {"session_id": s1, "offset": 10}, "commit": {"path": "/one.docx", "mode": "add"}},
        {"cursor": {"session_id": s2, "offset": 6}, "commit": {"path": "/taken.docx", "mode": "add"}},
        {"cursor": {"session_id": s3, "offset": 10}, "commit": {"path": "/three.docx", "mode": "add"}},
    ]}
    r = client.request("POST", API + "upload_session/finish_batch_v2", json_body=body)
    assert r.status == 200, r.text
    e = r.json()["entries"]
    assert e[0][".tag"] == "success" and e[0]["path_display"] == "/one.docx" and e[0]["size"] == 10
    assert e[1] == {".tag": "failure", "failure": {".tag": "path", "path": {".tag": "conflict", "conflict": {".tag": "file"}}}}
    assert e[2] == {".tag": "failure", "failure": {".tag": "lookup_failed", "lookup_failed": {".tag": "not_closed"}}}
    # batch is an api-host route: on the content host it does not exist
    assert client.request("POST", CONTENT + "upload_session/finish_batch_v2", json_body=body).status == 404


def test_accounts_are_separate_and_auth_errors(client):
    upload(client, "/mine.docx", b"alice's", token="alice", mode="add")
    assert download(client, "/mine.docx", token="bob").status == 409
    nf = download(client, "/mine.docx", token="bob").json()
    assert nf["error_summary"].startswith("path/not_found/")
    bad = upload(client, "/x", b"x", token="invalid-token")
    assert bad.status == 401 and bad.json()["error"][".tag"] == "invalid_access_token"
    none = client.request("POST", CONTENT + "upload", data=b"x", token=None, headers={"Dropbox-API-Arg": '{"path": "/x"}'})
    assert none.status == 400 and "Authorization" in none.text
    garbled = client.request("POST", CONTENT + "upload", data=b"x", headers={"Dropbox-API-Arg": "{nope"})
    assert garbled.status == 400 and "Dropbox-API-Arg" in garbled.text


def test_metadata_and_list_folder(client):
    upload(client, "/F/one.docx", b"1", mode="add")
    upload(client, "/F/sub/two.docx", b"22", mode="add")
    m = client.request("POST", API + "get_metadata", json_body={"path": "/f/ONE.docx"}).json()
    assert m[".tag"] == "file" and m["size"] == 1
    listing = client.request("POST", API + "list_folder", json_body={"path": "/F"}).json()
    tags = sorted((e[".tag"], e["name"]) for e in listing["entries"])
    assert tags == [("file", "one.docx"), ("folder", "sub")]
    d = client.request("POST", API + "delete_v2", json_body={"path": "/F/one.docx"})
    assert d.status == 200
    assert download(client, "/F/one.docx").status == 409


def test_chunked_transfer_encoding_upload(client):
    data = bytes(range(256)) * 5000
    r = client.request("POST", CONTENT + "upload", data=data, chunked=True,
                       headers={"Dropbox-API-Arg": json.dumps({"path": "/chunked.docx"}), "Content-Type": "application/octet-stream"})
    assert r.status == 200, r.text
    [entry] = client.log()
    assert entry["headers"].get("Transfer-Encoding") == "chunked" and "Content-Length" not in entry["headers"]
    assert entry["body_size"] == len(data)
    assert download(client, "/chunked.docx").body == data


def test_content_hash_is_per_call_on_session_routes(client):
    """UploadSession{Start,Append,Finish}Arg.content_hash: "a hash of the file
    content uploaded in this call". The Dropbox Python SDK 12.x sends one on
    every call by default, so a finish with the last bytes (or none) carries
    the hash of those bytes, not of the session (issue 11)."""
    parts = [b"PK\x03\x04" + b"a" * 5000, b"b" * 3000, b"tail bytes"]
    ch = dropbox_content_hash
    r = client.request("POST", CONTENT + "upload_session/start", data=parts[0], token="alice", headers={
        "Dropbox-API-Arg": json.dumps({"close": False, "content_hash": ch(parts[0])}), "Content-Type": "application/octet-stream"})
    assert r.status == 200, r.text
    sid = r.json()["session_id"]
    bad = client.request("POST", CONTENT + "upload_session/append_v2", data=parts[1], headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid, "offset": len(parts[0])}, "content_hash": ch(parts[0] + parts[1])}),
        "Content-Type": "application/octet-stream"})
    assert bad.status == 409 and bad.json()["error"][".tag"] == "content_hash_mismatch"
    ok = client.request("POST", CONTENT + "upload_session/append_v2", data=parts[1], headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid, "offset": len(parts[0])}, "content_hash": ch(parts[1])}),
        "Content-Type": "application/octet-stream"})
    assert ok.status == 200, ok.text
    whole = b"".join(parts)
    finish = lambda h: client.request("POST", CONTENT + "upload_session/finish", data=parts[2], headers={  # noqa: E731
        "Dropbox-API-Arg": json.dumps({"cursor": {"session_id": sid, "offset": len(parts[0]) + len(parts[1])},
                                       "commit": {"path": "/s.docx", "mode": "add"}, "content_hash": h}),
        "Content-Type": "application/octet-stream"})
    wrong = finish(ch(whole))  # the whole file's hash is not this call's
    assert wrong.status == 409 and wrong.json()["error"][".tag"] == "content_hash_mismatch", wrong.text
    fin = finish(ch(parts[2]))
    assert fin.status == 200, fin.text
    assert fin.json()["content_hash"] == ch(whole)
    # a finish without bytes: the hash of the empty body
    sid2 = start(client, whole, close=True).json()["session_id"]
    empty = client.request("POST", CONTENT + "upload_session/finish", headers={"Dropbox-API-Arg": json.dumps(
        {"cursor": {"session_id": sid2, "offset": len(whole)}, "commit": {"path": "/e.docx"}, "content_hash": ch(b"")})})
    assert empty.status == 200, empty.text
    assert empty.json()["content_hash"] == ch(whole)


def test_download_honours_range(client):
    data = bytes(range(256)) * 10
    assert upload(client, "/r.bin", data).status == 200

    def ranged(spec):
        return client.request("POST", CONTENT + "download", token="alice",
                              headers={"Dropbox-API-Arg": json.dumps({"path": "/r.bin"}), "Range": spec})

    r = ranged("bytes=0-0")
    assert r.status == 206 and r.body == data[:1] and r.headers["Content-Range"] == f"bytes 0-0/{len(data)}"
    assert json.loads(r.headers["Dropbox-API-Result"])["size"] == len(data)
    r = ranged("bytes=100-")
    assert r.status == 206 and r.body == data[100:]
    r = ranged("bytes=-10")
    assert r.status == 206 and r.body == data[-10:]
    r = ranged("bytes=5-99999")
    assert r.status == 206 and r.body == data[5:]
    r = ranged(f"bytes={len(data)}-")
    assert r.status == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"
    assert download(client, "/r.bin").body == data
