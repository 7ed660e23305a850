"""Canonical provider request heads (spec §4.3.1) and response heads (§4.6.1).

A head travels as one byte string, ``METHOD SP URL LF`` then one
``name: value LF`` per header field in the app's order, names lower-cased,
so every head has exactly one encoding and consecutive heads delta well.
`canonical_head` builds one from what an app sent (dropping the hop-by-hop
and framing fields the EPS derives itself); `parse_head` checks one the way
the EPS must (`invalid_request`, `limit_exceeded`). Header values are bytes,
since providers carry raw UTF-8 in some fields (``dropbox-api-arg``); names
and values given as `str` are encoded with UTF-8 and ``surrogateescape`` so
that strings mitmproxy decoded that way come back to the bytes on the wire.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Iterable, Union

from .errors import ProtocolError, malformed
from .limits import DEFAULT_LIMITS, Limits

Text = Union[str, bytes]

FORBIDDEN_REQUEST_FIELDS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)
FORBIDDEN_RESPONSE_FIELDS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length"}
)

_TCHAR_LOWER = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
_METHOD = re.compile(rb"[A-Z]{1,16}\Z")
_STATUS = re.compile(rb"[0-9]{3}\Z")
_VALUE_BAD = re.compile(rb"[\x00\r\n]")
_URL_CHARS = re.compile(rb"[\x21-\x7e]+\Z")
_OWS = b" \t"


def _b(x: Text) -> bytes:
    return x.encode("utf-8", "surrogateescape") if isinstance(x, str) else bytes(x)


def _invalid(detail: str) -> ProtocolError:
    return ProtocolError("invalid_request", detail)


@dataclass(frozen=True)
class RequestHead:
    """A provider request head; `headers` are (lower-case name, value bytes)."""

    method: str
    url: str
    headers: tuple[tuple[str, bytes], ...] = field(default_factory=tuple)

    def encode(self) -> bytes:
        lines = [self.method.encode("ascii") + b" " + self.url.encode("ascii") + b"\n"]
        lines += [n.encode("ascii") + b": " + v + b"\n" for n, v in self.headers]
        return b"".join(lines)

    def get(self, name: str) -> bytes | None:
        """The first value of a field (names are compared lower-case)."""
        name = name.lower()
        for n, v in self.headers:
            if n == name:
                return v
        return None


def canonical_head(
    method: Text,
    url: Text,
    headers: Iterable[tuple[Text, Text]],
    *,
    allow_http: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> bytes:
    """The canonical head of an app request, as the device must send it.

    Lower-cases names, removes the forbidden fields of §4.3.1 and the
    optional whitespace around values (RFC 9110 §5.5 makes it no part of
    the value), keeps everything else in order, then checks the result as
    the EPS will; a head the EPS would refuse raises here instead."""
    lines = [_b(method) + b" " + _b(url) + b"\n"]
    for name, value in headers:
        n = _b(name).lower()
        if n in {f.encode() for f in FORBIDDEN_REQUEST_FIELDS} or n.startswith(b":"):
            continue
        lines.append(n + b": " + _b(value).strip(_OWS) + b"\n")
    head = b"".join(lines)
    parse_head(head, allow_http=allow_http, limits=limits)
    return head


def check_url(url: bytes, *, allow_http: bool, limits: Limits) -> None:
    if len(url) > limits.max_url:
        raise _invalid(f"URL is {len(url)} bytes, over max_url {limits.max_url}")
    if not _URL_CHARS.match(url):
        raise _invalid("URL holds a byte outside 0x21-0x7E")
    if url.startswith(b"https://"):
        rest = url[8:]
    elif url.startswith(b"http://") and allow_http:
        rest = url[7:]
    else:
        raise _invalid("URL is not absolute with scheme https")
    if b"#" in url:
        raise _invalid("URL has a fragment")
    authority = re.split(rb"[/?]", rest, maxsplit=1)[0]
    if not authority:
        raise _invalid("URL has no host")
    if b"@" in authority:
        raise _invalid("URL has userinfo")


def parse_head(data: bytes, *, allow_http: bool = False, limits: Limits = DEFAULT_LIMITS) -> RequestHead:
    """Checks a canonical request head by every rule of §4.3.1."""
    if len(data) > limits.max_head:
        raise ProtocolError("limit_exceeded", f"head is {len(data)} bytes, over max_head {limits.max_head}")
    if not data.endswith(b"\n"):
        raise _invalid("head does not end with LF")
    lines = data[:-1].split(b"\n")
    if len(lines) - 1 > limits.max_headers:
        raise ProtocolError("limit_exceeded", f"head has {len(lines) - 1} fields, over max_headers {limits.max_headers}")
    method, sp, url = lines[0].partition(b" ")
    if not sp or not _METHOD.match(method):
        raise _invalid("head's method is not 1-16 letters A-Z followed by SP")
    check_url(url, allow_http=allow_http, limits=limits)
    headers = []
    for i, line in enumerate(lines[1:], 1):
        name, value = _split_field(line, i, _invalid)
        if name in FORBIDDEN_REQUEST_FIELDS or name.startswith(":"):
            raise _invalid(f"head line {i} carries forbidden field {name!r}")
        headers.append((name, value))
    return RequestHead(method.decode("ascii"), url.decode("ascii"), tuple(headers))


def _split_field(line: bytes, i: int, err) -> tuple[str, bytes]:
    name, colon, value = line.partition(b":")
    if not colon or not value.startswith(b" "):
        raise err(f"head line {i} is not 'name: value'")
    value = value[1:]
    if not _TCHAR_LOWER.match(name):
        raise err(f"head line {i}: field name is not lower-case tchar")
    if _VALUE_BAD.search(value):
        raise err(f"head line {i}: field value holds NUL, CR or LF")
    if value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
        raise err(f"head line {i}: field value has leading or trailing whitespace")
    return name.decode("ascii"), value


@dataclass(frozen=True)
class ResponseHead:
    """A provider response head of §4.6.1."""

    status: int
    reason: str
    headers: tuple[tuple[str, bytes], ...] = field(default_factory=tuple)

    def encode(self) -> bytes:
        lines = [b"%03d " % self.status + self.reason.encode("latin-1") + b"\n"]
        lines += [n.encode("ascii") + b": " + v + b"\n" for n, v in self.headers]
        return b"".join(lines)

    @property
    def phrase(self) -> str:
        """REASON, or the standard phrase when it is empty (HTTP/2)."""
        if self.reason:
            return self.reason
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return ""

    def for_app(self, body_length: int) -> list[tuple[str, bytes]]:
        """The header list to hand the app: as received, plus the
        Content-Length of the body the device hands over (§4.6.1)."""
        return list(self.headers) + [("content-length", str(body_length).encode())]

    def get(self, name: str) -> bytes | None:
        name = name.lower()
        for n, v in self.headers:
            if n == name:
                return v
        return None


def canonical_response_head(status: int, reason: Text, headers: Iterable[tuple[Text, Text]]) -> bytes:
    """What the EPS sends for a provider response (used by tests and fixtures)."""
    lines = [b"%03d " % status + _b(reason) + b"\n"]
    for name, value in headers:
        n = _b(name).lower()
        if n.decode("latin-1") in FORBIDDEN_RESPONSE_FIELDS:
            continue
        lines.append(n + b": " + _b(value).strip(_OWS) + b"\n")
    return b"".join(lines)


def parse_response_head(data: bytes) -> ResponseHead:
    """Reads a canonical response head; a broken one is `malformed` (the
    EPS made it, so the fault is in the message, not in the app's request)."""
    if not data.endswith(b"\n"):
        raise malformed("response head does not end with LF")
    lines = data[:-1].split(b"\n")
    status, sp, reason = lines[0].partition(b" ")
    if not sp or not _STATUS.match(status):
        raise malformed("response head does not start with a 3-digit status and SP")
    if _VALUE_BAD.search(reason):
        raise malformed("response reason holds NUL or CR")
    headers = [_split_field(line, i, malformed) for i, line in enumerate(lines[1:], 1)]
    return ResponseHead(int(status), reason.decode("latin-1"), tuple(headers))
