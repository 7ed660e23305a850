"""Resolving a SAVE or FETCH against a session's contexts, as the EPS does in
steps 4-5 of spec §5.1, and the operation digest of §5.4.

The device does not need this to talk to an EPS; it exists so that the
Python side checks the shared vectors the whole way (resolved heads, bodies,
document keys, store keys, operation digests) and so that test fixtures can
stand in for an EPS. It applies the context definitions only after every one
of them is valid, lists every missing context in one `context_unknown`, and
checks decoded lengths before decoding (through `CB.resolve`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

from .errors import ProtocolError
from .heads import RequestHead, parse_head
from .limits import DEFAULT_LIMITS, Limits
from .messages import (
    BODY_BYTES,
    BODY_WRAPPED,
    ContextDef,
    DocKey,
    Fetch,
    Save,
    validate_fetch,
    validate_save,
)
from .wire import blob, varint


@dataclass(frozen=True)
class ResolvedRequest:
    head_bytes: bytes
    head: RequestHead
    body_kind: int
    item: Optional[int] = None
    body: Optional[bytes] = None
    split: Optional[int] = None

    @property
    def host(self) -> str:
        rest = self.head.url.split("://", 1)[1]
        authority = rest.split("/", 1)[0].split("?", 1)[0]
        return authority.rsplit(":", 1)[0] if not authority.endswith("]") else authority


@dataclass(frozen=True)
class ResolvedSave:
    requests: tuple[ResolvedRequest, ...]
    docs: tuple[DocKey, ...]  # each item's document key

    @property
    def store_keys(self) -> tuple[bytes, ...]:
        return tuple(store_key(d) for d in self.docs)


def store_key(doc: DocKey) -> bytes:
    """SHA-256 of the encoded document key (§4.4.1)."""
    return hashlib.sha256(doc.encode()).digest()


def apply_definitions(defs: tuple[ContextDef, ...], contexts: dict[int, ContextDef], *, allow_http: bool = False,
                      limits: Limits = DEFAULT_LIMITS) -> None:
    """Checks every definition, then adds them all (§4.3.2: they take effect
    only when every definition in the message is valid)."""
    for d in defs:
        if d.ctx_id == 0 or d.ctx_id > limits.max_contexts:
            raise ProtocolError("invalid_request", f"context id {d.ctx_id} is outside 1..{limits.max_contexts}")
        parse_head(d.head, allow_http=allow_http, limits=limits)
    for d in defs:
        contexts[d.ctx_id] = d


def _resolve_request(spec, contexts, allow_http, limits, n_items) -> ResolvedRequest:
    ctx = contexts[spec.ctx_id] if spec.ctx_id else None
    ref_head = ctx.head if ctx else b""
    ref_body = ctx.body if ctx else b""
    head_bytes = spec.head.resolve(ref_head, limits.max_head, what="head")
    head = parse_head(head_bytes, allow_http=allow_http, limits=limits)
    body = None
    if spec.body_kind in (BODY_BYTES, BODY_WRAPPED):
        body = spec.body.resolve(ref_body, limits.max_body_ref, what="request bytes")
    if spec.body_kind == BODY_WRAPPED and spec.split > len(body):
        raise ProtocolError("invalid_request", f"split {spec.split} is past the {len(body)} bytes")
    if spec.item is not None and spec.item >= n_items:
        raise ProtocolError("invalid_request", f"item {spec.item} out of range")
    return ResolvedRequest(head_bytes, head, spec.body_kind, spec.item, body, spec.split)


def _missing(specs, contexts) -> None:
    missing = sorted({s.ctx_id for s in specs if s.ctx_id and s.ctx_id not in contexts})
    if missing:
        raise ProtocolError("context_unknown", "contexts not defined", list=missing)


def resolve_save(save: Save, contexts: dict[int, ContextDef], *, allow_http: bool = False,
                 limits: Limits = DEFAULT_LIMITS) -> ResolvedSave:
    """Applies the SAVE's definitions to `contexts` and resolves its
    requests and items' document keys (§5.1 steps 4-5, without hosts,
    capabilities and bound accounts, which are EPS configuration)."""
    apply_definitions(save.ctx_defs, contexts, allow_http=allow_http, limits=limits)
    _missing(save.requests, contexts)
    validate_save(save)
    requests = tuple(_resolve_request(s, contexts, allow_http, limits, len(save.items)) for s in save.requests)
    first_ctx = contexts.get(save.requests[0].ctx_id) if save.requests and save.requests[0].ctx_id else None
    docs = []
    for k, item in enumerate(save.items):
        doc = item.doc if item.doc is not None else (first_ctx.doc if first_ctx else None)
        if doc is None:
            raise ProtocolError("invalid_request", f"item {k} has no document key and its context none")
        docs.append(doc)
    return ResolvedSave(requests, tuple(docs))


def resolve_fetch(fetch: Fetch, contexts: dict[int, ContextDef], *, allow_http: bool = False,
                  limits: Limits = DEFAULT_LIMITS) -> tuple[ResolvedRequest, DocKey]:
    apply_definitions(fetch.ctx_defs, contexts, allow_http=allow_http, limits=limits)
    _missing((fetch.request,), contexts)
    validate_fetch(fetch)
    req = _resolve_request(fetch.request, contexts, allow_http, limits, 0)
    if any(n in ("range", "if-range") for n, _ in req.head.headers):
        raise ProtocolError("unsupported", "ranged FETCH")
    ctx = contexts.get(fetch.request.ctx_id) if fetch.request.ctx_id else None
    doc = fetch.doc if fetch.doc is not None else (ctx.doc if ctx else None)
    if doc is None:
        raise ProtocolError("invalid_request", "FETCH has no document key and its context none")
    return req, doc


def operation_digest(save: Save, resolved: ResolvedSave) -> bytes:
    """§5.4: SHA-256 over the procedure, the number of requests, each
    request's canonical head, body kind, item / bytes / split as present,
    the number of items, and each item's document key, binding, target size
    and SHA-256. Independent of seq, resp_ref, context ids, CB modes and
    PATCH versus FULL."""
    h = hashlib.sha256(bytes([save.procedure]) + varint(len(resolved.requests)))
    for r in resolved.requests:
        h.update(blob(r.head_bytes) + bytes([r.body_kind]))
        if r.item is not None:
            h.update(varint(r.item))
        if r.body is not None:
            h.update(blob(r.body))
        if r.split is not None:
            h.update(varint(r.split))
    h.update(varint(len(save.items)))
    for item, doc in zip(save.items, resolved.docs):
        h.update(doc.encode() + blob(item.binding) + varint(item.target_size) + item.target_sha256)
    return h.digest()


__all__ = [
    "ResolvedRequest",
    "ResolvedSave",
    "apply_definitions",
    "operation_digest",
    "resolve_fetch",
    "resolve_save",
    "store_key",
]
