"""What every recogniser shares: the request as the proxy saw it, what a
recogniser says about it, and the helpers that turn headers, tokens and
bodies into document identities.

A recogniser looks at one app request (method, URL, headers, body) and says
which provider API call it is (`Kind`), which document it concerns (a
`DocKey` of the spec §4.4.1: provider, account, normalised path or id) and
whether it is worth patching. It never performs I/O and never needs the
proxy: the addon calls it from its hooks, the tests with literal bytes.

Account identity. The device cannot call a provider's API to learn the
account id, so it derives one from what the request carries: an explicit
account selector when there is one (Dropbox `Dropbox-API-Select-User`,
Graph `/drives/{id}`, the WebDAV user of the URL or of Basic auth), else
`tok:` + the first 12 hex digits of SHA-256 of the bearer token. The cost of
the token digest: after an OAuth token refresh the same document gets a new
key; the device store lends the new key the base the document has under the
older token (`ec_proxy.store`, "A new OAuth token"), so its next save is
still a patch. The digest never reveals the token (spec §8).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Optional, Union
from urllib.parse import parse_qsl, unquote, urlsplit

from ec_protocol import DocKey

Header = tuple[str, str]

#: Extensions of the documents EdgeCourier is for (spec §1 and issue 4).
OFFICE_EXTENSIONS = frozenset(
    ".docx .docm .dotx .dotm .xlsx .xlsm .xltx .pptx .pptm .potx .ppsx "
    ".odt .ods .odp .ott .ots .otp .odg".split()
)
#: A ZIP local file header: every OOXML and ODF file starts with one.
ZIP_MAGIC = b"PK\x03\x04"
#: The OLE compound file magic: password-protected OOXML is an OLE container.
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


class Kind(enum.Enum):
    """Which provider call a request is, as far as the device cares."""

    UPLOAD_SINGLE = "upload_single"  # the whole file in one request: SAVE with SINGLE
    SESSION_START = "session_start"  # Dropbox upload_session/start
    SESSION_APPEND = "session_append"  # Dropbox append_v2 / append (v1)
    SESSION_FINISH = "session_finish"  # Dropbox upload_session/finish
    BATCH_FINISH = "batch_finish"  # Dropbox upload_session/finish_batch_v2
    GRAPH_CREATE_SESSION = "graph_create_session"
    GRAPH_FRAGMENT = "graph_fragment"  # PUT to an uploadUrl
    GRAPH_SESSION_STATUS = "graph_session_status"  # GET uploadUrl
    GRAPH_SESSION_CANCEL = "graph_session_cancel"  # DELETE uploadUrl
    DRIVE_RESUMABLE_INIT = "drive_resumable_init"
    DRIVE_RESUMABLE_CHUNK = "drive_resumable_chunk"  # PUT to the session URI
    NC_MKCOL = "nc_mkcol"  # Nextcloud chunking v2: transfer folder
    NC_CHUNK = "nc_chunk"
    NC_MOVE = "nc_move"  # MOVE …/.file: assemble
    NC_CANCEL = "nc_cancel"  # DELETE of the transfer folder
    DOWNLOAD = "download"
    OTHER = "other"  # pass through untouched


SESSION_KINDS = frozenset(
    {
        Kind.SESSION_START,
        Kind.SESSION_APPEND,
        Kind.SESSION_FINISH,
        Kind.BATCH_FINISH,
        Kind.GRAPH_CREATE_SESSION,
        Kind.GRAPH_FRAGMENT,
        Kind.GRAPH_SESSION_STATUS,
        Kind.GRAPH_SESSION_CANCEL,
        Kind.DRIVE_RESUMABLE_INIT,
        Kind.DRIVE_RESUMABLE_CHUNK,
        Kind.NC_MKCOL,
        Kind.NC_CHUNK,
        Kind.NC_MOVE,
        Kind.NC_CANCEL,
    }
)


@dataclass(frozen=True)
class AppRequest:
    """One request as the app sent it: headers in order with their original
    case, the body already de-chunked (mitmproxy removes the chunked framing;
    nothing here relies on `Content-Length`). `body` is None when only the
    head has been seen (mitmproxy's `requestheaders` hook)."""

    method: str
    url: str
    headers: tuple[Header, ...]
    body: Optional[bytes] = field(default=None, repr=False)

    def header(self, name: str) -> Optional[str]:
        """The first value of field `name` (case-insensitive), as text."""
        low = name.lower()
        for n, v in self.headers:
            if n.lower() == low:
                return v
        return None

    @property
    def parts(self):
        return urlsplit(self.url)

    @property
    def host(self) -> str:
        return (self.parts.hostname or "").lower()

    @property
    def path(self) -> str:
        """The URL path, still percent-encoded."""
        return self.parts.path

    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.parts.query, keep_blank_values=True))


@dataclass(frozen=True)
class Download:
    """What the response to a recognised download will be."""

    #: Graph answers `…/content` with a 302 to a pre-authenticated URL; the
    #: file comes from following it (spec §6.8 FOLLOW_REDIRECT).
    follow_redirect: bool = False
    #: The response header that carries the file's metadata (Dropbox
    #: `Dropbox-API-Result`), if any.
    metadata_header: Optional[str] = None


@dataclass(frozen=True)
class Recognised:
    """What a recogniser found out about one request."""

    provider: int  # ec_protocol.DROPBOX / GRAPH / DRIVE / WEBDAV
    kind: Kind
    request: AppRequest
    #: The document, when the request names it (uploads, downloads, session
    #: finishes). None for session requests that do not name the file.
    doc: Optional[DocKey] = None
    #: The file's name for display and for the office test, if known.
    name: Optional[str] = None
    #: The account part of the key, even when `doc` is None (session starts).
    account: Optional[bytes] = None
    #: Session requests: the session the request belongs to (Dropbox
    #: `session_id`, Graph uploadUrl token, Drive `upload_id`, Nextcloud
    #: `user/transfer`). None for a Dropbox start.
    session: Optional[str] = None
    #: Dropbox cursor offset; `close` flag of start / append_v2.
    offset: Optional[int] = None
    close: bool = False
    #: Nextcloud chunk name (`00001`), Graph/Drive `Content-Range` (start,
    #: end inclusive, total); end is None for Drive's `bytes */total`.
    chunk: Optional[str] = None
    content_range: Optional[tuple[Optional[int], Optional[int], Optional[int]]] = None
    #: Drive multipart: the byte range [start, end) of the media part inside
    #: the body, so the SAVE can carry it as a WRAPPED body.
    file_span: Optional[tuple[int, int]] = None
    #: Downloads: what the response will be.
    download: Optional[Download] = None
    #: Dropbox finish / batch: the parsed arguments (cursor, commit, entries).
    args: Optional[dict] = None
    #: Why a request that looked like a known call was not taken as one.
    note: Optional[str] = None

    @property
    def file(self) -> Optional[bytes]:
        """The file bytes an UPLOAD_SINGLE carries (the media part for
        multipart), or None when the body has not been seen."""
        body = self.request.body
        if body is None or self.kind is not Kind.UPLOAD_SINGLE:
            return None
        if self.file_span is not None:
            return body[self.file_span[0] : self.file_span[1]]
        return body

    @property
    def office(self) -> bool:
        """Worth patching: an office name, or (name unknown or not office)
        content that starts like an office container."""
        return is_office_name(self.name) or is_office_content(self.file)


def is_office_name(name: Optional[str]) -> bool:
    if not name:
        return False
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    dot = base.rfind(".")
    return dot > 0 and base[dot:] in OFFICE_EXTENSIONS


def is_office_content(data: Optional[bytes]) -> bool:
    """Content decides when the name does not: the core patches any file, and
    a ZIP or OLE container is where its savings are."""
    return bool(data) and (data.startswith(ZIP_MAGIC) or data.startswith(OLE_MAGIC))


def header_text(value: Union[str, bytes]) -> str:
    """A header value as the UTF-8 text the app meant.

    Dropbox accepts raw UTF-8 in `Dropbox-API-Arg`. mitmproxy hands header
    values over as str decoded with surrogateescape (undecodable bytes) and
    other stacks use latin-1; both are turned back into the UTF-8 text.
    """
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if any("\udc80" <= c <= "\udcff" for c in value):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if not value.isascii() and all(ord(c) < 256 for c in value):
        try:
            return value.encode("latin-1").decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def bearer_token(req: AppRequest) -> Optional[str]:
    """The OAuth bearer token of the request: `Authorization: Bearer x`, or
    Dropbox's `?authorization=Bearer x` URL parameter."""
    auth = req.header("authorization")
    if auth is None:
        auth = req.query().get("authorization")
    if not auth:
        return None
    scheme, _, value = auth.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def token_account(token: Optional[str]) -> Optional[bytes]:
    """`tok:` + 12 hex digits of SHA-256(token): stable per token, not the token."""
    if token is None:
        return None
    return b"tok:" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:12].encode()


def json_object(text: Optional[Union[str, bytes]]) -> Optional[dict]:
    """`text` parsed as a JSON object, or None."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


_RANGE = re.compile(r"^bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)$")


def content_range(value: Optional[str]) -> Optional[tuple[Optional[int], Optional[int], Optional[int]]]:
    """`bytes a-b/total` -> (a, b, total); `bytes */total` -> (None, None,
    total); `*` totals are None. None if absent or malformed."""
    if value is None:
        return None
    m = _RANGE.match(value.strip())
    if not m:
        return None
    a, b, total = m.groups()
    return (
        None if a is None else int(a),
        None if b is None else int(b),
        None if total == "*" else int(total),
    )


def unquoted_path(path: str) -> str:
    return unquote(path, errors="surrogateescape")
