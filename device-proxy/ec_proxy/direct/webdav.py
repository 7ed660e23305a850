"""The direct replay of a Nextcloud chunked upload (chunking v2, spec
§6.6): the app's MKCOL of the upload folder, the file in numbered chunks
(`00001`, …) each with `OC-Total-Length`, then the app's MOVE of `.file`;
a best-effort DELETE of the folder when a chunk or the MOVE fails.
"""

from __future__ import annotations

import ec_protocol as ecp

from ..sessions.common import Answer, GatheredUpload
from .common import ChunkSizes, Procedure, Run, chunked, inherit_headers, set_header


def chunked_upload(run: Run, g: GatheredUpload, sizes: ChunkSizes) -> Answer:
    mkcol, move, data = g.requests[0], g.requests[1], g.files[0].data
    go, resp = run.step("MKCOL", "MKCOL", mkcol.url, inherit_headers(mkcol), b"", (201,))
    if not go:
        return resp
    total = str(len(data))
    base = mkcol.url.rstrip("/")
    for n, (_, piece) in enumerate(chunked(data, sizes.nextcloud), start=1):
        headers = inherit_headers(mkcol, set_=[("OC-Total-Length", total)])
        go, resp = run.step("upload chunk", "PUT", f"{base}/{n:05d}", headers, piece, (201, 204))
        if not go:
            run.cancel("DELETE", mkcol.url, inherit_headers(mkcol, ("destination", "oc-total-length")))
            return resp
    resp = run.send("MOVE", move.url, set_header(inherit_headers(move), "oc-total-length", total), b"")
    if resp.status >= 300:
        run.cancel("DELETE", mkcol.url, inherit_headers(mkcol, ("destination", "oc-total-length")))
    return resp


PROCEDURES: dict[int, Procedure] = {ecp.NEXTCLOUD_CHUNKED: chunked_upload}
