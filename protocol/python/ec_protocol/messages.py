"""Every message of spec §4, with its encoder, its strict decoder and its MAC.

Messages are plain dataclasses holding the fields exactly as they travel
(CBs keep their mode and data), so `decode_message(x).encode(...) == x` for
every valid message. Decoding checks the layout rules of §1.2 and the
limits a message can be checked against on its own (`malformed`,
`unsupported_version`, `too_large`, `limit_exceeded`, and the
`invalid_request` cases that need no state, such as a context id of 0).
Checks that need the decoded heads, a session or a procedure's shape are in
`validate_save` / `validate_fetch` and in the EPS.

MACs (§3.2): a request's is HMAC-SHA-256(secret, "ec1q" ‖ path ‖ 00 ‖ S)
truncated to 16 bytes, a response's HMAC-SHA-256(secret, "ec1r" ‖ the
request's mac ‖ S); S is the message up to its mac. Payloads after the mac
are bound by the MACed target hashes instead.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Optional, Union

from .cb import CB, SAME
from .errors import CODE_NUMBER, ERROR_TABLE, ProtocolError, malformed
from .limits import (
    DEFAULT_LIMITS,
    MAX_ACCOUNT,
    MAX_BINDING,
    MAX_CAUSE,
    MAX_DETAIL,
    MAX_LABEL,
    MAX_LIMIT_PAIRS,
    MAX_REF,
    MAX_REQUESTS,
    Limits,
)
from .wire import Reader, blob, varint

# Message types (§4.1).
HELLO = 0x01
HELLO_OK = 0x81
SAVE = 0x02
SAVE_RESULT = 0x82
FETCH = 0x03
FETCH_RESULT = 0x83
ERROR = 0xE0

PROTOCOL_VERSION = 1
HELLO_PATH = "/ec/hello"
SAVE_PATH = "/ec/1/save"
FETCH_PATH = "/ec/1/fetch"
PATH_OF_TYPE = {HELLO: HELLO_PATH, SAVE: SAVE_PATH, FETCH: FETCH_PATH}
TYPE_OF_PATH = {HELLO_PATH: HELLO, SAVE_PATH: SAVE, FETCH_PATH: FETCH}
VERSION_OF_PATH = {HELLO_PATH: 0, SAVE_PATH: 1, FETCH_PATH: 1}
_VERSION_OF_TYPE = {HELLO: 0, HELLO_OK: 0, SAVE: 1, SAVE_RESULT: 1, FETCH: 1, FETCH_RESULT: 1}

# Flags (§4.1).
FLAG_RESP_REF = 0x01  # SAVE, FETCH
FLAG_REPLAYED = 0x01  # SAVE_RESULT
FLAG_REF_USED = 0x02  # SAVE_RESULT, FETCH_RESULT
FLAG_HASH_DISAGREEMENT = 0x04  # SAVE_RESULT, FETCH_RESULT
FETCH_FOLLOW_REDIRECT = 0x01  # fetch_flags

# Procedures (§4.5, §6).
SINGLE, DROPBOX_SESSION, DROPBOX_BATCH, GRAPH_SESSION, DRIVE_RESUMABLE, NEXTCLOUD_CHUNKED = range(6)
PROCEDURE_NAMES = ("SINGLE", "DROPBOX_SESSION", "DROPBOX_BATCH", "GRAPH_SESSION", "DRIVE_RESUMABLE", "NEXTCLOUD_CHUNKED")

# Request body kinds (§4.3.3).
BODY_EMPTY, BODY_FILE, BODY_BYTES, BODY_WRAPPED = range(4)
# Item payload kinds (§4.4).
PATCH, FULL = 0, 1
# FETCH_RESULT part body kinds (§4.8).
INLINE, PART_PATCH, PART_FULL = 0, 1, 2

# Providers (§4.4.1).
DROPBOX, GRAPH, DRIVE, WEBDAV = 1, 2, 3, 4

MAC_LEN = 16
ZERO_MAC = bytes(MAC_LEN)


def request_mac(secret: bytes, path: str, signed: bytes) -> bytes:
    return hmac.new(secret, b"ec1q" + path.encode("ascii") + b"\x00" + signed, hashlib.sha256).digest()[:MAC_LEN]


def response_mac(secret: bytes, req_mac: bytes, signed: bytes) -> bytes:
    return hmac.new(secret, b"ec1r" + req_mac + signed, hashlib.sha256).digest()[:MAC_LEN]


def response_digest(head: bytes, body: bytes) -> bytes:
    """§4.6.2: SHA-256(varint(|H|) ‖ H ‖ B)[0, 8)."""
    return hashlib.sha256(varint(len(head)) + head + body).digest()[:8]


# ---------------------------------------------------------------- pieces


@dataclass(frozen=True)
class DocKey:
    """A document key (§4.4.1): provider, account and file reference."""

    provider: int
    account: bytes
    ref: bytes

    def encode(self) -> bytes:
        return bytes([self.provider]) + blob(self.account) + blob(self.ref)

    @classmethod
    def read(cls, r: Reader) -> "DocKey":
        provider = r.u8("document key provider")
        if provider not in (DROPBOX, GRAPH, DRIVE, WEBDAV):
            raise malformed(f"document key provider {provider} is not defined")
        account = r.blob("document key account", MAX_ACCOUNT)
        ref = r.blob("document key ref", MAX_REF)
        if not account or not ref:
            raise ProtocolError("invalid_request", "document key has an empty account or ref")
        return cls(provider, account, ref)


def _read_has(r: Reader, what: str) -> bool:
    flag = r.u8(what)
    if flag > 1:
        raise malformed(f"{what} is {flag}, not 0 or 1")
    return flag == 1


def _opt_doc(doc: Optional[DocKey]) -> bytes:
    return b"\x00" if doc is None else b"\x01" + doc.encode()


@dataclass(frozen=True)
class ContextDef:
    """A context definition (§4.3.2)."""

    ctx_id: int
    head: bytes
    body: bytes = b""
    doc: Optional[DocKey] = None

    def encode(self) -> bytes:
        return varint(self.ctx_id) + blob(self.head) + blob(self.body) + _opt_doc(self.doc)

    @classmethod
    def read(cls, r: Reader, limits: Limits) -> "ContextDef":
        ctx_id = r.varint("ctx_id")
        if ctx_id == 0 or ctx_id > limits.max_contexts:
            raise ProtocolError("invalid_request", f"context id {ctx_id} is outside 1..{limits.max_contexts}")
        head = r.blob("context head", limits.max_head)
        body = r.blob("context body", limits.max_body_ref)
        doc = DocKey.read(r) if _read_has(r, "context has_doc") else None
        return cls(ctx_id, head, body, doc)

    def size(self) -> int:
        """What the definition counts towards `max_context_bytes`."""
        return len(self.head) + len(self.body) + (len(self.doc.encode()) if self.doc else 0)


@dataclass(frozen=True)
class RequestSpec:
    """A provider request specification (§4.3.3). `item` is set for FILE and
    WRAPPED bodies, `body` for BYTES and WRAPPED, `split` for WRAPPED."""

    ctx_id: int
    head: CB
    body_kind: int = BODY_FILE
    item: Optional[int] = None
    body: Optional[CB] = None
    split: Optional[int] = None

    def encode(self) -> bytes:
        out = varint(self.ctx_id) + self.head.encode() + bytes([self.body_kind])
        if self.body_kind in (BODY_FILE, BODY_WRAPPED):
            out += varint(self.item)
        if self.body_kind in (BODY_BYTES, BODY_WRAPPED):
            out += self.body.encode()
        if self.body_kind == BODY_WRAPPED:
            out += varint(self.split)
        return out

    @classmethod
    def read(cls, r: Reader, limits: Limits) -> "RequestSpec":
        ctx_id = r.varint("request ctx_id")
        head = CB.read(r, "request head", limits.max_head)
        kind = r.u8("body_kind")
        if kind > BODY_WRAPPED:
            raise malformed(f"body_kind {kind} is not defined")
        item = r.varint("request item") if kind in (BODY_FILE, BODY_WRAPPED) else None
        body = CB.read(r, "request bytes", limits.max_body_ref) if kind in (BODY_BYTES, BODY_WRAPPED) else None
        split = r.varint("request split") if kind == BODY_WRAPPED else None
        return cls(ctx_id, head, kind, item, body, split)


@dataclass(frozen=True)
class Item:
    """An item (§4.4); `payload` is the patch (PATCH) or the file (FULL)."""

    payload_kind: int
    target_size: int
    target_sha256: bytes
    payload: bytes = field(default=b"", repr=False)
    doc: Optional[DocKey] = None
    binding: bytes = b""

    @property
    def payload_len(self) -> Optional[int]:
        return len(self.payload) if self.payload_kind == PATCH else None

    def encode(self) -> bytes:
        out = _opt_doc(self.doc) + blob(self.binding) + bytes([self.payload_kind])
        out += varint(self.target_size) + self.target_sha256
        if self.payload_kind == PATCH:
            out += varint(len(self.payload))
        return out

    @classmethod
    def read(cls, r: Reader, limits: Limits) -> tuple["Item", int]:
        """The item without its payload, and the payload's length."""
        doc = DocKey.read(r) if _read_has(r, "item has_doc") else None
        binding = r.blob("item binding", MAX_BINDING)
        kind = r.u8("payload_kind")
        if kind > FULL:
            raise malformed(f"payload_kind {kind} is not defined")
        size = r.varint("target_size")
        if size > limits.max_item_size:
            raise ProtocolError("too_large", f"target_size {size} is over max_item_size {limits.max_item_size}")
        sha = r.take(32, "target_sha256")
        if kind == PATCH:
            plen = r.varint("payload_len")
            if plen > limits.max_patch_size:
                raise ProtocolError("too_large", f"payload_len {plen} is over max_patch_size {limits.max_patch_size}")
        else:
            plen = size
        return cls(kind, size, sha, b"", doc, binding), plen


# ---------------------------------------------------------------- messages


class _Message:
    """Shared encode helpers: `signed_part()` is S of §3.2."""

    type_code: int = 0

    def signed_part(self) -> bytes:  # pragma: no cover - every message overrides
        raise NotImplementedError

    def payloads(self) -> bytes:
        return b""


class _Request(_Message):
    mac: Optional[bytes]

    @property
    def path(self) -> str:
        return PATH_OF_TYPE[self.type_code]

    def compute_mac(self, secret: bytes) -> bytes:
        return request_mac(secret, self.path, self.signed_part())

    def encode(self, secret: Optional[bytes] = None) -> bytes:
        """The message's bytes; with `secret`, the MAC is computed (and
        stored in `mac`), else the stored `mac` is written."""
        signed = self.signed_part()
        if secret is not None:
            self.mac = request_mac(secret, self.path, signed)
        if self.mac is None:
            raise ValueError("no mac: pass the secret")
        return signed + self.mac + self.payloads()

    def verify(self, secret: bytes) -> bool:
        """Constant-time check of the MAC against `secret`."""
        return self.mac is not None and hmac.compare_digest(self.mac, self.compute_mac(secret))


class _Response(_Message):
    mac: Optional[bytes]

    def compute_mac(self, secret: bytes, req_mac: bytes) -> bytes:
        return response_mac(secret, req_mac, self.signed_part())

    def encode(self, secret: Optional[bytes] = None, req_mac: Optional[bytes] = None) -> bytes:
        signed = self.signed_part()
        if secret is not None:
            if req_mac is None:
                raise ValueError("a response MAC needs the request's mac")
            self.mac = response_mac(secret, req_mac, signed)
        if self.mac is None:
            raise ValueError("no mac: pass the secret and the request's mac")
        return signed + self.mac + self.payloads()

    def verify(self, secret: bytes, req_mac: bytes) -> bool:
        return (
            self.mac is not None
            and self.mac != ZERO_MAC
            and hmac.compare_digest(self.mac, self.compute_mac(secret, req_mac))
        )


def _check_descending(values: bytes, what: str, allow_empty: bool = False) -> tuple[int, ...]:
    if not values and not allow_empty:
        raise malformed(f"{what} is empty")
    if any(a <= b for a, b in zip(values, values[1:])):
        raise malformed(f"{what} is not strictly descending")
    return tuple(values)


@dataclass
class Hello(_Request):
    key_id: int
    device_nonce: bytes
    versions: tuple[int, ...] = (PROTOCOL_VERSION,)
    patch_versions: tuple[int, ...] = (1,)
    caps: int = 0
    label: str = ""
    mac: Optional[bytes] = None
    type_code = HELLO

    def signed_part(self) -> bytes:
        return (
            bytes([0, HELLO, 0])
            + varint(self.key_id)
            + self.device_nonce
            + blob(bytes(self.versions))
            + blob(bytes(self.patch_versions))
            + varint(self.caps)
            + blob(self.label.encode("utf-8"))
        )

    @classmethod
    def read(cls, r: Reader, limits: Limits) -> "Hello":
        key_id = r.varint("key_id")
        nonce = r.take(16, "device_nonce")
        versions = _check_descending(r.blob("versions"), "versions")
        patch_versions = _check_descending(r.blob("patch_versions"), "patch_versions")
        caps = r.varint("caps")
        label = r.blob("label", MAX_LABEL)
        try:
            text = label.decode("utf-8")
        except UnicodeDecodeError as e:
            raise malformed("label is not UTF-8") from e
        return cls(key_id, nonce, versions, patch_versions, caps, text)


@dataclass
class HelloOk(_Response):
    chosen_version: int
    session_id: bytes
    caps: int
    patch_versions: tuple[int, ...]
    limits: tuple[tuple[int, int], ...] = ()
    mac: Optional[bytes] = None
    type_code = HELLO_OK

    def signed_part(self) -> bytes:
        out = bytes([0, HELLO_OK, 0, self.chosen_version]) + self.session_id + varint(self.caps)
        out += blob(bytes(self.patch_versions)) + varint(len(self.limits))
        for lid, value in self.limits:
            out += varint(lid) + varint(value)
        return out

    @classmethod
    def read(cls, r: Reader, limits: Limits) -> "HelloOk":
        chosen = r.u8("chosen_version")
        session_id = r.take(8, "session_id")
        caps = r.varint("caps")
        patch_versions = _check_descending(r.blob("patch_versions"), "patch_versions", allow_empty=True)
        count = r.varint("limit_count")
        if count > MAX_LIMIT_PAIRS:
            raise malformed(f"limit_count {count} is over {MAX_LIMIT_PAIRS}")
        pairs = tuple((r.varint("limit id"), r.varint("limit value")) for _ in range(count))
        return cls(chosen, session_id, caps, patch_versions, pairs)


def _session_header(type_code: int, flags: int, session_id: bytes, seq: int, request_id: bytes, resp_ref) -> bytes:
    out = bytes([PROTOCOL_VERSION, type_code, flags]) + session_id + varint(seq) + request_id
    return out + (resp_ref if resp_ref is not None else b"")


def _read_session_header(r: Reader, flags: int):
    session_id = r.take(8, "session_id")
    seq = r.varint("seq")
    if seq == 0:
        raise malformed("seq is 0")
    request_id = r.take(8, "request_id")
    resp_ref = r.take(8, "resp_ref") if flags & FLAG_RESP_REF else None
    return session_id, seq, request_id, resp_ref


def _read_defs(r: Reader, limits: Limits) -> tuple[ContextDef, ...]:
    count = r.varint("ctx_def_count")
    return tuple(ContextDef.read(r, limits) for _ in range(count))


@dataclass
class Save(_Request):
    session_id: bytes
    seq: int
    request_id: bytes
    procedure: int
    requests: tuple[RequestSpec, ...]
    items: tuple[Item, ...]
    ctx_defs: tuple[ContextDef, ...] = ()
    resp_ref: Optional[bytes] = None
    mac: Optional[bytes] = None
    type_code = SAVE

    @property
    def flags(self) -> int:
        return FLAG_RESP_REF if self.resp_ref is not None else 0

    def signed_part(self) -> bytes:
        out = _session_header(SAVE, self.flags, self.session_id, self.seq, self.request_id, self.resp_ref)
        out += bytes([self.procedure]) + varint(len(self.ctx_defs)) + b"".join(d.encode() for d in self.ctx_defs)
        out += varint(len(self.requests)) + b"".join(q.encode() for q in self.requests)
        out += varint(len(self.items)) + b"".join(i.encode() for i in self.items)
        return out

    def payloads(self) -> bytes:
        return b"".join(i.payload for i in self.items)

    @classmethod
    def read(cls, r: Reader, limits: Limits, flags: int) -> "Save":
        session_id, seq, request_id, resp_ref = _read_session_header(r, flags)
        procedure = r.u8("procedure")
        if procedure > NEXTCLOUD_CHUNKED:
            raise malformed(f"procedure {procedure} is not defined")
        defs = _read_defs(r, limits)
        nreq = r.varint("request_count")
        if nreq > MAX_REQUESTS:
            raise ProtocolError("limit_exceeded", f"request_count {nreq} is over {MAX_REQUESTS}, the most any procedure takes")
        requests = tuple(RequestSpec.read(r, limits) for _ in range(nreq))
        nitems = r.varint("item_count")
        if nitems == 0:
            # §4.5 allows 1..max_items without naming the code for 0; the
            # shared vectors (zero-items) say `malformed`, read as a count
            # outside its layout range.
            raise malformed("item_count is 0")
        if nitems > limits.max_items:
            raise ProtocolError("limit_exceeded", f"item_count {nitems} is over max_items {limits.max_items}")
        read = [Item.read(r, limits) for _ in range(nitems)]
        save = cls(session_id, seq, request_id, procedure, requests, tuple(i for i, _ in read), defs, resp_ref)
        save._payload_lens = [n for _, n in read]  # used by decode_message once the mac is read
        return save

    def _read_payloads(self, r: Reader) -> None:
        self.items = tuple(
            Item(i.payload_kind, i.target_size, i.target_sha256, r.take(n, f"payload of item {k}"), i.doc, i.binding)
            for k, (i, n) in enumerate(zip(self.items, self._payload_lens))
        )
        del self._payload_lens


@dataclass
class ProviderResponseCB:
    """A provider response in a result (§4.6.1): head and body as CBs."""

    head: CB
    body: CB

    def encode(self) -> bytes:
        return self.head.encode() + self.body.encode()


@dataclass
class SaveResult(_Response):
    head: CB
    body: CB
    replayed: bool = False
    ref_used: bool = False
    hash_disagreement: bool = False
    mac: Optional[bytes] = None
    type_code = SAVE_RESULT

    @property
    def flags(self) -> int:
        return (
            (FLAG_REPLAYED if self.replayed else 0)
            | (FLAG_REF_USED if self.ref_used else 0)
            | (FLAG_HASH_DISAGREEMENT if self.hash_disagreement else 0)
        )

    def signed_part(self) -> bytes:
        return bytes([PROTOCOL_VERSION, SAVE_RESULT, self.flags]) + self.head.encode() + self.body.encode()

    @classmethod
    def read(cls, r: Reader, limits: Limits, flags: int) -> "SaveResult":
        head = CB.read(r, "response head", limits.max_response_body)
        body = CB.read(r, "response body", limits.max_response_body)
        return cls(
            head,
            body,
            bool(flags & FLAG_REPLAYED),
            bool(flags & FLAG_REF_USED),
            bool(flags & FLAG_HASH_DISAGREEMENT),
        )


@dataclass
class Fetch(_Request):
    session_id: bytes
    seq: int
    request_id: bytes
    request: RequestSpec
    doc: Optional[DocKey] = None
    have_sha256: Optional[bytes] = None
    follow_redirect: bool = False
    ctx_defs: tuple[ContextDef, ...] = ()
    resp_ref: Optional[bytes] = None
    mac: Optional[bytes] = None
    type_code = FETCH

    @property
    def flags(self) -> int:
        return FLAG_RESP_REF if self.resp_ref is not None else 0

    def signed_part(self) -> bytes:
        out = _session_header(FETCH, self.flags, self.session_id, self.seq, self.request_id, self.resp_ref)
        out += bytes([FETCH_FOLLOW_REDIRECT if self.follow_redirect else 0])
        out += varint(len(self.ctx_defs)) + b"".join(d.encode() for d in self.ctx_defs)
        out += self.request.encode() + _opt_doc(self.doc)
        out += b"\x00" if self.have_sha256 is None else b"\x01" + self.have_sha256
        return out

    @classmethod
    def read(cls, r: Reader, limits: Limits, flags: int) -> "Fetch":
        session_id, seq, request_id, resp_ref = _read_session_header(r, flags)
        fetch_flags = r.u8("fetch_flags")
        if fetch_flags & ~FETCH_FOLLOW_REDIRECT:
            raise malformed(f"reserved fetch_flags bits set: {fetch_flags:#04x}")
        defs = _read_defs(r, limits)
        request = RequestSpec.read(r, limits)
        doc = DocKey.read(r) if _read_has(r, "fetch has_doc") else None
        have = r.take(32, "have_sha256") if _read_has(r, "has_have") else None
        return cls(session_id, seq, request_id, request, doc, have, bool(fetch_flags & 1), defs, resp_ref)


@dataclass
class FetchPart:
    """One part of a FETCH_RESULT: INLINE carries `body`; PATCH and FULL
    carry the target and (PATCH) the payload length."""

    head: CB
    body_kind: int = INLINE
    body: Optional[CB] = None
    target_size: Optional[int] = None
    target_sha256: Optional[bytes] = None
    payload_len: Optional[int] = None

    def encode(self) -> bytes:
        out = self.head.encode() + bytes([self.body_kind])
        if self.body_kind == INLINE:
            return out + self.body.encode()
        out += varint(self.target_size) + self.target_sha256
        if self.body_kind == PART_PATCH:
            out += varint(self.payload_len)
        return out

    @classmethod
    def read(cls, r: Reader, limits: Limits) -> "FetchPart":
        head = CB.read(r, "part head", limits.max_response_body)
        kind = r.u8("part body_kind")
        if kind == INLINE:
            return cls(head, kind, CB.read(r, "part body", limits.max_response_body))
        if kind not in (PART_PATCH, PART_FULL):
            raise malformed(f"part body_kind {kind} is not defined")
        size = r.varint("part target_size")
        sha = r.take(32, "part target_sha256")
        plen = r.varint("part payload_len") if kind == PART_PATCH else None
        return cls(head, kind, None, size, sha, plen)


@dataclass
class FetchResult(_Response):
    parts: tuple[FetchPart, ...]
    payload: bytes = field(default=b"", repr=False)
    ref_used: bool = False
    hash_disagreement: bool = False
    mac: Optional[bytes] = None
    type_code = FETCH_RESULT

    @property
    def flags(self) -> int:
        return (FLAG_REF_USED if self.ref_used else 0) | (FLAG_HASH_DISAGREEMENT if self.hash_disagreement else 0)

    def signed_part(self) -> bytes:
        out = bytes([PROTOCOL_VERSION, FETCH_RESULT, self.flags, len(self.parts)])
        return out + b"".join(p.encode() for p in self.parts)

    def payloads(self) -> bytes:
        return self.payload

    def payload_length(self) -> int:
        last = self.parts[-1]
        if last.body_kind == PART_PATCH:
            return last.payload_len
        if last.body_kind == PART_FULL:
            return last.target_size
        return 0

    @classmethod
    def read(cls, r: Reader, limits: Limits, flags: int) -> "FetchResult":
        count = r.u8("part_count")
        if count not in (1, 2):
            raise malformed(f"part_count {count} is not 1 or 2")
        parts = tuple(FetchPart.read(r, limits) for _ in range(count))
        if count == 2 and parts[0].body_kind != INLINE:
            raise malformed("part 0 of a redirect is not INLINE")
        return cls(parts, b"", bool(flags & FLAG_REF_USED), bool(flags & FLAG_HASH_DISAGREEMENT))


@dataclass
class Error(_Response):
    code: str
    stage: int = 0
    retry_after_ms: int = 0
    list: tuple[int, ...] = ()
    cause: str = ""
    detail: str = ""
    version: int = PROTOCOL_VERSION
    mac: Optional[bytes] = None
    type_code = ERROR

    def signed_part(self) -> bytes:
        out = bytes([self.version, ERROR, 0, CODE_NUMBER[self.code], self.stage]) + varint(self.retry_after_ms)
        out += varint(len(self.list)) + b"".join(varint(v) for v in self.list)
        return out + blob(self.cause.encode("ascii")) + blob(self.detail.encode("utf-8"))

    @classmethod
    def read(cls, r: Reader, limits: Limits, version: int) -> "Error":
        number = r.u8("code")
        if number not in ERROR_TABLE:
            raise malformed(f"error code {number} is not defined")
        stage = r.u8("stage")
        if stage > 1:
            raise malformed(f"stage {stage} is not 0 or 1")
        retry = r.varint("retry_after_ms")
        count = r.varint("list_count")
        values = tuple(r.varint("list entry") for _ in range(count))
        cause = r.blob("cause", MAX_CAUSE, over="malformed")
        detail = r.blob("detail", MAX_DETAIL, over="malformed")
        try:
            cause_text = cause.decode("ascii")
            detail_text = detail.decode("utf-8")
        except UnicodeDecodeError as e:
            raise malformed("cause is not ASCII or detail not UTF-8") from e
        return cls(ERROR_TABLE[number][0], stage, retry, values, cause_text, detail_text, version)

    def to_exception(self, authenticated: bool = True) -> ProtocolError:
        return ProtocolError(
            self.code,
            self.detail,
            stage=self.stage,
            list=self.list,
            cause=self.cause,
            retry_after_ms=self.retry_after_ms,
            authenticated=authenticated,
        )

    @classmethod
    def from_exception(cls, err: ProtocolError, version: int = PROTOCOL_VERSION) -> "Error":
        return cls(err.code, err.stage, err.retry_after_ms, err.list, err.cause, err.detail, version)


Message = Union[Hello, HelloOk, Save, SaveResult, Fetch, FetchResult, Error]

_FLAG_MASK = {
    HELLO: 0,
    HELLO_OK: 0,
    ERROR: 0,
    SAVE: FLAG_RESP_REF,
    FETCH: FLAG_RESP_REF,
    SAVE_RESULT: FLAG_REPLAYED | FLAG_REF_USED | FLAG_HASH_DISAGREEMENT,
    FETCH_RESULT: FLAG_REF_USED | FLAG_HASH_DISAGREEMENT,
}
_REQUEST_TYPES = (HELLO, SAVE, FETCH)


class _EnvelopeReader(Reader):
    """A reader whose structured part may not pass `limit` bytes: reading
    past it, when the message does hold the bytes, is `too_large` (§9 id 1),
    not `malformed`."""

    def __init__(self, data: bytes, limit: int) -> None:
        super().__init__(data)
        self.limit = limit

    def _guard(self, n: int) -> None:
        if self.pos + n > self.limit and self.pos + n <= len(self.data):
            raise ProtocolError("too_large", f"structured part is over max_envelope {self.limit}")

    def take(self, n: int, what: str) -> bytes:
        self._guard(n)
        return super().take(n, what)

    def u8(self, what: str) -> int:
        self._guard(1)
        return super().u8(what)

    def varint(self, what: str) -> int:
        # A varint is at most 10 bytes; guarding its first byte and then the
        # rest keeps the rule exact without duplicating the varint decoder.
        start = self.pos
        value = super().varint(what)
        if self.pos > self.limit:
            self.pos = start
            raise ProtocolError("too_large", f"structured part is over max_envelope {self.limit}")
        return value


def decode_message(data: bytes, *, path: Optional[str] = None, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decodes one message, payloads included.

    `path`, when given, is the endpoint a request arrived on, or the path of
    the request a response answers (§2.1: the type must match the path, and
    an ERROR carries the path's version). Requests' structured parts are
    bounded by `max_envelope`."""
    if len(data) < 1:
        raise malformed("empty message")
    version = data[0]
    expected_version = VERSION_OF_PATH.get(path) if path is not None else None
    if expected_version is not None and version != expected_version:
        raise ProtocolError("unsupported_version", f"version {version} on {path}")
    if len(data) < 3:
        raise malformed("message ends inside its header")
    type_code, flags = data[1], data[2]
    if type_code not in _FLAG_MASK:
        raise malformed(f"message type {type_code:#04x} is not defined")
    if expected_version is None:
        allowed = (0, PROTOCOL_VERSION) if type_code == ERROR else (_VERSION_OF_TYPE[type_code],)
        if version not in allowed:
            raise ProtocolError("unsupported_version", f"version {version} for type {type_code:#04x}")
    if path is not None and path in TYPE_OF_PATH:
        want = TYPE_OF_PATH[path]
        if type_code not in (want, want | 0x80, ERROR):
            raise malformed(f"message type {type_code:#04x} does not match {path}")
    if flags & ~_FLAG_MASK[type_code]:
        raise malformed(f"reserved flag bits set: {flags:#04x}")
    is_request = type_code in _REQUEST_TYPES
    r: Reader = _EnvelopeReader(data, limits.max_envelope) if is_request else Reader(data)
    r.pos = 3
    msg: Message
    if type_code == HELLO:
        msg = Hello.read(r, limits)
    elif type_code == HELLO_OK:
        msg = HelloOk.read(r, limits)
    elif type_code == SAVE:
        msg = Save.read(r, limits, flags)
    elif type_code == SAVE_RESULT:
        msg = SaveResult.read(r, limits, flags)
    elif type_code == FETCH:
        msg = Fetch.read(r, limits, flags)
    elif type_code == FETCH_RESULT:
        msg = FetchResult.read(r, limits, flags)
    else:
        msg = Error.read(r, limits, version)
    if is_request:
        r.limit = len(data)  # the mac and payloads are not part of the envelope
    msg.signed = bytes(data[: r.pos])  # S, kept for MAC checks on exactly the received bytes
    msg.mac = r.take(MAC_LEN, "mac")
    if isinstance(msg, Save):
        msg._read_payloads(r)
    elif isinstance(msg, FetchResult):
        msg.payload = r.take(msg.payload_length(), "payload")
    r.end()
    return msg


# ---------------------------------------------------------------- stateless validation


# Request counts and body kinds each procedure takes (§6.1-§6.6).
_SHAPES: dict[int, tuple[tuple[int, ...], ...]] = {
    SINGLE: ((BODY_FILE, BODY_WRAPPED),),
    DROPBOX_SESSION: ((BODY_EMPTY,),),
    DROPBOX_BATCH: ((BODY_BYTES,),),
    GRAPH_SESSION: ((BODY_BYTES, BODY_EMPTY),),
    DRIVE_RESUMABLE: ((BODY_BYTES, BODY_EMPTY),),
    NEXTCLOUD_CHUNKED: ((BODY_EMPTY,), (BODY_EMPTY,)),
}


def validate_save(save: Save) -> None:
    """The `invalid_request` checks of a SAVE that need no session state:
    the procedure's shape, item indexes, SAME heads without a context, and
    every item used (§4.3.3, §4.5, §6). Heads and bindings are checked once
    the heads are decoded (they need the contexts)."""
    shape = _SHAPES[save.procedure]
    name = PROCEDURE_NAMES[save.procedure]
    if len(save.requests) != len(shape):
        raise ProtocolError("invalid_request", f"{name} takes {len(shape)} requests, not {len(save.requests)}")
    used: set[int] = set()
    for i, (req, kinds) in enumerate(zip(save.requests, shape)):
        if req.body_kind not in kinds:
            raise ProtocolError("invalid_request", f"request {i}: body_kind {req.body_kind} does not fit {name}")
        if req.ctx_id == 0 and req.head.mode == SAME:
            raise ProtocolError("invalid_request", f"request {i}: SAME head without a context")
        if req.item is not None:
            if req.item >= len(save.items):
                raise ProtocolError("invalid_request", f"request {i}: item {req.item} out of range")
            used.add(req.item)
    if save.procedure in (DROPBOX_SESSION, DROPBOX_BATCH):
        used.update(k for k, item in enumerate(save.items) if item.binding)
    if save.procedure in (GRAPH_SESSION, DRIVE_RESUMABLE, NEXTCLOUD_CHUNKED):
        # The EPS uploads the one item's file in requests it makes itself (§4.5, §6.4-§6.6).
        used.add(0)
    if save.procedure != DROPBOX_BATCH and len(save.items) != 1:
        raise ProtocolError("invalid_request", f"{name} takes one item, not {len(save.items)}")
    unused = [k for k in range(len(save.items)) if k not in used]
    if unused:
        raise ProtocolError("invalid_request", "items not used by the procedure", list=unused)


def validate_fetch(fetch: Fetch) -> None:
    """The stateless `invalid_request` checks of a FETCH (§4.8)."""
    if fetch.request.body_kind not in (BODY_EMPTY, BODY_BYTES):
        raise ProtocolError("invalid_request", "a FETCH request's body must be EMPTY or BYTES")
    if fetch.request.ctx_id == 0 and fetch.request.head.mode == SAME:
        raise ProtocolError("invalid_request", "SAME head without a context")
