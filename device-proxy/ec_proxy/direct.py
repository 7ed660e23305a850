"""The direct path for a collapsed upload (spec §7): the device performs the
provider's own request sequence with the file it gathered.

When the EPS cannot be used, a `GatheredUpload` (ec_proxy.sessions) is
replayed against the provider exactly as the EPS would perform it (the
procedures of spec §6.2-§6.6, implemented in eps/providers/src/procedures/;
the request shapes here follow those files): a real Dropbox session with
the finish's cursor rewritten byte-exactly, Graph createUploadSession then
fragments without `Authorization`, Drive initiation then chunks, Nextcloud
MKCOL, numbered chunks and MOVE. The response to the final request is what
the app gets. As on the EPS, a status of 400 or more stops the sequence and
is returned unchanged (after a best-effort cancel of what was created), any
other unexpected status raises `DirectProtocolError`, and nothing is
retried: the app's retry policy stays the only one.

`replay(gathered, send)` takes the HTTP sender as a callable, so the addon
can pass one that goes where mitmproxy's upstream goes; `HttpSender` is a
plain `http.client` one with an SSL context and an optional host -> address
map (the lab's provider servers under the real host names).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Callable, Optional
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import ec_protocol as ecp

from .recognise.common import AppRequest, Header, header_text
from .sessions import HOP_FIELDS, Answer, GatheredUpload

#: send(method, url, headers, body) -> (status, reason, headers, body)
Sender = Callable[[str, str, list[Header], bytes], tuple[int, str, list[Header], bytes]]


@dataclass(frozen=True)
class ChunkSizes:
    """Request sizes of the replayed sequences (the EPS's defaults, §6)."""

    dropbox: int = 64 * 1024 * 1024
    graph: int = 10 * 1024 * 1024  # a multiple of 320 KiB
    drive: int = 64 * 1024 * 1024  # a multiple of 256 KiB
    nextcloud: int = 10 * 1024 * 1024  # at least 5 MiB


class DirectError(Exception):
    """The replay could not be performed as the provider's protocol says."""


class DirectProtocolError(DirectError):
    """A provider answered a step with a status the sequence does not expect
    (below 400), or without the session URL it must return. Answer the app
    502, as the EPS does for `provider_protocol`."""

    def __init__(self, step: str, message: str, response: Optional[Answer] = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step, self.response = step, response


# -- byte-exact JSON editing ---------------------------------------------------------

_WS = " \t\r\n"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _members(text: str, start: int) -> dict[str, tuple[int, int]]:
    """The value spans of the members of the JSON object starting at
    `text[start]` (after white space): {name: (start, end)}."""
    decoder = json.JSONDecoder()
    i = _skip(text, start)
    if i >= len(text) or text[i] != "{":
        raise DirectError("JSON: an object was due")
    out: dict[str, tuple[int, int]] = {}
    i = _skip(text, i + 1)
    if i < len(text) and text[i] == "}":
        return out
    while True:
        if i >= len(text) or text[i] != '"':
            raise DirectError("JSON: a member name was due")
        name, i = scanstring(text, i + 1)
        i = _skip(text, i)
        if i >= len(text) or text[i] != ":":
            raise DirectError("JSON: ':' was due")
        i = _skip(text, i + 1)
        _, end = decoder.raw_decode(text, i)
        out[name] = (i, end)
        i = _skip(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
            continue
        if i < len(text) and text[i] == "}":
            return out
        raise DirectError("JSON: ',' or '}' was due")


def _elements(text: str, span: tuple[int, int]) -> list[int]:
    """Start offsets of the elements of the JSON array at `span`."""
    decoder = json.JSONDecoder()
    i = _skip(text, span[0] + 1)
    starts: list[int] = []
    if text[i] == "]":
        return starts
    while True:
        starts.append(i)
        _, end = decoder.raw_decode(text, i)
        i = _skip(text, end)
        if text[i] == ",":
            i = _skip(text, i + 1)
            continue
        return starts


def _cursor_edits(text: str, obj_start: int, real_id: str, size: int) -> list[tuple[tuple[int, int], str]]:
    cursor = _members(text, obj_start).get("cursor")
    if cursor is None:
        raise DirectError("Dropbox arguments: no cursor")
    inner = _members(text, cursor[0])
    if "session_id" not in inner or "offset" not in inner:
        raise DirectError("Dropbox arguments: cursor without session_id or offset")
    return [(inner["session_id"], json.dumps(real_id)), (inner["offset"], str(size))]


def _without_member(text: str, name: str) -> str:
    """The top-level JSON object `text` without its member `name`, every
    other byte kept (the member goes with the comma joining it to a neighbour)."""
    members = list(_members(text, 0).items())
    names = [n for n, _ in members]
    if name not in names:
        return text
    i = names.index(name)
    start, end = members[i][1]
    if i > 0:
        return text[: members[i - 1][1][1]] + text[end:]
    opening = text.index("{") + 1
    rest = _skip(text, end)
    if rest < len(text) and text[rest] == ",":
        return text[:opening] + text[rest + 1 :]
    return text[:opening] + text[end:]


def _splice(text: str, edits: list[tuple[tuple[int, int], str]]) -> str:
    for (a, b), value in sorted(edits, key=lambda e: e[0][0], reverse=True):
        text = text[:a] + value + text[b:]
    return text


# -- running steps -------------------------------------------------------------------


def _headers(req: AppRequest, drop: tuple[str, ...] = (), set_: list[Header] = ()) -> list[Header]:
    """The app request's fields minus hop-by-hop and `drop` and the ones being
    set, then the set ones: "inherit except what the procedure sets" (§6.0)."""
    setting = {n.lower() for n, _ in set_}
    kept = [(n, v) for n, v in req.headers if n.lower() not in HOP_FIELDS and n.lower() not in drop and n.lower() not in setting]
    return kept + list(set_)


def _set(headers: list[Header], name: str, value: str) -> list[Header]:
    """`name` set to `value` in place of its first occurrence (order kept)."""
    out, done = [], False
    for n, v in headers:
        if n.lower() == name:
            if not done:
                out.append((n, value))
                done = True
            continue
        out.append((n, v))
    if not done:
        out.append((name, value))
    return out


class _Run:
    def __init__(self, send: Sender) -> None:
        self._send = send

    def send(self, method: str, url: str, headers: list[Header], body: bytes) -> Answer:
        status, reason, rh, rb = self._send(method, url, headers, body)
        return Answer(status, reason, tuple(rh), rb)

    def step(self, name: str, method: str, url: str, headers: list[Header], body: bytes, expected: tuple[int, ...]) -> tuple[bool, Answer]:
        """(go on, response): False with the response when it stops the sequence."""
        resp = self.send(method, url, headers, body)
        if resp.status in expected:
            return True, resp
        if resp.status >= 400:
            return False, resp
        raise DirectProtocolError(name, f"status {resp.status} where {expected} was due", resp)

    def cancel(self, method: str, url: str, headers: list[Header]) -> None:
        try:  # best effort: its outcome changes nothing that is returned
            self.send(method, url, headers, b"")
        except Exception:  # noqa: BLE001 - the sequence's own answer matters, not this one
            pass


def _pieces(data: bytes, size: int) -> list[tuple[int, bytes]]:
    if not data:
        return [(0, b"")]
    return [(a, data[a : a + size]) for a in range(0, len(data), size)]


def _header(resp: Answer, name: str) -> Optional[str]:
    return next((v for n, v in resp.headers if n.lower() == name), None)


def _json_field(resp: Answer, name: str) -> Optional[str]:
    try:
        value = json.loads(resp.body).get(name)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


# -- Dropbox ---------------------------------------------------------------------------


def _dropbox_upload(run: _Run, named: AppRequest, data: bytes, chunk: int) -> tuple[Optional[str], Optional[Answer]]:
    """Start and append_v2 with the file: (real session id, None) or (None, the stopping answer)."""
    parts = urlsplit(named.url)
    netloc = parts.netloc
    if netloc.lower().startswith("api."):  # finish_batch_v2 lives on the API host, sessions on content
        netloc = "content." + netloc[4:]
    base = f"{parts.scheme}://{netloc}/2/files/upload_session/"
    pieces = _pieces(data, chunk)
    session_id = ""
    for i, (offset, piece) in enumerate(pieces):
        close = "true" if i == len(pieces) - 1 else "false"
        if i == 0:
            url, arg, name = base + "start", f'{{"close":{close}}}', "upload_session/start"
        else:
            url, name = base + "append_v2", "upload_session/append_v2"
            arg = f'{{"cursor":{{"session_id":{json.dumps(session_id)},"offset":{offset}}},"close":{close}}}'
        headers = _headers(named, ("dropbox-api-arg", "content-type"), [("Dropbox-API-Arg", arg), ("Content-Type", "application/octet-stream")])
        go, resp = run.step(name, "POST", url, headers, piece, (200,))
        if not go:
            return None, resp
        if i == 0:
            sid = _json_field(resp, "session_id")
            if sid is None:
                raise DirectProtocolError(name, "no session_id in the response", resp)
            session_id = sid
    return session_id, None


def _with_arg(req: AppRequest, new_arg: str) -> tuple[str, list[Header]]:
    """The request's URL and headers with its Dropbox argument replaced, where
    the app put it: the header, or the `?arg=` URL parameter."""
    headers = _headers(req)
    if req.header("dropbox-api-arg") is not None:
        return req.url, _set(headers, "dropbox-api-arg", new_arg)
    parts = urlsplit(req.url)
    query = [(k, new_arg if k == "arg" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote))), headers


def _dropbox_session(run: _Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    finish, file = g.requests[0], g.files[0]
    sid, stop = _dropbox_upload(run, finish, file.data, sizes.dropbox)
    if stop is not None:
        return stop
    raw = finish.header("dropbox-api-arg")
    if raw is None:
        raw = finish.query().get("arg", "")
    text = header_text(raw)
    new_arg = _splice(text, _cursor_edits(text, 0, sid, len(file.data)))
    # The app's content_hash described the bytes its finish carried; this
    # finish carries none (they went in start / append_v2): dropped, as the
    # EPS does (spec §6.2), or Dropbox would answer content_hash_mismatch.
    new_arg = _without_member(new_arg, "content_hash")
    url, headers = _with_arg(finish, new_arg)
    return run.send("POST", url, headers, b"")


def _dropbox_batch(run: _Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    batch = g.requests[0]
    text = (batch.body or b"").decode("utf-8")
    entries = _members(text, 0).get("entries")
    if entries is None:
        raise DirectError("finish_batch_v2: no entries")
    by_binding = {f.binding.decode(): f for f in g.files}
    edits = []
    for start in _elements(text, entries):
        cursor = _members(text, start).get("cursor")
        sid_span = _members(text, cursor[0])["session_id"] if cursor else None
        device_id = json.loads(text[sid_span[0] : sid_span[1]]) if sid_span else None
        file = by_binding.get(device_id)
        if file is None:
            raise DirectError("finish_batch_v2: an entry matches no gathered file")
        real, stop = _dropbox_upload(run, batch, file.data, sizes.dropbox)
        if stop is not None:
            return stop
        edits += _cursor_edits(text, start, real, len(file.data))
    body = _splice(text, edits).encode("utf-8")
    return run.send(batch.method, batch.url, _headers(batch), body)


# -- Graph, Drive, Nextcloud -------------------------------------------------------


def _graph_session(run: _Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    create, data = g.requests[0], g.files[0].data
    if not data:
        raise DirectError("a Graph upload session cannot carry an empty file")
    go, resp = run.step("createUploadSession", create.method, create.url, _headers(create), create.body or b"", (200,))
    if not go:
        return resp
    upload_url = _json_field(resp, "uploadUrl")
    if upload_url is None:
        raise DirectProtocolError("createUploadSession", "no uploadUrl in the response", resp)
    # The uploadUrl is pre-authenticated and Graph refuses a token there.
    base = [(n, v) for n, v in create.headers if n.lower() == "user-agent"]
    pieces = _pieces(data, sizes.graph)
    for i, (offset, piece) in enumerate(pieces):
        last = i == len(pieces) - 1
        headers = base + [("Content-Range", f"bytes {offset}-{offset + len(piece) - 1}/{len(data)}")]
        go, resp = run.step("upload fragment", "PUT", upload_url, headers, piece, (200, 201) if last else (202,))
        if not go:
            run.cancel("DELETE", upload_url, base)
            return resp
    return resp


def _drive_resumable(run: _Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    init, data = g.requests[0], g.files[0].data
    go, resp = run.step("initiate", init.method, init.url, _headers(init), init.body or b"", (200,))
    if not go:
        return resp
    location = (_header(resp, "location") or "").strip()
    if not location:
        raise DirectProtocolError("initiate", "no Location in the response", resp)
    drop = ("content-type",) + tuple(n.lower() for n, _ in init.headers if n.lower().startswith("x-upload-content-"))
    if (urlsplit(location).netloc.lower() != urlsplit(init.url).netloc.lower()):
        drop += ("authorization", "cookie")
    content_type = init.header("x-upload-content-type")
    pieces = _pieces(data, sizes.drive)
    for i, (offset, piece) in enumerate(pieces):
        last = i == len(pieces) - 1
        rng = "bytes */0" if not data else f"bytes {offset}-{offset + len(piece) - 1}/{len(data)}"
        set_ = ([("Content-Type", content_type)] if content_type else []) + [("Content-Range", rng)]
        go, resp = run.step("upload chunk", "PUT", location, _headers(init, drop, set_), piece, (200, 201) if last else (308,))
        if not go:
            return resp
    return resp


def _nextcloud_chunked(run: _Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    mkcol, move, data = g.requests[0], g.requests[1], g.files[0].data
    go, resp = run.step("MKCOL", "MKCOL", mkcol.url, _headers(mkcol), b"", (201,))
    if not go:
        return resp
    total = str(len(data))
    base = mkcol.url.rstrip("/")
    for n, (_, piece) in enumerate(_pieces(data, sizes.nextcloud), start=1):
        headers = _headers(mkcol, set_=[("OC-Total-Length", total)])
        go, resp = run.step("upload chunk", "PUT", f"{base}/{n:05d}", headers, piece, (201, 204))
        if not go:
            run.cancel("DELETE", mkcol.url, _headers(mkcol, ("destination", "oc-total-length")))
            return resp
    resp = run.send("MOVE", move.url, _set(_headers(move), "oc-total-length", total), b"")
    if resp.status >= 300:
        run.cancel("DELETE", mkcol.url, _headers(mkcol, ("destination", "oc-total-length")))
    return resp


_PROCEDURES = {
    ecp.DROPBOX_SESSION: _dropbox_session,
    ecp.DROPBOX_BATCH: _dropbox_batch,
    ecp.GRAPH_SESSION: _graph_session,
    ecp.DRIVE_RESUMABLE: _drive_resumable,
    ecp.NEXTCLOUD_CHUNKED: _nextcloud_chunked,
}


def replay(gathered: GatheredUpload, send: Sender, sizes: ChunkSizes = ChunkSizes()) -> Answer:
    """Performs the provider's sequence for `gathered`; the final response.

    Raises `DirectProtocolError` (answer the app 502) or `DirectError` (the
    gathered upload does not fit its procedure), and whatever `send` raises
    for transport failures (`OSError`, `http.client.HTTPException`).
    """
    procedure = _PROCEDURES.get(gathered.procedure)
    if procedure is None:
        raise DirectError(f"procedure {gathered.procedure} is not a collapsed upload")
    return procedure(_Run(send), gathered, sizes)


# -- a default sender ------------------------------------------------------------------


class HttpSender:
    """`send` over `http.client`, one connection per request.

    `resolve` maps a host name to the (address, port) to connect to, keeping
    the name for SNI, certificate checks and the Host field (the lab's
    provider servers). Header values given as str are sent as UTF-8 with
    surrogateescape, which gives back the bytes mitmproxy received.
    """

    def __init__(self, context: Optional[ssl.SSLContext] = None, resolve: Optional[dict[str, tuple[str, int]]] = None,
                 timeout: float = 120.0) -> None:
        self.context = context or ssl.create_default_context()
        self.resolve = {k.lower(): v for k, v in (resolve or {}).items()}
        self.timeout = timeout

    def __call__(self, method: str, url: str, headers: list[Header], body: bytes) -> tuple[int, str, list[Header], bytes]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addr, aport = self.resolve.get(host.lower(), (host, port))
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = _ResolvedHTTPS(host, addr, aport, self.context, self.timeout)
        else:
            conn = http.client.HTTPConnection(addr, aport, timeout=self.timeout)
        try:
            path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", parts.netloc)
            for n, v in headers:
                if n.lower() not in HOP_FIELDS:
                    conn.putheader(n, v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v)
            if body or method not in ("GET", "HEAD", "DELETE"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, list(resp.getheaders()), data
        finally:
            conn.close()


class _ResolvedHTTPS(http.client.HTTPSConnection):
    def __init__(self, name: str, addr: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(addr, port, timeout=timeout, context=context)
        self._name = name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._name)
