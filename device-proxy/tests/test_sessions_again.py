"""The final request of an upload session asked again after a SAVE whose
outcome the device did not learn (the link to the EPS lost its answer),
through the real device proxy, EPS and provider test servers: the retry
gets what the provider would answer for that very request, and no file
reaches the provider twice (`EdgeCourier._gathered_again`).

- The same request again: the earlier SAVE's answer (test_faults.py,
  test_batches.py).
- Another request (a Dropbox finish with another commit path, a last
  Graph fragment or Drive chunk with other bytes, a Nextcloud MOVE after
  other chunks): the earlier SAVE is sent again to learn its outcome; it
  committed, so the session is used up, and the app gets the provider's
  answer for a used-up session, not the old request's success; it did not
  commit, so the new request is a save of its own.
- A Dropbox session whose `finish` outcome is unknown, later named in a
  finish_batch_v2, and the reverse: the app learns the outcome.

Also the statistics of direct saves: a direct save's file is counted once
on the link (`ec-proxy status`: "sent" = bytes sent to the EPS).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import time
import urllib.parse
from pathlib import Path

import pytest

from app_client import dropbox_upload, proxy_status, sha, through
from test_faults import (
    RELAY_RETRY_WINDOW, CuttingRelay, dropbox_finish_batch, dropbox_sessions, eventually, held, log_seq, ok, uploads_since,
)
from testbed.lab import Eps, Proxy


@pytest.fixture
def relayed(lab, eps):
    """A proxy whose EPS link runs through a CuttingRelay (test_faults.py)."""
    relay = CuttingRelay(eps.device)
    name = f"again-relay-{time.monotonic_ns()}"
    proxy = lab.start_proxy(name, Eps(name="relay", state=Path("."), config_path=Path("."), device=relay.url.removeprefix("http://")),
                            "--eps-retry-window", str(RELAY_RETRY_WINDOW))
    yield relay, proxy
    proxy.stop()
    relay.close()


def holders(lab, provider: str, data: bytes) -> list[str]:
    """The paths (Drive: ids) of the files of `provider` that hold `data`."""
    return sorted(str(f.get("path") or f.get("id")) for f in lab.providers.files(provider) if f["sha256"] == sha(data))


def lost(relay: CuttingRelay, send_last) -> tuple:
    """Sends the app's last request with the EPS's answers lost: the app gets 504."""
    relay.cut_responses = 99
    try:
        r = send_last()
    finally:
        relay.cut_responses = 0
    assert r[0] == 504 and relay.cuts >= 1, r
    return r


# ---------------------------------------------------------------- Dropbox finish


DBX = "https://content.dropboxapi.com/2/files/upload_session/"


def dbx_head(token: str, arg: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream", "Dropbox-API-Arg": json.dumps(arg)}


def dbx_start(send, token: str, data: bytes) -> str:
    r = send("POST", DBX + "start", dbx_head(token, {"close": True}), data)
    assert r[0] == 200, r
    return json.loads(r[2])["session_id"]


def dbx_finish(send, token: str, sid: str, offset: int, path: str, mode: object = "overwrite"):
    arg = {"cursor": {"session_id": sid, "offset": offset}, "commit": {"path": path, "mode": mode, "autorename": False}}
    return send("POST", DBX + "finish", dbx_head(token, arg), b"")


def test_a_dropbox_finish_asked_again_with_another_path_gets_not_found(lab, small, relayed):
    """A finish of /a whose answer the link lost (the EPS committed /a);
    the app asks again, now to commit /b. Dropbox, whose session /a used
    up, answers `lookup_failed/not_found`; so must the device. Before, it
    handed the app /a's success for its request of /b: the app believed its
    file at /b, which Dropbox never got."""
    relay, proxy = relayed
    send = through(proxy)
    token, a, b = "again-path", "/again/a.docx", "/again/b.docx"
    sid = dbx_start(send, token, small.v1)
    mark = log_seq(lab)
    lost(relay, lambda: dbx_finish(send, token, sid, len(small.v1), a))
    assert held(lab, "dropbox", token, a) == sha(small.v1)

    r = dbx_finish(send, token, sid, len(small.v1), b)
    assert r[0] == 409, r
    assert json.loads(r[2])["error"] == {".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}}, r
    assert held(lab, "dropbox", token, b) is None
    assert uploads_since(lab, mark, small.v1) == 1, "the file reached Dropbox twice"
    # The same finish again, now: the session is gone, as at Dropbox.
    r = dbx_finish(send, token, sid, len(small.v1), a)
    assert r[0] == 409 and json.loads(r[2])["error"]["lookup_failed"][".tag"] == "not_found", r
    # The store learnt /a's version from the answer the app never got: the next save is a patch.
    assert ok(dropbox_upload(send, token, a, small.v2))
    assert eventually(lambda: _doc(proxy, a) is not None and _doc(proxy, a)["last_how"] == "patch"), _doc(proxy, a)


def _doc(proxy: Proxy, path: str):
    for d in proxy_status(proxy)["documents"]:
        if d["ref"].lower() in (path.lower(), f"root:{path.lower()}:"):
            return d
    return None


def test_a_refused_dropbox_finish_asked_again_with_another_commit_is_performed(lab, small, relayed):
    """A finish that Dropbox refused (an `update` of a revision it does not
    hold: 409 path/conflict), its answer lost; the app asks again with
    `overwrite`. Nothing was committed, so the new request is judged on its
    own, as Dropbox would: it commits the file, once. Before, the app got
    the old request's conflict for its new one."""
    relay, proxy = relayed
    send = through(proxy)
    token, path = "again-refused", "/again/refused.docx"
    assert ok(dropbox_upload(send, token, path, small.v0))
    sid = dbx_start(send, token, small.v1)
    mark = log_seq(lab)
    stale = {".tag": "update", "update": "0123456789abcdef"}
    lost(relay, lambda: dbx_finish(send, token, sid, len(small.v1), path, stale))
    assert held(lab, "dropbox", token, path) == sha(small.v0)

    r = dbx_finish(send, token, sid, len(small.v1), path, "overwrite")
    assert ok(r), r
    assert held(lab, "dropbox", token, path) == sha(small.v1)
    commits = [e for e in lab.providers.log()
               if e["seq"] > mark and e["route"] == "upload_session/finish" and e["status"] == 200]
    assert len(commits) == 1, commits


def test_a_finish_with_an_unknown_outcome_named_in_a_batch_gets_its_result(lab, small, relayed):
    """A finish whose answer the link lost (the EPS committed it); the app
    then names the session in a finish_batch_v2 (as rclone's batcher would
    after a failed single finish). The entry naming the same commit gets
    the commit's result; nothing is uploaded again. Before, the entry got
    `too_many_write_operations` for as long as the session lived: the app
    never learnt its file's outcome."""
    relay, proxy = relayed
    send = through(proxy)
    token, path = "again-into-batch", "/again/into-batch.docx"
    sid = dbx_start(send, token, small.v1)
    mark = log_seq(lab)
    lost(relay, lambda: dbx_finish(send, token, sid, len(small.v1), path))

    r = dropbox_finish_batch(send, token, [(sid, len(small.v1), path, "overwrite")])
    assert r[0] == 200, r
    (entry,) = json.loads(r[2])["entries"]
    assert entry[".tag"] == "success" and entry["path_lower"] == path.lower(), entry
    assert uploads_since(lab, mark, small.v1) == 1
    # Asked once more: used up, as at Dropbox.
    r = dropbox_finish_batch(send, token, [(sid, len(small.v1), path, "overwrite")])
    assert json.loads(r[2])["entries"][0]["failure"]["lookup_failed"][".tag"] == "not_found", r


def test_a_batch_session_with_an_unknown_outcome_finished_alone_gets_its_result(lab, small, relayed):
    """A finish_batch_v2 of two files whose answer the link lost (the EPS
    committed both); the app then finishes one of its sessions with
    upload_session/finish, same commit: it gets that file's metadata (a
    finish's answer, not the batch's), nothing is uploaded again, and the
    other entry's result is kept for the app's retry of the batch. A
    finish with another commit gets `not_found`. Before, the app got the
    whole batch's answer (`{"entries": [...]}`) for its single finish."""
    relay, proxy = relayed
    send = through(proxy)
    token, paths, news = "again-out-of-batch", ["/again/o1.docx", "/again/o2.docx"], [small.v1, small.v2]
    ids = dropbox_sessions(send, token, news)
    entries = [(sid, len(data), p, "overwrite") for sid, data, p in zip(ids, news, paths)]
    mark = log_seq(lab)
    lost(relay, lambda: dropbox_finish_batch(send, token, entries))
    assert all(held(lab, "dropbox", token, p) == sha(d) for p, d in zip(paths, news))

    r = dbx_finish(send, token, ids[0], len(news[0]), paths[0])
    assert r[0] == 200, r
    meta = json.loads(r[2])
    assert "entries" not in meta and meta["path_lower"] == paths[0].lower(), meta
    saves = relay.saves
    r = dropbox_finish_batch(send, token, [entries[1]])
    assert r[0] == 200 and json.loads(r[2])["entries"][0][".tag"] == "success", r
    assert relay.saves == saves, "the kept result answers it"
    assert uploads_since(lab, mark, news[0]) == 1 and uploads_since(lab, mark, news[1]) == 1


def test_a_batch_session_finished_alone_with_its_argument_in_the_query_gets_its_result(lab, small, relayed):
    """As above, with the finish's argument as `?arg=` (Dropbox reads it
    there too, as does the recogniser): the same commit gets the file's
    metadata. Before, the device read the argument only from the head field,
    found none, and answered `not_found` for a file Dropbox holds."""
    relay, proxy = relayed
    send = through(proxy)
    token, paths, news = "again-out-of-batch-query", ["/again/q1.docx", "/again/q2.docx"], [small.v1, small.v2]
    ids = dropbox_sessions(send, token, news)
    entries = [(sid, len(data), p, "overwrite") for sid, data, p in zip(ids, news, paths)]
    mark = log_seq(lab)
    lost(relay, lambda: dropbox_finish_batch(send, token, entries))
    arg = {"cursor": {"session_id": ids[0], "offset": len(news[0])}, "commit": {"path": paths[0], "mode": "overwrite", "autorename": False}}
    r = send("POST", DBX + "finish?arg=" + urllib.parse.quote(json.dumps(arg)),
             {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}, b"")
    assert r[0] == 200, r
    assert json.loads(r[2])["path_lower"] == paths[0].lower(), r
    assert uploads_since(lab, mark, news[0]) == 1


# ---------------------------------------------------------------- Graph, Drive, Nextcloud


def graph_session(send, token: str, path: str) -> str:
    r = send("POST", f"https://graph.microsoft.com/v1.0/me/drive/root:{path}:/createUploadSession", {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
             json.dumps({"item": {"@microsoft.graph.conflictBehavior": "replace"}}).encode())
    assert r[0] == 200, r
    return json.loads(r[2])["uploadUrl"]


def graph_fragment(send, url: str, data: bytes):
    return send("PUT", url, {"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}, data)


def test_a_graph_session_asked_again_with_other_bytes_gets_item_not_found(lab, small, relayed):
    """The last fragment of a Graph upload session, its answer lost (the EPS
    committed the file); the app sends a last fragment with other bytes.
    OneDrive's session is used up: 404 itemNotFound. Before, the app got the
    earlier file's 201 for bytes OneDrive never received."""
    relay, proxy = relayed
    send = through(proxy)
    token, path = "again-graph", "/Again/graph.docx"
    url = graph_session(send, token, path)
    mark = log_seq(lab)
    lost(relay, lambda: graph_fragment(send, url, small.v1))
    assert held(lab, "graph", token, path) == sha(small.v1)
    r = graph_fragment(send, url, small.v2)
    assert r[0] == 404 and json.loads(r[2])["error"]["code"] == "itemNotFound", r
    assert held(lab, "graph", token, path) == sha(small.v1)
    assert uploads_since(lab, mark, small.v1) == 1 and uploads_since(lab, mark, small.v2) == 0


def test_a_drive_session_asked_again_with_other_bytes_gets_not_found(lab, small, relayed):
    """The same for a Google Drive resumable upload: 404 notFound."""
    relay, proxy = relayed
    send = through(proxy)
    token = "again-drive"
    head = {"Authorization": f"Bearer {token}"}
    r = send("POST", "https://www.googleapis.com/upload/drive/v3/files?uploadType=resumable",
             {**head, "Content-Type": "application/json; charset=UTF-8"}, json.dumps({"name": "again.docx"}).encode())
    assert r[0] == 200, r
    location = r[1]["location"]

    def chunk(data: bytes):
        return send("PUT", location, {**head, "Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}, data)

    mark = log_seq(lab)
    lost(relay, lambda: chunk(small.v1))
    assert holders(lab, "drive", small.v1)
    r = chunk(small.v2)
    assert r[0] == 404 and json.loads(r[2])["error"]["errors"][0]["reason"] == "notFound", r
    assert not holders(lab, "drive", small.v2)
    assert uploads_since(lab, mark, small.v1) == 1


def drive_files(lab, token: str, data: bytes) -> list[str]:
    """The ids of `token`'s Drive files that hold `data` (ids are per account)."""
    return sorted(f["id"] for f in lab.providers.files("drive") if f["account"] == token and f["sha256"] == sha(data))


def drive_sdk_create(proxy, token: str, name: str, data: bytes, http_class=None):
    """google-api-python-client's resumable create of `data` as `name`
    through `proxy` (`http_class`: an httplib2.Http subclass to send with):
    the http object and the request, whose next_chunk() sends it."""
    import google_auth_httplib2
    import httplib2
    from google.oauth2.credentials import Credentials
    from googleapiclient.discovery import build
    from googleapiclient.http import MediaIoBaseUpload

    host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
    http = (http_class or httplib2.Http)(proxy_info=httplib2.ProxyInfo(3, host, int(port)), ca_certs=str(proxy.ca), timeout=120)
    svc = build("drive", "v3", http=google_auth_httplib2.AuthorizedHttp(Credentials(token=token), http=http),
                static_discovery=True, cache_discovery=False)
    media = MediaIoBaseUpload(io.BytesIO(data), mimetype="application/octet-stream", resumable=True, chunksize=256 * 1024)
    return http, svc.files().create(body={"name": name}, media_body=media, fields="id,md5Checksum,size")


def test_a_drive_status_query_after_a_lost_final_chunk_gets_the_file(lab, small, relayed):
    """A Google Drive resumable upload whose final chunk's answer the link
    to the EPS loses (the app gets 504; the EPS uploaded the file). The app
    asks for the upload's status as google-api-python-client does after an
    error (`PUT` with `Content-Range: bytes */N` and no body): Google
    answers a completed upload 200 with the file resource, and so does the
    device now, by sending the earlier SAVE again with its request id (the
    EPS answers from its outcome record): the provider got the file once.
    Before, the device answered 308 Resume Incomplete from the bytes it had
    gathered before that chunk. Then the same through the client library
    itself: its next_chunk() after the 504 ends with the file resource."""
    relay, proxy = relayed
    send = through(proxy)
    token = "again-drive-status"
    head = {"Authorization": f"Bearer {token}"}
    r = send("POST", "https://www.googleapis.com/upload/drive/v3/files?uploadType=resumable&fields=id,md5Checksum,size",
             {**head, "Content-Type": "application/json; charset=UTF-8"}, json.dumps({"name": "status.docx"}).encode())
    assert r[0] == 200, r
    location = r[1]["location"]
    data = small.v1
    mark = log_seq(lab)
    lost(relay, lambda: send("PUT", location, {**head, "Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}, data))
    assert holders(lab, "drive", data)
    r = send("PUT", location, {**head, "Content-Range": f"bytes */{len(data)}", "Content-Length": "0"})
    assert r[0] == 200, r
    meta = json.loads(r[2])
    assert meta["md5Checksum"] == hashlib.md5(data).hexdigest() and int(meta["size"]) == len(data), meta
    assert drive_files(lab, token, data) == [meta["id"]]
    assert uploads_since(lab, mark, data) == 1

    # google-api-python-client: a resumable create whose one chunk's answer is lost, then next_chunk() again.
    from googleapiclient.errors import HttpError

    other = small.v0
    _, request = drive_sdk_create(proxy, token, "status-sdk.docx", other)
    mark = log_seq(lab)
    relay.cut_responses = 99
    try:
        with pytest.raises(HttpError) as failed:
            request.next_chunk()
    finally:
        relay.cut_responses = 0
    assert failed.value.resp.status == 504
    progress, meta = request.next_chunk()
    assert meta is not None and meta["md5Checksum"] == hashlib.md5(other).hexdigest(), (progress, meta)
    assert drive_files(lab, token, other) == [meta["id"]]
    assert uploads_since(lab, mark, other) == 1


def test_a_drive_upload_whose_answer_the_app_lost_is_not_uploaded_again(lab, small, proxy):
    """google-api-python-client's resumable create, the answer to its final
    chunk lost on the app's side (the device got the provider's 200 through
    the EPS, the app's connection then broke): its next_chunk() asks for the
    upload's status (`bytes */N`), and Google answers a completed upload
    200 with the file resource. The device had forgotten the session after
    the success and answered 404 notFound, on which the app would upload
    the file a second time; now it answers what the provider answered, and
    the provider holds the file once."""
    import httplib2

    class LosingHttp(httplib2.Http):
        """Performs a chunk's request, then loses its answer (once)."""

        lose = 1

        def request(self, uri, method="GET", body=None, headers=None, *args, **kwargs):
            answer = super().request(uri, method, body, headers, *args, **kwargs)
            ranges = {k.lower(): v for k, v in (headers or {}).items()}.get("content-range", "")
            if method == "PUT" and ranges and not ranges.startswith("bytes */") and self.lose:
                self.lose -= 1
                raise ConnectionResetError("the answer was lost on its way to the app")
            return answer

    token = "again-drive-lost-answer"
    data = small.v2
    http, request = drive_sdk_create(proxy, token, "lost-answer.docx", data, LosingHttp)
    mark = log_seq(lab)
    with pytest.raises(ConnectionResetError):
        request.next_chunk()
    assert http.lose == 0
    progress, meta = request.next_chunk()
    assert meta is not None and meta["md5Checksum"] == hashlib.md5(data).hexdigest(), (progress, meta)
    assert drive_files(lab, token, data) == [meta["id"]]
    assert uploads_since(lab, mark, data) == 1


def test_a_nextcloud_move_asked_again_after_other_chunks_gets_not_found(lab, small, relayed):
    """A Nextcloud chunked upload's MOVE, its answer lost (the EPS committed
    the file, and Nextcloud removed the upload folder); the app puts its
    chunk again with other bytes and moves again. Nextcloud answers the
    MOVE of a folder that is gone 404; so must the device. Before, the app
    got the earlier file's 201."""
    relay, proxy = relayed
    send = through(proxy)
    user = "again-nc"
    auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode(),
            "Destination": f"https://cloud.example.com/remote.php/dav/files/{user}/again.docx"}
    folder = f"https://cloud.example.com/remote.php/dav/uploads/{user}/transfer-again"
    assert send("MKCOL", folder, auth, b"")[0] == 201

    def chunk_and_move(data: bytes):
        r = send("PUT", folder + "/00001", auth, data)
        assert ok(r), r
        return send("MOVE", folder + "/.file", {**auth, "OC-Total-Length": str(len(data))}, b"")

    mark = log_seq(lab)
    lost(relay, lambda: chunk_and_move(small.v1))
    assert holders(lab, "webdav", small.v1)
    r = chunk_and_move(small.v2)
    assert r[0] == 404, r
    assert not holders(lab, "webdav", small.v2)
    assert uploads_since(lab, mark, small.v1) == 1


# ---------------------------------------------------------------- direct saves in the statistics


@pytest.fixture(scope="module")
def direct_proxy(lab) -> Proxy:
    """A proxy whose EPS nobody runs: every save goes directly."""
    return lab.start_proxy("again-no-eps", None)


def test_a_direct_save_is_counted_once_on_the_link(lab, small, direct_proxy):
    """A single upload and an upload session that went directly (the EPS
    unreachable): `ec-proxy status` shows 0 sent to the EPS and the file
    once on the link. Before, the body was counted as sent to the EPS and
    the file again as the direct upload: link_bytes showed twice the file."""
    send = through(direct_proxy)
    token = "again-direct"
    single, session = "/direct/single.docx", "/direct/session.docx"
    assert ok(dropbox_upload(send, token, single, small.v1))
    sid = dbx_start(send, token, small.v2)
    assert ok(dbx_finish(send, token, sid, len(small.v2), session))
    assert held(lab, "dropbox", token, session) == sha(small.v2)
    assert eventually(lambda: all(_doc(direct_proxy, p) is not None for p in (single, session)))
    for p, data in ((single, small.v1), (session, small.v2)):
        d = _doc(direct_proxy, p)
        assert d["last_how"] == "direct" and d["saves"] == 1, d
        assert d["sent_bytes"] == 0 and d["whole_bytes"] == len(data) and d["link_bytes"] == len(data), d
