"""Coded bytes (CB, spec §1.3): a byte string sent as SAME, DELTA or LITERAL
against a reference the receiver already holds.

A `CB` keeps the mode and data exactly as they travel, so a decoded message
re-encodes byte for byte; `CB.resolve(reference, limit)` turns it into the
value. DELTA data is an ec-diff (edit-patch spec Appendix B) made and applied
by the `ec_patch` binding. Before a zstd middle is decoded, the decoded
length |T| - base_mid + middle_len is computed from the ec-diff's header and
checked against the caller's limit, as §1.3 requires, so a small DELTA
cannot make the receiver allocate more than the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import ec_patch

from .errors import ProtocolError, malformed
from .wire import Reader, blob

SAME = 0
DELTA = 1
LITERAL = 2
MODE_NAMES = {SAME: "SAME", DELTA: "DELTA", LITERAL: "LITERAL"}

# ec-diff middle kinds (edit-patch spec §4.2).
_MIDDLE_LITERAL = 0
_MIDDLE_ZSTD = 1


@dataclass(frozen=True)
class CB:
    mode: int
    data: bytes = b""

    @classmethod
    def same(cls) -> "CB":
        return cls(SAME)

    @classmethod
    def literal(cls, value: bytes) -> "CB":
        return cls(LITERAL, bytes(value))

    @classmethod
    def delta(cls, reference: bytes, value: bytes) -> "CB":
        return cls(DELTA, bytes(ec_patch.diff_content(reference, value)))

    @classmethod
    def code(cls, reference: bytes, value: bytes) -> "CB":
        """The shortest coding of `value` against `reference`: SAME when equal,
        else whichever of DELTA and LITERAL is smaller (LITERAL on a tie, as
        it costs the receiver nothing to decode)."""
        if value == reference:
            return cls.same()
        lit = cls.literal(value)
        try:
            dlt = cls.delta(reference, value)
        except ec_patch.PatchError:
            return lit
        return dlt if len(dlt.data) < len(lit.data) else lit

    def encode(self) -> bytes:
        if self.mode == SAME:
            return b"\x00"
        if self.mode not in (DELTA, LITERAL):
            raise ValueError(f"CB mode {self.mode} is not defined")
        return bytes([self.mode]) + blob(self.data)

    @classmethod
    def read(cls, reader: Reader, what: str, max_data: int | None = None) -> "CB":
        """Reads a CB; `max_data` bounds the `data` blob (`limit_exceeded`),
        since no decoded value may exceed its limit and a LITERAL's data is
        the value."""
        mode = reader.u8(f"{what} mode")
        if mode == SAME:
            return cls(SAME)
        if mode not in (DELTA, LITERAL):
            raise malformed(f"{what}: CB mode {mode} is not defined")
        limit = max_data if mode == LITERAL else None
        return cls(mode, reader.blob(f"{what} data", limit))

    def decoded_length(self, reference: bytes) -> int:
        if self.mode == SAME:
            return len(reference)
        if self.mode == LITERAL:
            return len(self.data)
        prefix, base_mid, middle_len = _ec_diff_header(self.data)
        if prefix + base_mid > len(reference):
            raise malformed("CB DELTA does not apply to its reference (prefix + base_mid past its end)")
        return len(reference) - base_mid + middle_len

    def resolve(self, reference: bytes, limit: int, over: str = "limit_exceeded", what: str = "value") -> bytes:
        """The value this CB stands for, against `reference`.

        A decoded length over `limit` raises `over` before any decoding; a
        DELTA that does not apply is `malformed` (§1.3)."""
        size = self.decoded_length(reference)
        if size > limit:
            raise ProtocolError(over, f"{what} decodes to {size} bytes, over the limit of {limit}")
        if self.mode == SAME:
            return bytes(reference)
        if self.mode == LITERAL:
            return self.data
        try:
            value = bytes(ec_patch.apply_content(reference, self.data))
        except ec_patch.PatchError as e:
            raise malformed(f"CB DELTA for {what} does not apply ({getattr(e, 'code', 'error')})") from e
        if len(value) != size:
            raise malformed(f"CB DELTA for {what} decoded to {len(value)} bytes, its header says {size}")
        return value

    def describe(self) -> str:
        return f"{MODE_NAMES.get(self.mode, self.mode)}({len(self.data)} bytes)"


def _ec_diff_header(delta: bytes) -> tuple[int, int, int]:
    """(prefix, base_mid, middle length) from an ec-diff's leading fields."""
    r = Reader(delta)
    prefix = r.varint("ec-diff prefix")
    base_mid = r.varint("ec-diff base_mid")
    kind = r.u8("ec-diff middle_kind")
    if kind == _MIDDLE_LITERAL:
        middle_len = r.varint("ec-diff middle length")
    elif kind == _MIDDLE_ZSTD:
        middle_len = r.varint("ec-diff middle_len")
    else:
        raise malformed(f"ec-diff middle_kind {kind} is not defined")
    return prefix, base_mid, middle_len
