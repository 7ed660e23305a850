"""Shared by the tests that run the providers' official client libraries
(test_sdk_*.py): one lab per module with the provider test servers, a real
EPS, `ec-proxy` in front of it and a plain mitmproxy (`MitmRedirect`, no
EdgeCourier) beside it, so each client runs the same saves both ways; and
the documents they save.

`route` is "edgecourier" or "plain"; `Route.url` / `Route.ca` are what a
client configured with an HTTPS proxy needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from app_client import TRACES, Versions, proxy_status
from link_tap import LinkTap, breakdown, describe
from testbed.lab import Eps, Lab, Proxy
from testbed import shared
from testbed.rclone import MitmRedirect

ROUTES = ("edgecourier", "plain")
#: Device-link bytes (both directions, HTTP framing included) a one-word
#: edit of a 43 kB .docx may cost: the issue's goal, under 1,000 B. Measured
#: with link_tap.py (EC_LINK_REPORT=FILE; `python link_tap.py --table
#: FILE.*.json`), the saves after the first (patches of 150-169 B; the
#: corpus rows, a Python zipfile edit of a real document, 126-262 B):
#:
#:   client, save        total  http  SAVE hdr+mac  ctx defs  req heads  items  result head+body
#:   before (LINK_BOUND was 1,500)
#:   Dropbox SDK session  1,091-1,108  152  48   550-554  1    94    74-76
#:   Dropbox, corpus      1,311-1,448  152  48   597      1    93-94 275-276
#:   Drive media/resum.   532-1,137    152  40-48  0-479  1-59 40    64-236
#:   Drive, corpus        626-1,592    153  40-48  0-823  1-26 40    166-251
#:   Graph SDK            1,174-1,462  153  40-48  535-635  1  40    128-505
#:   nextcloudcmd         1,078-1,108  152  48   627      1    40    41-52
#:   Apache mod_dav       443-462      151  48   0        1    40    34
#:   after
#:   Dropbox SDK session  636-667      152  48   0        111-115  79  74-89
#:   Dropbox, corpus      520-643      152  48   0        8    78-79  77-90
#:   Drive media/resum.   633-652      152  48   0        97-124  95  53-63
#:   Drive, corpus        779-916      151  48   0        94-95 (+190 body CB)  95  59
#:   Graph SDK            651-662      153  48   0        61-84 (+59 body CB)  40-73  109-128
#:   nextcloudcmd         557-587      152  48   0        107-109  40  39-52
#:   Apache mod_dav       414-465      151  48   0        1    40    5-37
#:
#: (SAVE hdr+mac: header, resp_ref, counts, MAC; items: fields, binding and
#: an inline document key; result: its 3-byte header and MAC are 19 B more.)
#: What went: context redefinitions in every save (a finish head whose
#: per-call content_hash and session id were new each time; nextcloudcmd's
#: changing mtime and checksum) and whole context definitions plus
#: unreferenced answers for a first save under a new addressing form or
#: method (ec_protocol.client: `_redefine`, `_borrow`, `_resp_ref`,
#: `response_aliases`), and the finish's content_hash and random session
#: ids (ec_proxy.sessions.dropbox). The rest is the patch, HTTP framing
#: (with the Server-Timing of spec §7.3) and the provider's own answer.
LINK_BOUND = 1000
#: The shared corpus of real documents (testbed/shared.py: EC_SHARED, else ../shared).
CORPUS = shared.root() / "corpus" / "real"


@dataclass
class Route:
    name: str
    url: str
    ca: Path


@dataclass
class SdkLab:
    lab: Lab
    eps: Eps
    proxy: Proxy
    plain: MitmRedirect
    #: Records the device link (ec-proxy <-> EPS) for `link_tap.breakdown`.
    tap: Optional[LinkTap] = None

    def route(self, name: str) -> Route:
        if name == "edgecourier":
            return Route(name, self.proxy.url, self.proxy.ca)
        return Route(name, self.plain.url, self.plain.ca_cert)

    def sent(self, ref_suffix: str) -> int:
        """Bytes the proxy sent and received on the device link for the
        document whose reference ends with `ref_suffix` (both directions)."""
        docs = [d for d in proxy_status(self.proxy)["documents"] if d["ref"].lower().endswith(ref_suffix.lower())]
        return sum(d["sent_bytes"] for d in docs)

    def held(self, provider: str, account: str) -> dict[str, dict]:
        return {f["path"] or f["id"]: f for f in self.lab.providers.files(provider) if f["account"] == account}


def sdk_lab(tmp_path_factory, name: str, *proxy_args: str, provider_args: tuple[str, ...] = ()):
    """A generator for a module-scoped fixture."""
    work = tmp_path_factory.mktemp(name)
    with Lab(work, provider_args) as lab:
        eps = lab.start_eps(f"{name}-user")
        tap = LinkTap(eps.device).start()
        proxy = lab.start_proxy(f"{name}-laptop", Tapped(tap.url), *proxy_args)
        plain = MitmRedirect(lab.providers, work / "plain").start()
        try:
            yield SdkLab(lab, eps, proxy, plain, tap)
        finally:
            plain.stop()
            report(tap, name)
            tap.stop()


@dataclass
class Tapped:
    """What `Lab.start_proxy` reads of an EPS: its URL, here the tap's."""

    url: str


def report(tap: LinkTap, name: str) -> None:
    """With EC_LINK_REPORT=FILE, appends the breakdown of every exchange the
    tap saw (link_tap.describe) to FILE, and writes the recording itself
    to FILE.NAME.json (`python link_tap.py FILE.NAME.json` prints it again)."""
    path = os.environ.get("EC_LINK_REPORT")
    if not path:
        return
    tap.dump(f"{path}.{name}.json")
    with open(path, "a") as f:
        f.write(f"==== {name}\n")
        for ex in tap.exchanges():
            f.write(describe(breakdown(ex, tap)) + "\n")


def documents() -> Versions:
    """Three successive LibreOffice saves of one .docx (one-word edits):
    the base and the edit of one trace, then the edit of another; the traces
    come from `make traces` (EC_TRACES names another folder of them)."""
    traces = Path(os.environ.get("EC_TRACES", TRACES))
    d, e = traces / "writer-100k-middle-docx", traces / "writer-100k-end-docx"
    if not (d / "new.docx").exists() or not (e / "new.docx").exists():
        pytest.fail(f"no LibreOffice traces in {traces}: run `make traces`")
    return Versions((d / "base.docx").read_bytes(), (d / "new.docx").read_bytes(), (e / "new.docx").read_bytes())


def corpus_document(suffix: str = ".docx") -> tuple[str, bytes]:
    """One real document of the shared corpus (not LibreOffice-made)."""
    folder = CORPUS / suffix.lstrip(".")
    if not folder.is_dir():
        pytest.fail(f"the shared document corpus is missing: {folder} (put ../shared beside the repository or set {shared.ENV})")
    files = sorted(p for p in folder.iterdir() if p.suffix == suffix and 20_000 < p.stat().st_size < 2_000_000)
    if not files:
        pytest.fail(f"no {suffix} between 20 kB and 2 MB in {folder}")
    return files[0].name, files[0].read_bytes()


def one_word_edit(data: bytes) -> Optional[bytes]:
    """`data` (a .docx) with one word of document.xml changed, rewritten by
    Python's zipfile (as a script would): None if it has no such word."""
    import io
    import zipfile

    src = zipfile.ZipFile(io.BytesIO(data))
    xml = src.read("word/document.xml")
    at = xml.find(b"<w:t>")
    if at < 0:
        at = xml.find(b"<w:t ")
    if at < 0:
        return None
    at = xml.index(b">", at) + 1
    edited = xml[:at] + b"Edited " + xml[at:]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, edited if info.filename == "word/document.xml" else src.read(info.filename))
    return out.getvalue()
