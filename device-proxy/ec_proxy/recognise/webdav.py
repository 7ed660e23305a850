"""WebDAV and Nextcloud: PUT / GET of files and Nextcloud chunking v2.

Follows RFC 4918 and
https://docs.nextcloud.com/server/latest/developer_manual/client_apis/WebDAV/chunking.html.
A request is WebDAV when its host is one the user configured
(`webdav_hosts`), or, on any host, when its path is under Nextcloud's
`/remote.php/dav/` or `/remote.php/webdav/`.

References: the file's percent-decoded path. Under Nextcloud it is taken
relative to the user's root, so `/remote.php/webdav/a.docx` and
`/remote.php/dav/files/{user}/a.docx` name the same document. Account:
`{user}@{host}`, the user from `/remote.php/dav/files/{user}/` (or
`uploads/{user}/`), else from Basic auth, else the token digest.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection
from typing import Optional
from urllib.parse import urlsplit

from ec_protocol import WEBDAV, DocKey

from .common import AppRequest, Download, Kind, Recognised, bearer_token, token_account, unquoted_path

FILES = re.compile(r"^/remote\.php/dav/files/(?P<user>[^/]+)(?P<path>/.*)?$")
LEGACY = re.compile(r"^/remote\.php/webdav(?P<path>/.*)?$")
UPLOADS = re.compile(r"^/remote\.php/dav/uploads/(?P<user>[^/]+)/(?P<transfer>[^/]+)(?:/(?P<chunk>[^/]+))?/?$")


#: Nextcloud / ownCloud endpoints that are not WebDAV files, on any host:
#: `status.php`, the OCS API (capabilities, shares, user), the web UI and
#: `.well-known`. A desktop client asks for them first; they are never documents.
NOT_FILES = re.compile(r"^/(?:status\.php|ocs/|index\.php(?:/|$)|\.well-known/|ocm-provider/|ocs-provider/|login(?:/|$)|apps/)")


def is_webdav(host: str, path: str, webdav_hosts: Collection[str]) -> bool:
    return host in webdav_hosts or path.startswith(("/remote.php/dav/", "/remote.php/webdav"))


def _basic_user(req: AppRequest) -> Optional[str]:
    auth = req.header("authorization")
    if not auth:
        return None
    scheme, _, value = auth.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[0] or None
    except (binascii.Error, UnicodeDecodeError):
        return None


def _account(req: AppRequest, url_user: Optional[str]) -> Optional[bytes]:
    host = req.host.encode()
    user = unquoted_path(url_user) if url_user else _basic_user(req)
    if user:
        return user.encode("utf-8", "surrogateescape") + b"@" + host
    tok = token_account(bearer_token(req))
    return tok + b"@" + host if tok else None


def file_ref(path: str) -> tuple[str, Optional[str]]:
    """(reference, URL user) of a file path (percent-encoded URL path)."""
    m = FILES.match(path)
    if m:
        return unquoted_path(m.group("path") or "/"), m.group("user")
    m = LEGACY.match(path)
    if m:
        return unquoted_path(m.group("path") or "/"), None
    return unquoted_path(path), None


def recognise(req: AppRequest, webdav_hosts: Collection[str] = ()) -> Optional[Recognised]:
    if not is_webdav(req.host, req.path, webdav_hosts):
        return None
    if NOT_FILES.match(req.path):
        return Recognised(WEBDAV, Kind.OTHER, req, note="a Nextcloud endpoint, not a file")
    m = UPLOADS.match(req.path)
    if m:
        user, transfer, chunk = m.group("user"), m.group("transfer"), m.group("chunk")
        session = f"{req.host}/{user}/{transfer}"
        acct = _account(req, user)
        kind = {
            ("MKCOL", False): Kind.NC_MKCOL,
            ("PUT", True): Kind.NC_CHUNK,
            ("MOVE", True): Kind.NC_MOVE,
            ("DELETE", False): Kind.NC_CANCEL,
        }.get((req.method, chunk is not None))
        if kind is None or (kind is Kind.NC_MOVE and chunk != ".file") or (kind is Kind.NC_CHUNK and chunk == ".file"):
            return Recognised(WEBDAV, Kind.OTHER, req, account=acct)
        doc = name = None
        dest = req.header("destination")
        if dest is not None and acct is not None:
            ref, _ = file_ref(urlsplit(dest.strip()).path)
            doc, name = DocKey(WEBDAV, acct, ref.encode("utf-8", "surrogateescape")), ref.rsplit("/", 1)[-1]
        if kind in (Kind.NC_MKCOL, Kind.NC_MOVE) and doc is None:
            # Without a Destination this is chunking v1-style or malformed: the
            # spec's procedure needs one, so the provider handles it.
            return Recognised(WEBDAV, Kind.OTHER, req, account=acct, session=session, note="no Destination")
        return Recognised(WEBDAV, kind, req, doc=doc, name=name, account=acct, session=session, chunk=chunk)
    kind = {"PUT": Kind.UPLOAD_SINGLE, "GET": Kind.DOWNLOAD}.get(req.method)
    if kind is None:
        return Recognised(WEBDAV, Kind.OTHER, req)
    ref, user = file_ref(req.path)
    acct = _account(req, user)
    if acct is None or ref.endswith("/"):
        return Recognised(WEBDAV, Kind.OTHER, req, account=acct, note="no credentials or a collection")
    doc = DocKey(WEBDAV, acct, ref.encode("utf-8", "surrogateescape"))
    return Recognised(WEBDAV, kind, req, doc=doc, name=ref.rsplit("/", 1)[-1], account=acct,
                      download=Download() if kind is Kind.DOWNLOAD else None)
