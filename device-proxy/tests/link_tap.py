"""What a save costs on the device link, part by part.

`LinkTap` is a TCP relay put between ec-proxy and a plain-HTTP (lab) EPS:
it forwards every byte unchanged and records both directions of each
connection. `LinkTap.exchanges()` cuts the recording into HTTP/1.1
exchanges, and `breakdown()` decodes one with ec_protocol's own decoder
into the parts of spec §13.4: HTTP framing, the SAVE's header and MAC,
its context definitions, each request's head CB (and body CB), the items
and their payloads (the patch), and the SAVE_RESULT's head CB and body CB.
It also resolves the CBs against the contexts and responses seen earlier
on the tap, so `Part.text` shows what a DELTA carried (`describe()`).

    tap = LinkTap(eps.device).start()          # then start ec-proxy with --edge tap.url
    mark = tap.mark()
    ... one save ...
    for ex in tap.exchanges(mark): print(describe(breakdown(ex, tap)))

Run as a script on a recording (`python link_tap.py FILE.json`) it prints
the same breakdowns, and `python link_tap.py --table FILE.json ...` one
Markdown table of every SAVE; `LinkTap.dump(path)` writes a recording
(the SDK tests do with EC_LINK_REPORT=FILE: sdk_lab.report).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from ec_protocol.cb import CB
from ec_protocol.messages import (
    HELLO_PATH,
    SAVE_PATH,
    Save,
    SaveResult,
    decode_message,
    response_digest,
)
from ec_protocol.wire import varint
from testbed.relay import Relay


@dataclass
class Exchange:
    """One HTTP/1.1 request and its response on the device link."""

    at: float
    path: str
    request_head: bytes
    request_body: bytes
    response_head: bytes
    response_body: bytes

    @property
    def total(self) -> int:
        return len(self.request_head) + len(self.request_body) + len(self.response_head) + len(self.response_body)


class LinkTap(Relay):
    """A recording TCP relay to `target` ("host:port")."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        super().__init__((host, int(port)))
        self.conns: list[tuple[list, list]] = []  # per connection: [(t, bytes)] out, [(t, bytes)] in
        self.lock = threading.Lock()
        # ec_protocol state to resolve CBs: contexts by (session, id), responses by digest
        self._contexts: dict[tuple[bytes, int], tuple[bytes, bytes]] = {}
        self._responses: dict[bytes, tuple[bytes, bytes]] = {}
        self._resolved: set[int] = set()

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self) -> None:
        self.close()

    def opened(self) -> tuple[list, list]:
        out: list = []
        back: list = []
        with self.lock:
            self.conns.append((out, back))
        return out, back

    def pass_on(self, state: tuple[list, list], upstream: bool, data: bytes, dst: socket.socket) -> None:
        with self.lock:
            state[0 if upstream else 1].append((time.monotonic(), data))
        dst.sendall(data)

    def exchanges(self, since: int = 0) -> list[Exchange]:
        """Every complete exchange so far, in the order the requests started,
        from the `since`-th on (see `mark`)."""
        with self.lock:
            conns = [(list(o), list(b)) for o, b in self.conns]
        out: list[Exchange] = []
        for sent, got in conns:
            out.extend(_exchanges(sent, got))
        out.sort(key=lambda e: e.at)
        return out[since:]

    def mark(self) -> int:
        return len(self.exchanges())

    def dump(self, path) -> None:
        with open(path, "w") as f:
            json.dump([{"at": e.at, "path": e.path, "req_head": e.request_head.hex(), "req_body": e.request_body.hex(),
                        "resp_head": e.response_head.hex(), "resp_body": e.response_body.hex()}
                       for e in self.exchanges()], f)


def _messages(chunks: list) -> list[tuple[float, bytes, bytes]]:
    """HTTP/1.1 messages (time of the first byte, head, body) in one direction."""
    data = b"".join(c for _, c in chunks)
    starts = []
    pos = 0
    for t, c in chunks:
        starts.append((pos, t))
        pos += len(c)
    out = []
    at = 0
    while at < len(data):
        end = data.find(b"\r\n\r\n", at)
        if end < 0:
            break
        head = data[at : end + 4]
        fields = {}
        for line in head.split(b"\r\n")[1:]:
            if b":" in line:
                k, v = line.split(b":", 1)
                fields[k.strip().lower()] = v.strip()
        body_at = end + 4
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            p = body_at
            while True:
                nl = data.find(b"\r\n", p)
                if nl < 0:
                    return out
                size = int(data[p:nl].split(b";")[0], 16)
                p = nl + 2 + size + 2
                if size == 0:
                    break
            body, nxt = data[body_at:p], p
        else:
            n = int(fields.get(b"content-length", b"0"))
            body, nxt = data[body_at : body_at + n], body_at + n
            if len(body) < n:
                break
        t = max((tt for p0, tt in starts if p0 <= at), default=0.0)
        out.append((t, head, body))
        at = nxt
    return out


def _exchanges(sent: list, got: list) -> list[Exchange]:
    reqs, resps = _messages(sent), _messages(got)
    return [
        Exchange(t, rh.split(b" ", 2)[1].decode(), rh, rb, ph, pb)
        for (t, rh, rb), (_, ph, pb) in zip(reqs, resps)
    ]


# ---------------------------------------------------------------- the breakdown


@dataclass
class Part:
    name: str
    size: int
    text: str = ""


@dataclass
class Breakdown:
    path: str
    total: int
    parts: list[Part] = field(default_factory=list)
    #: SAVE: the request heads as the EPS decodes them (resolved with a tap).
    heads: list[bytes] = field(default_factory=list)
    #: SAVE: the items' bindings.
    bindings: list[bytes] = field(default_factory=list)

    def size(self, prefix: str) -> int:
        return sum(p.size for p in self.parts if p.name.startswith(prefix))


def _cb_text(cb: CB, reference: bytes) -> str:
    mode = {0: "SAME", 1: "DELTA", 2: "LITERAL"}[cb.mode]
    if cb.mode == 0:
        return mode
    try:
        value = cb.resolve(reference, 1 << 26)
    except Exception as e:  # noqa: BLE001 - an informative helper
        return f"{mode} (unresolved: {e})"
    return f"{mode} -> {_changed(reference, value)}"


def _changed(ref: bytes, value: bytes) -> str:
    """The middle of `value` that differs from `ref` (common prefix and suffix cut)."""
    a = 0
    while a < min(len(ref), len(value)) and ref[a] == value[a]:
        a += 1
    b = 0
    while b < min(len(ref), len(value)) - a and ref[-1 - b] == value[-1 - b]:
        b += 1
    mid = value[a : len(value) - b]
    return f"{len(mid)} B differ at {a}: {mid[:160]!r}"


def breakdown(ex: Exchange, tap: Optional[LinkTap] = None) -> Breakdown:
    """The device-link bytes of one exchange, by part. With `tap`, CBs are
    resolved against the contexts and responses earlier exchanges of the
    tap defined (call it on the exchanges in order)."""
    bd = Breakdown(ex.path, ex.total)
    bd.parts.append(Part("http: request line and fields", len(ex.request_head)))
    bd.parts.append(Part("http: status line and fields", len(ex.response_head),
                         ex.response_head.decode("latin-1").replace("\r\n", " | ")))
    if ex.path != SAVE_PATH:
        bd.parts.append(Part(f"{ex.path}: request body", len(ex.request_body)))
        bd.parts.append(Part(f"{ex.path}: response body", len(ex.response_body)))
        if ex.path == HELLO_PATH and tap is not None:
            tap._contexts.clear()  # a new session
        return bd
    save = decode_message(ex.request_body, path=SAVE_PATH)
    assert isinstance(save, Save)
    header = 3 + 8 + len(varint(save.seq)) + 8 + (8 if save.resp_ref is not None else 0)
    bd.parts.append(Part("save: header (session, seq, request id, resp_ref)", header,
                         f"resp_ref {'set' if save.resp_ref else 'none'}"))
    bd.parts.append(Part("save: procedure and counts", 1 + len(varint(len(save.ctx_defs)))
                         + len(varint(len(save.requests))) + len(varint(len(save.items)))))
    for d in save.ctx_defs:
        bd.parts.append(Part(f"save: context {d.ctx_id} definition", len(d.encode()),
                             f"head {len(d.head)} B, body {len(d.body)} B"))
        if tap is not None:
            tap._contexts[(save.session_id, d.ctx_id)] = (d.head, d.body)
    for k, q in enumerate(save.requests):
        ref_head, ref_body = (tap._contexts.get((save.session_id, q.ctx_id), (b"", b"")) if tap else (b"", b""))
        head_cb = q.head.encode()
        if tap is not None:
            try:
                bd.heads.append(q.head.resolve(ref_head, 1 << 26))
            except Exception:  # noqa: BLE001
                bd.heads.append(b"")
        bd.parts.append(Part(f"save: request {k} head CB (ctx {q.ctx_id})", len(head_cb),
                             _cb_text(q.head, ref_head) if tap else ""))
        rest = len(q.encode()) - len(head_cb)
        if q.body is not None:
            body_cb = q.body.encode()
            bd.parts.append(Part(f"save: request {k} body CB", len(body_cb), _cb_text(q.body, ref_body) if tap else ""))
            rest -= len(body_cb)
        bd.parts.append(Part(f"save: request {k} ctx id, body kind, item", rest))
    for k, it in enumerate(save.items):
        bd.bindings.append(it.binding)
        bd.parts.append(Part(f"save: item {k} fields", len(it.encode()),
                             f"binding {it.binding!r}, doc {'inline' if it.doc else 'from context'}"))
        bd.parts.append(Part(f"save: item {k} payload ({'patch' if it.payload_kind == 0 else 'full'})", len(it.payload)))
    bd.parts.append(Part("save: mac", 16))
    result = decode_message(ex.response_body, path=SAVE_PATH)
    if not isinstance(result, SaveResult):
        bd.parts.append(Part(f"answer: {type(result).__name__}", len(ex.response_body)))
        return bd
    ref = tap._responses.get(save.resp_ref, (b"", b"")) if (tap and result.ref_used and save.resp_ref) else (b"", b"")
    bd.parts.append(Part("result: header", 3, f"REF_USED {result.ref_used}"))
    bd.parts.append(Part("result: head CB", len(result.head.encode()), _cb_text(result.head, ref[0]) if tap else ""))
    bd.parts.append(Part("result: body CB", len(result.body.encode()), _cb_text(result.body, ref[1]) if tap else ""))
    bd.parts.append(Part("result: mac", 16))
    if tap is not None:
        try:
            head = result.head.resolve(ref[0], 1 << 26)
            body = result.body.resolve(ref[1], 1 << 26)
            tap._responses[response_digest(head, body)] = (head, body)
        except Exception:  # noqa: BLE001
            pass
    return bd


def saves(tap: LinkTap, since: int = 0) -> list[Breakdown]:
    """The breakdowns of the SAVEs from the `since`-th exchange on, their
    heads resolved (every exchange is read, in order, for the contexts)."""
    state = _offline()
    out = []
    for n, ex in enumerate(tap.exchanges()):
        bd = breakdown(ex, state)
        if n >= since and ex.path == SAVE_PATH:
            out.append(bd)
    return out


def describe(bd: Breakdown) -> str:
    lines = [f"{bd.path}: {bd.total} B on the device link"]
    for p in bd.parts:
        lines.append(f"  {p.size:6d}  {p.name}" + (f"   [{p.text}]" if p.text else ""))
    return "\n".join(lines)


def summary(bd: Breakdown) -> dict[str, int]:
    """The table's columns: framing, SAVE header+MAC, contexts, request heads
    (and bodies), items (fields), patch, result header+MAC, result head, result body."""
    return {
        "total": bd.total,
        "http": bd.size("http"),
        "save hdr+mac": bd.size("save: header") + bd.size("save: procedure") + bd.size("save: mac"),
        "ctx defs": bd.size("save: context"),
        "req heads": sum(p.size for p in bd.parts if p.name.startswith("save: request") and "head CB" in p.name),
        "req rest": sum(p.size for p in bd.parts if p.name.startswith("save: request") and "head CB" not in p.name),
        "items": sum(p.size for p in bd.parts if p.name.startswith("save: item") and "fields" in p.name),
        "payload": sum(p.size for p in bd.parts if "payload" in p.name),
        "res hdr+mac": bd.size("result: header") + bd.size("result: mac"),
        "res head": bd.size("result: head"),
        "res body": bd.size("result: body"),
    }


def load(path) -> list[Exchange]:
    """The exchanges of a recording written by `LinkTap.dump`."""
    return [Exchange(e["at"], e["path"], bytes.fromhex(e["req_head"]), bytes.fromhex(e["req_body"]),
                     bytes.fromhex(e["resp_head"]), bytes.fromhex(e["resp_body"])) for e in json.load(open(path))]


def _offline() -> LinkTap:
    tap = LinkTap.__new__(LinkTap)
    tap._contexts, tap._responses, tap._resolved = {}, {}, set()
    return tap


def table(paths: list[str]) -> str:
    """A Markdown table of every SAVE in the recordings: `summary` columns."""
    cols = list(summary(Breakdown("", 0)).keys())
    out = ["| recording | save | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for path in paths:
        tap = _offline()
        n = 0
        for ex in load(path):
            bd = breakdown(ex, tap)
            if ex.path != SAVE_PATH:
                continue
            n += 1
            row = summary(bd)
            out.append(f"| {path.rsplit('.', 2)[-2]} | {n} | " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(out)


def _main(args: list[str]) -> None:
    if args[0] == "--table":
        print(table(args[1:]))
        return
    tap = _offline()
    for ex in load(args[0]):
        print(describe(breakdown(ex, tap)))


if __name__ == "__main__":
    _main(sys.argv[1:])
