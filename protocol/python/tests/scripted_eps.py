"""A scripted stand-in for the EPS, for the client's resend tests only.

TEST FIXTURE, NOT AN EPS: it answers protocol requests with messages built
by this package's own codec, following a per-test script, so the client's
§7 logic can be exercised before the real EPS (eps/) exists. Once it does,
the end-to-end tests must run the client against the real EPS instead.

It checks MACs and sequence numbers, keeps contexts (so it can resolve the
heads the client codes against them) and the responses it sent (for
resp_ref), and records every request it decoded.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

import ec_protocol as p

SECRET = bytes(range(32))
DROP = "drop"  # script answer: close the connection without answering


@dataclass
class Seen:
    path: str
    msg: object
    heads: list = field(default_factory=list)  # resolved request heads (SAVE/FETCH)


class ScriptedEps:
    def __init__(self, caps: int = p.Cap.ALL_V1, secret: bytes = SECRET) -> None:
        self.secret = secret
        self.caps = caps
        self.sessions: dict[bytes, dict] = {}
        self.seen: list[Seen] = []
        self.responses: dict[bytes, tuple[bytes, bytes]] = {}  # digest -> (head, body)
        # script(seen, default) -> (status, bytes) | DROP; default builds a success.
        self.script: Optional[Callable] = None
        self.lock = threading.Lock()
        self.received = 0  # every request, authenticated or not

    # -- answers

    def ok(self, req, status=200, reason="OK", headers=(("content-type", "application/json"),), body=b"{}", **flags):
        head = p.canonical_response_head(status, reason, list(headers))
        ref = self.responses.get(req.resp_ref) if req.resp_ref is not None else None
        if ref is not None:
            msg = p.SaveResult(p.CB.code(ref[0], head), p.CB.code(ref[1], body), ref_used=True, **flags)
        else:
            msg = p.SaveResult(p.CB.code(b"", head), p.CB.code(b"", body), **flags)
        self.responses[p.response_digest(head, body)] = (head, body)
        return 200, msg.encode(self.secret, req.mac)

    def error(self, req, code, *, stage=None, lst=(), retry_after_ms=0, zero_mac=False, version=1):
        exc = p.ProtocolError(code, stage=stage, list=lst, retry_after_ms=retry_after_ms)
        err = p.Error.from_exception(exc, version)
        if zero_mac:
            err.mac = bytes(16)
            return exc.http, err.encode()
        return exc.http, err.encode(self.secret, req.mac)

    # -- handling

    def handle(self, path: str, body: bytes):
        with self.lock:
            self.received += 1
            msg = p.decode_message(body, path=path)
            if not msg.verify(self.secret):
                return self.error(msg, "auth_failed", zero_mac=True, version=0 if path == p.HELLO_PATH else 1)
            if isinstance(msg, p.Hello):
                sid = os.urandom(8)
                self.sessions[sid] = {"contexts": {}, "seqs": set()}
                self.seen.append(Seen(path, msg))
                ok = p.HelloOk(1, sid, self.caps, (1,), tuple(p.Limits().pairs()))
                return 200, ok.encode(self.secret, msg.mac)
            sess = self.sessions.get(msg.session_id)
            seen = Seen(path, msg)
            self.seen.append(seen)
            if sess is None:
                return self.error(msg, "session_unknown")
            if msg.seq in sess["seqs"]:
                return self.error(msg, "replayed")
            sess["seqs"].add(msg.seq)
            for d in msg.ctx_defs:
                sess["contexts"][d.ctx_id] = d
            reqs = msg.requests if isinstance(msg, p.Save) else (msg.request,)
            missing = sorted({r.ctx_id for r in reqs if r.ctx_id and r.ctx_id not in sess["contexts"]})
            if missing:
                default = self.error(msg, "context_unknown", lst=missing)
            else:
                for r in reqs:
                    ref = sess["contexts"][r.ctx_id].head if r.ctx_id else b""
                    seen.heads.append(p.parse_head(r.head.resolve(ref, 65536)))
                default = self.ok(msg) if isinstance(msg, p.Save) else (500, b"")
            if self.script is not None:
                return self.script(seen, default)
            return default

    def forget_contexts(self):
        for s in self.sessions.values():
            s["contexts"].clear()

    def saves(self):
        return [s for s in self.seen if isinstance(s.msg, (p.Save, p.Fetch))]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - http.server's naming
        n = int(self.headers["Content-Length"])
        body = self.rfile.read(n)
        answer = self.server.eps.handle(self.path, body)
        if answer == DROP:
            self.close_connection = True
            self.connection.close()
            return
        status, data = answer
        self.send_response_only(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def serve(eps: ScriptedEps, ssl_context=None, port: int = 0):
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.eps = eps
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server


def sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()
