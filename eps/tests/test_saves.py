"""Saves of real office documents through the whole path, for every
provider and upload style: device-side edit patch -> EPS (rebuild, verify)
-> provider test server (the provider's own upload requests).

After every save the provider holds a file whose size, SHA-256 and
provider hash (Dropbox content_hash, OneDrive quickXorHash, Drive
md5Checksum, Nextcloud OC-Checksum) are the device's, and every save after
the first travels as a PATCH costing a small fraction of the file on the
device link (issue 3, "Must show", first point).
"""

from __future__ import annotations

import json

import pytest

import ec_protocol as p

from .e2e import (
    FORMATS,
    UPLOADERS,
    Uploader,
    corpus_files,
    delta,
    device_bytes,
    dropbox_batch,
    edited,
    log_seq,
    provider_requests_since,
    provider_hash,
    sha256,
    trace_sequences,
)


@pytest.fixture(scope="module")
def sequences():
    return trace_sequences()


def response_hash(provider: str, body: bytes):
    """The provider hash in the provider's own answer to the upload, when its API returns one."""
    if provider == "dropbox":
        return json.loads(body).get("content_hash")
    if provider == "graph":
        return json.loads(body)["file"]["hashes"]["quickXorHash"]
    if provider == "drive":
        return json.loads(body).get("md5Checksum")
    return None  # WebDAV answers PUT / MOVE with headers only


def check_held(lab, up: Uploader, name: str, data: bytes, out) -> None:
    assert isinstance(out, p.ProviderResponse), f"{up.label} {name}: {out}"
    assert out.succeeded, f"{up.label} {name}: {out.status} {out.body[:300]!r}"
    assert not out.hash_disagreement
    held = up.held(lab, name)
    assert held is not None, f"{up.label}: the provider holds no {name}"
    assert (held["size"], held["sha256"]) == (len(data), sha256(data))
    hash_name, value = provider_hash(up.provider, data)
    assert held["provider_hash"][hash_name] == value
    in_response = response_hash(up.provider, out.body)
    if in_response is not None:
        assert in_response == value


def save_sequence(lab, eps, client, up: Uploader, name: str, versions: list[bytes]) -> list[tuple[int, int]]:
    """Saves `versions` in order to one document; checks the provider after
    each save and that every save after the first went as a PATCH. Returns
    (file size, device bytes in) per save after the first."""
    costs = []
    base = None
    for n, data in enumerate(versions):
        before = device_bytes(eps)
        out = up.save(client, name, data, base)
        used = delta(device_bytes(eps), before)
        check_held(lab, up, name, data, out)
        if base is None:
            assert used[("in", "full")] == len(data), "a first save goes FULL"
        else:
            assert used[("in", "full")] == 0, f"{up.label} {name} v{n}: went FULL, not as a patch"
            assert 0 < used[("in", "patch")] < len(data)
            costs.append((len(data), sum(v for (d, _), v in used.items() if d == "in")))
        base = data
    return costs


def styles():
    for provider, style in UPLOADERS:
        yield pytest.param(provider, style, id=f"{provider}-{style}")


@pytest.mark.parametrize("provider,style", list(styles()))
def test_libreoffice_traces(lab, eps, client, sequences, provider, style):
    """Two formats per upload style (each of the six formats at least twice
    over all styles): every LibreOffice trace sequence of the first, the
    smallest of the second."""
    i = UPLOADERS.index((provider, style))
    up = Uploader(provider, style)
    costs = []
    for fmt, chosen in ((FORMATS[i % 6], sequences[FORMATS[i % 6]]), (FORMATS[(i + 2) % 6], sequences[FORMATS[(i + 2) % 6]][:1])):
        for k, versions in enumerate(chosen):
            assert len(versions) >= 3
            costs += save_sequence(lab, eps, client, up, f"trace-{up.label}-{fmt}-{k}.{fmt}", versions)
    for size, sent in costs:
        # A LibreOffice re-save after a small edit: the device sends a small
        # fraction of the file (the 1k Writer trace, 5.5 kB, is the worst case).
        assert sent * 4 < size or (size < 10_000 and sent < 2_500), (size, sent)
    assert sum(s for _, s in costs) * 20 < sum(z for z, _ in costs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_real_corpus(lab, eps, client, fmt):
    """Real-world documents of the format from several producers (five,
    spread over the size range), spread over the upload styles: a FULL first
    save, then two edited versions as PATCHes."""
    styles = list(UPLOADERS)
    files = corpus_files(fmt)
    for k, path in enumerate(files[:: max(1, len(files) // 5)][:5]):
        provider, style = styles[(k + FORMATS.index(fmt)) % len(styles)]
        up = Uploader(provider, style)
        original = path.read_bytes()
        costs = save_sequence(lab, eps, client, up, f"corpus-{up.label}-{k}.{fmt}", [original, edited(original, 1), edited(original, 2)])
        for size, sent in costs:
            assert sent * 10 < size or sent < 2_000, (path.name, size, sent)


def test_dropbox_batch(lab, eps, client, sequences):
    """finish_batch_v2 with two files, twice: FULL items, then both as PATCH."""
    a, b = sequences["docx"][0], sequences["xlsx"][0]
    up = Uploader("dropbox", "batch")
    for n in range(3):
        before = device_bytes(eps)
        out = dropbox_batch(client, [("batch-a.docx", a[n], a[n - 1] if n else None),
                                     ("batch-b.xlsx", b[n], b[n - 1] if n else None)])
        used = delta(device_bytes(eps), before)
        assert isinstance(out, p.ProviderResponse) and out.status == 200, out
        entries = json.loads(out.body)["entries"]
        assert [e[".tag"] for e in entries] == ["success", "success"]
        for name, data, entry in (("batch-a.docx", a[n], entries[0]), ("batch-b.xlsx", b[n], entries[1])):
            held = up.held(lab, name)
            assert (held["size"], held["sha256"]) == (len(data), sha256(data))
            assert held["provider_hash"]["content_hash"] == entry["content_hash"] == provider_hash("dropbox", data)[1]
        if n:
            assert used[("in", "full")] == 0 and used[("in", "patch")] > 0


def chunked_save(lab, client, sequences, up: Uploader, route_min: int) -> None:
    """The upload-session procedures really chunk: a 380 kB document takes
    several provider requests with the lab's small chunk sizes."""
    big = sequences["docx"][-1][0]
    assert len(big) > 327_680
    seq = log_seq(lab)
    check_held(lab, up, f"chunks-{up.label}.docx", big, up.save(client, f"chunks-{up.label}.docx", big, None))
    calls = provider_requests_since(lab, seq)
    assert len(calls) >= route_min, (up.label, [(e["method"], e["path"]) for e in calls])
    assert all(e["status"] in (200, 201, 202, 204, 308) for e in calls)


@pytest.mark.parametrize("provider,style,route_min", [("dropbox", "session", 5), ("drive", "resumable", 3), ("webdav", "chunked", 6)])
def test_session_chunks(lab, eps, client, sequences, provider, style, route_min):
    chunked_save(lab, client, sequences, Uploader(provider, style), route_min)


def test_graph_session_chunks(lab, eps, client, sequences):
    chunked_save(lab, client, sequences, Uploader("graph", "session"), 3)


def test_drive_resumable_with_upload_content_length(lab, eps, client, sequences):
    """Drive's initiation may announce the size (X-Upload-Content-Length); the EPS checks it equals the file's."""
    versions = sequences["xlsx"][0]
    save_sequence(lab, eps, client, Uploader("drive", "resumable", upload_length=True), "announced.xlsx", versions)
