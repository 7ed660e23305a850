"""Nextcloud chunked uploads (chunking v2) on the device (spec §6.6):
MKCOL of an upload folder, numbered chunk PUTs, MOVE of `.file` to the
`Destination`, and DELETE of the folder.

Upload folders are the app's names, not the device's: a chunk or MOVE for
a folder the device did not answer MKCOL for passes through to the server.
Chunks and MOVE must carry the `Destination` the MKCOL carried; chunks
are numbered 1 to 10000 and `OC-Total-Length` must agree. Errors are Sabre/DAV
XML (`<d:error>` with `s:exception` and `s:message`).
"""

from __future__ import annotations

from typing import Union

import ec_protocol as ecp

from ..recognise import Kind, Recognised
from .common import (
    Answer,
    GatheredFile,
    GatheredUpload,
    Handler,
    Outcome,
    ProviderSessions,
    Session,
    empty_body,
)

#: The shelf's key prefix of a Nextcloud upload folder.
KEY = "nc:"


def _dav_error(status: int, reason: str, exception: str, message: str) -> Answer:
    body = ('<?xml version="1.0" encoding="utf-8"?>\n<d:error xmlns:d="DAV:" xmlns:s="http://sabredav.org/ns">\n'
            f"  <s:exception>Sabre\\DAV\\Exception\\{exception}</s:exception>\n  <s:message>{message}</s:message>\n</d:error>\n")
    return Answer(status, reason, (("Content-Type", "application/xml; charset=utf-8"),), body.encode())


class NextcloudSessions(ProviderSessions):
    """Chunking v2: MKCOL, chunk PUTs, MOVE `.file`, DELETE."""

    head_only = frozenset({Kind.NC_CANCEL})

    def handlers(self) -> dict[Kind, Handler]:
        return {
            Kind.NC_MKCOL: self.mkcol,
            Kind.NC_CHUNK: self.chunk,
            Kind.NC_MOVE: self.move,
            Kind.NC_CANCEL: self.cancel,
        }

    def mkcol(self, rec: Recognised) -> Outcome:
        key = KEY + (rec.session or "")
        if self.shelf.get(key) is not None:
            return _dav_error(405, "Method Not Allowed", "MethodNotAllowed", "The resource you tried to create already exists")
        self.shelf.add(Session(key, ecp.WEBDAV, rec.account, opener=empty_body(rec.request), doc=rec.doc, name=rec.name))
        return Answer(201, "Created", (("Content-Length", "0"),), b"")

    def _lookup(self, rec: Recognised) -> Union[Session, Answer, None]:
        s = self.shelf.get(KEY + (rec.session or ""))
        if s is None or s.account != rec.account:
            return None  # not an upload folder the device answered: the server's
        assert s.opener is not None
        if rec.request.header("destination") != s.opener.header("destination"):
            return _dav_error(400, "Bad Request", "BadRequest",
                              "Destination differs from the one given at MKCOL, or is missing")
        return s

    def chunk(self, rec: Recognised) -> Outcome:
        found = self._lookup(rec)
        if not isinstance(found, Session):
            return found
        chunk = rec.chunk or ""
        if not chunk.isdigit() or not 1 <= int(chunk) <= 10000:
            return _dav_error(400, "Bad Request", "BadRequest", f"Chunk name {chunk!r}: chunks are numbered 1 to 10000")
        total = rec.request.header("oc-total-length")
        if total is not None:
            if not total.strip().isdigit() or (found.total is not None and int(total) != found.total):
                return _dav_error(400, "Bad Request", "BadRequest", f"OC-Total-Length {total!r} is invalid or differs from earlier chunks")
            found.total = int(total)
        existed = int(chunk) in found.chunks
        found.chunks[int(chunk)] = rec.request.body or b""
        if not self.shelf.grew(found):
            return _dav_error(507, "Insufficient Storage", "InsufficientStorage", "The upload is too large for the device's buffer")
        return Answer(204 if existed else 201, "No Content" if existed else "Created", (("Content-Length", "0"),), b"")

    def move(self, rec: Recognised) -> Outcome:
        found = self._lookup(rec)
        if not isinstance(found, Session):
            return found
        data = b"".join(found.chunks[k] for k in sorted(found.chunks))
        total = rec.request.header("oc-total-length")
        if total is not None and (not total.strip().isdigit() or int(total) != len(data)):
            return _dav_error(400, "Bad Request", "BadRequest", f"Chunks on server do not sum up to {total} but to {len(data)} bytes")
        assert found.opener is not None
        file = GatheredFile(data, rec.doc or found.doc, rec.name or found.name)
        return GatheredUpload(ecp.WEBDAV, ecp.NEXTCLOUD_CHUNKED, (found.opener, empty_body(rec.request)), (file,), (found.key,))

    def cancel(self, rec: Recognised) -> Outcome:
        s = self.shelf.get(KEY + (rec.session or ""))
        if s is None or s.account != rec.account:
            return None
        self.shelf.drop(s.key)
        return Answer(204, "No Content", (), b"")
