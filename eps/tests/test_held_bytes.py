"""What an EPS holds in memory for a device with a valid key (spec §4.6.2,
§5.4, §9; docs/eps.md "Under attack"): bounded before the work it bounds,
whatever the device sends or the provider answers.

- Provider answers kept for retries (outcome records, §5.4) and for
  `resp_ref` (the sessions' response caches, §4.6.2) stay within their byte
  budgets (`outcome_records_max_bytes`, `response_cache_max_bytes`, 8 MiB
  each by default), however large the answers: a provider stand-in answers
  every upload with a 3 MiB body. A retry whose record let go of its answer
  is still never uploaded again: it is answered from the document's
  persisted record when that is its own (the whole answer, REPLAYED), else
  "outcome unknown" (`provider_timeout`, stage 1).
- A DROPBOX_BATCH is held to one item's limits: its files together to
  `max_item_size`, its patches together to `max_patch_size` (`too_large`,
  stage 0, before its files are read), so that a batch of `max_items` files
  does not hold `max_items` times what one save may.

Everything is real but the provider stand-in of the first test (the
provider test servers answer uploads with a few hundred bytes): the EPS
binary, the device codec, and for the batch the provider test servers.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import ssl
import threading
from pathlib import Path

import ec_protocol as p
from ec_protocol import ProviderRequest
from testbed.lab import PROVIDER_HOSTS

from .e2e import RawDevice, auth, dropbox_batch, dropbox_content_hash, dropbox_upload, full_item, log_seq, provider_requests_since

MIB = 1 << 20
#: The EPS's default budgets for kept answers (docs/eps.md).
KEPT_BUDGET = 8 * MIB
#: The body of every upload answer of the stand-in.
PAD = 3 * MIB


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class BigAnswers:
    """A Dropbox stand-in over TLS (the lab's provider certificate): it takes
    `/2/files/upload` as Dropbox does and answers with the file's metadata
    and `PAD` bytes more (a field Dropbox does not have, which clients
    ignore), and counts the uploads it took."""

    def __init__(self, server_pem: Path) -> None:
        self.uploads: list[tuple[str, str]] = []
        lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/2/files/upload":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                arg = json.loads(self.headers["Dropbox-API-Arg"])
                with lock:
                    owner.uploads.append((arg["path"], hashlib.sha256(data).hexdigest()))
                    n = len(owner.uploads)
                meta = {"name": arg["path"].rsplit("/", 1)[-1], "path_display": arg["path"], "id": "id:held",
                        "rev": f"{n:09x}", "size": len(data), "content_hash": dropbox_content_hash(data),
                        "pad": "x" * PAD}
                body = json.dumps(meta).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(server_pem))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answer_body(msg: p.SaveResult) -> bytes:
    assert not msg.ref_used
    return msg.body.resolve(b"", 32 * MIB)


def test_kept_provider_answers_stay_within_their_budgets_and_are_never_uploaded_again(lab, start_eps):
    fake = BigAnswers(lab.providers.certs / "server.pem")
    eps = start_eps("held-answers", upstream={"resolve": {h: fake.address for h in PROVIDER_HOSTS}})
    try:
        device = RawDevice(eps)
        device.hello()  # with `resp_ref` (capability bit 8): the session keeps what it sent
        doc = p.DocKey(p.DROPBOX, b"alice", b"/e2e/held.docx")
        request = dropbox_upload("held.docx")
        rss0 = vm_rss(eps.proc.pid)
        saves = []
        for i in range(24):
            item = full_item(os.urandom(2000), doc)
            rid = os.urandom(8)
            status, msg = device.send(device.save_message(p.SINGLE, [request], [item], request_id=rid))
            assert status == 200 and isinstance(msg, p.SaveResult) and not msg.replayed, (status, msg)
            assert len(answer_body(msg)) > PAD
            saves.append((rid, item))
        held = vm_rss(eps.proc.pid) - rss0
        outcome_bytes = eps.metric("ec_eps_outcome_record_bytes")
        cache_bytes = eps.metric("ec_eps_response_cache_bytes")
        print(f"24 answers of {PAD >> 20} MiB: RSS grew {held / MIB:.1f} MiB; outcome records {outcome_bytes / MIB:.1f} MiB, "
              f"response caches {cache_bytes / MIB:.1f} MiB")
        assert len(fake.uploads) == 24
        # Before the budgets: every answer twice (record and cache), 144 MiB and more.
        assert held < 64 * MIB, f"the EPS holds {held / MIB:.1f} MiB more after 24 saves"
        assert 0 < outcome_bytes <= KEPT_BUDGET and cache_bytes <= KEPT_BUDGET

        # The last save's retry is answered from its record: the same answer, REPLAYED.
        rid, item = saves[-1]
        status, msg = device.send(device.save_message(p.SINGLE, [request], [item], request_id=rid))
        assert status == 200 and isinstance(msg, p.SaveResult) and msg.replayed, (status, msg)
        assert len(answer_body(msg)) > PAD
        # The first one's record let go of its answer, and the document's
        # persisted record is the last save's: "outcome unknown", never a second upload.
        rid, item = saves[0]
        status, msg = device.send(device.save_message(p.SINGLE, [request], [item], request_id=rid))
        assert status == 504 and isinstance(msg, p.Error), (status, msg)
        assert (msg.code, msg.stage) == ("provider_timeout", 1), msg
        assert len(fake.uploads) == 24, "a retry was uploaded again"
        # A record that let go of its answer while its document's persisted
        # record is still its own: answered from that record, whole.
        other = full_item(os.urandom(2000), p.DocKey(p.DROPBOX, b"alice", b"/e2e/held-other.docx"))
        other_request, rid_other = dropbox_upload("held-other.docx"), os.urandom(8)
        status, msg = device.send(device.save_message(p.SINGLE, [other_request], [other], request_id=rid_other))
        assert status == 200 and isinstance(msg, p.SaveResult), (status, msg)
        first_answer = answer_body(msg)
        for _ in range(3):
            status, msg = device.send(device.save_message(p.SINGLE, [request], [full_item(os.urandom(2000), doc)]))
            assert status == 200 and isinstance(msg, p.SaveResult), (status, msg)
        status, msg = device.send(device.save_message(p.SINGLE, [other_request], [other], request_id=rid_other))
        assert status == 200 and isinstance(msg, p.SaveResult) and msg.replayed, (status, msg)
        assert answer_body(msg) == first_answer
        assert len(fake.uploads) == 28
        assert eps.metric("ec_eps_outcome_record_bytes") <= KEPT_BUDGET
        assert eps.proc.poll() is None
    finally:
        eps.stop()
        fake.close()


def batch_message(device: RawDevice, items: list[p.Item], name: str) -> p.Save:
    entries = [{"cursor": {"session_id": i.binding.decode(), "offset": i.target_size},
                "commit": {"path": f"/e2e/{name}-{k}.docx", "mode": "overwrite"}} for k, i in enumerate(items)]
    req = ProviderRequest("POST", "https://api.dropboxapi.com/2/files/upload_session/finish_batch_v2",
                          [auth("held-batch"), ("Content-Type", "application/json")], p.BODY_BYTES,
                          body=json.dumps({"entries": entries}).encode())
    return device.save_message(p.DROPBOX_BATCH, [req], items)


def batch_item(data: bytes, name: str, k: int, kind: int = p.FULL, patch: bytes = b"") -> p.Item:
    doc = p.DocKey(p.DROPBOX, b"held-batch", f"/e2e/{name}-{k}.docx".encode())
    payload = data if kind == p.FULL else patch
    return p.Item(kind, len(data), hashlib.sha256(data).digest(), payload, doc, f"dev-{name}-{k}".encode())


def send_without_payloads(eps, msg: p.Save, secret: bytes) -> tuple[int, object]:
    """Sends a SAVE's head and structured part with the `Content-Length` of
    the whole, and none of its payloads: the answer must come without them."""
    whole = msg.encode(secret)
    structured = whole[:len(whole) - sum(len(i.payload) for i in msg.items)]
    host, port = eps.device.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"POST {p.SAVE_PATH} HTTP/1.1\r\nHost: eps\r\nContent-Length: {len(whole)}\r\n\r\n".encode() + structured)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)  # a timeout here: the EPS waits for the payloads
            assert chunk, answer
            answer += chunk
        head, _, rest = answer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            chunk = s.recv(65536)
            assert chunk
            rest += chunk
    return int(head.split()[1]), p.decode_message(rest[:length], path=p.SAVE_PATH)


def test_a_batch_is_held_to_one_items_limits_before_its_files_are_read(lab, start_eps):
    eps = start_eps("held-batch", limits={"max_item_size": 4 * MIB, "max_patch_size": 64 * 1024})
    try:
        device = RawDevice(eps)
        device.hello()
        mark = log_seq(lab)
        # Six files of 768 KiB: each within max_item_size, 4.5 MiB together
        # (and the request within max_envelope + max_item_size + max_patch_size).
        items = [batch_item(os.urandom(768 << 10), "over", k) for k in range(6)]
        status, msg = send_without_payloads(eps, batch_message(device, items, "over"), device.secret)
        assert status == 413 and isinstance(msg, p.Error), (status, msg)
        assert (msg.code, msg.stage) == ("too_large", 0), msg
        assert "max_item_size" in msg.detail
        # Three patches of 30 KiB: each within max_patch_size, 90 KiB together
        # (refused as too large before they are decoded: garbage would be patch_failed).
        items = [batch_item(os.urandom(1000), "patches", k, p.PATCH, os.urandom(30 * 1024)) for k in range(3)]
        status, msg = send_without_payloads(eps, batch_message(device, items, "patches"), device.secret)
        assert status == 413 and isinstance(msg, p.Error), (status, msg)
        assert (msg.code, msg.stage) == ("too_large", 0), msg
        assert "max_patch_size" in msg.detail
        assert provider_requests_since(lab, mark) == [], "nothing may reach the provider"
        # The device's client takes the direct path for such a batch at once.
        client = eps.client()
        try:
            out = dropbox_batch(client, [(f"client-{k}.docx", os.urandom(MIB), None) for k in range(6)], token="held-batch")
            assert isinstance(out, p.Fallback) and out.reason == "item_over_limit", out
            assert provider_requests_since(lab, mark) == []
            # Within the bound (3 MiB together), a batch goes through as before.
            files = [(f"within-{k}.docx", os.urandom(MIB), None) for k in range(3)]
            out = dropbox_batch(client, files, token="held-batch")
            assert isinstance(out, p.ProviderResponse) and out.succeeded, out
        finally:
            client.close()
        held = {f["path"].lower(): f["sha256"] for f in lab.providers.files("dropbox") if f["account"] == "held-batch"}
        for name, data, _ in files:
            assert held[f"/e2e/{name}"] == hashlib.sha256(data).hexdigest()
        assert not any("over-" in path or "client-" in path for path in held)
        assert eps.proc.poll() is None
    finally:
        eps.stop()
