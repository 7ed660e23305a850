"""The spot check's fallback, end to end (issue 13): the device proxy's diff
checks a block-parallel part's recipe on a sample of its blocks only
(`ec_patch.diff(spot_check=True)`), so a document whose unsampled blocks
were written otherwise gets a patch whose recipe is wrong. The real EPS
rebuilds it, its SHA-256 check refuses the result (`patch_failed`), the
proxy's EPS client resends the file whole, and the provider holds exactly
the app's bytes. The document's next save is diffed with every block
checked, and goes as a patch.

The document: a LibreOffice save (the 1 MB-text trace) whose
`word/document.xml` is compressed again block by block as LibreOffice's
ThreadedDeflater does (128 KiB blocks, each a raw zlib stream preset with
the 32 KiB before it, ended with a sync flush), one late block at zlib level
1 instead of 6: what a writer that changed its level between blocks, or a
different deflater for one block, would make.

And the memory the spot check's diffs keep between saves: `--keep-idle`
seconds after the last save the proxy lets go of it.
"""

from __future__ import annotations

import re
import struct
import time
import zipfile
import zlib
from io import BytesIO
from pathlib import Path

import pytest

import app_client as app
from testbed.lab import Proxy

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / ".cache" / "traces" / "writer-1m-middle-docx"
BLOCK = 128 << 10
WINDOW = 32 << 10
PART = "word/document.xml"


def blocks(content: bytes, level_of) -> bytes:
    """LibreOffice's block-parallel deflate of `content`, block k at zlib level `level_of(k)`."""
    out = []
    count = max(1, -(-len(content) // BLOCK))
    for k in range(count):
        start = k * BLOCK
        kw = {"zdict": content[start - WINDOW:start]} if k else {}
        c = zlib.compressobj(level_of(k), zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, **kw)
        last = k == count - 1
        out.append(c.compress(content[start:start + BLOCK]) + c.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH))
    return b"".join(out)


def with_member_data(doc: bytes, name: str, data: bytes) -> bytes:
    """`doc` with member `name`'s compressed data replaced (same content):
    its sizes in the local header, data descriptor and central directory,
    and every later offset, moved accordingly."""
    z = zipfile.ZipFile(BytesIO(doc))
    info = z.getinfo(name)
    h = info.header_offset
    n, m = struct.unpack_from("<HH", doc, h + 26)
    start = h + 30 + n + m
    end = start + info.compress_size
    delta = len(data) - info.compress_size
    eocd = doc.rindex(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack_from("<II", doc, eocd + 12)
    head = bytearray(doc[:start])
    if struct.unpack_from("<I", head, h + 18)[0]:
        struct.pack_into("<I", head, h + 18, len(data))
    middle = bytearray(doc[end:cd_offset])
    if info.flag_bits & 8:
        at = 8 if middle[:4] == b"PK\x07\x08" else 4
        struct.pack_into("<I", middle, at, len(data))
    cd = bytearray(doc[cd_offset:cd_offset + cd_size])
    p = 0
    while p < len(cd):
        n, m, k = struct.unpack_from("<HHH", cd, p + 28)
        offset = struct.unpack_from("<I", cd, p + 42)[0]
        if offset == h:
            struct.pack_into("<I", cd, p + 20, len(data))
        elif offset > h:
            struct.pack_into("<I", cd, p + 42, offset + delta)
        p += 46 + n + m + k
    tail = bytearray(doc[cd_offset + cd_size:])
    struct.pack_into("<I", tail, 16, cd_offset + delta)
    return bytes(head) + data + bytes(middle) + bytes(cd) + bytes(tail)


@pytest.fixture(scope="module")
def proxy(lab, eps) -> Proxy:
    # The lab's proxies minimise bytes (a patch whenever smaller); the spot check is asked for explicitly.
    return lab.start_proxy("spot-check-laptop", eps, "--spot-check", "on")


def test_a_wrong_claim_is_resent_whole_and_the_provider_gets_the_apps_bytes(lab, eps, proxy):
    if not (TRACE / "base.docx").exists():
        pytest.fail(f"trace {TRACE.name} missing: run `make traces`")
    base, new = (TRACE / "base.docx").read_bytes(), (TRACE / "new.docx").read_bytes()
    content = zipfile.ZipFile(BytesIO(new)).read(PART)
    info = zipfile.ZipFile(BytesIO(new)).getinfo(PART)
    h = info.header_offset
    n, m = struct.unpack_from("<HH", new, h + 26)
    original = new[h + 30 + n + m:h + 30 + n + m + info.compress_size]
    count = -(-len(content) // BLOCK)
    assert count >= 8
    # The precondition: Python's zlib, block by block, writes LibreOffice's bytes exactly.
    assert blocks(content, lambda k: 6) == original, "Python's zlib does not reproduce LibreOffice's blocks here"
    odd = count - 3  # after the edit's block (the middle), before the last: not sampled
    mixed = with_member_data(new, PART, blocks(content, lambda k: 1 if k == odd else 6))
    assert mixed != new and zipfile.ZipFile(BytesIO(mixed)).read(PART) == content
    assert zipfile.ZipFile(BytesIO(mixed)).testzip() is None

    token, path = "spot-user", "/spot/report.docx"
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, base)
    assert code == 200, body
    failed_before = eps.metric("ec_eps_requests_total", 'outcome="patch_failed"')
    full_before = eps.metric("ec_eps_device_bytes_total", 'kind="full"')
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, mixed)
    assert code == 200, body
    held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
    assert held and held[0]["sha256"] == app.sha(mixed) and held[0]["size"] == len(mixed)
    # How: the patch was refused by the EPS's check and the file resent whole.
    assert eps.metric("ec_eps_requests_total", 'outcome="patch_failed"') == failed_before + 1
    assert eps.metric("ec_eps_device_bytes_total", 'kind="full"') - full_before >= len(mixed)
    doc = [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == path][0]
    assert doc["last_how"] == "full", doc

    # The next save of this document: every block checked (its patch applies), as a patch.
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, new)
    assert code == 200, body
    held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
    assert held[0]["sha256"] == app.sha(new)
    assert eps.metric("ec_eps_requests_total", 'outcome="patch_failed"') == failed_before + 1
    doc = [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == path][0]
    assert doc["last_how"] == "patch", doc
    assert "did not take a spot-checked patch" in proxy.log_path.read_text(errors="replace")


def test_spot_checked_patches_of_libreoffice_saves_go_as_patches(lab, eps, proxy):
    """The usual case: LibreOffice's saves, spot-checked, go as patches and arrive exact."""
    versions = [(ROOT / ".cache" / "traces" / t / f).read_bytes()
                for t, f in (("writer-1m-middle-docx", "base.docx"), ("writer-1m-middle-docx", "new.docx"),
                             ("writer-1m-end-docx", "new.docx"), ("writer-1m-start-docx", "new.docx"))]
    token, path = "spot-user-2", "/spot/chain.docx"
    failed_before = eps.metric("ec_eps_requests_total", 'outcome="patch_failed"')
    for i, v in enumerate(versions):
        code, _, body = app.dropbox_upload(app.through(proxy), token, path, v)
        assert code == 200, body
        held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
        assert held[0]["sha256"] == app.sha(v)
        doc = [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == path][0]
        assert doc["last_how"] == ("full" if i == 0 else "patch"), (i, doc)
    assert eps.metric("ec_eps_requests_total", 'outcome="patch_failed"') == failed_before


def test_kept_contents_are_let_go_of_after_the_idle_time(lab, eps):
    """The diffs keep the large parts they inflated for the next save of the
    document; `--keep-idle` seconds after the last save the proxy lets go of
    them (a log line says how much), and the next save is still a patch,
    exact at the provider."""
    idle = lab.start_proxy("keep-idle", eps, "--spot-check", "on", "--keep-idle", "2")
    versions = [(ROOT / ".cache" / "traces" / "writer-1m-middle-docx" / f).read_bytes() for f in ("base.docx", "new.docx")]
    token, path = "keep-idle-user", "/spot/idle.docx"
    for v in versions:
        code, _, body = app.dropbox_upload(app.through(idle), token, path, v)
        assert code == 200, body
    deadline = time.monotonic() + 60
    pattern = re.compile(r"let go of (\d+) bytes of document contents kept from the last saves")
    while not (found := pattern.search(idle.log_path.read_text(errors="replace"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found, "no 'let go of' line in the proxy's log"
    # word/document.xml (1.78 MB of XML), base and new, kept by the spot-checked diff.
    assert int(found.group(1)) > 3_000_000, found.group(0)
    code, _, body = app.dropbox_upload(app.through(idle), token, path, versions[0])
    assert code == 200, body
    held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
    assert held[0]["sha256"] == app.sha(versions[0])
    doc = [d for d in app.proxy_status(idle)["documents"] if d["ref"].lower() == path][0]
    assert doc["last_how"] == "patch", doc
    idle.stop()


def test_only_a_refuted_rebuild_turns_the_spot_check_off():
    """A spot-checked patch resent whole because the EPS lacked its base
    (`base_unknown`: the saves before it went directly, as the rule's
    exploration sends them) says nothing about the recipes: the document
    keeps its spot check. `patch_failed` and `target_mismatch` turn it off."""
    import types

    import ec_protocol as ecp
    from ec_proxy.addon import EdgeCourier

    addon = EdgeCourier()
    doc = ecp.DocKey(ecp.DROPBOX, b"u", b"/a.docx")
    addon._spot_refuted([doc], [True], types.SimpleNamespace(kinds=["full"], resends={"base_unknown"}))
    assert doc not in addon.full_check
    for code in ("patch_failed", "target_mismatch"):
        addon.full_check.clear()
        addon._spot_refuted([doc], [True], types.SimpleNamespace(kinds=["full"], resends={"base_unknown", code}))
        assert doc in addon.full_check, code
