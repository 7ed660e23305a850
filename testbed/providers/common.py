"""Helpers every provider module shares: bearer tokens to accounts, public URLs.

Accounts: any `Authorization: Bearer <x>` is accepted and names the account
`<x>` when x is 1-64 characters of `[A-Za-z0-9._-]`, else `t-` + the first 16
hex digits of SHA-256(x). A token starting with `invalid` or `expired` is
refused with the provider's 401, so clients' auth-error paths can be tested.
A token `<x>~<anything>` is another token of the account of `<x>`, as a
provider's is after an OAuth refresh (the account is the user's, not the
token's). WebDAV also takes `Basic user:password` (any password): the account is the
user name, sanitised the same way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import time
from dataclasses import dataclass
from email.utils import formatdate

from aiohttp import web

_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class Auth:
    account: str | None  # None: no usable credentials
    problem: str | None  # "missing" | "invalid" | "expired" | None


def _account_name(raw: str) -> str:
    raw = raw.split("~", 1)[0]  # `<x>~<n>`: account x's token after a refresh
    if _SAFE.match(raw) and raw not in (".", ".."):
        return raw
    return "t-" + hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def bearer_auth(request: web.Request, allow_basic: bool = False) -> Auth:
    header = request.headers.get("Authorization")
    if not header:
        return Auth(None, "missing")
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        low = value.lower()
        if low.startswith("invalid"):
            return Auth(None, "invalid")
        if low.startswith("expired"):
            return Auth(None, "expired")
        return Auth(_account_name(value), None)
    if allow_basic and scheme.lower() == "basic" and value:
        try:
            user = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            return Auth(None, "invalid")
        if user:
            return Auth(_account_name(user), None)
    return Auth(None, "invalid")


def public_base(request: web.Request, host: str) -> str:
    """`scheme://host[:port]` for URLs we hand out (upload sessions, redirects).

    The port is the one the client used in its Host header, so a client that
    reached us on a test port gets URLs on that port, and one that reached us on
    443 (as against the real cloud) gets URLs without a port.
    """
    _, sep, port = request.host.rpartition(":")
    if not sep or not port.isdigit() or request.host.endswith("]"):
        port = ""
    return f"{request.scheme}://{host}{':' + port if port else ''}"


def iso8601(ts: float, millis: bool = False) -> str:
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    if millis:
        return f"{base}.{int((ts % 1) * 1000):03d}Z"
    return base + "Z"


def http_date(ts: float) -> str:
    return formatdate(ts, usegmt=True)
