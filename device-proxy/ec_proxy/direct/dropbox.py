"""The direct replay of a Dropbox upload session (spec §6.2) and of a
finish_batch_v2 (§6.3): a real session per file (start, then append_v2
with `close` on the last piece, on the content host), then the app's
finish or finish_batch_v2 with the device's session ids and offsets
rewritten to the real ones, every other byte of the app's JSON kept.
"""

from __future__ import annotations

import json
from json.decoder import scanstring
from typing import Optional
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import ec_protocol as ecp

from ..recognise.common import AppRequest, Header, header_text
from ..sessions.common import Answer, GatheredUpload
from .common import (
    ChunkSizes,
    DirectError,
    DirectProtocolError,
    Procedure,
    Run,
    chunked,
    inherit_headers,
    json_field,
    set_header,
)

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


# -- the sequences ---------------------------------------------------------------------


def _dropbox_upload(run: Run, named: AppRequest, data: bytes, chunk: int) -> tuple[Optional[str], Optional[Answer]]:
    """Start and append_v2 with the file: (real session id, None) or (None, the stopping answer)."""
    parts = urlsplit(named.url)
    netloc = parts.netloc
    if netloc.lower().startswith("api."):  # finish_batch_v2 lives on the API host, sessions on content
        netloc = "content." + netloc[4:]
    base = f"{parts.scheme}://{netloc}/2/files/upload_session/"
    pieces = chunked(data, chunk)
    session_id = ""
    for i, (offset, piece) in enumerate(pieces):
        close = "true" if i == len(pieces) - 1 else "false"
        if i == 0:
            url, arg, name = base + "start", f'{{"close":{close}}}', "upload_session/start"
        else:
            url, name = base + "append_v2", "upload_session/append_v2"
            arg = f'{{"cursor":{{"session_id":{json.dumps(session_id)},"offset":{offset}}},"close":{close}}}'
        headers = inherit_headers(named, ("dropbox-api-arg", "content-type"),
                                  [("Dropbox-API-Arg", arg), ("Content-Type", "application/octet-stream")])
        go, resp = run.step(name, "POST", url, headers, piece, (200,))
        if not go:
            return None, resp
        if i == 0:
            sid = json_field(resp, "session_id")
            if sid is None:
                raise DirectProtocolError(name, "no session_id in the response", resp)
            session_id = sid
    return session_id, None


def _with_arg(req: AppRequest, new_arg: str) -> tuple[str, list[Header]]:
    """The request's URL and headers with its Dropbox argument replaced, where
    the app put it: the header, or the `?arg=` URL parameter."""
    headers = inherit_headers(req)
    if req.header("dropbox-api-arg") is not None:
        return req.url, set_header(headers, "dropbox-api-arg", new_arg)
    parts = urlsplit(req.url)
    query = [(k, new_arg if k == "arg" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote))), headers


def upload_session(run: Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
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


def finish_batch(run: Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
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
    return run.send(batch.method, batch.url, inherit_headers(batch), body)


PROCEDURES: dict[int, Procedure] = {
    ecp.DROPBOX_SESSION: upload_session,
    ecp.DROPBOX_BATCH: finish_batch,
}
