"""The official Dropbox Python SDK (`dropbox` 12.x from PyPI, unmodified)
through ec-proxy and the real EPS, and through a plain mitmproxy (no
EdgeCourier) for comparison.

Three saves of a LibreOffice document, each with another of the SDK's
upload paths: `files_upload` (one request), its sequential transfer helper
(`upload_session/start` with no bytes, then `finish` carrying the file)
and its parallel helper (a `concurrent` session: `append_v2` with the file,
then `finish` with no bytes); the SDK sends a `content_hash` of each call's
own body on every one of them by default. Then a real document from the
shared corpus, saved and edited. Downloads with `files_download` and the
parallel download helper (`Range` requests). Checked: the SDK's own
results, the provider holding exactly the SDK's bytes (SHA-256 and Dropbox
content_hash), the saves after the first travelling as patches of under
1,000 bytes on the device link, and the same outcome with and without
EdgeCourier.
"""

from __future__ import annotations

import hashlib

import dropbox
import pytest
from dropbox import file_transfer, files

import link_tap
from sdk_lab import LINK_BOUND, ROUTES, SdkLab, corpus_document, documents, one_word_edit, sdk_lab


def content_hash(data: bytes) -> str:
    from dropbox.content_hash import content_hash as h

    return h(data)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from sdk_lab(tmp_path_factory, "sdk-dropbox")


def client(lab: SdkLab, route: str, token: str) -> dropbox.Dropbox:
    r = lab.route(route)
    # The SDK's own session: it pins its CA bundle (`ca_certs`) in its adapter.
    session = dropbox.create_session(proxies={"https": r.url}, ca_certs=str(r.ca))
    session.trust_env = False  # else requests prefers REQUESTS_CA_BUNDLE from the environment over the session's CA
    return dropbox.Dropbox(oauth2_access_token=token, session=session, max_retries_on_error=0)


def check_held(lab: SdkLab, token: str, path: str, data: bytes, meta) -> None:
    assert meta.content_hash == content_hash(data)
    assert meta.size == len(data)
    held = lab.held("dropbox", token)[path]
    assert held["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("route", ROUTES)
def test_dropbox_sdk_three_saves_and_downloads(lab: SdkLab, route: str):
    token = f"sdk-dbx-{route}"
    dbx = client(lab, route, token)
    v = documents()
    path = "/SDK/Report.docx"
    sent: list[int] = []

    def link() -> int:
        return lab.sent("/sdk/report.docx") if route == "edgecourier" else 0

    mark = lab.tap.mark()
    # 1. files_upload: the whole file in one request (the first save goes whole)
    before = link()
    meta = dbx.files_upload(v.v0, path, mode=files.WriteMode.overwrite)
    check_held(lab, token, path, v.v0, meta)
    sent.append(link() - before)
    # 2. the sequential transfer helper: start (empty, content_hash of b""), finish with the file and its hash
    before = link()
    result = file_transfer.Uploader(dbx).upload(file_transfer.BytesUpload(v.v1), files.CommitInfo(path, mode=files.WriteMode.overwrite))
    check_held(lab, token, path, v.v1, result.metadata)
    sent.append(link() - before)
    # 3. the parallel helper: a concurrent session, append_v2 with the file and its hash, finish with none
    before = link()
    result = file_transfer.Uploader(dbx).upload(file_transfer.BytesUpload(v.v2), files.CommitInfo(path, mode=files.WriteMode.overwrite),
                                                file_transfer.UploadOptions(parallel_uploads=2))
    check_held(lab, token, path, v.v2, result.metadata)
    sent.append(link() - before)

    # downloads: plain, and the parallel helper (Range: bytes=0-0, then the rest in parts)
    meta, resp = dbx.files_download(path)
    assert resp.content == v.v2 and meta.content_hash == content_hash(v.v2)
    target = file_transfer.Bytes()
    got = file_transfer.Downloader(dbx).download(path, target, file_transfer.DownloadOptions(parallel_downloads=3))
    assert target.bytes() == v.v2 and got.metadata.rev == meta.rev
    old = file_transfer.Bytes()
    file_transfer.Downloader(dbx).download(f"rev:{result.metadata.rev}", old)
    assert old.bytes() == v.v2

    if route == "edgecourier":
        assert sent[0] > len(v.v0) / 2, sent  # the first save carried the file
        # The goal is under 1,000 B; see LINK_BOUND in sdk_lab for what was measured.
        assert all(0 < s < LINK_BOUND for s in sent[1:]), f"device-link bytes per save: {sent}"
        # What the EPS got for the two session saves (spec §6.2): finish heads
        # without the SDK's per-call content_hash, and device-issued session
        # ids that differ only in their counter (a few bytes of head delta).
        finishes = [b for b in link_tap.saves(lab.tap, mark) if b.bindings and b.bindings[0]]
        assert len(finishes) == 2, [b.heads for b in link_tap.saves(lab.tap, mark)]
        for b in finishes:
            arg = [ln for ln in b.heads[0].split(b"\n") if ln.startswith(b"dropbox-api-arg: ")]
            assert arg and b"content_hash" not in arg[0], arg
        a, b = (f.bindings[0] for f in finishes)
        assert a != b and a[:38] == b[:38] and len(a) <= 40, (a, b)  # "pid_upload_session:ec-" and the prefix


@pytest.mark.parametrize("route", ROUTES)
def test_dropbox_sdk_real_corpus_document(lab: SdkLab, route: str):
    """A document not made by LibreOffice, and an edit of it rewritten by
    Python's zipfile, saved with the sequential helper."""
    token = f"sdk-dbx-corpus-{route}"
    dbx = client(lab, route, token)
    name, data = corpus_document(".docx")
    edited = one_word_edit(data)
    assert edited is not None, name
    path = f"/Corpus/{name}"
    sent = []
    for version in (data, edited, one_word_edit(edited)):
        before = lab.sent(path) if route == "edgecourier" else 0
        result = file_transfer.Uploader(dbx).upload(file_transfer.BytesUpload(version), files.CommitInfo(path, mode=files.WriteMode.overwrite))
        check_held(lab, token, path, version, result.metadata)
        sent.append(lab.sent(path) - before if route == "edgecourier" else 0)
        _, resp = dbx.files_download(path)
        assert resp.content == version
    if route == "edgecourier":
        # A real corpus document's one-word edits, too, under the 1,000 B.
        assert all(0 < s < LINK_BOUND for s in sent[1:]), f"device-link bytes per save: {sent}"


def test_dropbox_sdk_per_call_hash_refused_like_dropbox(lab: SdkLab):
    """A per-call content_hash that does not match the call's body: the
    device answers content_hash_mismatch itself, as Dropbox does, and no
    file changes (the SDK's own error type)."""
    results = {}
    for route in ROUTES:
        dbx = client(lab, route, f"sdk-dbx-bad-{route}")
        first = b"PK\x03\x04 first part"
        start = dbx.files_upload_session_start(first)
        with pytest.raises(dropbox.exceptions.ApiError) as e:
            dbx.files_upload_session_append_v2(b" second part", files.UploadSessionCursor(start.session_id, len(first)),
                                               content_hash=content_hash(b"something else"))
        results[route] = e.value.error.is_content_hash_mismatch()
    assert results == {"edgecourier": True, "plain": True}
