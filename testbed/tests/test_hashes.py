"""Provider hashes against published vectors.

Vectors: rclone's backend/dropbox/dbhash/dbhash_test.go (runs of 'A' around
the 4 MiB block boundaries) and backend/onedrive/quickxorhash/quickxorhash_test.go
(base64 inputs of 0..64, 111, 128, 222, 256, 333 bytes), from
https://github.com/rclone/rclone.
"""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest

from testbed.providers.hashes import (
    DropboxContentHasher,
    OcChecksumError,
    QuickXorHash,
    dropbox_content_hash,
    md5_hex,
    oc_checksum,
    parse_oc_checksum,
    quickxor_base64,
)

DROPBOX_A_VECTORS = [
    (0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (1, "1cd6ef71e6e0ff46ad2609d403dc3fee244417089aa4461245a4e4fe23a55e42"),
    (2, "01e0655fb754d10418a73760f57515f4903b298e6d67dda6bf0987fa79c22c88"),
    (4096, "8620913d33852befe09f16fff8fd75f77a83160d29f76f07e0276e9690903035"),
    (4194303, "647c8627d70f7a7d13ce96b1e7710a771a55d41a62c3da490d92e56044d311fa"),
    (4194304, "d4d63bac5b866c71620185392a8a6218ac1092454a2d16f820363b69852befa3"),
    (4194305, "8f553da8d00d0bf509d8470e242888be33019c20c0544811f5b2b89e98360b92"),
    (8388607, "83b30cf4fb5195b04a937727ae379cf3d06673bf8f77947f6a92858536e8369c"),
    (8388608, "e08b3ba1f538804075c5f939accdeaa9efc7b5c01865c94a41e78ca6550a88e7"),
    (8388609, "02c8a4aefc2bfc9036f89a7098001865885938ca580e5c9e5db672385edd303c"),
]


@pytest.mark.parametrize("size,want", DROPBOX_A_VECTORS)
def test_dropbox_content_hash_rclone_vectors(size, want):
    assert dropbox_content_hash(b"A" * size) == want


@pytest.mark.parametrize("chunk", [2047, 65536, 4 * 1024 * 1024, 16 * 1024 * 1024])
def test_dropbox_content_hash_is_independent_of_write_sizes(chunk):
    # rclone writes the same vectors in chunks of 2047 bytes .. 16 MiB: a block
    # must close at exactly 4 MiB whatever the write boundaries are.
    data = b"A" * 8388609
    hasher = DropboxContentHasher()
    for i in range(0, len(data), chunk):
        hasher.update(data[i : i + chunk])
    assert hasher.hexdigest() == DROPBOX_A_VECTORS[-1][1]


def test_dropbox_content_hash_definition_on_random_data():
    # The definition written out, against the implementation, on data that is
    # not a run of one byte (so block order matters).
    data = hashlib.sha256(b"seed").digest() * (4194305 // 32 + 1)
    data = data[:4194305 * 2 + 7]
    blocks = [data[i : i + 4194304] for i in range(0, len(data), 4194304)]
    want = hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blocks)).hexdigest()
    assert dropbox_content_hash(data) == want


QUICKXOR_VECTORS = [
    (0, "", "AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
    (1, "Sg==", "SgAAAAAAAAAAAAAAAQAAAAAAAAA="),
    (2, "tbQ=", "taAFAAAAAAAAAAAAAgAAAAAAAAA="),
    (3, "0pZP", "0rDEEwAAAAAAAAAAAwAAAAAAAAA="),
    (4, "jRRDVA==", "jaDAEKgAAAAAAAAABAAAAAAAAAA="),
    (5, "eAV52qE=", "eChAHrQRCgAAAAAABQAAAAAAAAA="),
    (8, "/aNzzCFPS/A=", "/RjFHJgRgicsAR4ACAAAAAAAAAA="),
    (13, "vPgoDjOfO6fm71RxLw==", "vMAHChwwg0/s4BTmdQcV4vACAAA="),
    (16, "2fuxhBJXtpWFe8dOfdGeHw==", "O9tHLAghgSvYohKFyMMxnNCHaHg="),
    (20, "T6LYJIfDh81JrAK309H2JMJTXis=", "zBTHrspn3mEcohlJdIUAbjGNaNg="),
    (32, "NbYXsp5/K6mR+NmHwExjvWeWDJFnXTKWVlzYHoesp2E=", "wjuAuWDiq04qDt1R8hHWDDcwVoQ="),
    (
        64,
        "Mb7EGva2rEE5fENDL85P+BsapHEEjv2/siVhKjvAQe02feExVOQSkfmuYzU/kTF1MaKjPmKF/w+c"
        "bvwfdWL8aQ==",
        "n1anP5NfvD4XDYWIeRPW3ZkPv1Y=",
    ),
    (
        111,
        "jyibxJSzO6ZiZ0O1qe3tG/bvIAYssvukh9suIT5wEy1JBINVgPiqdsTW0cOpP0aUfP7mgqLfADkz"
        "I/m/GgCuVhr8oFLrOCoTx1/psBOWwhltCbhUx51Icm9aH8tY4Z3ccU+6BKpYQkLCy0B/A9Zc",
        "hZfLIilSITC6N3e3tQ/iSgEzkto=",
    ),
    (
        128,
        "ikwCorI7PKWz17EI50jZCGbV9JU2E8bXVfxNMg5zdmqSZ2NlsQPp0kqYIPjzwTg1MBtfWPg53k0h"
        "0P2naJNEVgrqpoHTfV2b3pJ4m0zYPTJmUX4Bg/lOxcnCxAYKU29Y5F0U8Quz7ZXFBEweftXxJ7RS"
        "4r6N7BzJrPsLhY7hgck=",
        "imAoFvCWlDn4yVw3/oq1PDbbm6U=",
    ),
    (
        222,
        "PfxMcUd0vIW6VbHG/uj/Y0W6qEoKmyBD0nYebEKazKaKG+UaDqBEcmQjbfQeVnVLuodMoPp7P7TR"
        "1htX5n2VnkHh22xDyoJ8C/ZQKiSNqQfXvh83judf4RVr9exJCud8Uvgip6aVZTaPrJHVjQhMCp/d"
        "EnGvqg0oN5OVkM2qqAXvA0teKUDhgNM71sDBVBCGXxNOR2bpbD1iM4dnuT0ey4L+loXEHTL0fqMe"
        "UcEi2asgImnlNakwenDzz0x57aBwyq3AspCFGB1ncX4yYCr/OaCcS5OKi/00WH+wNQU3",
        "QX/YEpG0gDsmhEpCdWhsxDzsfVE=",
    ),
    (
        256,
        "qwGf2ESubE5jOUHHyc94ORczFYYbc2OmEzo+hBIyzJiNwAzC8PvJqtTzwkWkSslgHFGWQZR2BV5+"
        "uYTrYT7HVwRM40vqfj0dBgeDENyTenIOL1LHkjtDKoXEnQ0mXAHoJ8PjbNC93zi5TovVRXTNzfGE"
        "s5dpWVqxUzb5lc7dwkyvOluBw482mQ4xrzYyIY1t+//OrNi1ObGXuUw2jBQOFfJVj2Y6BOyYmfB1"
        "y36eBxi3zxeG5d5NYjm2GSh6e08QMAwu3zrINcqIzLOuNIiGXBtl7DjKt7b5wqi4oFiRpZsCyx2s"
        "mhSrdrtK/CkdU6nDN+34vSR/M8rZpWQdBE7a8g==",
        "WYT9JY3JIo/pEBp+tIM6Gt2nyTM=",
    ),
    (
        333,
        "w0LGhqU1WXFbdavqDE4kAjEzWLGGzmTNikzqnsiXHx2KRReKVTxkv27u3UcEz9+lbMvYl4xFf2Z4"
        "aE1xRBBNd1Ke5C0zToSaYw5o4B/7X99nKK2/XaUX1byLow2aju2XJl2OpKpJg+tSJ2fmjIJTkfuY"
        "Uz574dFX6/VXxSxwGH/xQEAKS5TCsBK3CwnuG1p5SAsQq3gGVozDWyjEBcWDMdy8/AIFrj/y03Lf"
        "c/RNRCQTAfZbnf2QwV7sluw4fH3XJr07UoD0YqN+7XZzidtrwqMY26fpLZnyZjnBEt1FAZWO7RnK"
        "G5asg8xRk9YaDdedXdQSJAOy6bWEWlABj+tVAigBxavaluUH8LOj+yfCFldJjNLdi90fVHkUD/m4"
        "Mr5OtmupNMXPwuG3EQlqWUVpQoYpUYKLsk7a5Mvg6UFkiH596y5IbJEVCI1Kb3D1",
        "e3+wo77iKcILiZegnzyUNcjCdoQ=",
    ),
]


@pytest.mark.parametrize("size,data_b64,want", QUICKXOR_VECTORS)
def test_quickxor_rclone_vectors(size, data_b64, want):
    data = base64.b64decode(data_b64)
    assert len(data) == size
    assert quickxor_base64(data) == want


@pytest.mark.parametrize("write_size", [1, 2, 7, 64, 159, 160, 161, 512])
def test_quickxor_is_independent_of_write_sizes(write_size):
    size, data_b64, want = QUICKXOR_VECTORS[-1]
    data = base64.b64decode(data_b64)
    hasher = QuickXorHash()
    for i in range(0, len(data), write_size):
        hasher.update(data[i : i + write_size])
    assert hasher.base64() == want


def _quickxor_naive(data: bytes) -> bytes:
    # The per-byte definition, as the reference C# code states it.
    state = 0
    for i, b in enumerate(data):
        shift = (i * 11) % 160
        state ^= ((b << shift) | (b >> (160 - shift))) & ((1 << 160) - 1)
    out = bytearray(state.to_bytes(20, "little"))
    for i, b in enumerate(len(data).to_bytes(8, "little")):
        out[12 + i] ^= b
    return bytes(out)


def test_quickxor_matches_naive_definition_across_block_boundaries():
    data = hashlib.sha512(b"q").digest() * 200  # 12,800 bytes
    for size in (0, 159, 160, 161, 4093, 12800):
        hasher = QuickXorHash()
        hasher.update(data[:size])
        assert hasher.digest() == _quickxor_naive(data[:size]), size


def test_quickxor_10mb_is_fast():
    import time

    data = bytes(range(256)) * (10 * 1024 * 1024 // 256)
    t = time.perf_counter()
    quickxor_base64(data)
    assert time.perf_counter() - t < 2.0


def test_md5_and_oc_checksums():
    data = b"The quick brown fox jumps over the lazy dog"
    assert md5_hex(data) == "9e107d9d372bb6826bd81d3542a419d6"
    assert str(oc_checksum("sha1", data)) == "SHA1:2fd4e1c67a2d28fced849ee1bb76e7391b93eb12"
    assert str(oc_checksum("MD5", data)) == "MD5:9e107d9d372bb6826bd81d3542a419d6"
    # Adler-32 of "Wikipedia" is the example in the algorithm's own description.
    assert str(oc_checksum("adler32", b"Wikipedia")) == "ADLER32:11e60398"
    assert str(oc_checksum("ADLER32", b"")) == f"ADLER32:{zlib.adler32(b''):08x}"


def test_parse_oc_checksum():
    assert str(parse_oc_checksum("sha1:ABCDEF")) == "SHA1:abcdef"
    for bad in ("SHA1", "CRC32:00", "SHA1:xyz", ":00"):
        with pytest.raises(OcChecksumError):
            parse_oc_checksum(bad)
