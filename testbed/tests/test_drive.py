"""Google Drive v3 routes over TLS under the real host name."""

from __future__ import annotations

import hashlib
import json

U = "https://www.googleapis.com/upload/drive/v3/files"
D = "https://www.googleapis.com/drive/v3/files"
KIB256 = 256 * 1024


def test_media_create_update_and_download(client):
    r = client.request("POST", U + "?uploadType=media", data=b"hello", headers={"Content-Type": "text/plain"})
    assert r.status == 200, r.text
    created = r.json()
    assert set(created) == {"kind", "id", "name", "mimeType"}  # the default field set
    fid = created["id"]
    r = client.request("PATCH", f"{U}/{fid}?uploadType=media&fields=id,md5Checksum,size,version,headRevisionId", data=b"hello world")
    meta = r.json()
    assert meta["md5Checksum"] == hashlib.md5(b"hello world").hexdigest()
    assert meta["size"] == "11" and meta["version"] == "2"
    got = client.request("GET", f"{D}/{fid}?alt=media")
    assert got.status == 200 and got.body == b"hello world"
    full = client.request("GET", f"{D}/{fid}?fields=*").json()
    assert full["headRevisionId"] == meta["headRevisionId"]
    missing = client.request("GET", f"{D}/nope?alt=media")
    assert missing.status == 404
    err = missing.json()["error"]
    assert err["code"] == 404 and err["errors"][0]["reason"] == "notFound"


def test_multipart_is_split_byte_exact(client):
    media = b"PK\x03\x04\r\n--not-a-boundary\r\n\x00\xff" * 100
    boundary = "tb_boundary_123"
    body = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode()
        + json.dumps({"name": "Budget.xlsx", "parents": ["folder1"]}).encode()
        + f"\r\n--{boundary}\r\nContent-Type: application/vnd.openxmlformats-officedocument.spreadsheetml.sheet\r\n\r\n".encode()
        + media
        + f"\r\n--{boundary}--\r\n".encode()
    )
    r = client.request("POST", U + "?uploadType=multipart&fields=id,name,md5Checksum,parents,mimeType", data=body,
                       headers={"Content-Type": f"multipart/related; boundary={boundary}"})
    assert r.status == 200, r.text
    meta = r.json()
    assert meta["name"] == "Budget.xlsx" and meta["parents"] == ["folder1"]
    assert meta["md5Checksum"] == hashlib.md5(media).hexdigest()
    assert meta["mimeType"].endswith("spreadsheetml.sheet")
    assert client.request("GET", f"{D}/{meta['id']}?alt=media").body == media


def test_resumable_create_and_update(client):
    data = hashlib.sha256(b"d").digest() * (KIB256 * 2 // 32 + 10)
    total = len(data)
    init = client.request("POST", U + "?uploadType=resumable&fields=id,md5Checksum,size,version", json_body={"name": "r.docx"},
                          headers={"X-Upload-Content-Type": "application/octet-stream", "X-Upload-Content-Length": str(total)})
    assert init.status == 200
    loc = init.headers["Location"]
    assert loc.startswith("https://www.googleapis.com/upload/drive/v3/files?") and "upload_id=" in loc
    # status before any byte: 308 without Range
    st = client.request("PUT", loc, data=b"", headers={"Content-Range": f"bytes */{total}"})
    assert st.status == 308 and "Range" not in st.headers
    # chunk not a multiple of 256 KiB: refused
    bad = client.request("PUT", loc, data=data[:1000], headers={"Content-Range": f"bytes 0-999/{total}"})
    assert bad.status == 400 and bad.json()["error"]["errors"][0]["reason"] == "badRequest"
    c1 = client.request("PUT", loc, data=data[:KIB256], headers={"Content-Range": f"bytes 0-{KIB256 - 1}/{total}"})
    assert c1.status == 308 and c1.headers["Range"] == f"bytes=0-{KIB256 - 1}"
    c2 = client.request("PUT", loc, data=data[KIB256:], headers={"Content-Range": f"bytes {KIB256}-{total - 1}/{total}"})
    assert c2.status == 200, c2.text
    meta = c2.json()
    assert meta["md5Checksum"] == hashlib.md5(data).hexdigest() and meta["size"] == str(total)
    # resumable update of the same file
    upd = client.request("PATCH", f"{U}/{meta['id']}?uploadType=resumable&fields=id,version,md5Checksum", data=b"")
    loc2 = upd.headers["Location"]
    assert f"/files/{meta['id']}?" in loc2
    done = client.request("PUT", loc2, data=b"new", headers={"Content-Range": "bytes 0-2/3"})
    assert done.status == 200 and done.json()["version"] == "2"
    assert done.json()["md5Checksum"] == hashlib.md5(b"new").hexdigest()


def test_a_status_query_after_the_upload_completed_gets_the_file_again(client):
    """Google answers `Content-Range: bytes */N` on a session whose upload
    completed with 200 and the file resource (manage-uploads, "Resume an
    interrupted upload": an app whose final answer was lost asks so, and a
    404 would make it upload the file again). A chunk sent to the used-up
    session is still 404 notFound, and nothing is written twice."""
    data = b"x" * 1000
    init = client.request("POST", U + "?uploadType=resumable&fields=id,md5Checksum,size,version", json_body={"name": "s.docx"},
                          headers={"X-Upload-Content-Length": str(len(data))})
    loc = init.headers["Location"]
    done = client.request("PUT", loc, data=data, headers={"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"})
    assert done.status == 200, done.text
    for _ in range(2):
        st = client.request("PUT", loc, data=b"", headers={"Content-Range": f"bytes */{len(data)}"})
        assert st.status == 200, st.text
        assert st.json() == done.json()
    assert done.json()["version"] == "1"
    again = client.request("PUT", loc, data=data, headers={"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"})
    assert again.status == 404 and again.json()["error"]["errors"][0]["reason"] == "notFound"
    assert client.request("GET", f"{D}/{done.json()['id']}?fields=version").json()["version"] == "1"


def test_auth_error_shape(client):
    r = client.request("POST", U + "?uploadType=media", data=b"x", token="expired-1")
    assert r.status == 401
    err = r.json()["error"]
    assert err["code"] == 401 and err["errors"][0]["reason"] == "authError" and err["status"] == "UNAUTHENTICATED"


def test_multipart_as_googles_python_client_writes_it(client):
    """google-api-python-client builds the body with Python's `email`
    generator: LF line endings, and the media part's Content-Type folded onto
    a continuation line (issue 11: the testbed answered 400)."""
    media = b"PK\x03\x04 data\r\nwith CRLF\nand LF\r" * 50
    body = (b'--===============7==\nContent-Type: application/json\nMIME-Version: 1.0\n\n{"name": "Report.docx"}\n'
            b"--===============7==\nContent-Type: \n application/vnd.openxmlformats-officedocument.wordprocessingml.document\n"
            b"MIME-Version: 1.0\nContent-Transfer-Encoding: binary\n\n" + media + b"\n--===============7==--\n")
    r = client.request("POST", U + "?uploadType=multipart&fields=id,name,md5Checksum,mimeType", data=body,
                       headers={"Content-Type": 'multipart/related; boundary="===============7=="'})
    assert r.status == 200, r.text
    meta = r.json()
    assert meta["name"] == "Report.docx" and meta["md5Checksum"] == hashlib.md5(media).hexdigest()
    assert meta["mimeType"] == "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    assert client.request("GET", f"{D}/{meta['id']}?alt=media").body == media
