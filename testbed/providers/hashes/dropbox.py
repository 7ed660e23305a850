"""Dropbox `content_hash`.

Dropbox splits the file into 4 MiB (4,194,304-byte) blocks, takes the SHA-256
of each, concatenates those digests and takes the SHA-256 of that; lower-case
hex. An empty file has no blocks, so its hash is SHA-256 of the empty string.
Follows https://www.dropbox.com/developers/reference/content-hash; the
incremental form below mirrors rclone's `backend/dropbox/dbhash`, whose test
vectors (block boundaries 4194303 / 4194304 / 4194305) we test against.
"""

from __future__ import annotations

import hashlib

BLOCK_SIZE = 4 * 1024 * 1024


class DropboxContentHasher:
    """Incremental `content_hash`: feed bytes with `update`, read `hexdigest`."""

    def __init__(self) -> None:
        self._overall = hashlib.sha256()
        self._block = hashlib.sha256()
        self._block_pos = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            # A block that is exactly full is only closed when more bytes
            # come, so a file of exactly 4 MiB has one block, not two.
            if self._block_pos == BLOCK_SIZE:
                self._close_block()
            take = min(BLOCK_SIZE - self._block_pos, len(view))
            self._block.update(view[:take])
            self._block_pos += take
            view = view[take:]

    def _close_block(self) -> None:
        self._overall.update(self._block.digest())
        self._block = hashlib.sha256()
        self._block_pos = 0

    def hexdigest(self) -> str:
        overall = self._overall.copy()
        if self._block_pos > 0:
            overall.update(self._block.digest())
        return overall.hexdigest()


def dropbox_content_hash(data: bytes | bytearray | memoryview) -> str:
    """The `content_hash` of a whole file held in memory."""
    hasher = DropboxContentHasher()
    hasher.update(data)
    return hasher.hexdigest()
