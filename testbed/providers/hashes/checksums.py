"""MD5 (Google Drive `md5Checksum`) and Nextcloud `OC-Checksum` values.

Nextcloud clients send `OC-Checksum: <ALGO>:<hex>` with an upload, the server
checks it and reports it back (the `OC-Checksum` response header on GET, the
`oc:checksums` property in PROPFIND). The algorithms in use are SHA1, MD5 and
ADLER32 (the desktop client's choices); the hex digest is lower case, and
ADLER32 is written as 8 hex digits.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

ALGORITHMS = ("SHA1", "MD5", "ADLER32")


class OcChecksumError(ValueError):
    """An `OC-Checksum` value that cannot be parsed or names an unknown algorithm."""


@dataclass(frozen=True)
class OcChecksum:
    algorithm: str  # one of ALGORITHMS, upper case
    hexdigest: str  # lower case

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


def md5_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.md5(data).hexdigest()


def oc_checksum(algorithm: str, data: bytes | bytearray | memoryview) -> OcChecksum:
    algo = algorithm.upper()
    if algo == "SHA1":
        digest = hashlib.sha1(data).hexdigest()
    elif algo == "MD5":
        digest = hashlib.md5(data).hexdigest()
    elif algo == "ADLER32":
        digest = f"{zlib.adler32(data) & 0xFFFFFFFF:08x}"
    else:
        raise OcChecksumError(f"unknown OC-Checksum algorithm {algorithm!r}; use one of {ALGORITHMS}")
    return OcChecksum(algo, digest)


def parse_oc_checksum(value: str) -> OcChecksum:
    """Parse `SHA1:abc...`; the algorithm name is case-insensitive, as clients vary."""
    algo, sep, digest = value.strip().partition(":")
    if not sep or not digest:
        raise OcChecksumError(f"OC-Checksum {value!r} is not of the form ALGO:hex")
    algo = algo.upper()
    if algo not in ALGORITHMS:
        raise OcChecksumError(f"OC-Checksum {value!r}: unknown algorithm; use one of {ALGORITHMS}")
    digest = digest.strip().lower()
    try:
        int(digest, 16)
    except ValueError as e:
        raise OcChecksumError(f"OC-Checksum {value!r}: digest is not hex") from e
    return OcChecksum(algo, digest)
