"""Google Drive resumable uploads on the device (spec §6.5): the
initiation and the chunks put to the session URI.

The device answers the initiation with a session URI of its own
(`…?uploadType=resumable&upload_id=ec-…` on the Drive host); an upload id
without the mark is Google's and passes through. Chunks are contiguous and
in multiples of 256 KiB (the last one excepted); an incomplete upload is
answered `308 Resume Incomplete` with `Range`, and errors are
`{"error": {"code", "message", "errors": [{"reason", …}]}}`. A status
query (`Content-Range: bytes */total`) after the final chunk whose SAVE's
outcome is unknown is that final request again (`DriveSessions._attempted`):
the app gets what Google answers for a completed upload, the file resource.
Once the upload is definitely complete (`SessionBook.settle` with the
answer the app got), the session stays, without its bytes, and a status
query gets that answer again, as Google answers one on a completed
session (an app whose answer was lost asks so; a 404 would make it upload
the file again); any other request to it finds no session.
"""

from __future__ import annotations

from typing import Optional

import ec_protocol as ecp

from ..recognise import Kind, Recognised
from ..recognise.drive import HOST as DRIVE_HOST
from .common import (
    DEVICE_MARK,
    Answer,
    GatheredFile,
    GatheredUpload,
    Handler,
    Outcome,
    ProviderSessions,
    Session,
    json_answer,
    origin,
)

DRIVE_CHUNK_UNIT = 256 * 1024
#: The shelf's key prefix of a Drive session.
KEY = "drive:"


def _drive_error(status: int, reason: str, why: str, message: str) -> Answer:
    return json_answer(status, reason, {"error": {"code": status, "message": message,
                                                  "errors": [{"message": message, "domain": "global", "reason": why}]}})


class DriveSessions(ProviderSessions):
    """uploadType=resumable: initiation, then chunks (and status queries) to the session URI."""

    def handlers(self) -> dict[Kind, Handler]:
        return {
            Kind.DRIVE_RESUMABLE_INIT: self.init,
            Kind.DRIVE_RESUMABLE_CHUNK: self.chunk,
        }

    def init(self, rec: Recognised) -> Outcome:
        upload_id = DEVICE_MARK + self.shelf.new_id()
        declared = (rec.request.header("x-upload-content-length") or "").strip()
        s = Session(KEY + upload_id, ecp.DRIVE, rec.account, opener=rec.request, doc=rec.doc, name=rec.name,
                    total=int(declared) if declared.isdigit() else None)
        self.shelf.add(s)
        path = rec.request.path.rstrip("/")
        location = f"{origin(rec.request.url, DRIVE_HOST)}{path}?uploadType=resumable&upload_id={upload_id}"
        return Answer(200, "OK", (("Location", location), ("X-GUploader-UploadID", upload_id)), b"")

    def chunk(self, rec: Recognised) -> Outcome:
        upload_id = rec.session or ""
        if not upload_id.startswith(DEVICE_MARK):
            return None
        s = self.shelf.get(KEY + upload_id)
        if s is None or s.account != rec.account or s.opener is None or s.opener.path.rstrip("/") != rec.request.path.rstrip("/"):
            return _drive_error(404, "Not Found", "notFound", "The upload session was not found or has expired")
        body = rec.request.body or b""
        if s.done is not None:
            if rec.content_range is not None and rec.content_range[0] is None and not body:
                return s.done
            return _drive_error(404, "Not Found", "notFound", "The upload session was not found or has expired")
        received = len(s.data)
        if rec.request.header("content-range") is None:
            start, end, total = 0, len(body) - 1, len(body)
        else:
            cr = rec.content_range
            if cr is None:
                return _drive_error(400, "Bad Request", "badRequest", f"Invalid Content-Range {rec.request.header('content-range')!r}")
            start, end, total = cr
            if start is None:  # bytes */total: a status query, or the end of an empty file
                if body:
                    return _drive_error(400, "Bad Request", "badRequest", "Content-Range bytes */N must have an empty body")
                earlier = self._attempted(s, total)
                if earlier is not None:
                    return earlier
                if total is not None and total == received and (s.total is None or s.total == total):
                    return self._done(s, b"")
                return self._incomplete(received)
        if len(body) != end - start + 1:
            return _drive_error(400, "Bad Request", "badRequest", f"Content-Range covers {end - start + 1} bytes but the body has {len(body)}")
        if s.total is not None and total is not None and total != s.total:
            return _drive_error(400, "Bad Request", "badRequest", f"Total {total} differs from X-Upload-Content-Length {s.total}")
        if start != received:
            return _drive_error(400, "Bad Request", "badRequest",
                                f"Chunk starts at {start} but the server has {received} bytes; query the status with Content-Range: bytes */{total or '*'}")
        last = total is not None and end + 1 == total
        if not last and len(body) % DRIVE_CHUNK_UNIT:
            return _drive_error(400, "Bad Request", "badRequest", f"Chunk size {len(body)} is not a multiple of 256 KiB (262144 bytes)")
        if last:
            return self._done(s, body)
        s.data += body
        if not self.shelf.grew(s):
            return _drive_error(404, "Not Found", "notFound", "The upload session was not found or has expired")
        return self._incomplete(len(s.data))

    @staticmethod
    def _attempted(s: Session, total: Optional[int]) -> Optional[GatheredUpload]:
        """A status query (`bytes */total`) after the final chunk went to the
        EPS in a SAVE whose outcome is unknown (`s.attempt`): Google answers
        it 200 with the file resource once the upload is complete (and the
        app's client, google-api-python-client among them, is then done),
        so the device must not answer 308 from the bytes it gathered before
        that chunk. The upload of that SAVE, whole file and all, goes back
        to the addon as the session's final request, which sends the same
        SAVE again with its request id (`EdgeCourier._gathered_again`): the
        EPS answers from its outcome record, or performs it if it never
        started it, never twice; the app gets the provider's answer, a 504
        while the outcome stays unknown, or a 503 when the EPS cannot be
        asked. None when the query is for another length (it is answered
        from the gathered bytes, as before)."""
        attempt = s.attempt
        if attempt is None or s.opener is None:
            return None
        k = attempt.keys.index(s.key) if s.key in attempt.keys else 0 if len(attempt.items) == 1 else None
        if k is None:
            return None
        item = attempt.items[k]
        if total is not None and total != len(item.target) or s.total is not None and s.total != len(item.target):
            return None
        file = GatheredFile(item.target, item.doc, s.name, item.binding)
        return GatheredUpload(ecp.DRIVE, ecp.DRIVE_RESUMABLE, (s.opener,), (file,), (s.key,))

    @staticmethod
    def _incomplete(received: int) -> Answer:
        headers = (("Range", f"bytes=0-{received - 1}"),) if received else ()
        return Answer(308, "Resume Incomplete", headers + (("Content-Length", "0"),), b"")

    @staticmethod
    def _done(s: Session, tail: bytes) -> GatheredUpload:
        assert s.opener is not None
        file = GatheredFile(bytes(s.data) + tail, s.doc, s.name)
        return GatheredUpload(ecp.DRIVE, ecp.DRIVE_RESUMABLE, (s.opener,), (file,), (s.key,))
