"""Microsoft Graph / OneDrive: simple uploads, upload sessions, downloads.

Follows https://learn.microsoft.com/en-us/graph/api/driveitem-put-content,
…/driveitem-createuploadsession and …/driveitem-get-content. Items are
addressed under a drive (`/me/drive`, `/drives/{id}`, `/users/{x}/drive`,
`/sites/{x}/drive`, `/groups/{x}/drive`, OneDrive's own `/drive`), then
`root:/{path}:`, `items/{id}` or `items/{parent}:/{name}:`. The same calls
are served under `api.onedrive.com/v1.0/…` (the OneDrive API) and
`{tenant}.sharepoint.com/_api/v2.0/…` (business drives).

References: `root:/{path}:` and `id:{parent}:/{name}:` with the path
lower-cased (OneDrive compares names case-insensitively), `id:{id}` for
an item. Account: `drive:{id}` when the URL names the drive, `user:{x}`
for `/users/{x}/drive`, else the token digest; so one document reached
through two drive spellings has two keys, which costs one whole upload.

Clients spell the same address several ways; the path is normalised
before matching, so each document gets one key: repeated slashes collapse
(the Graph SDK's base URL ends in `/`, giving `/v1.0//me/drive`), and
`%3A` / `%2F` are decoded (the SDK expands an item id `root:/a.docx:` as
`items/root%3A%2Fa.docx%3A`, the same item as `root:/a.docx:`). A
successful save's driveItem (`id`, `name`, `parentReference.path`) lets
the addon key the same file by id as well (`aliases`), so a
path-addressed and an id-addressed save share one base.

Upload fragments go to an `uploadUrl` on an upload host (`api.onedrive.com`
`/rup/…`, a SharePoint host, `*.files.1drv.com`) and carry no
`Authorization`; they are recognised by host and `/rup/` path.
"""

from __future__ import annotations

import re
from typing import Optional

from ec_protocol import GRAPH, DocKey

from .common import AppRequest, Download, Kind, Recognised, bearer_token, content_range, token_account, unquoted_path

GRAPH_HOST = "graph.microsoft.com"
ONEDRIVE_HOST = "api.onedrive.com"
#: Where the device's own uploadUrls live: `/rup/` + a device-issued id.
UPLOAD_PATH_PREFIX = "/rup/"

ITEM_PATH = re.compile(
    r"^(?:/_api)?/(?:v1\.0|beta|v2\.0|v2\.1)"
    r"/(?:me/drive|drive|drives/(?P<drive_id>[^/]+)|users/(?P<user>[^/]+)/drive|(?:sites|groups)/(?P<owner>[^/]+)/drive)"
    r"(?:/(?P<root>root)|/items/(?P<item>[^/:]+))"
    r"(?::(?P<rel>/[^:]*):?)?"
    r"(?P<action>/content|/createUploadSession)?/?$"
)


_SLASHES = re.compile(r"/{2,}")
_ESCAPED = re.compile(r"%(3[Aa]|2[Ff])")


def normalise_path(path: str) -> str:
    """One spelling per address: `//` → `/`, `%3A` → `:`, `%2F` → `/`."""
    path = _ESCAPED.sub(lambda m: ":" if m.group(1) in ("3A", "3a") else "/", path)
    return _SLASHES.sub("/", path)


def aliases(doc: DocKey, item: object) -> list[DocKey]:
    """Other keys of the file a driveItem describes, in `doc`'s account:
    `id:{id}` and `root:/{path}:` (from `parentReference.path`)."""
    if not isinstance(item, dict):
        return []
    out = []
    if isinstance(item.get("id"), str) and item["id"]:
        out.append(DocKey(GRAPH, doc.account, b"id:" + item["id"].encode("utf-8", "surrogateescape")))
    parent = (item.get("parentReference") or {}).get("path") if isinstance(item.get("parentReference"), dict) else None
    name = item.get("name")
    if isinstance(parent, str) and isinstance(name, str) and "root:" in parent:
        folder = unquoted_path(parent.split("root:", 1)[1]).strip("/")
        rel = ("/" + folder if folder else "") + "/" + name
        out.append(DocKey(GRAPH, doc.account, f"root:{rel.lower()}:".encode("utf-8", "surrogateescape")))
    return [k for k in out if k != doc]


def is_api_host(host: str) -> bool:
    return host in (GRAPH_HOST, ONEDRIVE_HOST) or host.endswith(".sharepoint.com")


def is_upload_host(host: str) -> bool:
    return host == ONEDRIVE_HOST or host.endswith((".sharepoint.com", ".files.1drv.com"))


def hosts_match(host: str) -> bool:
    return is_api_host(host) or is_upload_host(host)


def _account(req: AppRequest, m: re.Match) -> Optional[bytes]:
    if m.group("drive_id"):
        return b"drive:" + unquoted_path(m.group("drive_id")).encode("utf-8", "surrogateescape")
    if m.group("user"):
        return b"user:" + unquoted_path(m.group("user")).lower().encode("utf-8", "surrogateescape")
    if m.group("owner"):
        return b"owner:" + unquoted_path(m.group("owner")).lower().encode("utf-8", "surrogateescape")
    return token_account(bearer_token(req))


def _ref(m: re.Match) -> tuple[Optional[str], Optional[str]]:
    """(reference, file name) of the addressed item."""
    rel = unquoted_path(m.group("rel")) if m.group("rel") is not None else None
    item = unquoted_path(m.group("item")) if m.group("item") is not None else None  # the SDK sends `1TB%211` for `1TB!1`
    if item is not None and item.lower() == "root":
        item = None
    if rel is not None:
        rel = "/" + rel.strip("/")
        name = rel.rsplit("/", 1)[-1] or None
        if item is None:
            return f"root:{rel.lower()}:", name
        return f"id:{item}:{rel.lower()}:", name
    if item is not None:
        return f"id:{item}", None
    return None, None  # the root itself


def recognise(req: AppRequest) -> Optional[Recognised]:
    host = req.host
    if not hosts_match(host):
        return None
    if is_upload_host(host) and req.path.startswith(UPLOAD_PATH_PREFIX):
        session = req.path[len(UPLOAD_PATH_PREFIX) :]
        kind = {"PUT": Kind.GRAPH_FRAGMENT, "GET": Kind.GRAPH_SESSION_STATUS, "DELETE": Kind.GRAPH_SESSION_CANCEL}.get(req.method)
        if kind is None or not session:
            return Recognised(GRAPH, Kind.OTHER, req)
        return Recognised(GRAPH, kind, req, session=session, content_range=content_range(req.header("content-range")))
    if not is_api_host(host):
        return Recognised(GRAPH, Kind.OTHER, req)
    m = ITEM_PATH.match(normalise_path(req.path))
    if not m:
        return Recognised(GRAPH, Kind.OTHER, req)
    action = m.group("action")
    kind = {
        ("PUT", "/content"): Kind.UPLOAD_SINGLE,
        ("POST", "/createUploadSession"): Kind.GRAPH_CREATE_SESSION,
        ("GET", "/content"): Kind.DOWNLOAD,
    }.get((req.method, action))
    if kind is None:
        return Recognised(GRAPH, Kind.OTHER, req)
    acct = _account(req, m)
    ref, name = _ref(m)
    if acct is None or ref is None:
        return Recognised(GRAPH, Kind.OTHER, req, account=acct, note="no credentials or no item")
    doc = DocKey(GRAPH, acct, ref.encode("utf-8", "surrogateescape"))
    download = Download(follow_redirect=True) if kind is Kind.DOWNLOAD else None
    return Recognised(GRAPH, kind, req, doc=doc, name=name, account=acct, download=download)
