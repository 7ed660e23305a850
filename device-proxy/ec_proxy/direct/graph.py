"""The direct replay of a Microsoft Graph / OneDrive upload session
(spec §6.4): the app's createUploadSession, then the file in fragments to
the returned `uploadUrl` with `Content-Range` and without `Authorization`
(the URL is pre-authenticated), a best-effort DELETE of the session when a
fragment fails.
"""

from __future__ import annotations

import ec_protocol as ecp

from ..sessions.common import Answer, GatheredUpload
from .common import ChunkSizes, DirectError, DirectProtocolError, Procedure, Run, chunked, inherit_headers, json_field


def upload_session(run: Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    create, data = g.requests[0], g.files[0].data
    if not data:
        raise DirectError("a Graph upload session cannot carry an empty file")
    go, resp = run.step("createUploadSession", create.method, create.url, inherit_headers(create), create.body or b"", (200,))
    if not go:
        return resp
    upload_url = json_field(resp, "uploadUrl")
    if upload_url is None:
        raise DirectProtocolError("createUploadSession", "no uploadUrl in the response", resp)
    # The uploadUrl is pre-authenticated and Graph refuses a token there.
    base = [(n, v) for n, v in create.headers if n.lower() == "user-agent"]
    pieces = chunked(data, sizes.graph)
    for i, (offset, piece) in enumerate(pieces):
        last = i == len(pieces) - 1
        headers = base + [("Content-Range", f"bytes {offset}-{offset + len(piece) - 1}/{len(data)}")]
        go, resp = run.step("upload fragment", "PUT", upload_url, headers, piece, (200, 201) if last else (202,))
        if not go:
            run.cancel("DELETE", upload_url, base)
            return resp
    return resp


PROCEDURES: dict[int, Procedure] = {ecp.GRAPH_SESSION: upload_session}
