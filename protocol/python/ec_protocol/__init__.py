"""EdgeCourier device-to-edge protocol, version 1, in pure Python.

The codec (`messages`, `cb`, `heads`, `wire`) encodes and strictly decodes
every message of docs/spec/device-edge-protocol-v1.md, computes and checks
their MACs, and codes byte strings as SAME / DELTA / LITERAL. The client
(`client.EpsClient`) is what the device proxy calls: it runs HELLO, SAVE and
FETCH with the resend and fallback rules of §7 and returns a provider
response, a `Fallback` (direct path) or an `AppError` (answer 502/504).

Written from the spec text alone, independently of the Rust codec, so the
two meet only through the shared test vectors in protocol/vectors/.
"""

from .cb import CB, DELTA, LITERAL, SAME
from .client import (
    OUTCOME_RETRY_WINDOW_S,
    AppError,
    Traffic,
    EnrolmentBundle,
    EpsClient,
    Fallback,
    FetchResponse,
    ProviderRequest,
    ProviderResponse,
    SaveItem,
    make_item,
    spki_sha256_of_der_certificate,
)
from .errors import ERROR_TABLE, ProtocolError
from .heads import (
    RequestHead,
    ResponseHead,
    canonical_head,
    canonical_response_head,
    parse_head,
    parse_response_head,
)
from .limits import DEFAULT_LIMITS, Cap, Limits
from .messages import (
    BODY_BYTES,
    BODY_EMPTY,
    BODY_FILE,
    BODY_WRAPPED,
    DRIVE,
    DRIVE_RESUMABLE,
    DROPBOX,
    DROPBOX_BATCH,
    DROPBOX_SESSION,
    FETCH_PATH,
    FULL,
    GRAPH,
    GRAPH_SESSION,
    HELLO_PATH,
    INLINE,
    NEXTCLOUD_CHUNKED,
    PART_FULL,
    PART_PATCH,
    PATCH,
    SAVE_PATH,
    SINGLE,
    WEBDAV,
    ContextDef,
    DocKey,
    Error,
    Fetch,
    FetchPart,
    FetchResult,
    Hello,
    HelloOk,
    Item,
    RequestSpec,
    Save,
    SaveResult,
    decode_message,
    request_mac,
    response_digest,
    response_mac,
    validate_fetch,
    validate_save,
)
from .resolve import ResolvedRequest, ResolvedSave, apply_definitions, operation_digest, resolve_fetch, resolve_save, store_key
from .wire import Reader, blob, varint

__all__ = [name for name in dir() if not name.startswith("_")]
