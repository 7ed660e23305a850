"""The direct replay of a Google Drive resumable upload (spec §6.5): the
app's initiation, then the file in chunks PUT to the session URI of the
`Location` answered, with the app's `X-Upload-Content-Type` as the chunks'
`Content-Type` (and without the app's credentials when the session URI is
on another host).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import ec_protocol as ecp

from ..sessions.common import Answer, GatheredUpload
from .common import ChunkSizes, DirectProtocolError, Procedure, Run, chunked, inherit_headers, response_header


def resumable(run: Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    init, data = g.requests[0], g.files[0].data
    go, resp = run.step("initiate", init.method, init.url, inherit_headers(init), init.body or b"", (200,))
    if not go:
        return resp
    location = (response_header(resp, "location") or "").strip()
    if not location:
        raise DirectProtocolError("initiate", "no Location in the response", resp)
    drop = ("content-type",) + tuple(n.lower() for n, _ in init.headers if n.lower().startswith("x-upload-content-"))
    if (urlsplit(location).netloc.lower() != urlsplit(init.url).netloc.lower()):
        drop += ("authorization", "cookie")
    content_type = init.header("x-upload-content-type")
    pieces = chunked(data, sizes.drive)
    for i, (offset, piece) in enumerate(pieces):
        last = i == len(pieces) - 1
        rng = "bytes */0" if not data else f"bytes {offset}-{offset + len(piece) - 1}/{len(data)}"
        set_ = ([("Content-Type", content_type)] if content_type else []) + [("Content-Range", rng)]
        go, resp = run.step("upload chunk", "PUT", location, inherit_headers(init, drop, set_), piece, (200, 201) if last else (308,))
        if not go:
            return resp
    return resp


PROCEDURES: dict[int, Procedure] = {ecp.DRIVE_RESUMABLE: resumable}
