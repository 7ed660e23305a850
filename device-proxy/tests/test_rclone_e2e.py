"""A real, unmodified third-party client through the device proxy: Debian's
rclone (1.60) with its dropbox, onedrive and webdav (Nextcloud) backends,
HTTPS_PROXY pointing at `ec-proxy`, trusting the proxy's CA.

rclone uploads the last-synced versions of several LibreOffice documents,
then their edited versions; the proxy turns the second round into edit
patches to the real EPS, which uploads the files with the provider's own
API (rclone's Dropbox batch sessions become one DROPBOX_BATCH save, its
OneDrive upload sessions one GRAPH_SESSION save, its WebDAV PUTs SINGLE
saves). rclone's own hash checks must pass, the provider test servers must
hold exactly the local files, and the second round must have travelled as
patches.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from testbed.lab import Lab
from testbed.rclone import RcloneRemote, write_save

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".cache" / "traces"
PROVIDER = {"dropbox": "dropbox", "onedrive": "graph", "webdav": "webdav"}
#: One trace per format; base = last-synced version, new = the edit.
DOCS = ("writer-100k-middle-docx", "writer-100k-end-odt", "calc-200rows-insert-xlsx", "impress-5slides-edit-pptx")


def traces() -> dict[str, tuple[str, bytes, bytes]]:
    manifest = TRACES / "manifest.json"
    if not manifest.exists():
        pytest.fail("no traces: run `make traces`")
    by_name = {t["name"]: t for t in json.loads(manifest.read_text())["traces"]}
    out = {}
    for want in DOCS:
        t = by_name.get(want) or next(t for n, t in by_name.items() if n.startswith(want.rsplit("-", 2)[0]) and n.endswith(want.rsplit("-", 1)[1]))
        ext = t["format"]
        out[f"{t['name']}.{ext}"] = (t["name"], (TRACES / t["base"]).read_bytes(), (TRACES / t["new"]).read_bytes())
    return out


from app_client import proxy_status as status  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # rclone 1.60 sends Authorization on OneDrive upload fragments, which the
    # OneDrive accounts it works with accept: both the provider and the
    # device are told so (by default both answer 401, as OneDrive does for
    # the Graph SDK).
    with Lab(tmp_path_factory.mktemp("rclone-proxy"), ("--graph-fragment-auth", "accept")) as lab:
        eps = lab.start_eps("rclone-user")
        proxy = lab.start_proxy("rclone-laptop", eps, "--graph-fragment-auth", "accept")
        yield lab, eps, proxy


@pytest.mark.parametrize("kind", ["dropbox", "onedrive", "webdav"])
def test_rclone_through_the_proxy_saves_edits_as_patches(lab, kind, tmp_path):
    lab, eps, proxy = lab
    if shutil.which("rclone") is None:
        pytest.fail("rclone is not installed: `make setup` installs it from Debian")
    remote = RcloneRemote(kind, lab.providers, proxy.url, proxy.ca, tmp_path / "rclone", account=f"rc-{kind}")
    docs = traces()
    local = tmp_path / "local"
    local.mkdir()
    patch_bytes_before = eps.metric("ec_eps_device_bytes_total", 'kind="patch"')
    for i, (round_, pick) in enumerate((("base", 1), ("new", 2))):
        for name, entry in docs.items():
            write_save(local / name, entry[pick], i)
        remote.copy(local, "Sync")
        report = remote.check(local, "Sync")  # rclone's own comparison, with the provider's hash
        assert f"{len(docs)} matching files" in report and "0 differences found" in report, report
        held = {f["path"].rsplit("/", 1)[-1]: f["sha256"] for f in lab.providers.files(PROVIDER[kind])
                if f["account"] == f"rc-{kind}"}
        assert held == {n: hashlib.sha256(e[pick]).hexdigest() for n, e in docs.items()}, round_
    # The edits travelled as patches: the EPS received patch bytes, far fewer than the files.
    patch_bytes = eps.metric("ec_eps_device_bytes_total", 'kind="patch"') - patch_bytes_before
    whole = sum(len(e[2]) for e in docs.values())
    assert 0 < patch_bytes < whole / 10, f"{patch_bytes} patch bytes for {whole} bytes of files"
    st = status(proxy)
    ours = [d for d in st["documents"] if d["account"] and d["saves"]]
    assert any(d["patch_saves"] for d in ours), st


@pytest.mark.parametrize("kind", ["webdav", "dropbox"])
def test_rclone_through_the_default_rule_on_a_fast_link_arrives_exact(lab, kind, tmp_path):
    """ec-proxy as a user runs it (`--decision hybrid`) on the loopback, a link
    where no patch pays: after a document's first save, rclone's WebDAV PUTs
    go to the provider directly, decided from their head and streamed as
    they arrive; its Dropbox batch sessions (answered by the proxy piece by
    piece) go whole through the EPS. Every round must arrive byte-exact, by
    rclone's own check and the provider's hashes, and each version must be
    kept as the document's base."""
    lab, eps, _ = lab
    if shutil.which("rclone") is None:
        pytest.fail("rclone is not installed: `make setup` installs it from Debian")
    proxy = lab.start_proxy(f"rclone-hybrid-{kind}", eps, "--decision", "hybrid", "--graph-fragment-auth", "accept")
    remote = RcloneRemote(kind, lab.providers, proxy.url, proxy.ca, tmp_path / "rclone", account=f"rc-hybrid-{kind}")
    docs = traces()
    local = tmp_path / "local"
    local.mkdir()
    for i, (round_, pick) in enumerate((("base", 1), ("new", 2), ("base again", 1))):
        for name, entry in docs.items():
            write_save(local / name, entry[pick], i)
        remote.copy(local, "Sync")
        report = remote.check(local, "Sync")
        assert f"{len(docs)} matching files" in report and "0 differences found" in report, report
        held = {f["path"].rsplit("/", 1)[-1]: f["sha256"] for f in lab.providers.files(PROVIDER[kind])
                if f["account"] == f"rc-hybrid-{kind}"}
        assert held == {n: hashlib.sha256(e[pick]).hexdigest() for n, e in docs.items()}, round_
    log = proxy.log_path.read_text(errors="replace")
    if kind == "webdav":
        ours = [d for d in status(proxy)["documents"] if d["saves"]]
        assert len(ours) == len(docs), ours
        for d in ours:  # the last version, sent directly, is the document's base
            assert d["last_how"] == "direct" and d["held_bytes"] == len(docs[d["ref"].rsplit("/", 1)[-1]][1]), d
        # rclone's transfers run four at a time: an upload whose head finds the store
        # busy waits for its body and goes directly all the same.
        assert "went directly, streamed as it arrived" in log, log[-3000:]
    else:
        assert "streamed as it arrived" not in log
