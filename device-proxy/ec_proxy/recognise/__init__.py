"""Recognisers: which provider call an app request is, and which document.

`recognise(method, url, headers, body)` returns a `Recognised` for a
request to one of the four provider APIs the EPS speaks (Dropbox, Microsoft
Graph / OneDrive, Google Drive, WebDAV / Nextcloud), or None for any other
host. A provider request that is not an upload, a session step or a
download comes back with `kind` `Kind.OTHER`: pass it through untouched.
The module is pure (no proxy, no I/O), so the addon calls it from its hooks
and the tests call it with literal request bytes; one module per provider,
`common` for what they share.

    r = recognise("POST", "https://content.dropboxapi.com/2/files/upload",
                  [("Authorization", "Bearer t"), ("Dropbox-API-Arg", '{"path": "/A.docx"}')], data)
    r.kind is Kind.UPLOAD_SINGLE; r.doc == DocKey(DROPBOX, b"tok:…", b"/a.docx"); r.office; r.file
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Optional

from . import dropbox, drive, graph, webdav
from .common import (
    OFFICE_EXTENSIONS,
    SESSION_KINDS,
    AppRequest,
    Download,
    Header,
    Kind,
    Recognised,
    is_office_content,
    is_office_name,
)

__all__ = [
    "OFFICE_EXTENSIONS",
    "SESSION_KINDS",
    "AppRequest",
    "Download",
    "Header",
    "Kind",
    "Recognised",
    "is_office_content",
    "is_office_name",
    "recognise",
    "recognise_request",
]


def recognise_request(req: AppRequest, webdav_hosts: Collection[str] = ()) -> Optional[Recognised]:
    """`recognise` for an `AppRequest` already built."""
    found = None
    for module in (dropbox, graph, drive):
        found = module.recognise(req)
        if found is not None:
            break
    else:
        found = webdav.recognise(req, webdav_hosts)
    if found is not None and found.kind is Kind.DOWNLOAD and req.header("range") is not None:
        # A part of the file (the Dropbox SDK's parallel download asks for
        # byte 0 first): the provider answers 206 with that part, which is
        # no version of the document; it goes directly and is not stored.
        return Recognised(found.provider, Kind.OTHER, req, account=found.account, note="ranged download")
    return found


def recognise(
    method: str,
    url: str,
    headers: Iterable[tuple[str, str]],
    body: Optional[bytes],
    *,
    webdav_hosts: Collection[str] = (),
) -> Optional[Recognised]:
    """What the request is, or None if it is for no provider this knows.

    `headers` in the app's order with their original case (values as str,
    as mitmproxy gives them, or bytes); `body` de-chunked, or None when only
    the head is known (content sniffing then waits for the body).
    `webdav_hosts`: hosts whose every path is WebDAV (Nextcloud paths are
    recognised on any host).
    """
    hs = tuple((n.decode("latin-1") if isinstance(n, bytes) else n,
                v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v) for n, v in headers)
    req = AppRequest(method.upper(), url, hs, body)
    return recognise_request(req, frozenset(h.lower() for h in webdav_hosts))
