"""WebDAV / Nextcloud routes (plain WebDAV and chunking v2) under the configured host name."""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET

from testbed.providers.hashes import oc_checksum

HOST = "https://cloud.example.com"
FILES = HOST + "/remote.php/dav/files/alice"
BASIC = {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()}
MIB = 1024 * 1024


def dav(client, method, url, data=None, **headers):
    return client.request(method, url, data=data, headers={**BASIC, **headers})


def exception_of(resp) -> str:
    root = ET.fromstring(resp.body)
    assert root.tag == "{DAV:}error"
    return root.find("{http://sabredav.org/ns}exception").text


def test_put_get_propfind(client):
    data = b"PK\x03\x04 docx bytes" * 100
    assert dav(client, "MKCOL", FILES + "/Docs").status == 201
    r = dav(client, "PUT", FILES + "/Docs/Plan%20B.docx", data, **{"OC-Checksum": str(oc_checksum("SHA1", data)), "X-OC-MTime": "1700000000"})
    assert r.status == 201
    etag, fileid = r.headers["ETag"], r.headers["OC-FileId"]
    assert r.headers["OC-ETag"] == etag and r.headers["X-OC-MTime"] == "accepted"
    got = dav(client, "GET", FILES + "/Docs/Plan%20B.docx")
    assert got.status == 200 and got.body == data
    assert got.headers["ETag"] == etag and got.headers["OC-Checksum"] == str(oc_checksum("SHA1", data))
    over = dav(client, "PUT", FILES + "/Docs/Plan%20B.docx", b"v2")
    assert over.status == 204 and over.headers["ETag"] != etag and over.headers["OC-FileId"] == fileid
    pf = dav(client, "PROPFIND", FILES + "/Docs", Depth="1")
    assert pf.status == 207
    root = ET.fromstring(pf.body)
    hrefs = [e.text for e in root.iter("{DAV:}href")]
    assert hrefs == ["/remote.php/dav/files/alice/Docs/", "/remote.php/dav/files/alice/Docs/Plan%20B.docx"]
    sizes = [e.text for e in root.iter("{DAV:}getcontentlength")]
    assert sizes == ["2"]
    # legacy root serves the same files
    assert dav(client, "GET", HOST + "/remote.php/webdav/Docs/Plan%20B.docx").body == b"v2"


def test_errors_preconditions_and_checksum(client):
    r = dav(client, "PUT", FILES + "/missing/dir/a.docx", b"x")
    assert r.status == 409 and exception_of(r) == "Sabre\\DAV\\Exception\\Conflict"
    r = dav(client, "GET", FILES + "/nope.docx")
    assert r.status == 404 and exception_of(r) == "Sabre\\DAV\\Exception\\NotFound"
    put = dav(client, "PUT", FILES + "/a.docx", b"one")
    stale = dav(client, "PUT", FILES + "/a.docx", b"two", **{"If-Match": '"0000"'})
    assert stale.status == 412 and exception_of(stale) == "Sabre\\DAV\\Exception\\PreconditionFailed"
    ok = dav(client, "PUT", FILES + "/a.docx", b"two", **{"If-Match": put.headers["ETag"]})
    assert ok.status == 204
    exists = dav(client, "PUT", FILES + "/a.docx", b"three", **{"If-None-Match": "*"})
    assert exists.status == 412
    bad_sum = dav(client, "PUT", FILES + "/b.docx", b"data", **{"OC-Checksum": "MD5:" + "0" * 32})
    assert bad_sum.status == 400 and exception_of(bad_sum) == "Sabre\\DAV\\Exception\\BadRequest"
    assert dav(client, "GET", FILES + "/b.docx").status == 404  # nothing stored
    noauth = client.request("GET", FILES + "/a.docx", token=None)
    assert noauth.status == 401 and "WWW-Authenticate" in noauth.headers
    other = client.request("GET", HOST + "/remote.php/dav/files/bob/a.docx", headers=BASIC)
    assert other.status == 403


def test_move_and_delete(client):
    dav(client, "PUT", FILES + "/a.docx", b"x")
    mv = dav(client, "MOVE", FILES + "/a.docx", Destination=FILES + "/b.docx")
    assert mv.status == 201
    assert dav(client, "GET", FILES + "/b.docx").body == b"x"
    assert dav(client, "DELETE", FILES + "/b.docx").status == 204
    assert dav(client, "GET", FILES + "/b.docx").status == 404


def chunked_upload(client, transfer, dest, chunks, total=None, order=None):
    up = HOST + f"/remote.php/dav/uploads/alice/{transfer}"
    total = sum(len(c) for c in chunks) if total is None else total
    assert dav(client, "MKCOL", up, Destination=dest).status == 201
    for n in order or range(1, len(chunks) + 1):
        r = dav(client, "PUT", f"{up}/{n:05d}", chunks[n - 1], Destination=dest, **{"OC-Total-Length": str(total)})
        assert r.status == 201, r.text
    return dav(client, "MOVE", up + "/.file", Destination=dest, **{"OC-Total-Length": str(total)})


def test_chunking_v2_assembles_in_name_order(client):
    data = hashlib.sha512(b"c").digest() * (11 * MIB // 64 + 7)
    chunks = [data[:5 * MIB], data[5 * MIB:10 * MIB], data[10 * MIB:]]
    dav(client, "MKCOL", FILES + "/Up")
    # chunks sent out of order are still assembled by number
    r = chunked_upload(client, "web-file-upload-1", FILES + "/Up/big.pptx", chunks, order=[2, 3, 1])
    assert r.status == 201, r.text
    assert r.headers["OC-ETag"] and r.headers["OC-FileId"] and r.headers["ETag"]
    assert dav(client, "GET", FILES + "/Up/big.pptx").body == data
    [stored] = client.files("webdav")
    assert stored["sha256"] == hashlib.sha256(data).hexdigest()
    # overwrite through another transfer: 204
    r2 = chunked_upload(client, "web-file-upload-2", FILES + "/Up/big.pptx", [b"tiny"])
    assert r2.status == 204


def test_chunking_v2_rules(client):
    dest = FILES + "/c.docx"
    # total mismatch
    r = chunked_upload(client, "t1", dest, [b"a" * 10], total=11)
    assert r.status == 400 and "do not sum up" in r.text
    # a small chunk that is not the last
    r = chunked_upload(client, "t2", dest, [b"a" * 10, b"b" * 10])
    assert r.status == 400 and "smaller than" in r.text
    # chunk names must be numbers 1..10000; Destination is required in v2
    up = HOST + "/remote.php/dav/uploads/alice/t3"
    dav(client, "MKCOL", up, Destination=dest)
    assert dav(client, "PUT", up + "/abc", b"x", Destination=dest).status == 400
    assert dav(client, "PUT", up + "/00001", b"x").status == 400
    assert dav(client, "DELETE", up).status == 204
    assert dav(client, "PUT", up + "/00001", b"x", Destination=dest).status == 404
    assert dav(client, "GET", dest).status == 404  # nothing was ever stored


def test_ocs_capabilities_and_user(client):
    """What nextcloudcmd asks right after status.php (issue 11: without it,
    `Error connecting to server`): OCS v1 / v2, JSON or XML, 401 without credentials."""
    r = client.request("GET", "https://cloud.example.com/ocs/v1.php/cloud/capabilities?format=json", token=None,
                       headers={**BASIC, "OCS-APIRequest": "true"})
    assert r.status == 200, r.text
    ocs = r.json()["ocs"]
    assert ocs["meta"]["statuscode"] == 100
    caps = ocs["data"]["capabilities"]
    assert caps["core"]["webdav-root"] == "remote.php/webdav" and caps["dav"]["chunking"] == "1.0"
    assert "SHA1" in caps["checksums"]["supportedTypes"] and "bulkupload" not in caps["dav"]
    v2 = client.request("GET", "https://cloud.example.com/ocs/v2.php/cloud/user?format=json", token=None, headers=BASIC)
    assert v2.status == 200 and v2.json()["ocs"]["meta"]["statuscode"] == 200 and v2.json()["ocs"]["data"]["id"] == "alice"
    xml = client.request("GET", "https://cloud.example.com/ocs/v1.php/cloud/capabilities", token=None, headers=BASIC)
    assert xml.status == 200 and b"<statuscode>100</statuscode>" in xml.body and b"<webdav-root>remote.php/webdav</webdav-root>" in xml.body
    anon = client.request("GET", "https://cloud.example.com/ocs/v1.php/cloud/capabilities?format=json", token=None)
    assert anon.status == 401
