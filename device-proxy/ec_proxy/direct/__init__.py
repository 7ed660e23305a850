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

Layout, as `ec_proxy.recognise` and `ec_proxy.sessions`: `common` holds
what the providers share (the sender and `HttpSender`, `ChunkSizes`, the
errors, `Run` for one step, header helpers); one module per provider
(`dropbox`, `graph`, `drive`, `webdav` for Nextcloud) holds its sequence(s)
in a `PROCEDURES` table keyed by the spec's procedure number, which
`replay` here dispatches on. Provider modules import only `common`,
`ec_proxy.sessions.common` and the recognisers' helpers, never each other.
"""

from __future__ import annotations

from ..sessions.common import Answer, GatheredUpload
from . import dropbox, drive, graph, webdav
from .common import ChunkSizes, DirectError, DirectProtocolError, HttpSender, Procedure, Run, Sender

__all__ = [
    "ChunkSizes",
    "DirectError",
    "DirectProtocolError",
    "HttpSender",
    "Sender",
    "replay",
]

_PROCEDURES: dict[int, Procedure] = {
    **dropbox.PROCEDURES,
    **graph.PROCEDURES,
    **drive.PROCEDURES,
    **webdav.PROCEDURES,
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
    return procedure(Run(send), gathered, sizes)
