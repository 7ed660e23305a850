"""Primitive encodings of spec §1.2: varints, blobs, and a strict reader.

Varints are unsigned LEB128 of at most 64 bits in shortest form, with the
rules of the edit-patch spec §1.3 (a non-shortest form, an 11th byte or a
10th byte above 0x01 is `malformed`). The reader turns every way a message
can end early into `malformed`, so decoders never index past the input.
"""

from __future__ import annotations

from .errors import ProtocolError, malformed

U64_MAX = (1 << 64) - 1


def varint(value: int) -> bytes:
    """The shortest LEB128 encoding of an unsigned 64-bit integer."""
    if not 0 <= value <= U64_MAX:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def blob(data: bytes) -> bytes:
    return varint(len(data)) + bytes(data)


class Reader:
    """Reads a message front to back; every shortfall is `malformed`."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining:
            raise malformed(f"message ends inside {what} (needs {n} bytes, {self.remaining} left)")
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        if self.remaining < 1:
            raise malformed(f"message ends before {what}")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self, what: str) -> int:
        value = 0
        for i in range(10):
            if self.remaining < 1:
                raise malformed(f"message ends inside varint {what}")
            byte = self.data[self.pos]
            self.pos += 1
            if i == 9 and byte > 0x01:
                raise malformed(f"varint {what} exceeds 64 bits")
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if i > 0 and byte == 0:
                    raise malformed(f"varint {what} is not in shortest form")
                return value
        raise AssertionError("unreachable: the 10th byte check stops the loop")

    def blob(self, what: str, max_len: int | None = None, over: str = "limit_exceeded") -> bytes:
        """A varint length and that many bytes; the length is checked
        against `max_len` (raising `over`) before anything is read, and against
        the bytes left (`malformed`)."""
        n = self.varint(f"{what} length")
        if max_len is not None and n > max_len:
            raise ProtocolError(over, f"{what} is {n} bytes, over the limit of {max_len}")
        return self.take(n, what)

    def end(self, what: str = "message") -> None:
        if self.remaining:
            raise malformed(f"{self.remaining} bytes left after the {what}")
