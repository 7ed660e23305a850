"""Debian's rclone 1.60, unmodified, against the Dropbox, OneDrive and
WebDAV/Nextcloud test servers, reached through a plain mitmproxy that
redirects the providers' real host names to the testbed (testbed/rclone).

For each backend rclone uploads a sequence of edited real office documents
(the traces' base, then new version, under the same names) plus one real
document large enough to need several upload chunks; after each step
rclone's own hash check against the provider passes, the digests rclone reads
from the provider are the provider's documented hashes of the local bytes,
and the testbed holds exactly those files (SHA-256 through the admin API).
The request log shows which upload path rclone took.

Skipped when rclone or mitmdump is missing.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path

import pytest

from testbed.lab import start_providers
from testbed.providers.hashes.dropbox import dropbox_content_hash
from testbed.providers.hashes.quickxor import quickxor_base64
from testbed.rclone import MITMDUMP, RCLONE, MitmRedirect, RcloneError, RcloneRemote, write_save
from testbed.shared import corpus

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".cache" / "traces"
CORPUS = corpus()
#: Edited documents: (trace folder, extension); base then new go up under one name.
EDITED = [
    ("writer-1k-start-docx", "docx"),  # 5 KB: one request
    ("impress-40slides-title-pptx", "pptx"),  # 80 KB
    ("calc-5000rows-row-middle-xlsx", "xlsx"),  # 273 KB: 2 chunks of 256 KiB
    ("writer-1m-middle-docx", "docx"),  # 381 KB: 2 chunks of 256 KiB / 320 KiB
]
#: One real document far over the chunk sizes below (several chunks per upload).
BIG = CORPUS / "odp" / "libreoffice25.8-mac_odf_presentation_02.odp"
#: Chunk flags: small enough that the traces above need upload sessions.
CHUNK_FLAGS = {
    "dropbox": ("--dropbox-chunk-size", "256k"),
    "onedrive": ("--onedrive-chunk-size", "320k"),
    "webdav": (),
}
PROVIDER = {"dropbox": "dropbox", "onedrive": "graph", "webdav": "webdav"}

pytestmark = pytest.mark.skipif(
    shutil.which(RCLONE) is None or not MITMDUMP.exists(),
    reason="needs rclone (apt-get install rclone) and mitmdump in the venv",
)


def _inputs_present() -> bool:
    return BIG.exists() and all((TRACES / t / f"base.{ext}").exists() for t, ext in EDITED)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Provider servers that, like OneDrive did for rclone 1.60, ignore an
    Authorization header on Graph upload fragments; plus the redirecting proxy."""
    work = tmp_path_factory.mktemp("rclone-lab")
    providers = start_providers(work, "--graph-fragment-auth", "accept", "--quiet")
    proxy = MitmRedirect(providers, work).start()
    yield providers, proxy, work
    proxy.stop()
    providers.proc.terminate()
    providers.proc.wait(10)


def remote_for(lab, kind: str, tmp_path: Path, **kw) -> RcloneRemote:
    providers, proxy, _ = lab
    providers.admin("POST", "reset")
    return RcloneRemote(kind, providers, proxy.url, proxy.ca_cert, tmp_path / "rclone", **kw)


def provider_digest(hash_type: str, data: bytes) -> str:
    """The provider's documented hash of `data`, in rclone's hex spelling."""
    if hash_type == "dropbox":
        return dropbox_content_hash(data)
    if hash_type == "quickxor":
        return base64.b64decode(quickxor_base64(data)).hex()
    assert hash_type == "sha1"
    return hashlib.sha1(data).hexdigest()


def stage(folder: Path, version: str) -> dict[str, bytes]:
    """Writes version `base` or `new` of every edited document into `folder`,
    the new version stamped as a later save (`write_save`: a trace pair whose
    edit kept the size was otherwise skipped by rclone on a fast machine)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = {}
    for trace, ext in EDITED:
        data = (TRACES / trace / f"{version}.{ext}").read_bytes()
        name = f"{trace.rsplit('-', 1)[0]}.{ext}"
        write_save(folder / name, data, 0 if version == "base" else 1)
        out[name] = data
    return out


def assert_provider_holds(providers, kind: str, folder: str, expected: dict[str, bytes]) -> None:
    held = {f["path"].lstrip("/"): f["sha256"] for f in providers.files(PROVIDER[kind])}
    want = {f"{folder}/{name}": hashlib.sha256(data).hexdigest() for name, data in expected.items()}
    assert held == want


#: Routes that only read (Dropbox answers every call with POST, so the method alone does not tell).
READS = {"get_metadata", "list_folder", "download", "get_drive", "get_item", "list_children", "propfind", "get", "status"}


def upload_routes(providers, kind: str) -> list[str]:
    """The writing requests rclone made, in order, by testbed route name."""
    return [e["route"] for e in providers.log() if e["provider"] == PROVIDER[kind] and e["route"] not in READS]


@pytest.mark.skipif(not _inputs_present(), reason="needs .cache/traces and the real corpus")
@pytest.mark.parametrize("kind", ["dropbox", "onedrive", "webdav"])
def test_rclone_uploads_edited_documents_and_its_hash_check_passes(lab, kind, tmp_path):
    providers = lab[0]
    remote = remote_for(lab, kind, tmp_path)
    local = tmp_path / "local"
    for version in ("base", "new"):
        docs = stage(local, version)
        remote.copy(local, "Sync", *CHUNK_FLAGS[kind])
        # rclone compares the provider's hashes with its own hashes of the local files
        report = remote.check(local, "Sync")
        assert f"{len(docs)} matching files" in report and "0 differences found" in report
        assert remote.hashsum("Sync") == {n: provider_digest(remote.hash_type, d) for n, d in docs.items()}
        assert_provider_holds(providers, kind, "Sync", docs)
    listed = {e["Name"]: e for e in remote.lsjson("Sync")}
    assert {n: e["Size"] for n, e in listed.items()} == {n: len(d) for n, d in docs.items()}
    assert {n: e["Hashes"][remote.hash_type] for n, e in listed.items()} == {
        n: provider_digest(remote.hash_type, d) for n, d in docs.items()}
    name = next(iter(docs))
    assert remote.cat(f"Sync/{name}") == docs[name]


@pytest.mark.skipif(not BIG.exists(), reason="needs the real corpus")
@pytest.mark.parametrize("kind", ["dropbox", "onedrive", "webdav"])
def test_rclone_big_document_takes_the_chunked_path(lab, kind, tmp_path):
    providers = lab[0]
    remote = remote_for(lab, kind, tmp_path)
    data = BIG.read_bytes()
    remote.copyto(BIG, "Big/presentation.odp", *CHUNK_FLAGS[kind])
    assert_provider_holds(providers, kind, "Big", {"presentation.odp": data})
    assert remote.hashsum("Big") == {"presentation.odp": provider_digest(remote.hash_type, data)}
    routes = upload_routes(providers, kind)
    if kind == "dropbox":
        # rclone 1.60's default --dropbox-batch-mode sync: session, appends, then finish_batch_v2
        chunks = -(-len(data) // (256 * 1024))
        assert routes == ["upload_session/start"] + ["upload_session/append_v2"] * chunks + ["upload_session/finish_batch_v2"]
    elif kind == "onedrive":
        fragments = -(-len(data) // (320 * 1024))
        assert routes == ["create_folder", "create_upload_session"] + ["upload_fragment"] * fragments
    else:
        # rclone 1.60 has no Nextcloud chunking: one PUT (after creating the folder)
        assert routes == ["mkcol", "put"]
    # the copy back is byte-exact (OneDrive: through the 302 to the download host)
    assert remote.cat("Big/presentation.odp") == data


@pytest.mark.skipif(not _inputs_present(), reason="needs .cache/traces and the real corpus")
def test_rclone_dropbox_batch_mode_off_uses_upload_and_session_finish(lab, tmp_path):
    providers = lab[0]
    remote = remote_for(lab, "dropbox", tmp_path)
    small = TRACES / "writer-1k-start-docx" / "new.docx"
    remote.copyto(small, "Off/small.docx", "--dropbox-batch-mode", "off", "--dropbox-chunk-size", "256k")
    remote.copyto(BIG, "Off/big.odp", "--dropbox-batch-mode", "off", "--dropbox-chunk-size", "1M")
    routes = upload_routes(providers, "dropbox")
    chunks = -(-BIG.stat().st_size // (1024 * 1024))
    # rclone 1.60 starts the session empty, appends every chunk, and finishes with an empty body
    assert routes == ["upload", "upload_session/start"] + ["upload_session/append_v2"] * chunks + ["upload_session/finish"]
    assert_provider_holds(providers, "dropbox", "Off", {"small.docx": small.read_bytes(), "big.odp": BIG.read_bytes()})
    assert remote.hashsum("Off") == {"small.docx": dropbox_content_hash(small.read_bytes()),
                                     "big.odp": dropbox_content_hash(BIG.read_bytes())}


@pytest.mark.skipif(not _inputs_present(), reason="needs .cache/traces and the real corpus")
def test_rclone_onedrive_personal_uses_sha1(lab, tmp_path):
    remote = remote_for(lab, "onedrive", tmp_path, onedrive_drive_type="personal")
    doc = TRACES / "writer-1m-middle-docx" / "new.docx"
    remote.copyto(doc, "P/doc.docx", "--onedrive-chunk-size", "320k")
    assert remote.hash_type == "sha1"
    assert remote.hashsum("P") == {"doc.docx": hashlib.sha1(doc.read_bytes()).hexdigest()}


def test_rclone_errors_surface_as_rclone_error(lab, tmp_path):
    remote = remote_for(lab, "dropbox", tmp_path)
    with pytest.raises(RcloneError) as e:
        remote.cat("Nowhere/missing.docx")
    assert e.value.returncode != 0 and "not found" in e.value.stderr.lower()


def test_rclone_delete_removes_the_file_at_the_provider(lab, tmp_path):
    providers = lab[0]
    for kind in ("dropbox", "onedrive", "webdav"):
        remote = remote_for(lab, kind, tmp_path / kind)
        f = tmp_path / "x.docx"
        f.write_bytes(b"PK\x03\x04 not really a document")
        remote.copyto(f, "D/x.docx")
        assert [x["path"].lstrip("/") for x in providers.files(PROVIDER[kind])] == ["D/x.docx"]
        remote.deletefile("D/x.docx")
        assert providers.files(PROVIDER[kind]) == []
