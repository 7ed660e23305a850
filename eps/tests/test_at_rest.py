"""Nothing at rest names a file, a path or an account, or holds a credential
(issue 8 item 5, spec §8, §5.4): after saves through every provider
procedure (Dropbox single, session and batch, Graph session, Drive
resumable, Nextcloud chunked) and a FETCH, every byte of every file under
the EPS's state folder (store, temporaries, in-flight markers, its log) is
searched for the file names, paths, accounts and tokens used.

Outcome records are sealed with a key derived from the request (its
credential included), so a retry after a restart still gets the recorded
answer: the second half checks that, and that the provider saw one upload.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

import ec_protocol as p

from .e2e import RawDevice, Uploader, download_request, dropbox_batch, dropbox_upload, full_item, log_seq, provider_requests_since, trace_sequences

MARK = "Qx9Vt" + uuid.uuid4().hex[:6]
TOKEN = f"tok-{MARK}-secret"
PROCEDURES = (("dropbox", "single"), ("dropbox", "session"), ("graph", "session"), ("drive", "resumable"), ("webdav", "chunked"))


def needles(names: list[str]) -> dict[str, bytes]:
    out = {"mark": MARK.encode(), "token": TOKEN.encode(), "account": b"alice"}
    for n in names:
        out[f"name {n}"] = n.encode()
        out[f"path /e2e/{n}"] = f"/e2e/{n}".encode()
    return out


def scan(folder: Path, needles: dict[str, bytes]) -> list[str]:
    found = []
    for f in sorted(folder.rglob("*")):
        if not f.is_file() or f.name == "eps.json":
            continue
        data = f.read_bytes()
        low = data.lower()
        for what, needle in needles.items():
            if needle.lower() in low:
                found.append(f"{f.relative_to(folder)}: {what}")
    return found


@pytest.fixture(scope="module")
def saved(start_eps):
    eps = start_eps("at-rest")
    versions = trace_sequences()["docx"][0]
    client = eps.client()
    names = []
    for provider, style in PROCEDURES:
        up = Uploader(provider, style, token=TOKEN)
        name = f"{MARK}-plan-{provider}-{style}.docx"
        names.append(name)
        for base, data in ((None, versions[0]), (versions[0], versions[1])):
            out = up.save(client, name, data, base)
            assert isinstance(out, p.ProviderResponse) and out.succeeded, (provider, style, out)
        if provider == "dropbox" and style == "single":
            got = client.fetch(download_request(provider, name, None, token=TOKEN), up.doc(name), None)
            assert isinstance(got, p.FetchResponse) and got.final.status == 200, got
    batch = [(f"{MARK}-batch-{i}.docx", versions[0], None) for i in range(2)]
    names += [n for n, _, _ in batch]
    out = dropbox_batch(client, batch, token=TOKEN)
    assert isinstance(out, p.ProviderResponse) and out.succeeded, out
    client.close()
    return eps, names


def test_the_state_folder_names_no_file_path_account_or_token(saved):
    eps, names = saved
    records = list((eps.state / "store" / "docs").rglob("*"))
    assert any(f.is_file() for f in records), "no document pointer written"
    found = scan(eps.state, needles(names))
    assert found == [], "\n".join(found)


def test_the_scan_would_see_a_name(saved, tmp_path):
    # The scan itself works: a file holding a name is found.
    eps, names = saved
    (tmp_path / "x").write_bytes(b'{"path_display": "/e2e/' + names[0].encode() + b'"}')
    assert scan(tmp_path, needles(names))


def test_a_retry_after_a_restart_is_answered_from_the_sealed_record(lab, saved):
    eps, _ = saved
    data = trace_sequences()["docx"][0][2]
    name = f"{MARK}-retry.docx"
    device = RawDevice(eps)
    device.hello()
    doc = p.DocKey(p.DROPBOX, b"alice", f"/e2e/{name}".encode())
    rid = uuid.uuid4().bytes[:8]
    save = device.save_message(p.SINGLE, [dropbox_upload(name, token=TOKEN)], [full_item(data, doc)], request_id=rid)
    mark = log_seq(lab)
    status, first = device.send(save)
    assert status == 200 and isinstance(first, p.SaveResult), first
    eps.restart()
    device = RawDevice(eps)
    device.hello()
    again = device.save_message(p.SINGLE, [dropbox_upload(name, token=TOKEN)], [full_item(data, doc)], request_id=rid)
    status, second = device.send(again)
    assert status == 200 and isinstance(second, p.SaveResult) and second.replayed, second
    uploads = [e for e in provider_requests_since(lab, mark) if e.get("body_sha256") == hashlib.sha256(data).hexdigest()]
    assert len(uploads) == 1
    # The record is sealed: the answer names the file, the state folder does not.
    assert scan(eps.state, needles([name])) == []
