"""ec_proxy.sessions: the answers the device gives for each provider's
session requests, the error shapes, and what a completed upload gathers."""

from __future__ import annotations

import hashlib
import json
import urllib.parse

import ec_protocol as ecp
from ec_proxy.recognise import recognise
from ec_proxy.sessions import Answer, GatheredUpload, SessionBook, accepted_files

AUTH = ("Authorization", "Bearer alice")
DBX = "https://content.dropboxapi.com/2/files/upload_session/"


def feed(book, method, url, headers, body=b""):
    return book.feed(recognise(method, url, headers, body))


def body(a: Answer):
    return json.loads(a.body)


def arg(sid, offset, close=None, commit=None):
    a = {"cursor": {"session_id": sid, "offset": offset}}
    if close is not None:
        a["close"] = close
    if commit is not None:
        a["commit"] = commit
    return ("Dropbox-API-Arg", json.dumps(a))


def dropbox_start(book, data=b"abc", close=False):
    a = feed(book, "POST", DBX + "start", [AUTH, ("Dropbox-API-Arg", json.dumps({"close": close}))], data)
    assert a.status == 200
    return body(a)["session_id"]


# -- Dropbox -------------------------------------------------------------------


def test_dropbox_start_append_finish_gathers_the_file():
    book = SessionBook()
    sid = dropbox_start(book, b"abc")
    assert sid.startswith("pid_upload_session:ec-")
    a = feed(book, "POST", DBX + "append_v2", [AUTH, arg(sid, 3, False)], b"def")
    assert (a.status, a.body) == (200, b"null")
    g = feed(book, "POST", DBX + "finish", [AUTH, arg(sid, 6, commit={"path": "/R.docx", "mode": "add"}), ("Content-Length", "1")], b"g")
    assert isinstance(g, GatheredUpload) and g.procedure == ecp.DROPBOX_SESSION
    assert g.files[0].data == b"abcdefg" and g.files[0].binding == sid.encode()
    assert g.files[0].doc == ecp.DocKey(ecp.DROPBOX, b"tok:" + hashlib.sha256(b"alice").hexdigest()[:12].encode(), b"/r.docx")
    # the finish goes to the EPS with an empty body and no hop-by-hop fields
    (fin,) = g.provider_requests()
    assert fin.body_kind == ecp.BODY_EMPTY and all(n.lower() != "content-length" for n, _ in fin.headers)


def test_dropbox_incorrect_offset_closed_and_not_found_shapes():
    book = SessionBook()
    sid = dropbox_start(book, b"abc")
    a = feed(book, "POST", DBX + "append_v2", [AUTH, arg(sid, 2)], b"x")
    assert a.status == 409 and body(a)["error"] == {".tag": "incorrect_offset", "correct_offset": 3}
    assert body(a)["error_summary"].startswith("incorrect_offset/")
    assert feed(book, "POST", DBX + "append_v2", [AUTH, arg(sid, 3, True)], b"d").status == 200
    closed = feed(book, "POST", DBX + "append_v2", [AUTH, arg(sid, 4)], b"e")
    assert closed.status == 409 and body(closed)["error"][".tag"] == "closed"
    f = feed(book, "POST", DBX + "finish", [AUTH, arg(sid, 9, commit={"path": "/a.docx"})])
    assert body(f)["error"] == {".tag": "lookup_failed", "lookup_failed": {".tag": "incorrect_offset", "correct_offset": 4}}
    gone = feed(book, "POST", DBX + "append_v2", [AUTH, arg("pid_upload_session:ec-unknown", 0)], b"x")
    assert gone.status == 409 and body(gone)["error"] == {".tag": "not_found"}
    # another account cannot use the session
    other = feed(book, "POST", DBX + "append_v2", [("Authorization", "Bearer mallory"), arg(sid, 4)], b"x")
    assert body(other)["error"] == {".tag": "not_found"}
    # a provider-issued id is not the device's business
    assert feed(book, "POST", DBX + "append_v2", [AUTH, arg("pid_upload_session:REAL", 0)], b"x") is None


def test_dropbox_failed_finish_keeps_the_session_for_the_retry():
    book = SessionBook()
    sid = dropbox_start(book, b"abc", close=True)
    finish = [AUTH, arg(sid, 3, commit={"path": "/a.docx"})]
    g1 = feed(book, "POST", DBX + "finish", finish)
    book.settle(g1, succeeded=False)
    g2 = feed(book, "POST", DBX + "finish", finish)
    assert isinstance(g2, GatheredUpload) and g2.files[0].data == b"abc"
    book.settle(g2, succeeded=True)
    assert len(book) == 0
    assert body(feed(book, "POST", DBX + "finish", finish))["error"]["lookup_failed"] == {".tag": "not_found"}


def test_dropbox_batch_gathers_every_entry_or_answers_per_entry():
    book = SessionBook()
    s1, s2 = dropbox_start(book, b"one", close=True), dropbox_start(book, b"two!", close=True)
    entries = [{"cursor": {"session_id": s1, "offset": 3}, "commit": {"path": "/A.docx"}},
               {"cursor": {"session_id": s2, "offset": 4}, "commit": {"path": "/B.xlsx"}}]
    url = "https://api.dropboxapi.com/2/files/upload_session/finish_batch_v2"
    hs = [AUTH, ("Content-Type", "application/json")]
    g = feed(book, "POST", url, hs, json.dumps({"entries": entries}).encode())
    assert g.procedure == ecp.DROPBOX_BATCH and [f.data for f in g.files] == [b"one", b"two!"]
    assert [f.binding for f in g.files] == [s1.encode(), s2.encode()]
    assert g.provider_requests()[0].body_kind == ecp.BODY_BYTES
    s3 = dropbox_start(book, b"open", close=False)
    bad = entries[:1] + [{"cursor": {"session_id": s3, "offset": 4}, "commit": {"path": "/C.docx"}}]
    a = feed(book, "POST", url, hs, json.dumps({"entries": bad}).encode())
    assert a.status == 200
    assert body(a)["entries"] == [
        {".tag": "failure", "failure": {".tag": "too_many_write_operations"}},
        {".tag": "failure", "failure": {".tag": "lookup_failed", "lookup_failed": {".tag": "not_closed"}}},
    ]
    real = [{"cursor": {"session_id": "pid_upload_session:REAL", "offset": 1}, "commit": {"path": "/x"}}]
    assert feed(book, "POST", url, hs, json.dumps({"entries": real}).encode()) is None


def test_a_dropbox_batch_is_accepted_per_entry_and_keeps_the_refused_sessions():
    """Dropbox answers finish_batch_v2 with 200 and one result per entry
    (spec §6.3): only the entries tagged `success` are accepted; an answer
    of another shape accepts none. Settled so, the accepted entries'
    sessions go and the refused ones' stay for the app's retry."""
    book = SessionBook()
    s1, s2 = dropbox_start(book, b"one", close=True), dropbox_start(book, b"two!", close=True)
    entries = [{"cursor": {"session_id": s1, "offset": 3}, "commit": {"path": "/A.docx"}},
               {"cursor": {"session_id": s2, "offset": 4}, "commit": {"path": "/B.xlsx"}}]
    url = "https://api.dropboxapi.com/2/files/upload_session/finish_batch_v2"
    hs = [AUTH, ("Content-Type", "application/json")]
    g = feed(book, "POST", url, hs, json.dumps({"entries": entries}).encode())
    answer = json.dumps({"entries": [{".tag": "success", "name": "A.docx"},
                                     {".tag": "failure", "failure": {".tag": "path", "path": {".tag": "conflict"}}}]}).encode()
    assert accepted_files(g, 200, answer) == (True, False)
    assert accepted_files(g, 409, answer) == (False, False)
    assert accepted_files(g, 200, b"not json") == (False, False)
    assert accepted_files(g, 200, json.dumps({"entries": [{".tag": "success"}]}).encode()) == (False, False)
    book.settle(g, accepted_files(g, 200, answer))
    again = feed(book, "POST", url, hs, json.dumps({"entries": entries[1:]}).encode())
    assert isinstance(again, GatheredUpload) and [f.data for f in again.files] == [b"two!"]
    gone = feed(book, "POST", url, hs, json.dumps({"entries": entries[:1]}).encode())
    assert body(gone)["entries"][0]["failure"]["lookup_failed"][".tag"] == "not_found"


# -- Graph ---------------------------------------------------------------------

UNIT = 327_680


def graph_create(book, url="https://graph.microsoft.com/v1.0/me/drive/root:/a.docx:/createUploadSession"):
    a = feed(book, "POST", url, [AUTH, ("Content-Type", "application/json")], b"{}")
    assert a.status == 200 and body(a)["nextExpectedRanges"] == ["0-"] and body(a)["expirationDateTime"].endswith("Z")
    return body(a)["uploadUrl"]


def test_graph_fragments_and_gathering():
    book = SessionBook()
    url = graph_create(book)
    assert url.startswith("https://api.onedrive.com/rup/ec-")
    data = bytes(range(256)) * 2000  # 512,000 bytes
    a = feed(book, "PUT", url, [("Content-Range", f"bytes 0-{UNIT - 1}/{len(data)}")], data[:UNIT])
    assert a.status == 202 and body(a)["nextExpectedRanges"] == [f"{UNIT}-"]
    st = feed(book, "GET", url, [])
    assert body(st)["nextExpectedRanges"] == [f"{UNIT}-{len(data) - 1}"]
    g = feed(book, "PUT", url, [("Content-Range", f"bytes {UNIT}-{len(data) - 1}/{len(data)}")], data[UNIT:])
    assert g.procedure == ecp.GRAPH_SESSION and g.files[0].data == data
    assert g.requests[0].url.endswith(":/createUploadSession") and g.requests[0].body == b"{}"
    assert g.provider_requests()[0].body_kind == ecp.BODY_BYTES


def test_graph_fragment_errors_in_graph_shape():
    book = SessionBook()
    url = graph_create(book)
    cr = lambda a, b, t: ("Content-Range", f"bytes {a}-{b}/{t}")  # noqa: E731
    not_unit = feed(book, "PUT", url, [cr(0, 99, 1000)], b"x" * 100)
    assert not_unit.status == 400 and body(not_unit)["error"]["code"] == "invalidRequest"
    gap = feed(book, "PUT", url, [cr(10, 19, 1000)], b"x" * 10)
    assert gap.status == 416 and body(gap)["error"]["code"] == "invalidRange"
    no_range = feed(book, "PUT", url, [], b"x")
    assert no_range.status == 400
    short = feed(book, "PUT", url, [cr(0, 9, 10)], b"x" * 9)
    assert short.status == 400
    # An Authorization header on the pre-authenticated uploadUrl: 401, as
    # OneDrive answers the Graph SDK's large-file task (issue 11); the session stays.
    refused = feed(book, "PUT", url, [AUTH, cr(0, 9, 10)], b"x" * 10)
    assert refused.status == 401 and body(refused)["error"]["code"] == "unauthenticated"
    book.graph_fragment_auth = "accept"  # --graph-fragment-auth accept: as OneDrive did for rclone 1.60
    authed = feed(book, "PUT", url, [AUTH, cr(0, 9, 10)], b"x" * 10)
    assert isinstance(authed, GatheredUpload) and authed.files[0].data == b"x" * 10
    unknown = feed(book, "PUT", "https://api.onedrive.com/rup/ec-nope", [cr(0, 9, 10)], b"x" * 10)
    assert unknown.status == 404 and body(unknown)["error"]["code"] == "itemNotFound"
    assert feed(book, "PUT", "https://api.onedrive.com/rup/REALTOKEN", [cr(0, 9, 10)], b"x" * 10) is None
    assert feed(book, "DELETE", url, []).status == 204
    assert feed(book, "PUT", url, [cr(0, 9, 10)], b"x" * 10).status == 404


def test_graph_upload_url_keeps_sharepoint_host_and_lab_port():
    book = SessionBook()
    sp = graph_create(book, "https://contoso.sharepoint.com/_api/v2.0/drives/b!1/root:/a.docx:/createUploadSession")
    assert sp.startswith("https://contoso.sharepoint.com/rup/ec-")
    lab = graph_create(book, "https://graph.microsoft.com:8443/v1.0/me/drive/root:/a.docx:/createUploadSession")
    assert lab.startswith("https://api.onedrive.com:8443/rup/ec-")


# -- Drive ---------------------------------------------------------------------

CHUNK = 256 * 1024


def drive_init(book, headers=(), path="/upload/drive/v3/files/FILE1"):
    a = feed(book, "PATCH", f"https://www.googleapis.com{path}?uploadType=resumable",
             [AUTH, ("Content-Type", "application/json"), *headers], b'{"name": "n.docx"}')
    loc = dict(a.headers)["Location"]
    assert a.status == 200 and f"{path}?uploadType=resumable&upload_id=ec-" in loc
    return loc


def test_drive_chunks_308_and_gathering():
    book = SessionBook()
    loc = drive_init(book, [("X-Upload-Content-Length", str(CHUNK + 5))])
    data = b"d" * (CHUNK + 5)
    st = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes */{len(data)}")])
    assert st.status == 308 and "Range" not in dict(st.headers)
    a = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes 0-{CHUNK - 1}/{len(data)}")], data[:CHUNK])
    assert a.status == 308 and dict(a.headers)["Range"] == f"bytes=0-{CHUNK - 1}"
    g = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes {CHUNK}-{len(data) - 1}/{len(data)}")], data[CHUNK:])
    assert g.procedure == ecp.DRIVE_RESUMABLE and g.files[0].data == data
    assert g.files[0].doc.ref == b"id:FILE1" and g.requests[0].method == "PATCH"


def test_a_drive_status_query_after_a_final_chunk_with_an_unknown_outcome_is_that_final_request():
    """`Content-Range: bytes */N` after the final chunk went in a SAVE whose
    outcome is unknown (`attempting`, not settled): the device hands the
    addon that upload again (the whole file, the same operation), which
    resends the earlier SAVE with its request id and gives the app
    Google's answer for a completed upload. Before, it answered 308 from the
    bytes gathered before the final chunk. Without an attempt, a query for
    another length, or once the attempt is settled, it is 308 as before."""
    from ec_proxy.sessions import Attempt, same_operation

    book = SessionBook()
    data = b"d" * (CHUNK + 5)
    loc = drive_init(book, [("X-Upload-Content-Length", str(len(data)))])
    assert feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes 0-{CHUNK - 1}/{len(data)}")], data[:CHUNK]).status == 308
    g = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes {CHUNK}-{len(data) - 1}/{len(data)}")], data[CHUNK:])
    items = tuple(ecp.SaveItem(f.data, f.doc, None, f.binding) for f in g.files)
    earlier = Attempt(b"\1" * 8, g.procedure, tuple(g.provider_requests()), items, g.keys)
    book.attempting(g, earlier)
    for query in (f"bytes */{len(data)}", "bytes */*"):
        q = feed(book, "PUT", loc, [AUTH, ("Content-Range", query), ("Content-Length", "0")])
        assert isinstance(q, GatheredUpload), (query, q)
        assert q.files[0].data == data and q.keys == g.keys and same_operation(q, earlier)
        assert book.attempt(q) is earlier
    other = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes */{len(data) + 1}")])
    assert other.status == 308 and dict(other.headers)["Range"] == f"bytes=0-{CHUNK - 1}"
    book.settle(g, False)  # the provider refused it: the app's retry is a new attempt
    again = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes */{len(data)}")])
    assert again.status == 308 and dict(again.headers)["Range"] == f"bytes=0-{CHUNK - 1}"


def test_a_drive_status_query_after_a_definite_success_gets_the_answer_again():
    """Google answers `bytes */N` on a completed upload with 200 and the
    file resource: an app whose final answer was lost on its way asks so
    (google-api-python-client after a connection error). The device kept
    no session after a success and answered 404 notFound, on which the
    app would upload the file again. Now the settled session keeps the
    answer the app was given (not its bytes) and a status query gets it;
    another chunk to it is 404 notFound, as to a used-up session. Settled
    without an answer (or refused), it is as before."""
    from ec_proxy.sessions import Answer

    book = SessionBook()
    data = b"d" * (CHUNK + 5)
    loc = drive_init(book, [("X-Upload-Content-Length", str(len(data)))])
    assert feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes 0-{CHUNK - 1}/{len(data)}")], data[:CHUNK]).status == 308
    g = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes {CHUNK}-{len(data) - 1}/{len(data)}")], data[CHUNK:])
    answer = Answer(200, "OK", (("content-type", b"application/json"),), b'{"id": "FILE1", "size": "262149"}')
    book.settle(g, (True,), answer)
    assert book.gathered_bytes == len(answer.body)  # the file's bytes are gone
    for query in (f"bytes */{len(data)}", "bytes */*"):
        assert feed(book, "PUT", loc, [AUTH, ("Content-Range", query), ("Content-Length", "0")]) is answer
    again = feed(book, "PUT", loc, [AUTH, ("Content-Range", f"bytes {CHUNK}-{len(data) - 1}/{len(data)}")], data[CHUNK:])
    assert again.status == 404 and body(again)["error"]["errors"][0]["reason"] == "notFound"

    loc = drive_init(book, [("X-Upload-Content-Length", "3")])
    g = feed(book, "PUT", loc, [AUTH, ("Content-Range", "bytes 0-2/3")], b"abc")
    book.settle(g, True)  # no answer to keep: forgotten
    gone = feed(book, "PUT", loc, [AUTH, ("Content-Range", "bytes */3")])
    assert gone.status == 404 and body(gone)["error"]["errors"][0]["reason"] == "notFound"


def test_completed_drive_sessions_never_push_out_one_still_gathering():
    """Completed sessions kept for status queries are bounded on their own
    (`Shelf.MAX_DONE`, the oldest going first, and `DONE_TTL`): before
    they were kept, a completed session was dropped at once, so hundreds of
    saves must not evict, by their number or their recency, an upload the
    app is still sending (here one started first, idle since)."""
    from ec_proxy.sessions import Answer

    now = [1000.0]
    book = SessionBook(clock=lambda: now[0])
    gathering = drive_init(book, [("X-Upload-Content-Length", str(CHUNK + 3))])
    assert feed(book, "PUT", gathering, [AUTH, ("Content-Range", f"bytes 0-{CHUNK - 1}/{CHUNK + 3}")], b"g" * CHUNK).status == 308
    done = []
    for k in range(book.max_sessions + 44):  # more than the book holds of all sessions
        loc = drive_init(book, [("X-Upload-Content-Length", "3")])
        g = feed(book, "PUT", loc, [AUTH, ("Content-Range", "bytes 0-2/3")], b"abc")
        book.settle(g, True, Answer(200, "OK", (), b'{"id": "%d"}' % k))
        done.append(loc)
    status = lambda loc: feed(book, "PUT", loc, [AUTH, ("Content-Range", "bytes */3")])  # noqa: E731
    gone = len(done) - book.MAX_DONE
    assert {status(loc).status for loc in done[:gone]} == {404}, "the oldest completed ones went"
    assert [status(loc).status for loc in done[gone:]] == [200] * book.MAX_DONE
    assert status(done[-1]).body == b'{"id": "%d"}' % (len(done) - 1)
    now[0] += book.DONE_TTL + 1
    assert status(done[-1]).status == 404, "a completed session is kept an hour"
    last = feed(book, "PUT", gathering, [AUTH, ("Content-Range", f"bytes {CHUNK}-{CHUNK + 2}/{CHUNK + 3}")], b"xyz")
    assert isinstance(last, GatheredUpload) and last.files[0].data == b"g" * CHUNK + b"xyz"


def test_drive_errors_and_whole_file_put():
    book = SessionBook()
    loc = drive_init(book, [("X-Upload-Content-Length", "10")])
    wrong_total = feed(book, "PUT", loc, [AUTH, ("Content-Range", "bytes 0-10/11")], b"x" * 11)
    assert wrong_total.status == 400 and body(wrong_total)["error"]["errors"][0]["reason"] == "badRequest"
    not_unit = feed(book, "PUT", loc, [AUTH, ("Content-Range", "bytes 0-4/10")], b"x" * 5)
    assert not_unit.status == 400
    unknown = feed(book, "PUT", loc.replace("upload_id=ec-", "upload_id=ec-x"), [AUTH], b"x" * 10)
    assert unknown.status == 404 and body(unknown)["error"]["errors"][0]["reason"] == "notFound"
    g = feed(book, "PUT", loc, [AUTH], b"0123456789")  # no Content-Range: the whole file at once
    assert isinstance(g, GatheredUpload) and g.files[0].data == b"0123456789"


# -- Nextcloud -----------------------------------------------------------------

NC = "https://cloud.example.com/remote.php/dav/uploads/alice/t1"
DEST = ("Destination", "https://cloud.example.com/remote.php/dav/files/alice/d/Big.docx")


def test_nextcloud_mkcol_chunks_move():
    book = SessionBook()
    assert feed(book, "MKCOL", NC, [AUTH, DEST]).status == 201
    assert feed(book, "MKCOL", NC, [AUTH, DEST]).status == 405
    assert feed(book, "PUT", NC + "/00002", [AUTH, DEST, ("OC-Total-Length", "6")], b"def").status == 201
    assert feed(book, "PUT", NC + "/00001", [AUTH, DEST, ("OC-Total-Length", "6")], b"abc").status == 201
    assert feed(book, "PUT", NC + "/00001", [AUTH, DEST, ("OC-Total-Length", "6")], b"abc").status == 204
    wrong_dest = feed(book, "PUT", NC + "/00003", [AUTH, ("Destination", "https://cloud.example.com/x")], b"")
    assert wrong_dest.status == 400 and b"Sabre\\DAV\\Exception\\BadRequest" in wrong_dest.body
    bad_total = feed(book, "MOVE", NC + "/.file", [AUTH, DEST, ("OC-Total-Length", "7")])
    assert bad_total.status == 400 and b"do not sum up to 7" in bad_total.body
    g = feed(book, "MOVE", NC + "/.file", [AUTH, DEST, ("OC-Total-Length", "6")])
    assert g.procedure == ecp.NEXTCLOUD_CHUNKED and g.files[0].data == b"abcdef"
    assert [r.method for r in g.requests] == ["MKCOL", "MOVE"] and g.requests[1].url == NC + "/.file"
    assert g.files[0].doc.ref == b"/d/Big.docx"
    # an upload folder the device never answered belongs to the server
    assert feed(book, "PUT", NC.replace("t1", "t9") + "/00001", [AUTH, DEST], b"x") is None


# -- bounds --------------------------------------------------------------------


def test_idle_sessions_expire_and_get_not_found():
    now = [0.0]
    book = SessionBook(idle_ttl=60, clock=lambda: now[0])
    sid = dropbox_start(book)
    now[0] = 61
    assert body(feed(book, "POST", DBX + "append_v2", [AUTH, arg(sid, 3)], b"x"))["error"] == {".tag": "not_found"}
    assert len(book) == 0


def test_count_and_byte_bounds_evict_least_recently_used():
    book = SessionBook(max_sessions=2, max_bytes=10)
    s1 = dropbox_start(book, b"aaaa")
    s2 = dropbox_start(book, b"bbbb")
    s3 = dropbox_start(book, b"cc")  # count bound: s1 goes
    assert body(feed(book, "POST", DBX + "append_v2", [AUTH, arg(s1, 4)], b"x"))["error"] == {".tag": "not_found"}
    # byte bound: growing s3 to 8 bytes pushes s2 out (4 + 8 > 10)
    assert feed(book, "POST", DBX + "append_v2", [AUTH, arg(s3, 2)], b"dddddd").status == 200
    assert body(feed(book, "POST", DBX + "append_v2", [AUTH, arg(s2, 4)], b"x"))["error"] == {".tag": "not_found"}
    assert book.gathered_bytes == 8
    # a session alone over the bound is dropped
    assert feed(book, "POST", DBX + "append_v2", [AUTH, arg(s3, 8)], b"eeee").status == 409
    assert len(book) == 0


def test_head_only_requests_are_not_fed():
    book = SessionBook()
    rec = recognise("POST", DBX + "start", [AUTH, ("Dropbox-API-Arg", "{}")], None)
    assert book.feed(rec) is None and len(book) == 0


def test_dropbox_per_call_content_hash(tmp_path=None):
    """The Dropbox SDK 12.x sends, on start, append_v2 and finish, the
    content_hash of that call's own body: checked against it, as Dropbox
    does (content_hash_mismatch), never against the whole session (issue 11)."""
    from ec_proxy.recognise.dropbox import content_hash

    book = SessionBook()
    start_url = "https://content.dropboxapi.com/2/files/upload_session/start"
    append_url = "https://content.dropboxapi.com/2/files/upload_session/append_v2"
    finish_url = "https://content.dropboxapi.com/2/files/upload_session/finish"
    arg = lambda v: ("Dropbox-API-Arg", json.dumps(v))  # noqa: E731
    a, b, c = b"PK\x03\x04" + b"a" * 100, b"b" * 50, b"c" * 20
    bad_start = feed(book, "POST", start_url, [AUTH, arg({"content_hash": content_hash(b"")})], a)
    assert bad_start.status == 409 and body(bad_start)["error"][".tag"] == "content_hash_mismatch"
    sid = body(feed(book, "POST", start_url, [AUTH, arg({"content_hash": content_hash(a)})], a))["session_id"]
    cursor = {"session_id": sid, "offset": len(a)}
    bad = feed(book, "POST", append_url, [AUTH, arg({"cursor": cursor, "content_hash": content_hash(a + b)})], b)
    assert bad.status == 409 and body(bad)["error"][".tag"] == "content_hash_mismatch"
    assert feed(book, "POST", append_url, [AUTH, arg({"cursor": cursor, "content_hash": content_hash(b)})], b).status == 200
    fin = {"cursor": {"session_id": sid, "offset": len(a + b)}, "commit": {"path": "/x.docx"}}
    wrong = feed(book, "POST", finish_url, [AUTH, arg({**fin, "content_hash": content_hash(a + b + c)})], c)
    assert wrong.status == 409 and body(wrong)["error"][".tag"] == "content_hash_mismatch"
    done = feed(book, "POST", finish_url, [AUTH, arg({**fin, "content_hash": content_hash(c)})], c)
    assert isinstance(done, GatheredUpload) and done.files[0].data == a + b + c


def test_dropbox_finish_goes_to_the_eps_without_its_per_call_hash():
    """Spec §6.2 (MAY): the device leaves the finish's top-level
    content_hash out (checked first against the finish's body); the rest of
    the argument is byte for byte the app's, cut exactly as the EPS and the
    direct replay cut it. A nested content_hash, a non-ASCII argument or a
    member named twice are left for the EPS."""
    from ec_proxy.direct.dropbox import _without_member
    from ec_proxy.recognise.dropbox import content_hash

    book = SessionBook()
    finish_url = DBX + "finish"
    c = b"PK\x03\x04" + b"c" * 20
    sid = dropbox_start(book, b"", close=False)
    shape = '{"cursor": {"session_id": "%s", "offset": 0}, "commit": {"path": "/x.docx", "mode": "add"}, "content_hash": "%s"}'
    raw = shape % (sid, content_hash(c))
    done = feed(book, "POST", finish_url, [AUTH, ("Dropbox-API-Arg", raw)], c)
    assert isinstance(done, GatheredUpload)
    (fin,) = done.provider_requests()
    sent = dict((n.lower(), v) for n, v in fin.headers)["dropbox-api-arg"]
    assert "content_hash" not in sent
    assert sent == _without_member(raw, "content_hash") == raw.split(', "content_hash"')[0] + "}"
    # the app's hash is still checked before it is dropped
    sid = dropbox_start(book, b"", close=False)
    bad = shape % (sid, content_hash(b"x"))
    assert body(feed(book, "POST", finish_url, [AUTH, ("Dropbox-API-Arg", bad)], c))["error"][".tag"] == "content_hash_mismatch"
    # a member named twice stays for the EPS to refuse
    twice = '{"cursor": {"session_id": "%s", "offset": 0}, "commit": {"path": "/y.docx"}, "content_hash": "%s", "content_hash": "%s"}' % (
        sid, content_hash(c), content_hash(c))
    kept = feed(book, "POST", finish_url, [AUTH, ("Dropbox-API-Arg", twice)], c)
    if isinstance(kept, GatheredUpload):
        (fin,) = kept.provider_requests()
        assert dict((n.lower(), v) for n, v in fin.headers)["dropbox-api-arg"] == twice


def test_dropbox_session_ids_share_a_per_process_prefix():
    """Two sessions' ids differ in a few characters (a counter after a
    random prefix drawn once per SessionBook), so consecutive finish heads
    differ by a few bytes on the link; two books never share a prefix."""
    book, other = SessionBook(), SessionBook()
    a, b = dropbox_start(book), dropbox_start(book)
    c = dropbox_start(other)
    assert a != b and a.startswith("pid_upload_session:ec-") and b.startswith("pid_upload_session:ec-")
    prefix = len("pid_upload_session:ec-") + 16
    assert a[:prefix] == b[:prefix] and a[prefix:] != b[prefix:] and len(b) - prefix <= 2
    assert c[:prefix] != a[:prefix]
    assert len(a) <= 40, a  # it travels as the item's binding in every save (§6.2)


def attempt_of(g):
    """The SAVE a device would send for the gathered upload `g` (the earlier attempt of a retry)."""
    from ec_proxy.sessions import Attempt

    items = tuple(ecp.SaveItem(f.data, f.doc, None, f.binding) for f in g.files)
    return Attempt(b"\0" * 8, g.procedure, tuple(g.provider_requests()), items, g.keys)


def test_a_retry_is_the_same_operation_only_when_it_asks_the_provider_for_the_same():
    """`same_operation`: the app's final request again after an unknown
    outcome is the earlier SAVE's operation when only head fields that change
    nothing at the provider differ (a refreshed Authorization, a new
    User-Agent or request id, a per-call content_hash); another commit, other
    bytes or another precondition is another operation, and the device
    answers it as the provider would (`used_up`, test_sessions_again.py)."""
    from ec_proxy.sessions import same_operation, used_up
    from ec_proxy.sessions.dropbox import same_entry

    book = SessionBook()
    sid = dropbox_start(book, b"abc", close=True)
    commit = {"path": "/R.docx", "mode": "overwrite"}
    g = feed(book, "POST", DBX + "finish", [AUTH, arg(sid, 3, commit=commit)])
    earlier = attempt_of(g)
    again = feed(book, "POST", DBX + "finish", [AUTH, ("User-Agent", "sdk/2"), ("X-Request-Id", "r2"), arg(sid, 3, commit=commit)])
    assert same_operation(again, earlier)
    other = feed(book, "POST", DBX + "finish", [AUTH, arg(sid, 3, commit={"path": "/S.docx", "mode": "overwrite"})])
    assert not same_operation(other, earlier)
    assert (used_up(other).status, body(used_up(other))["error"]) == (409, {".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}})
    # A batch entry asks for the same commit as a finish when Dropbox's defaults fill in the rest.
    assert same_entry({"cursor": {"session_id": sid, "offset": 3}, "commit": {"path": "/R.docx", "mode": {".tag": "overwrite"},
                                                                            "autorename": False, "mute": False}},
                      {"cursor": {"session_id": sid, "offset": 3}, "commit": commit, "content_hash": "x"})
    assert not same_entry({"cursor": {"session_id": sid, "offset": 3}, "commit": {"path": "/R.docx"}},
                          {"cursor": {"session_id": sid, "offset": 3}, "commit": commit})

    # Nextcloud: the MOVE again with another password is the same; after other chunks, not.
    import base64

    def basic(pw):
        return ("Authorization", "Basic " + base64.b64encode(b"dave:" + pw).decode())

    dest = ("Destination", "https://cloud.example.com/remote.php/dav/files/dave/A.docx")
    folder = "https://cloud.example.com/remote.php/dav/uploads/dave/t-1"
    assert feed(book, "MKCOL", folder, [basic(b"a"), dest]).status == 201
    assert feed(book, "PUT", folder + "/00001", [basic(b"a"), dest], b"PK\x03\x04one").status == 201
    g = feed(book, "MOVE", folder + "/.file", [basic(b"a"), dest])
    earlier = attempt_of(g)
    assert same_operation(feed(book, "MOVE", folder + "/.file", [basic(b"b"), dest]), earlier)
    assert feed(book, "PUT", folder + "/00001", [basic(b"a"), dest], b"PK\x03\x04two").status == 204
    moved = feed(book, "MOVE", folder + "/.file", [basic(b"a"), dest])
    assert not same_operation(moved, earlier)
    assert used_up(moved).status == 404 and b"Upload folder t-1 does not exist" in used_up(moved).body


def test_a_retry_is_the_same_operation_whatever_fields_the_provider_ignores():
    """A retry's head fields that the provider does not act on (a changed
    Cookie, a new sentry-trace or baggage, an Accept-Encoding another HTTP
    stack adds) and Dropbox's commit spelt otherwise (a void mode as its
    tagged form, a default written out, the argument as `?arg=`) leave it the
    same operation: judged another, the app would be told that its committed
    file is not there (`used_up`) and would upload it again. What the
    provider does act on (Dropbox's commit options, Nextcloud's
    preconditions) still makes it another."""
    from ec_proxy.sessions import same_operation

    book = SessionBook()
    sid = dropbox_start(book, b"abc", close=True)
    commit = {"path": "/R.docx", "mode": "overwrite"}
    g = feed(book, "POST", DBX + "finish", [AUTH, ("Cookie", "a=1"), ("sentry-trace", "1-2-1"), arg(sid, 3, commit=commit)])
    earlier = attempt_of(g)
    ignored = [("Cookie", "a=2"), ("sentry-trace", "3-4-1"), ("baggage", "x=y"), ("Accept-Encoding", "gzip"),
               ("X-B3-TraceId", "5"), ("Connection", "close")]
    assert same_operation(feed(book, "POST", DBX + "finish", [AUTH, *ignored, arg(sid, 3, commit=commit)]), earlier)
    spelt = {"path": "/R.docx", "mode": {".tag": "overwrite"}, "autorename": False, "mute": False, "strict_conflict": False}
    assert same_operation(feed(book, "POST", DBX + "finish", [AUTH, arg(sid, 3, commit=spelt)]), earlier)
    as_query = DBX + "finish?arg=" + urllib.parse.quote(json.dumps({"cursor": {"session_id": sid, "offset": 3}, "commit": commit}))
    q = feed(book, "POST", as_query, [AUTH])
    assert isinstance(q, GatheredUpload)
    assert attempt_of(q).requests and same_operation(q, attempt_of(feed(book, "POST", as_query, [AUTH, ("Cookie", "b=3")])))
    autorename = feed(book, "POST", DBX + "finish", [AUTH, arg(sid, 3, commit={**commit, "autorename": True})])
    assert not same_operation(autorename, earlier)

    dest = ("Destination", "https://cloud.example.com/remote.php/dav/files/dave/A.docx")
    folder = "https://cloud.example.com/remote.php/dav/uploads/dave/t-2"
    auth = ("Authorization", "Basic ZGF2ZTph")
    assert feed(book, "MKCOL", folder, [auth, dest]).status == 201
    assert feed(book, "PUT", folder + "/00001", [auth, dest], b"PK\x03\x04one").status == 201
    g = feed(book, "MOVE", folder + "/.file", [auth, dest, ("Cookie", "nc_session=1")])
    earlier = attempt_of(g)
    assert same_operation(feed(book, "MOVE", folder + "/.file", [auth, dest, ("Cookie", "nc_session=2"), ("Accept-Encoding", "br")]), earlier)
    assert not same_operation(feed(book, "MOVE", folder + "/.file", [auth, dest, ("If-Match", '"e1"')]), earlier)
    assert not same_operation(feed(book, "MOVE", folder + "/.file", [auth, dest, ("Overwrite", "F")]), earlier)
