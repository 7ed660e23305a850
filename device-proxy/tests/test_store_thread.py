"""The store's writes run off mitmproxy's event loop: while a save's
records are being written, other flows through the same proxy go on, the
save's own answer does not wait for them, and the next save of the same
document waits for them before it reads the store.

The proxy runs as `python -m ec_proxy run` does (`ec_proxy.cli.main`), from
a launcher that gives the addon a `DeviceStore` whose test hook
`_crash_point` (the one the store's crash tests override) holds at every
committed row ("row-written": `pending`, `accepted`, `downloaded`) until
the test releases it through a file. So a store write is exactly as slow
as the test wants, with no guess about timing: the hold starts when the
hook writes `held-N` and ends when the test writes `release-N` (or
removes `armed`: holds happen only while that file exists). Each proxy
has its own gates folder.

A plain provider request (Dropbox `get_metadata`, recognised as no save)
sent while a save's record is held must be answered; with the store's
writes on the event loop it waited for the release (so it fails here after
PLAIN_TIMEOUT_S, against a hold that lasts until the test releases it).
The app's own answer must come while the record is held too."""

from __future__ import annotations

import http.client
import io
import json
import ssl
import sys
import textwrap
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app_client import dropbox_upload, proxy_status, sha, through
from testbed.lab import TEST_SECRET, Lab, Proxy

LAUNCHER = textwrap.dedent('''
    import sys
    import time
    from pathlib import Path

    import ec_proxy.addon
    from ec_proxy.cli import main
    from ec_proxy.store import DeviceStore

    GATES = Path(sys.argv.pop(1))


    class HeldStore(DeviceStore):
        """Holds its N-th committed row while GATES/armed exists, until GATES/release-N (or disarmed)."""

        holds = 0

        def _crash_point(self, stage):
            if stage != "row-written" or not (GATES / "armed").exists():
                return
            HeldStore.holds += 1  # under the store's lock: one at a time
            n = HeldStore.holds
            (GATES / f"held-{n}").write_text(stage)
            deadline = time.monotonic() + 120
            while (GATES / "armed").exists() and not (GATES / f"release-{n}").exists() and time.monotonic() < deadline:
                time.sleep(0.005)


    ec_proxy.addon.DeviceStore = HeldStore
    sys.exit(main())
''')

TOKEN = "store-thread-token"
#: How long the plain request may take while a store write is held (it
#: takes milliseconds when the event loop is free).
PLAIN_TIMEOUT_S = 20.0


def tiny_docx(text: str) -> bytes:
    """A small but real .docx (a ZIP with the parts Word needs)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml",
                   '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                   '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                   '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.'
                   'wordprocessingml.document.main+xml"/></Types>')
        z.writestr("_rels/.rels",
                   '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
                   'Target="word/document.xml"/></Relationships>')
        z.writestr("word/document.xml",
                   '<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
                   f"<w:body><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:body></w:document>")
    return buf.getvalue()


class Gates:
    """The test's side of the held store of one proxy."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def arm(self) -> int:
        """Holds from now on; returns the number the next hold will have."""
        (self.folder / "armed").touch()
        return len(list(self.folder.glob("held-*"))) + 1

    def disarm(self) -> None:
        """No more holds; any hold in place ends."""
        (self.folder / "armed").unlink(missing_ok=True)

    def wait_held(self, n: int, alive: threading.Thread, timeout: float = 90.0) -> None:
        """Until the store's hook holds its n-th row (or the operation ended without it)."""
        deadline = time.monotonic() + timeout
        while not (self.folder / f"held-{n}").exists():
            assert alive.is_alive(), f"the operation ended without the store's write #{n}"
            assert time.monotonic() < deadline, f"the store's write #{n} did not start within {timeout} s"
            time.sleep(0.005)

    def release(self, n: int) -> None:
        (self.folder / f"release-{n}").touch()


@dataclass
class Held:
    proxy: Proxy
    gates: Gates


def held_proxy(lab: Lab, name: str, eps) -> Held:
    """`ec_proxy run` with the lab's options as Lab.start_proxy starts it, with the held store."""
    launcher = lab.workdir / "held_store_proxy.py"
    launcher.write_text(LAUNCHER)
    gates = Gates(lab.workdir / f"gates-{name}")
    state = lab.workdir / f"proxy-{name}"
    state.mkdir(parents=True, exist_ok=True)
    edge = eps.url if eps is not None else "http://127.0.0.1:9"
    command = [sys.executable, str(launcher), str(gates.folder), "run", "--edge", edge, "--secret", TEST_SECRET.hex(),
               "--plain-edge", "--port", "0", "--state", str(state)]
    proxy, _ = lab.launch_proxy(command, [], state, 30, "the device proxy (held store) did not start")
    return Held(proxy, gates)


@pytest.fixture(scope="module")
def via_eps(lab, eps) -> Held:
    return held_proxy(lab, "held-via-eps", eps)


@pytest.fixture(scope="module")
def no_eps(lab) -> Held:
    return held_proxy(lab, "held-no-eps", None)


def plain_request(proxy: Proxy) -> int:
    """Dropbox get_metadata through the proxy (decrypted, recognised as no
    save, passed to the provider): its status, within PLAIN_TIMEOUT_S."""
    parts = urlsplit("https://api.dropboxapi.com/2/files/get_metadata")
    host, port = proxy.listen.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=str(proxy.ca)),
                                       timeout=PLAIN_TIMEOUT_S)
    conn.set_tunnel(parts.hostname, 443)
    try:
        conn.request("POST", parts.path, body=json.dumps({"path": "/no-such-file.txt"}).encode(),
                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return r.status
    except TimeoutError:
        pytest.fail(f"a plain request through the proxy waited more than {PLAIN_TIMEOUT_S} s for a store write")
    finally:
        conn.close()


def in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def doc_stats(proxy: Proxy, path: str) -> dict:
    docs = [d for d in proxy_status(proxy)["documents"] if d["ref"].lower() == path.lower()]
    assert docs, f"the proxy's status knows no {path}"
    return docs[0]


@pytest.mark.parametrize("route", ["eps", "direct"])
def test_a_save_being_recorded_holds_up_no_flow(request, route: str):
    """The first save of a document, with its `pending` version held in the
    store's write: the app gets the provider's answer all the same (its
    records are queued behind the held write, and the answer does not wait
    for them), and a plain request is answered meanwhile. A second save of
    the same document, made while those records are still held, waits for
    them before it reads the store: it finds the first save's version as
    its base (the small file then goes whole as `too_small`; without a base
    it would be `no_base`). Before the answer stopped waiting for the
    records, the first save's answer came only after the release."""
    held: Held = request.getfixturevalue("via_eps" if route == "eps" else "no_eps")
    proxy, gates = held.proxy, held.gates
    path = f"/store-thread/{route}.docx"
    data = tiny_docx(f"written while the store is held ({route})")
    n = gates.arm()
    try:
        save, result = in_thread(lambda: dropbox_upload(through(proxy), TOKEN, path, data))
        gates.wait_held(n, threading.main_thread())  # pending: the version being uploaded
        save.join(PLAIN_TIMEOUT_S)
        assert not save.is_alive(), f"the app's answer waited more than {PLAIN_TIMEOUT_S} s for the store's records"
        assert not (gates.folder / f"release-{n}").exists()  # still held when the answer came
        assert not isinstance(result[0], BaseException), result
        status, _, body = result[0]
        assert status == 200, body
        assert plain_request(proxy) == 409  # Dropbox's path/not_found, while the record is held

        second = tiny_docx(f"the next save, while the first one's records are held ({route})")
        save2, result2 = in_thread(lambda: dropbox_upload(through(proxy), TOKEN, path, second))
        time.sleep(0.5)  # time enough to read the store if it did not wait: the assertion below would then see no_base
        gates.disarm()  # every hold ends, and no more
        save2.join(60)
        assert not save2.is_alive() and not isinstance(result2[0], BaseException), result2
        status, _, body = result2[0]
        assert status == 200, body
    finally:
        gates.disarm()
    st = doc_stats(proxy, path)
    if route == "eps":
        # The lab's proxy minimises bytes: a file under the diff's minimum goes whole through the EPS.
        assert (st["saves"], st["last_how"], st["last_reason"]) == (2, "full", "too_small"), st
    else:
        # No EPS: both saves fall back to the direct path, whatever the reason the proxy had to send them whole.
        assert (st["saves"], st["last_how"]) == (2, "direct"), st


def test_a_download_being_recorded_holds_up_no_flow(via_eps: Held):
    """A download through the EPS: the app gets the file while the store's
    record of the version it served (`downloaded`) is held, and other flows
    go on meanwhile. Before, the app's answer waited for the record."""
    proxy, gates = via_eps.proxy, via_eps.gates
    path = "/store-thread/download.docx"
    data = tiny_docx("served through the EPS while the store is held")
    status, _, body = dropbox_upload(through(proxy), TOKEN, path, data)  # not armed: no holds
    assert status == 200, body
    # The upload's records (`accepted`, then its statistics) are written after
    # its answer: armed before they are, the hold would catch its `accepted`
    # instead of the download's `downloaded`, and the download's read of the
    # base would wait behind it (a CI run under load did just that).
    deadline = time.monotonic() + 60
    while not any(d["ref"].lower() == path and d["saves"] >= 1 for d in proxy_status(proxy)["documents"]):
        assert time.monotonic() < deadline, "the upload's records were not written within 60 s"
        time.sleep(0.05)
    n = gates.arm()
    try:
        arg = json.dumps({"path": path})
        fetch, result = in_thread(lambda: through(proxy)(
            "POST", "https://content.dropboxapi.com/2/files/download", {"Authorization": f"Bearer {TOKEN}", "Dropbox-API-Arg": arg}))
        gates.wait_held(n, threading.main_thread())  # downloaded: the version the EPS fetched
        fetch.join(PLAIN_TIMEOUT_S)
        assert not fetch.is_alive(), f"the app's download waited more than {PLAIN_TIMEOUT_S} s for the store's record"
        assert not isinstance(result[0], BaseException), result
        status, _, body = result[0]
        assert status == 200 and sha(body) == sha(data)
        assert plain_request(proxy) == 409, "a plain request was not answered while a download was recorded"
    finally:
        gates.disarm()
