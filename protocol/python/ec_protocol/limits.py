"""Limits (spec §9) and capability bits (spec §11).

`Limits` holds the values an EPS advertises in HELLO_OK by id; unknown ids
are kept in `extra` and otherwise ignored, as §11 requires. The codec checks
lengths and counts against a `Limits` before it allocates for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

#: limit id -> attribute name, in the order of §9's table.
LIMIT_IDS: dict[int, str] = {
    1: "max_envelope",
    2: "max_item_size",
    3: "max_patch_size",
    4: "max_items",
    5: "max_contexts",
    6: "max_context_bytes",
    7: "max_head",
    8: "max_headers",
    9: "max_url",
    10: "max_body_ref",
    11: "max_response_body",
    12: "replay_window",
    13: "max_inflight",
    14: "max_sessions",
    15: "resp_cache",
    16: "context_idle_ttl",
    17: "session_idle_ttl",
    18: "op_timeout",
}

# Lengths fixed by the message tables rather than advertised.
MAX_LABEL = 64
MAX_BINDING = 128
MAX_ACCOUNT = 256
MAX_REF = 4096
MAX_CAUSE = 32
MAX_DETAIL = 256
# The most request specifications a SAVE may carry: the most any procedure takes (§4.5, §6).
MAX_REQUESTS = 2
MAX_LIMIT_PAIRS = 64


@dataclass
class Limits:
    max_envelope: int = 1 * MIB
    max_item_size: int = 2 * GIB
    max_patch_size: int = 64 * MIB
    max_items: int = 100
    max_contexts: int = 64
    max_context_bytes: int = 256 * KIB
    max_head: int = 64 * KIB
    max_headers: int = 100
    max_url: int = 8 * KIB
    max_body_ref: int = 256 * KIB
    max_response_body: int = 16 * MIB
    replay_window: int = 1024
    max_inflight: int = 4
    max_sessions: int = 8
    resp_cache: int = 32
    context_idle_ttl: int = 600
    session_idle_ttl: int = 3600
    op_timeout: int = 900
    extra: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_pairs(cls, pairs: list[tuple[int, int]]) -> "Limits":
        """Defaults overridden by advertised (id, value) pairs."""
        limits = cls()
        for lid, value in pairs:
            name = LIMIT_IDS.get(lid)
            if name is None:
                limits.extra[lid] = value
            else:
                setattr(limits, name, value)
        return limits

    def pairs(self) -> list[tuple[int, int]]:
        """Every known limit as (id, value), in id order, then unknown ids."""
        out = [(lid, getattr(self, name)) for lid, name in LIMIT_IDS.items()]
        return out + sorted(self.extra.items())


DEFAULT_LIMITS = Limits()
assert {f.name for f in fields(Limits)} - {"extra"} == set(LIMIT_IDS.values())


class Cap:
    """Capability bits of §11 (bit n of `caps`)."""

    SINGLE = 1 << 0
    DROPBOX_SESSION = 1 << 1
    DROPBOX_BATCH = 1 << 2
    GRAPH_SESSION = 1 << 3
    DRIVE_RESUMABLE = 1 << 4
    NEXTCLOUD_CHUNKED = 1 << 5
    FETCH = 1 << 6
    FOLLOW_REDIRECT = 1 << 7
    RESP_REF = 1 << 8
    ALL_V1 = (1 << 9) - 1

    @staticmethod
    def procedure(procedure: int) -> int:
        return 1 << procedure
