"""Documents written by ZIP writers other than zlib's users (issue 13): a
one-character save of the 100 KB-text .docx, re-zipped by Go's archive/zip,
by Rust's flate2 (miniz_oxide and zlib-rs backends), by Info-ZIP's `zip`
(its own deflater, not zlib's) and by 7-Zip (`7z a -tzip -mx=5`, its optimal
parser), through the real
device proxy and EPS. The proxy and the EPS negotiate edit-patch version 2,
whose recipes rebuild these writers' members from their content (edit-patch-v2.md
§3): the save costs under 1,000 bytes on the device's link, and the provider
receives the app's exact bytes. Before version 2 such members went as
PREFLATE corrections of the whole part (kilobytes per save).

The writers are the real programs (testbed/rezip.py builds them on first use).
"""

from __future__ import annotations

import zipfile
from io import BytesIO
from pathlib import Path

import pytest

import app_client as app
from testbed import rezip

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / ".cache" / "traces" / "writer-100k-middle-docx"
WRITERS = ("go", "flate2-miniz", "flate2-zlib-rs", "info-zip", "7zip")
LINK_BOUND = 1_000


@pytest.fixture(scope="module")
def tools():
    return rezip.build(WRITERS)


@pytest.fixture(scope="module")
def proxy(lab, eps):
    return lab.start_proxy("other-deflaters-laptop", eps)


def save_twice(lab, proxy, token: str, path: str, base: bytes, new: bytes) -> tuple[dict, int]:
    """The app uploads `base`, then `new`, to Dropbox through the proxy; the
    provider holds exactly `new`. Returns the proxy's record of the document
    and the bytes the second save cost on the device's link."""
    def record() -> dict:
        return [d for d in app.proxy_status(proxy)["documents"] if d["ref"].lower() == path][0]
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, base)
    assert code == 200, body
    before = record()["sent_bytes"]
    code, _, body = app.dropbox_upload(app.through(proxy), token, path, new)
    assert code == 200, body
    held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == path]
    assert held and held[0]["sha256"] == app.sha(new) and held[0]["size"] == len(new)
    doc = record()
    return doc, doc["sent_bytes"] - before


@pytest.mark.parametrize("writer", WRITERS)
def test_a_save_of_another_writers_document_costs_bytes_and_arrives_exact(lab, eps, proxy, tools, writer, tmp_path):
    if not (TRACE / "base.docx").exists():
        pytest.fail(f"trace {TRACE.name} missing: run `make traces`")
    base, new = (rezip.rezip_bytes(writer, tools, (TRACE / f).read_bytes(), str(tmp_path / f))
                 for f in ("base.docx", "new.docx"))
    original = zipfile.ZipFile(TRACE / "new.docx")
    assert zipfile.ZipFile(BytesIO(new)).read("word/document.xml") == original.read("word/document.xml")
    assert new != (TRACE / "new.docx").read_bytes(), "re-zipped: other compressed bytes"

    doc, sent = save_twice(lab, proxy, f"{writer}-user", f"/deflaters/{writer}.docx", base, new)
    assert doc["last_how"] == "patch", doc
    assert sent < LINK_BOUND, (writer, sent)


def test_a_picture_office_wrote_goes_as_its_pixels(lab, eps, proxy, tmp_path):
    """A 1600 x 900 screenshot from a Microsoft Office file of the shared corpus,
    added to the document as a stored PNG. Office cuts its zlib stream into
    a first IDAT chunk of 65,445 bytes and others of 65,524, which version 1's
    PNG recipe does not take: the picture went as its 555 kB deflate stream.
    Edit-patch version 2's recipe 11 (edit-patch-v2.md §3.7) sends its pixels,
    compressed, and the EPS makes the PNG again byte for byte. The lab's
    proxy minimises bytes (mode metered): the 4.3 MB of pixels are coded at
    zstd level 19, not at the everyday level 3 (docs/edit-patch.md, step 7)."""
    from testbed import shared
    if not (TRACE / "base.docx").exists():
        pytest.fail(f"trace {TRACE.name} missing: run `make traces`")
    png = zipfile.ZipFile(shared.corpus("pptx/ppt2010-template_bug59273.potx")).read("ppt/media/image1.png")
    base = (TRACE / "base.docx").read_bytes()
    out = BytesIO()
    with zipfile.ZipFile(BytesIO(base)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info.filename))
        dst.writestr(zipfile.ZipInfo("word/media/image1.png", (2026, 11, 29, 12, 0, 0)), png, compress_type=zipfile.ZIP_STORED)
    new = out.getvalue()

    doc, sent = save_twice(lab, proxy, "office-picture-user", "/deflaters/picture.docx", base, new)
    assert doc["last_how"] == "patch", doc
    # Its pixels at zstd level 19 and 10 kB of PREFLATE corrections: about
    # 441 kB; at the everyday level 3, 528 kB; as bytes (version 1), 542 kB.
    assert sent < len(png) - 100_000, (sent, len(png))
