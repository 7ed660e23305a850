"""Shared helpers of the EPS end-to-end tests: documents, the app requests
of every provider and upload style, provider hashes, and snapshots of what
the EPS and the providers hold.

The tests drive the real static `ec-eps` binary with the real device codec
(`ec_protocol.EpsClient`) against the provider test servers; nothing of the
project is replaced. The requests built here are the ones an app would send
(and, for collapsed upload sessions, the final request the device forwards
after answering the session-feeding requests itself, spec §6.0), so every
helper follows the provider's published API, not the EPS's code.

Provider hashes are computed independently of the test servers (hashlib,
and the `quickxorhash` package for OneDrive) so that a wrong hash on either
side shows.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import ec_protocol as p
from ec_protocol import ProviderRequest, make_item
from testbed import shared

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / ".cache" / "traces"
CORPUS = shared.root() / "corpus" / "real"
FORMATS = ("docx", "xlsx", "pptx", "odt", "ods", "odp")
ACCOUNT = "alice"
#: Chunk sizes small enough that the lab's documents take several provider
#: requests per upload session (each is the smallest the provider allows).
SMALL_CHUNKS = {"dropbox_chunk": 100_000, "graph_fragment": 327_680, "drive_chunk": 262_144, "nc_chunk": 100_000}
MIB = 1 << 20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- documents


def trace_sequences(max_bytes: int = 450_000) -> dict[str, list[list[bytes]]]:
    """LibreOffice edit traces as save sequences, per format: for each
    (app, size) the shared base, then each edited version (each one small
    edit of the base and a re-save), consecutive duplicates dropped."""
    manifest = json.loads((TRACES / "manifest.json").read_text())
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for t in manifest["traces"]:
        if t["base_bytes"] <= max_bytes:
            groups.setdefault((t["format"], t["app"], str(t["size"])), []).append(t)
    out: dict[str, list[list[bytes]]] = {}
    for (fmt, _app, _size), traces in sorted(groups.items()):
        versions = [(TRACES / traces[0]["base"]).read_bytes()]
        for t in traces:
            new = (TRACES / t["new"]).read_bytes()
            if new != versions[-1]:
                versions.append(new)
        out.setdefault(fmt, []).append(versions)
    return out


def corpus_files(fmt: str) -> list[Path]:
    """The real-world documents of one format (several producers), smallest first."""
    folder = CORPUS / fmt
    return sorted((f for f in folder.iterdir() if f.is_file()), key=lambda f: (f.stat().st_size, f.name))


def edited(doc: bytes, n: int) -> bytes:
    """A small byte-exact edit of a real document that keeps it a valid
    ZIP: every member stays as its producer wrote it and only the archive
    comment (and the central directory after it) changes, as when a tool
    re-saves without touching the content."""
    buf = io.BytesIO(doc)
    with zipfile.ZipFile(buf, "a") as z:
        z.comment = f"EdgeCourier e2e edit {n}".encode()
    return buf.getvalue()


# ---------------------------------------------------------------- provider hashes


def dropbox_content_hash(data: bytes) -> str:
    blocks = [hashlib.sha256(data[i:i + 4 * MIB]).digest() for i in range(0, len(data), 4 * MIB)]
    return hashlib.sha256(b"".join(blocks)).hexdigest()


def quickxor_b64(data: bytes) -> str:
    import quickxorhash

    h = quickxorhash.quickxorhash()
    h.update(data)
    return base64.b64encode(h.digest()).decode()


def provider_hash(provider: str, data: bytes) -> tuple[str, str]:
    """(name, value) of the provider's own hash, as the test servers' admin
    API reports it."""
    if provider == "dropbox":
        return "content_hash", dropbox_content_hash(data)
    if provider == "graph":
        return "quickXorHash", quickxor_b64(data)
    if provider == "drive":
        return "md5Checksum", hashlib.md5(data).hexdigest()
    return "OC-Checksum", "SHA1:" + hashlib.sha1(data).hexdigest()


# ---------------------------------------------------------------- uploads


def device_session_id() -> bytes:
    """The id of the upload session the device answered for the app (Graph
    uploadUrl, Drive session URI, Nextcloud transfer). Sent as the item's
    `binding` for the procedures whose requests carry no FILE body: both
    codecs require every item to be used by a FILE/WRAPPED body or a binding
    (spec §4.5), while §6.4-§6.6 give those procedures one item and no FILE
    request; the binding is the only way an item can be "used" there."""
    return ("dev-" + uuid.uuid4().hex).encode()


def auth(token: str = ACCOUNT) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


@dataclass
class Uploader:
    """One provider and upload style: builds the app's request(s) for a save
    of `data` to `name` and sends them through `client` as one SAVE.
    `held()` finds the provider's record of the file."""

    provider: str  # the test servers' provider name
    style: str
    token: str = ACCOUNT
    ids: dict[str, str] = field(default_factory=dict)  # Drive: name -> file id
    #: Drive resumable: send X-Upload-Content-Length (optional in Drive's API).
    upload_length: bool = False

    @property
    def label(self) -> str:
        return f"{self.provider}-{self.style}"

    def doc(self, name: str) -> p.DocKey:
        code = {"dropbox": p.DROPBOX, "graph": p.GRAPH, "drive": p.DRIVE, "webdav": p.WEBDAV}[self.provider]
        account = f"{ACCOUNT}@cloud.example.com" if self.provider == "webdav" else ACCOUNT
        ref = self.ids.get(name, name) if self.provider == "drive" else name
        return p.DocKey(code, account.encode(), ref.encode())

    def save(self, client: p.EpsClient, name: str, data: bytes, base: Optional[bytes]):
        """Returns the client's outcome; remembers Drive's file id."""
        build = getattr(self, f"_{self.style}_{self.provider}")
        procedure, requests, items = build(name, data, base)
        out = client.save(procedure, requests, items)
        if self.provider == "drive" and isinstance(out, p.ProviderResponse) and out.succeeded:
            self.ids.setdefault(name, json.loads(out.body)["id"])
        return out

    def held(self, lab, name: str) -> Optional[dict]:
        for f in lab.providers.files(self.provider):
            if f["account"] != self.token:
                continue
            if self.provider == "drive":
                if f["id"] == self.ids.get(name):
                    return f
            elif f["path"].lower().rstrip("/").endswith("/" + name.strip("/").lower()):
                return f
        return None

    # -- Dropbox

    def _dropbox_path(self, name: str) -> str:
        return "/e2e/" + name

    def _single_dropbox(self, name, data, base):
        arg = json.dumps({"path": self._dropbox_path(name), "mode": "overwrite", "content_hash": dropbox_content_hash(data)})
        hdrs = [auth(self.token), ("Dropbox-API-Arg", arg), ("Content-Type", "application/octet-stream")]
        req = ProviderRequest("POST", "https://content.dropboxapi.com/2/files/upload", hdrs)
        return p.SINGLE, [req], [make_item(data, self.doc(name), base)]

    def _session_dropbox(self, name, data, base):
        # The device answered start/append_v2 itself with a session id of its
        # own; the app's finish names that id, and the item binds it (§6.2).
        binding = "dev-" + uuid.uuid4().hex
        arg = json.dumps({"cursor": {"session_id": binding, "offset": len(data)},
                          "commit": {"path": self._dropbox_path(name), "mode": "overwrite"}})
        hdrs = [auth(self.token), ("Dropbox-API-Arg", arg), ("Content-Type", "application/octet-stream")]
        req = ProviderRequest("POST", "https://content.dropboxapi.com/2/files/upload_session/finish", hdrs, p.BODY_EMPTY)
        return p.DROPBOX_SESSION, [req], [make_item(data, self.doc(name), base, binding.encode())]

    # -- Graph

    def _graph_url(self, name: str, tail: str) -> str:
        return f"https://graph.microsoft.com/v1.0/me/drive/root:/e2e/{name}:/{tail}"

    def _single_graph(self, name, data, base):
        hdrs = [auth(self.token), ("Content-Type", "application/octet-stream")]
        req = ProviderRequest("PUT", self._graph_url(name, "content"), hdrs)
        return p.SINGLE, [req], [make_item(data, self.doc(name), base)]

    def _session_graph(self, name, data, base):
        body = json.dumps({"item": {"@microsoft.graph.conflictBehavior": "replace"}}).encode()
        hdrs = [auth(self.token), ("Content-Type", "application/json")]
        req = ProviderRequest("POST", self._graph_url(name, "createUploadSession"), hdrs, p.BODY_BYTES, body=body)
        return p.GRAPH_SESSION, [req], [make_item(data, self.doc(name), base, device_session_id())]

    # -- Drive

    def _drive_url(self, name: str, upload_type: str) -> tuple[str, str]:
        fid = self.ids.get(name)
        path = f"/upload/drive/v3/files/{fid}" if fid else "/upload/drive/v3/files"
        return ("PATCH" if fid else "POST"), f"https://www.googleapis.com{path}?uploadType={upload_type}&fields=id,md5Checksum,size"

    def _media_drive(self, name, data, base):
        method, url = self._drive_url(name, "media")
        hdrs = [auth(self.token), ("Content-Type", "application/octet-stream")]
        return p.SINGLE, [ProviderRequest(method, url, hdrs)], [make_item(data, self.doc(name), base)]

    def _multipart_drive(self, name, data, base):
        method, url = self._drive_url(name, "multipart")
        boundary = "ec_e2e_" + uuid.uuid4().hex
        meta = json.dumps({"name": name} if method == "POST" else {}).encode()
        head = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n").encode() + meta + (
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        hdrs = [auth(self.token), ("Content-Type", f"multipart/related; boundary={boundary}")]
        req = ProviderRequest(method, url, hdrs, p.BODY_WRAPPED, body=head + tail, split=len(head))
        return p.SINGLE, [req], [make_item(data, self.doc(name), base)]

    def _resumable_drive(self, name, data, base):
        method, url = self._drive_url(name, "resumable")
        meta = json.dumps({"name": name} if method == "POST" else {}).encode()
        hdrs = [auth(self.token), ("Content-Type", "application/json; charset=UTF-8"),
                ("X-Upload-Content-Type", "application/octet-stream")]
        if self.upload_length:
            hdrs.append(("X-Upload-Content-Length", str(len(data))))
        req = ProviderRequest(method, url, hdrs, p.BODY_BYTES, body=meta)
        return p.DRIVE_RESUMABLE, [req], [make_item(data, self.doc(name), base, device_session_id())]

    # -- WebDAV / Nextcloud

    def _dav_url(self, name: str) -> str:
        return f"https://cloud.example.com/remote.php/dav/files/{self.token}/{name}"

    def _put_webdav(self, name, data, base):
        hdrs = [auth(self.token), ("Content-Type", "application/octet-stream"),
                ("OC-Checksum", "SHA1:" + hashlib.sha1(data).hexdigest()), ("X-OC-MTime", "1700000000")]
        return p.SINGLE, [ProviderRequest("PUT", self._dav_url(name), hdrs)], [make_item(data, self.doc(name), base)]

    def _chunked_webdav(self, name, data, base):
        transfer = f"https://cloud.example.com/remote.php/dav/uploads/{self.token}/ec-{uuid.uuid4().hex[:12]}"
        dest = ("Destination", self._dav_url(name))
        mkcol = ProviderRequest("MKCOL", transfer, [auth(self.token), dest], p.BODY_EMPTY)
        move = ProviderRequest("MOVE", transfer + "/.file",
                               [auth(self.token), dest, ("OC-Checksum", "SHA1:" + hashlib.sha1(data).hexdigest())], p.BODY_EMPTY)
        return p.NEXTCLOUD_CHUNKED, [mkcol, move], [make_item(data, self.doc(name), base, device_session_id())]


#: The EPS refuses every GRAPH_SESSION save, and DRIVE_RESUMABLE saves that
#: carry X-Upload-Content-Length, before reading the payloads: it checks the
#: procedure's shape with empty placeholder files (eps/service/src/service.rs,
#: `build_procedure(.., &vec![Bytes::new(); n])` then `upstream.check`), and
#: ec-providers' checks of the file itself (graph.rs: "cannot carry an empty
#: file"; drive.rs: "x-upload-content-length differs") fail on the placeholder.
#: Every provider and upload style of issue 3: single request, and upload session.
UPLOADERS = (
    ("dropbox", "single"), ("dropbox", "session"),
    ("graph", "single"), ("graph", "session"),
    ("drive", "media"), ("drive", "multipart"), ("drive", "resumable"),
    ("webdav", "put"), ("webdav", "chunked"),
)


def dropbox_batch(client: p.EpsClient, files: list[tuple[str, bytes, Optional[bytes]]], token: str = ACCOUNT):
    """A DROPBOX_BATCH save (§6.3): the app ran one upload session per file
    (answered by the device) and then finish_batch_v2 with their ids."""
    up = Uploader("dropbox", "batch", token)
    entries, items = [], []
    for name, data, base in files:
        binding = "dev-" + uuid.uuid4().hex
        entries.append({"cursor": {"session_id": binding, "offset": len(data)},
                        "commit": {"path": up._dropbox_path(name), "mode": "overwrite"}})
        items.append(make_item(data, up.doc(name), base, binding.encode()))
    body = json.dumps({"entries": entries}).encode()
    req = ProviderRequest("POST", "https://api.dropboxapi.com/2/files/upload_session/finish_batch_v2",
                          [auth(token), ("Content-Type", "application/json")], p.BODY_BYTES, body=body)
    return client.save(p.DROPBOX_BATCH, [req], items)


# ---------------------------------------------------------------- downloads


def download_request(provider: str, name: str, ids: Optional[dict] = None, token: str = ACCOUNT) -> ProviderRequest:
    """The app's download request for a file saved by `Uploader(provider, ...)`."""
    if provider == "dropbox":
        return ProviderRequest("POST", "https://content.dropboxapi.com/2/files/download",
                               [auth(token), ("Dropbox-API-Arg", json.dumps({"path": "/e2e/" + name}))], p.BODY_EMPTY)
    if provider == "graph":
        return ProviderRequest("GET", f"https://graph.microsoft.com/v1.0/me/drive/root:/e2e/{name}:/content", [auth(token)], p.BODY_EMPTY)
    if provider == "drive":
        return ProviderRequest("GET", f"https://www.googleapis.com/drive/v3/files/{ids[name]}?alt=media", [auth(token)], p.BODY_EMPTY)
    return ProviderRequest("GET", f"https://cloud.example.com/remote.php/dav/files/{token}/{name}", [auth(token)], p.BODY_EMPTY)


# ---------------------------------------------------------------- state snapshots


def store_snapshot(eps) -> dict[str, str]:
    """Every file under the EPS's store folder (temporaries included), with
    the SHA-256 of its content: equal snapshots mean no blob, document
    pointer or outcome record was added, removed or changed. (Content, not
    mtime: the store may rewrite a pointer unchanged to keep its LRU order.)"""
    root = Path(eps.state) / "store"
    out = {}
    if root.exists():
        for f in root.rglob("*"):
            if f.is_file() and f.name != "LOCK":
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def log_seq(lab) -> int:
    """The provider servers' last request-log sequence number."""
    log = lab.providers.log()
    return max((e["seq"] for e in log), default=0)


def provider_requests_since(lab, seq: int) -> list[dict]:
    return [e for e in lab.providers.log() if e["seq"] > seq]


def device_bytes(eps) -> dict[tuple[str, str], float]:
    """ec_eps_device_bytes_total by (direction, kind), read in one scrape."""
    out: dict[tuple[str, str], float] = {}
    for line in eps.metrics().splitlines():
        if line.startswith("ec_eps_device_bytes_total{"):
            labels, value = line.rsplit(" ", 1)
            d = labels.split('direction="', 1)[1].split('"', 1)[0]
            k = labels.split('kind="', 1)[1].split('"', 1)[0]
            out[(d, k)] = float(value)
    return out


def delta(after: dict, before: dict) -> dict:
    """Per-key increase; every (direction, kind) present (0 for a series not yet exported)."""
    keys = set(after) | set(before) | {(d, k) for d in ("in", "out") for k in ("envelope", "patch", "full")}
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}


# ---------------------------------------------------------------- hand-made protocol messages


class RawDevice:
    """A device that builds protocol messages by hand with the codec, to
    send what `EpsClient` never would (wrong hashes, corrupt patches,
    replays, garbage). One HTTP connection per request, so a `Connection:
    close` after an early error does not matter."""

    def __init__(self, eps, secret: Optional[bytes] = None, key_id: int = 1) -> None:
        from testbed.lab import TEST_SECRET

        host, port = eps.device.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.secret = TEST_SECRET if secret is None else secret
        self.key_id = key_id
        self.session_id = b""
        self.seq = 0

    def post(self, path: str, body: bytes, method: str = "POST", headers: Optional[dict] = None) -> tuple[int, bytes]:
        import http.client

        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def hello(self) -> p.HelloOk:
        hello = p.Hello(self.key_id, os.urandom(16), (1,), (1,), (1 << 9) - 1, "raw")
        status, data = self.post(p.HELLO_PATH, hello.encode(self.secret))
        msg = p.decode_message(data, path=p.HELLO_PATH)
        assert status == 200 and isinstance(msg, p.HelloOk), (status, msg)
        self.session_id, self.seq = msg.session_id, 0
        return msg

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, msg) -> tuple[int, object]:
        """Encodes `msg` (MAC with this device's secret), posts it to its
        path, and decodes the answer."""
        status, data = self.post(msg.path, msg.encode(self.secret))
        return status, p.decode_message(data, path=msg.path)

    def save_message(self, procedure: int, requests: list[ProviderRequest], items: list[p.Item],
                     request_id: Optional[bytes] = None, seq: Optional[int] = None) -> p.Save:
        """A SAVE with literal heads and no contexts (so every item names its document)."""
        specs = []
        for r in requests:
            head = p.canonical_head(r.method, r.url, r.headers)
            body = p.CB.literal(r.body) if r.body_kind in (p.BODY_BYTES, p.BODY_WRAPPED) else None
            specs.append(p.RequestSpec(0, p.CB.literal(head), r.body_kind,
                                       r.item if r.body_kind in (p.BODY_FILE, p.BODY_WRAPPED) else None,
                                       body, r.split if r.body_kind == p.BODY_WRAPPED else None))
        return p.Save(self.session_id, self.next_seq() if seq is None else seq, request_id or os.urandom(8),
                      procedure, tuple(specs), tuple(items))


def full_item(data: bytes, doc: p.DocKey, sha: Optional[bytes] = None) -> p.Item:
    return p.Item(p.FULL, len(data), sha or hashlib.sha256(data).digest(), data, doc)


def patch_item(patch: bytes, target: bytes, doc: p.DocKey, sha: Optional[bytes] = None) -> p.Item:
    return p.Item(p.PATCH, len(target), sha or hashlib.sha256(target).digest(), patch, doc)


def dropbox_upload(name: str, token: str = ACCOUNT) -> ProviderRequest:
    """The app's /2/files/upload request (body FILE item 0)."""
    arg = json.dumps({"path": "/e2e/" + name, "mode": "overwrite"})
    return ProviderRequest("POST", "https://content.dropboxapi.com/2/files/upload",
                           [auth(token), ("Dropbox-API-Arg", arg), ("Content-Type", "application/octet-stream")])
