"""Microsoft Graph / OneDrive routes over TLS under the real host names."""

from __future__ import annotations

import hashlib

from testbed.providers.hashes import quickxor_base64

G = "https://graph.microsoft.com/v1.0/me/drive"
UNIT = 320 * 1024


def put_fragment(client, url, data, start, total, **headers):
    end = start + len(data) - 1
    return client.request("PUT", url, data=data, token=None,
                          headers={"Content-Range": f"bytes {start}-{end}/{total}", **headers})


def test_simple_upload_download_by_redirect(client):
    data = bytes(range(256)) * 1000
    r = client.request("PUT", G + "/root:/Docs/Plan%20A.docx:/content", data=data)
    assert r.status == 201, r.text
    item = r.json()
    assert item["name"] == "Plan A.docx" and item["size"] == len(data)
    assert item["file"]["hashes"]["quickXorHash"] == quickxor_base64(data)
    assert item["eTag"] and item["cTag"] and item["parentReference"]["path"] == "/drive/root:/Docs"
    again = client.request("PUT", G + f"/items/{item['id']}/content", data=b"v2")
    assert again.status == 200 and again.json()["eTag"] != item["eTag"]
    # GET content: 302 to a pre-authenticated URL on *.files.1drv.com; no token needed there
    redirect = client.request("GET", G + "/root:/docs/plan a.docx:/content")
    assert redirect.status == 302
    location = redirect.headers["Location"]
    assert location.startswith("https://") and ".files.1drv.com/" in location
    body = client.request("GET", location, token=None)
    assert body.status == 200 and body.body == b"v2"
    [stored] = client.files("graph")
    assert stored["provider_hash"]["quickXorHash"] == quickxor_base64(b"v2")


def test_conflict_behavior_and_if_match(client):
    first = client.request("PUT", G + "/root:/a.xlsx:/content", data=b"one").json()
    fail = client.request("PUT", G + "/root:/a.xlsx:/content?@microsoft.graph.conflictBehavior=fail", data=b"two")
    assert fail.status == 409
    assert fail.json()["error"]["code"] == "nameAlreadyExists"
    renamed = client.request("PUT", G + "/root:/a.xlsx:/content?@microsoft.graph.conflictBehavior=rename", data=b"two")
    assert renamed.status == 201 and renamed.json()["name"] == "a 1.xlsx"
    stale = client.request("PUT", G + "/root:/a.xlsx:/content", data=b"three", headers={"If-Match": '"wrong"'})
    assert stale.status == 412 and stale.json()["error"]["code"] == "resourceModified"
    ok = client.request("PUT", G + "/root:/a.xlsx:/content", data=b"three", headers={"If-Match": first["eTag"]})
    assert ok.status == 200


def test_upload_session_rules(client):
    data = hashlib.sha512(b"x").digest() * (3 * UNIT // 64 + 100)  # 3 units + 6400 bytes
    total = len(data)
    s = client.request("POST", G + "/root:/big.docx:/createUploadSession",
                       json_body={"item": {"@microsoft.graph.conflictBehavior": "replace"}})
    assert s.status == 200, s.text
    session = s.json()
    url = session["uploadUrl"]
    assert url.startswith("https://api.onedrive.com/") and session["nextExpectedRanges"] == ["0-"]
    # The uploadUrl is pre-authenticated: a token there is refused with 401.
    with_auth = client.request("PUT", url, data=data[:UNIT], token="alice",
                               headers={"Content-Range": f"bytes 0-{UNIT - 1}/{total}"})
    assert with_auth.status == 401
    # Not a multiple of 320 KiB (and not the last fragment): refused.
    odd = put_fragment(client, url, data[:UNIT + 1], 0, total)
    assert odd.status == 400 and odd.json()["error"]["code"] == "invalidRequest"
    first = put_fragment(client, url, data[:2 * UNIT], 0, total)
    assert first.status == 202
    assert first.json()["nextExpectedRanges"] == [f"{2 * UNIT}-{total - 1}"]
    # A gap is refused with 416.
    gap = put_fragment(client, url, data[3 * UNIT:], 3 * UNIT, total)
    assert gap.status == 416 and gap.json()["error"]["code"] == "invalidRange"
    status = client.request("GET", url, token=None).json()
    assert status["nextExpectedRanges"] == [f"{2 * UNIT}-{total - 1}"]
    last = put_fragment(client, url, data[2 * UNIT:], 2 * UNIT, total)
    assert last.status == 201, last.text
    item = last.json()
    assert item["size"] == total and item["file"]["hashes"]["quickXorHash"] == quickxor_base64(data)
    # the session is gone once complete
    assert put_fragment(client, url, b"x", 0, 1).status == 404
    # a second session on the same path replaces: 200
    s2 = client.request("POST", G + "/root:/big.docx:/createUploadSession").json()
    assert put_fragment(client, s2["uploadUrl"], b"small", 0, 5).status == 200
    [stored] = client.files("graph")
    assert stored["sha256"] == hashlib.sha256(b"small").hexdigest() and stored["version"] == 2


def test_upload_session_conflict_fail_and_cancel(client):
    client.request("PUT", G + "/root:/taken.docx:/content", data=b"x")
    r = client.request("POST", G + "/root:/taken.docx:/createUploadSession",
                       json_body={"item": {"@microsoft.graph.conflictBehavior": "fail"}})
    assert r.status == 409 and r.json()["error"]["code"] == "nameAlreadyExists"
    s = client.request("POST", G + "/root:/new.docx:/createUploadSession").json()
    assert client.request("DELETE", s["uploadUrl"], token=None).status == 204
    assert client.request("GET", s["uploadUrl"], token=None).status == 404


def test_auth_and_not_found_errors(client):
    r = client.request("GET", G + "/root:/nope.docx:/content")
    assert r.status == 404 and r.json()["error"]["code"] == "itemNotFound"
    r = client.request("PUT", G + "/root:/x.docx:/content", data=b"x", token=None)
    assert r.status == 401 and r.json()["error"]["code"] == "InvalidAuthenticationToken"
    # other accounts do not see alice's files
    client.request("PUT", G + "/root:/mine.docx:/content", data=b"x")
    assert client.request("GET", G + "/root:/mine.docx:/content", token="bob").status == 404


def test_graph_sdk_addressing_forms(client):
    """The Graph SDK's spellings (issue 11: 404 and 400 here before): an item
    id `root:/path:` percent-encoded in `items/{id}`, and a base URL ending in
    a slash (`/v1.0//me/drive`), address the same item as `root:/path:`."""
    data = b"PK\x03\x04 sdk" * 100
    r = client.request("PUT", "https://graph.microsoft.com/v1.0/me/drive/items/root%3A%2FSDK%2FA.docx%3A/content", data=data)
    assert r.status == 201, r.text
    item = r.json()
    assert item["name"] == "A.docx" and item["parentReference"]["path"].endswith("root:/SDK")
    again = client.request("PUT", "https://graph.microsoft.com/v1.0//me/drive/root:/SDK/A.docx:/content", data=data + b"2")
    assert again.status == 200 and again.json()["id"] == item["id"], again.text
    got = client.request("GET", f"https://graph.microsoft.com/v1.0//me/drive/items/{item['id']}")
    assert got.status == 200 and got.json()["size"] == len(data) + 1
    s = client.request("POST", "https://graph.microsoft.com/v1.0/me/drive/items/root%3a%2fSDK%2fB.docx%3a/createUploadSession",
                       json_body={"item": {"@microsoft.graph.conflictBehavior": "replace"}})
    assert s.status == 200 and "uploadUrl" in s.json(), s.text
