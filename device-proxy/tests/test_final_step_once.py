"""Two final requests of one upload session at the same time (an app that
timed out and asked again while its first request was still on its way,
or two of its threads), through the real device proxy, EPS and Dropbox
test server: the file reaches the provider once; the first request gets its metadata and the other
what Dropbox answers for a session already finished, `lookup_failed/
not_found` (or the same metadata, when it came while the first one's
outcome was still unknown). `EdgeCourier._session` takes a session's final
step one request at a time (`FinalSteps`). Before, both requests found no
attempt for the session and each sent a SAVE: the file reached Dropbox
twice.
"""

from __future__ import annotations

import json
import threading

from app_client import sha, through
from test_faults import held, log_seq, uploads_since
from test_sessions_again import dbx_finish, dbx_start


def test_two_finishes_of_one_session_at_once_upload_the_file_once(lab, small, proxy):
    send = through(proxy)
    token, path = "once-at-a-time", "/once/a.docx"
    for attempt in range(3):  # the race needs both requests inside the first one's preparation: try a few times
        sid = dbx_start(send, token, small.v1)
        mark = log_seq(lab)
        answers: list = [None, None]
        go = threading.Barrier(2)

        def finish(i: int) -> None:
            go.wait()
            answers[i] = dbx_finish(send, token, sid, len(small.v1), path)

        threads = [threading.Thread(target=finish, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(a is not None for a in answers), answers
        firsts = [json.loads(a[2]) for a in answers if a[0] == 200]
        assert firsts and all(f["content_hash"] == firsts[0]["content_hash"] for f in firsts), answers
        for a in answers:
            if a[0] != 200:
                assert (a[0], json.loads(a[2])["error"]) == (409, {".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}}), a
        assert held(lab, "dropbox", token, path) == sha(small.v1)
        assert uploads_since(lab, mark, small.v1) == 1, f"round {attempt}: the file reached Dropbox twice"
