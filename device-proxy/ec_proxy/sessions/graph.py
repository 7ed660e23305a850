"""Microsoft Graph / OneDrive upload sessions on the device (spec §6.4):
createUploadSession, fragments, the session's status and its cancel.

The device answers createUploadSession with an `uploadUrl` of its own
(`…/rup/ec-…` on the OneDrive host, or on the SharePoint host the app
used); a token without the mark is the provider's and passes through.
Fragments must be contiguous, in multiples of 320 KiB (the last one
excepted) and at most 60 MiB; errors are `{"error": {"code", "message"}}`.
"""

from __future__ import annotations

from typing import Union

import ec_protocol as ecp

from ..recognise import Kind, Recognised
from ..recognise.graph import ONEDRIVE_HOST
from .common import (
    DEVICE_MARK,
    Answer,
    GatheredFile,
    GatheredUpload,
    Handler,
    Outcome,
    ProviderSessions,
    Session,
    Shelf,
    iso,
    json_answer,
    origin,
)

GRAPH_FRAGMENT_UNIT = 320 * 1024
GRAPH_MAX_FRAGMENT = 60 * 1024 * 1024
#: The shelf's key prefix of a Graph session.
KEY = "graph:"


def _graph_error(status: int, reason: str, code: str, message: str) -> Answer:
    return json_answer(status, reason, {"error": {"code": code, "message": message}})


class GraphSessions(ProviderSessions):
    """createUploadSession, fragments to the uploadUrl, GET and DELETE of it."""

    head_only = frozenset({Kind.GRAPH_SESSION_STATUS, Kind.GRAPH_SESSION_CANCEL})

    def __init__(self, shelf: Shelf, fragment_auth: str = "reject") -> None:
        super().__init__(shelf)
        #: Graph fragments carrying `Authorization`: "reject" answers 401 as
        #: OneDrive does (its documentation warns of it, and the Graph SDK's
        #: large-file task sends one); "accept" as OneDrive did for rclone 1.60.
        if fragment_auth not in ("reject", "accept"):
            raise ValueError("graph_fragment_auth is reject or accept")
        self.fragment_auth = fragment_auth

    def handlers(self) -> dict[Kind, Handler]:
        return {
            Kind.GRAPH_CREATE_SESSION: self.create,
            Kind.GRAPH_FRAGMENT: self.fragment,
            Kind.GRAPH_SESSION_STATUS: self.status,
            Kind.GRAPH_SESSION_CANCEL: self.cancel,
        }

    def create(self, rec: Recognised) -> Outcome:
        host = rec.request.host if rec.request.host.endswith(".sharepoint.com") else ONEDRIVE_HOST
        token = DEVICE_MARK + self.shelf.new_id()
        s = Session(KEY + token, ecp.GRAPH, rec.account, opener=rec.request, doc=rec.doc, name=rec.name,
                    expires_at=iso(self.shelf.wall_clock() + self.shelf.idle_ttl))
        self.shelf.add(s)
        url = f"{origin(rec.request.url, host)}/rup/{token}"
        return json_answer(200, "OK", {"uploadUrl": url, "expirationDateTime": s.expires_at, "nextExpectedRanges": ["0-"]})

    def _lookup(self, rec: Recognised) -> Union[Session, Answer, None]:
        token = rec.session or ""
        if not token.startswith(DEVICE_MARK):
            return None
        s = self.shelf.get(KEY + token)
        if s is None:
            return _graph_error(404, "Not Found", "itemNotFound", "The upload session was not found or has expired")
        return s

    @staticmethod
    def _status_body(s: Session) -> dict:
        end = "" if s.total is None else str(s.total - 1)
        return {"expirationDateTime": s.expires_at, "nextExpectedRanges": [f"{len(s.data)}-{end}"]}

    def fragment(self, rec: Recognised) -> Outcome:
        found = self._lookup(rec)
        if not isinstance(found, Session):
            return found
        s, body = found, rec.request.body or b""
        # The uploadUrl is pre-authenticated: "including the Authorization
        # header when issuing the PUT call may result in an HTTP 401", and
        # OneDrive does answer 401 to the Graph SDK's large-file task. The
        # device answers what the provider would (the session stays, as at
        # OneDrive); `graph_fragment_auth="accept"` for a provider that takes it.
        if self.fragment_auth == "reject" and rec.request.header("authorization") is not None:
            return _graph_error(401, "Unauthorized", "unauthenticated",
                                "The uploadUrl is pre-authenticated; do not send an Authorization header")
        cr = rec.content_range
        if cr is None or cr[0] is None or cr[2] is None:
            return _graph_error(400, "Bad Request", "invalidRequest", "Missing or invalid Content-Range header; expected 'bytes a-b/total'")
        start, end, total = cr
        if end < start or end >= total:
            return _graph_error(416, "Requested Range Not Satisfiable", "invalidRange", f"Content-Range {start}-{end}/{total} is not a valid range")
        if s.total is not None and total != s.total:
            return _graph_error(400, "Bad Request", "invalidRequest", f"Declared total {total} differs from the session's {s.total}")
        if len(body) != end - start + 1:
            return _graph_error(400, "Bad Request", "invalidRequest", f"Content-Range covers {end - start + 1} bytes but the body has {len(body)}")
        if len(body) > GRAPH_MAX_FRAGMENT:
            return _graph_error(413, "Request Entity Too Large", "requestTooLarge", "A fragment must be at most 60 MiB")
        if start != len(s.data):
            return _graph_error(416, "Requested Range Not Satisfiable", "invalidRange",
                                f"The uploaded fragment overlaps or skips data; next expected range is {len(s.data)}-")
        last = end + 1 == total
        if not last and len(body) % GRAPH_FRAGMENT_UNIT:
            return _graph_error(400, "Bad Request", "invalidRequest", f"Fragment size {len(body)} is not a multiple of 320 KiB (327680 bytes)")
        if last:
            assert s.opener is not None
            file = GatheredFile(bytes(s.data) + body, s.doc, s.name)
            return GatheredUpload(ecp.GRAPH, ecp.GRAPH_SESSION, (s.opener,), (file,), (s.key,))
        s.total = total
        s.data += body
        if not self.shelf.grew(s):
            return _graph_error(404, "Not Found", "itemNotFound", "The upload session was not found or has expired")
        return json_answer(202, "Accepted", {"expirationDateTime": s.expires_at, "nextExpectedRanges": [f"{len(s.data)}-"]})

    def status(self, rec: Recognised) -> Outcome:
        found = self._lookup(rec)
        return json_answer(200, "OK", self._status_body(found)) if isinstance(found, Session) else found

    def cancel(self, rec: Recognised) -> Outcome:
        found = self._lookup(rec)
        if not isinstance(found, Session):
            return found
        self.shelf.drop(found.key)
        return Answer(204, "No Content", (), b"")
