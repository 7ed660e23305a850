"""ec_proxy.recognise with real request bytes: the shapes of spec §6, of the
provider test servers, of rclone 1.60 and of the providers' mobile apps."""

from __future__ import annotations

import base64
import hashlib

from mitmproxy.net.http.http1 import read

import ec_protocol as ecp
from ec_proxy.recognise import Kind, is_office_content, is_office_name, recognise

PK = b"PK\x03\x04" + b"\x14\x00" * 20
TOKEN = "sl.AbCdEf-123"
TOK = b"tok:" + hashlib.sha256(TOKEN.encode()).hexdigest()[:12].encode()


def dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        line_end = data.index(b"\r\n", i)
        size = int(data[i:line_end].split(b";")[0], 16)
        i = line_end + 2
        if size == 0:
            return bytes(out)
        out += data[i : i + size]
        i += size + 2


def parse(raw: bytes):
    """Raw HTTP/1.1 bytes -> what the addon passes: head read by mitmproxy's
    own reader (values str with surrogateescape), chunked framing removed."""
    head, _, body = raw.partition(b"\r\n\r\n")
    req = read.read_request_head([line + b"\r\n" for line in head.split(b"\r\n")])
    if req.headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = dechunk(body)
    headers = [(n, v) for n, v in req.headers.items(multi=True) if n.lower() != "host"]
    return req.method, f"https://{req.headers['Host']}{req.path}", headers, body


def rec(raw: bytes, **kw):
    return recognise(*parse(raw), **kw)


# -- Dropbox -------------------------------------------------------------------


def test_dropbox_mobile_upload_with_raw_utf8_arg():
    r = rec(b"POST /2/files/upload HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer " + TOKEN.encode()
            + b"\r\nDropbox-API-Arg: {\"path\": \"/Docs/B\xc3\xa9rich\xc3\xa9.DOCX\", \"mode\": \"overwrite\"}\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Length: 42\r\n\r\n" + PK)
    assert r.kind is Kind.UPLOAD_SINGLE and r.provider == ecp.DROPBOX
    assert r.doc == ecp.DocKey(ecp.DROPBOX, TOK, "/docs/bériché.docx".encode())
    assert r.name == "/Docs/Bériché.DOCX" and r.office and r.file == PK


def test_dropbox_query_string_arg_and_authorization_and_chunked_body():
    arg = "%7B%22path%22%3A%22%2Fa%2Freport.xlsx%22%7D"
    raw = (b"POST /2/files/upload?arg=" + arg.encode() + b"&authorization=Bearer%20" + TOKEN.encode()
           + b" HTTP/1.1\r\nHost: content.dropboxapi.com\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"a\r\n" + PK[:10] + b"\r\n" + f"{len(PK) - 10:x}".encode() + b"\r\n" + PK[10:] + b"\r\n0\r\n\r\n")
    r = rec(raw)
    assert r.kind is Kind.UPLOAD_SINGLE
    assert r.doc == ecp.DocKey(ecp.DROPBOX, TOK, b"/a/report.xlsx")
    assert r.file == PK


def test_dropbox_select_user_and_path_root_name_the_account():
    r = rec(b"POST /2/files/upload HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer x\r\n"
            b"Dropbox-API-Select-User: dbmid:AAH4\r\nDropbox-API-Arg: {\"path\": \"/a.odt\"}\r\n\r\n" + PK)
    assert r.doc.account == b"user:dbmid:AAH4"
    r2 = rec(b"POST /2/files/upload HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer x\r\n"
             b"Dropbox-API-Select-User: dbmid:AAH4\r\nDropbox-API-Path-Root: {\".tag\": \"root\", \"root\": \"123\"}\r\n"
             b"Dropbox-API-Arg: {\"path\": \"/a.odt\"}\r\n\r\n" + PK)
    assert r2.doc.account.startswith(b"user:dbmid:AAH4|root:") and r2.doc != r.doc


def test_dropbox_id_paths_keep_their_case():
    r = rec(b"POST /2/files/upload HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer x\r\n"
            b"Dropbox-API-Arg: {\"path\": \"id:AbC\"}\r\n\r\n" + PK)
    assert r.doc.ref == b"id:AbC" and r.office  # no name: the content decides


def test_dropbox_session_steps():
    base = b"Host: content.dropboxapi.com\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
    start = rec(b"POST /2/files/upload_session/start HTTP/1.1\r\n" + base + b"Dropbox-API-Arg: {\"close\": false}\r\n\r\nabc")
    assert start.kind is Kind.SESSION_START and start.account == TOK and start.close is False and start.session is None
    app = rec(b"POST /2/files/upload_session/append_v2 HTTP/1.1\r\n" + base
              + b"Dropbox-API-Arg: {\"cursor\": {\"session_id\": \"S1\", \"offset\": 3}, \"close\": true}\r\n\r\ndef")
    assert (app.kind, app.session, app.offset, app.close) == (Kind.SESSION_APPEND, "S1", 3, True)
    v1 = rec(b"POST /2/files/upload_session/append HTTP/1.1\r\n" + base
             + b"Dropbox-API-Arg: {\"session_id\": \"S1\", \"offset\": 6}\r\n\r\ng")
    assert (v1.kind, v1.session, v1.offset) == (Kind.SESSION_APPEND, "S1", 6)
    fin = rec(b"POST /2/files/upload_session/finish HTTP/1.1\r\n" + base
              + b"Dropbox-API-Arg: {\"cursor\": {\"session_id\": \"S1\", \"offset\": 7}, \"commit\": {\"path\": \"/X/Y.PPTX\"}}\r\n\r\n")
    assert (fin.kind, fin.session, fin.offset) == (Kind.SESSION_FINISH, "S1", 7)
    assert fin.doc == ecp.DocKey(ecp.DROPBOX, TOK, b"/x/y.pptx")


def test_dropbox_batch_download_and_others():
    body = b'{"entries": [{"cursor": {"session_id": "S1", "offset": 7}, "commit": {"path": "/a.docx"}}]}'
    b = rec(b"POST /2/files/upload_session/finish_batch_v2 HTTP/1.1\r\nHost: api.dropboxapi.com\r\nAuthorization: Bearer x\r\n"
            b"Content-Type: application/json\r\n\r\n" + body)
    assert b.kind is Kind.BATCH_FINISH and b.args["entries"][0]["cursor"]["session_id"] == "S1"
    d = rec(b"POST /2/files/download HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer x\r\n"
            b"Dropbox-API-Arg: {\"path\": \"/A.docx\"}\r\n\r\n")
    assert d.kind is Kind.DOWNLOAD and d.doc.ref == b"/a.docx" and d.download.metadata_header == "Dropbox-API-Result"
    meta = rec(b"POST /2/files/get_metadata HTTP/1.1\r\nHost: api.dropboxapi.com\r\nAuthorization: Bearer x\r\n\r\n{}")
    assert meta.kind is Kind.OTHER
    bad = rec(b"POST /2/files/upload HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer x\r\n"
              b"Dropbox-API-Arg: {not json\r\n\r\nabc")
    assert bad.kind is Kind.OTHER and bad.note
    noauth = rec(b"POST /2/files/upload HTTP/1.1\r\nHost: content.dropboxapi.com\r\nDropbox-API-Arg: {\"path\": \"/a.docx\"}\r\n\r\nx")
    assert noauth.kind is Kind.OTHER


# -- Graph ---------------------------------------------------------------------


def test_onedrive_mobile_simple_put():
    r = rec(b"PUT /v1.0/me/drive/root:/Documents/Budget%202024.XLSX:/content?@microsoft.graph.conflictBehavior=replace HTTP/1.1\r\n"
            b"Host: graph.microsoft.com\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\nContent-Type: application/octet-stream\r\n\r\n" + PK)
    assert r.kind is Kind.UPLOAD_SINGLE and r.provider == ecp.GRAPH
    assert r.doc == ecp.DocKey(ecp.GRAPH, TOK, b"root:/documents/budget 2024.xlsx:")
    assert r.name == "Budget 2024.XLSX" and r.file == PK


def test_rclone_onedrive_shapes():
    # rclone addresses the drive by id, parent by item id for uploads
    r = rec(b"PUT /v1.0/drives/b!XyZ/items/01ABC:/notes.odt:/content HTTP/1.1\r\nHost: graph.microsoft.com\r\n"
            b"Authorization: Bearer t\r\n\r\n" + PK)
    assert r.doc == ecp.DocKey(ecp.GRAPH, b"drive:b!XyZ", b"id:01ABC:/notes.odt:")
    c = rec(b"POST /v1.0/drives/b!XyZ/root:/dir/big.docx:/createUploadSession HTTP/1.1\r\nHost: graph.microsoft.com\r\n"
            b"Authorization: Bearer t\r\nContent-Type: application/json\r\n\r\n{\"item\":{\"@microsoft.graph.conflictBehavior\":\"replace\"}}")
    assert c.kind is Kind.GRAPH_CREATE_SESSION and c.doc.ref == b"root:/dir/big.docx:"
    f = rec(b"PUT /rup/ec-abc HTTP/1.1\r\nHost: api.onedrive.com\r\nContent-Range: bytes 0-327679/700000\r\n\r\n" + b"x" * 10)
    assert (f.kind, f.session, f.content_range) == (Kind.GRAPH_FRAGMENT, "ec-abc", (0, 327679, 700000))
    item = rec(b"GET /v1.0/drives/b!XyZ/items/01DEF/content HTTP/1.1\r\nHost: graph.microsoft.com\r\nAuthorization: Bearer t\r\n\r\n")
    assert item.kind is Kind.DOWNLOAD and item.doc.ref == b"id:01DEF" and item.download.follow_redirect
    assert rec(b"GET /v1.0/me/drive HTTP/1.1\r\nHost: graph.microsoft.com\r\nAuthorization: Bearer t\r\n\r\n").kind is Kind.OTHER
    assert rec(b"GET /rup/ec-abc HTTP/1.1\r\nHost: api.onedrive.com\r\n\r\n").kind is Kind.GRAPH_SESSION_STATUS


def test_graph_items_root_form_is_the_root_path():
    a = rec(b"PUT /v1.0/me/drive/items/root:/A.docx:/content HTTP/1.1\r\nHost: graph.microsoft.com\r\nAuthorization: Bearer t\r\n\r\nx")
    b = rec(b"PUT /v1.0/me/drive/root:/a.docx:/content HTTP/1.1\r\nHost: graph.microsoft.com\r\nAuthorization: Bearer t\r\n\r\nx")
    assert a.doc == b.doc


# -- Drive ---------------------------------------------------------------------

MULTIPART = (b"--BOUNDARY\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{\"name\": \"Sheet.xlsx\"}\r\n"
             b"--BOUNDARY\r\nContent-Type: application/octet-stream\r\n\r\n" + PK + b"\r\n--BOUNDARY--\r\n")


def test_drive_multipart_split():
    r = rec(b"POST /upload/drive/v3/files?uploadType=multipart HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer "
            + TOKEN.encode() + b"\r\nContent-Type: multipart/related; boundary=BOUNDARY\r\n\r\n" + MULTIPART)
    assert r.kind is Kind.UPLOAD_SINGLE and r.name == "Sheet.xlsx" and r.doc == ecp.DocKey(ecp.DRIVE, TOK, b"new:Sheet.xlsx")
    a, b = r.file_span
    assert MULTIPART[a:b] == PK and r.file == PK
    assert MULTIPART[:a].endswith(b"\r\n\r\n") and MULTIPART[b:].startswith(b"\r\n--BOUNDARY--")


def test_drive_media_resumable_and_download():
    m = rec(b"PATCH /upload/drive/v3/files/1AbC_d-9?uploadType=media HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer t\r\n\r\n" + PK)
    assert m.kind is Kind.UPLOAD_SINGLE and m.doc.ref == b"id:1AbC_d-9" and m.file == PK and m.office
    i = rec(b"POST /upload/drive/v3/files?uploadType=resumable HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer t\r\n"
            b"X-Upload-Content-Length: 5\r\nContent-Type: application/json\r\n\r\n{\"name\": \"talk.pptx\"}")
    assert i.kind is Kind.DRIVE_RESUMABLE_INIT and i.name == "talk.pptx"
    c = rec(b"PUT /upload/drive/v3/files?uploadType=resumable&upload_id=ec-1 HTTP/1.1\r\nHost: www.googleapis.com\r\n"
            b"Content-Range: bytes */5\r\n\r\n")
    assert (c.kind, c.session, c.content_range) == (Kind.DRIVE_RESUMABLE_CHUNK, "ec-1", (None, None, 5))
    d = rec(b"GET /drive/v3/files/1AbC?alt=media HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer t\r\n\r\n")
    assert d.kind is Kind.DOWNLOAD and d.doc.ref == b"id:1AbC"
    meta = rec(b"GET /drive/v3/files/1AbC HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer t\r\n\r\n")
    assert meta.kind is Kind.OTHER


def test_drive_malformed_multipart_passes_through():
    r = rec(b"POST /upload/drive/v3/files?uploadType=multipart HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer t\r\n"
            b"Content-Type: multipart/related; boundary=X\r\n\r\nno parts here")
    assert r.kind is Kind.OTHER and r.note


# -- WebDAV / Nextcloud ------------------------------------------------------------


def basic(user: str) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(f"{user}:secret".encode()) + b"\r\n"


def test_rclone_webdav_put_and_legacy_path_name_one_document():
    a = rec(b"PUT /remote.php/dav/files/alice/Docs/Q%C3%BC.docx HTTP/1.1\r\nHost: cloud.example.com\r\n" + basic("alice")
            + b"OC-Checksum: SHA1:00\r\nX-OC-Mtime: 1700000000\r\n\r\n" + PK)
    b = rec(b"PUT /remote.php/webdav/Docs/Q%C3%BC.docx HTTP/1.1\r\nHost: cloud.example.com\r\n" + basic("alice") + b"\r\n" + PK)
    assert a.kind is Kind.UPLOAD_SINGLE and a.doc == b.doc == ecp.DocKey(ecp.WEBDAV, b"alice@cloud.example.com", "/Docs/Qü.docx".encode())


def test_webdav_configured_host_any_path():
    assert rec(b"PUT /dav/a.docx HTTP/1.1\r\nHost: files.example.org\r\nAuthorization: Bearer t\r\n\r\nx") is None
    r = rec(b"PUT /dav/a.docx HTTP/1.1\r\nHost: files.example.org\r\nAuthorization: Bearer t\r\n\r\nx", webdav_hosts=["files.example.org"])
    assert r.kind is Kind.UPLOAD_SINGLE and r.doc.account == b"tok:" + hashlib.sha256(b"t").hexdigest()[:12].encode() + b"@files.example.org"
    g = rec(b"GET /dav/a.docx HTTP/1.1\r\nHost: files.example.org\r\nAuthorization: Bearer t\r\n\r\n", webdav_hosts=["files.example.org"])
    assert g.kind is Kind.DOWNLOAD and g.doc == r.doc
    p = rec(b"PROPFIND /dav/ HTTP/1.1\r\nHost: files.example.org\r\n\r\n", webdav_hosts=["files.example.org"])
    assert p.kind is Kind.OTHER


def test_nextcloud_chunking_v2():
    dest = b"Destination: https://cloud.example.com/remote.php/dav/files/bob/Big.docx\r\n"
    mk = rec(b"MKCOL /remote.php/dav/uploads/bob/t-1 HTTP/1.1\r\nHost: cloud.example.com\r\n" + basic("bob") + dest + b"\r\n")
    assert mk.kind is Kind.NC_MKCOL and mk.doc == ecp.DocKey(ecp.WEBDAV, b"bob@cloud.example.com", b"/Big.docx")
    ch = rec(b"PUT /remote.php/dav/uploads/bob/t-1/00003 HTTP/1.1\r\nHost: cloud.example.com\r\n" + basic("bob") + dest + b"\r\nxyz")
    assert (ch.kind, ch.chunk, ch.session) == (Kind.NC_CHUNK, "00003", mk.session)
    mv = rec(b"MOVE /remote.php/dav/uploads/bob/t-1/.file HTTP/1.1\r\nHost: cloud.example.com\r\n" + basic("bob") + dest + b"\r\n")
    assert mv.kind is Kind.NC_MOVE and mv.doc == mk.doc
    no_dest = rec(b"MKCOL /remote.php/dav/uploads/bob/t-2 HTTP/1.1\r\nHost: cloud.example.com\r\n" + basic("bob") + b"\r\n")
    assert no_dest.kind is Kind.OTHER


# -- office test and other hosts ------------------------------------------------------


def test_office_by_name_and_by_content():
    for name in ("a.docx", "B.XLSM", "c.odg", "/x/y.ppsx", "deck.potx"):
        assert is_office_name(name)
    for name in ("a.txt", "docx", ".docx", None, "a.docx.bak"):
        assert not is_office_name(name)
    assert is_office_content(b"PK\x03\x04rest") and is_office_content(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1...")
    assert not is_office_content(b"%PDF-1.7") and not is_office_content(b"")


def test_other_hosts_are_not_providers():
    assert rec(b"POST /upload HTTP/1.1\r\nHost: example.com\r\n\r\nx") is None


# -- what the providers' official clients send (issue 11) ----------------------


def test_ranged_downloads_pass_through():
    """The Dropbox SDK's parallel download asks for `Range: bytes=0-0` first:
    a part of the file is no version of it, so it is not a FETCH."""
    arg = b'Dropbox-API-Arg: {"path": "/A.docx"}\r\n'
    head = b"POST /2/files/download HTTP/1.1\r\nHost: content.dropboxapi.com\r\nAuthorization: Bearer t\r\n" + arg
    assert rec(head + b"\r\n").kind is Kind.DOWNLOAD
    ranged = rec(head + b"Range: bytes=0-0\r\n\r\n")
    assert ranged.kind is Kind.OTHER and ranged.note == "ranged download"
    graph = rec(b"GET /v1.0/me/drive/root:/a.docx:/content HTTP/1.1\r\nHost: graph.microsoft.com\r\nAuthorization: Bearer t\r\n"
                b"Range: bytes=100-\r\n\r\n")
    assert graph.kind is Kind.OTHER


def test_nextcloud_endpoints_are_not_documents():
    """nextcloudcmd asks status.php and the OCS capabilities first; on a
    configured WebDAV host they were taken for documents and stored."""
    for path in (b"/status.php", b"/ocs/v1.php/cloud/capabilities?format=json", b"/ocs/v2.php/cloud/user?format=json",
                 b"/index.php/login/v2", b"/.well-known/caldav"):
        r = recognise(*parse(b"GET " + path + b" HTTP/1.1\r\nHost: cloud.example.com\r\nAuthorization: Basic YWxpY2U6eA==\r\n\r\n"),
                      webdav_hosts=["cloud.example.com"])
        assert r is not None and r.kind is Kind.OTHER, path
    # a file at the root of a plain WebDAV host still is one
    r = recognise(*parse(b"GET /status.docx HTTP/1.1\r\nHost: cloud.example.com\r\nAuthorization: Basic YWxpY2U6eA==\r\n\r\n"),
                  webdav_hosts=["cloud.example.com"])
    assert r.kind is Kind.DOWNLOAD


def test_graph_sdk_addressing_is_one_document():
    """The Graph SDK expands an item id `root:/Docs/A.docx:` percent-encoded
    (`items/root%3A%2FDocs%2FA.docx%3A`), and its base URL ends in a slash
    (`/v1.0//me/drive`): the same document as `root:/Docs/A.docx:`."""
    auth = b"\r\nHost: graph.microsoft.com\r\nAuthorization: Bearer t\r\n\r\nx"
    plain = rec(b"PUT /v1.0/me/drive/root:/Docs/A.docx:/content HTTP/1.1" + auth)
    encoded = rec(b"PUT /v1.0/me/drive/items/root%3A%2FDocs%2FA.docx%3A/content HTTP/1.1" + auth)
    lower = rec(b"PUT /v1.0/me/drive/items/root%3a%2fDocs%2fa.docx%3a/content HTTP/1.1" + auth)
    doubled = rec(b"PUT /v1.0//me/drive/root:/Docs/A.docx:/content HTTP/1.1" + auth)
    session = rec(b"POST /v1.0/me/drive/items/root%3A%2FDocs%2FA.docx%3A/createUploadSession HTTP/1.1" + auth)
    assert encoded.kind is Kind.UPLOAD_SINGLE and session.kind is Kind.GRAPH_CREATE_SESSION and doubled.kind is Kind.UPLOAD_SINGLE
    assert plain.doc == encoded.doc == lower.doc == doubled.doc == session.doc
    assert encoded.name == "A.docx"
    # OneDrive ids hold `!`, which the SDK percent-encodes: one document either way
    by_id = rec(b"PUT /v1.0/drives/d1/items/1TB%211/content HTTP/1.1" + auth)
    assert by_id.doc == rec(b"PUT /v1.0/drives/d1/items/1TB!1/content HTTP/1.1" + auth).doc
    assert by_id.doc.ref == b"id:1TB!1"


def test_graph_and_drive_aliases_from_the_response():
    from ec_proxy.recognise import drive, graph

    doc = ecp.DocKey(ecp.GRAPH, b"tok:x", b"root:/docs/a.docx:")
    item = {"id": "01ABC", "name": "A.docx", "parentReference": {"path": "/drive/root:/Docs", "id": "P"}}
    assert graph.aliases(doc, item) == [ecp.DocKey(ecp.GRAPH, b"tok:x", b"id:01ABC")]
    by_id = ecp.DocKey(ecp.GRAPH, b"tok:x", b"id:01ABC")
    assert graph.aliases(by_id, item) == [doc]
    created = ecp.DocKey(ecp.DRIVE, TOK, b"new:Sheet.xlsx")
    assert drive.aliases(created, {"kind": "drive#file", "id": "1xYz"}) == [ecp.DocKey(ecp.DRIVE, TOK, b"id:1xYz")]
    assert drive.aliases(created, []) == []


def test_drive_multipart_as_googles_client_writes_it():
    """google-api-python-client (`email` generator): LF line endings and the
    media part's Content-Type folded onto a continuation line."""
    media = PK + b"data\r\nwith CRLF\nand LF\r"
    body = (b'--===============42==\nContent-Type: application/json\nMIME-Version: 1.0\n\n{"name": "A.docx"}\n'
            b"--===============42==\nContent-Type: \n application/vnd.openxmlformats-officedocument.wordprocessingml.document\n"
            b"MIME-Version: 1.0\nContent-Transfer-Encoding: binary\n\n" + media + b"\n--===============42==--\n")
    r = rec(b"POST /upload/drive/v3/files?alt=json&uploadType=multipart HTTP/1.1\r\nHost: www.googleapis.com\r\nAuthorization: Bearer "
            + TOKEN.encode() + b'\r\ncontent-type: multipart/related; boundary="===============42=="\r\n\r\n' + body)
    assert r.kind is Kind.UPLOAD_SINGLE and r.name == "A.docx"
    assert r.file == media


def test_which_downloads_may_enter_the_store():
    """Only documents enter the device's store: a name with a non-document
    extension goes directly; ids, revisions and bare names let the content decide."""
    from ec_proxy.addon import _named_non_document

    assert _named_non_document("/status.php") and _named_non_document("/Notes/todo.txt")
    assert not _named_non_document("/Docs/A.docx") and not _named_non_document("id:AbC.123")
    assert not _named_non_document("rev:015abc") and not _named_non_document("/Docs/README") and not _named_non_document(None)
