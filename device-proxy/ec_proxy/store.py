"""The device's last-synced store: the version of each document the provider holds.

The proxy makes an edit patch against the version it last synced with the
provider, so it keeps, per document key (provider, account, file reference:
`ec_protocol.DocKey`), the bytes of that version. Versions live as
content-addressed files (`blobs/ab/<sha256>`) in a state folder; an SQLite
index (WAL mode) maps documents to them and keeps per-document save
statistics for the status command (`ec_proxy.status`).

The invariant of issue 4: **the store never offers as a base a version the
provider did not accept.** An upload in flight is recorded with `pending()`
(its bytes are written then, while the upload travels, so that accepting it
is only an index update) and becomes the document's base only through
`accepted()`, which the proxy calls on the provider's 2xx; `rejected()`
forgets it. `downloaded()` records a version the provider served. Pending
versions do not survive a restart: their outcome is unknown once the process
that would have learnt it is gone.

The EPS's version: the EPS keeps the last version of a document that went
through it (a save, or a download it fetched), and sees nothing of a save
the proxy sent straight to the provider. So `accepted(token, at_edge=...)`
and `downloaded(..., at_edge=...)` say whether the EPS holds the new
version too; when a version it does not hold replaces one it holds, the
store keeps the older one as the document's *edge version*, and
`edge_base()` offers it as the base of the next patch (the EPS looks bases
up by hash, spec §5.2): a save after a direct one costs a patch of both
edits, not `base_unknown` and the whole file resent. A version that went
through the EPS clears it. It is a cache of a cache: a wrong guess costs
the `base_unknown` resend it was meant to save, never a wrong file (the
EPS checks the rebuilt file's SHA-256).

A new OAuth token: an account the device knows only by its bearer token
(`tok:` + a digest, `ec_proxy.recognise.common`) changes with every token
refresh (OneDrive's tokens last an hour, Dropbox's four), and so does the
key of each of its documents. A key with no base of its own borrows the
base of the same document (provider, reference, and the account's part
after the token digest) under the most recently used other token
(`_sibling`): the first save after a refresh is a patch, not the whole
file. Like the edge version, a wrong guess (two accounts on one device with
the same path) costs a larger patch or a `base_unknown` resend, never a
wrong file.

Crash safety: a blob is written to `tmp/`, fsynced, renamed into place and
its folder fsynced before any row names it; rows change in SQLite
transactions; a file is deleted only after the rows naming it are gone. So a
crash at any point leaves at worst an orphan file, which the next open
deletes. A blob is checked against its SHA-256 on every read and dropped when
it fails, is missing, or cannot be read (an I/O error of its own: the entry
is deleted at once, as it would be at the next open, and a later write of the
same content replaces whatever could not be deleted); each is counted for
`ec_proxy status` and logged, and the document's next save goes whole. An index SQLite cannot open is moved aside and the store starts
empty: it is a cache, and losing it costs one whole upload per document.

Bounded: when the distinct bytes held exceed `max_bytes`, last-synced
versions are evicted least recently used first (reads and writes both count
as use). Save statistics are kept per document for the `max_stats_docs`
documents saved last; older ones are folded into one row of sums, in the
transaction that records the save which took them over the bound. Versions referenced by a pending upload are never evicted; they are
bounded by the uploads in flight. One process owns a state folder at a time
(an advisory lock); `read_stats()` reads it without owning it.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ec_protocol import DocKey

__all__ = [
    "DeviceStore",
    "DocStats",
    "StoreError",
    "StoreLocked",
    "StoreStats",
    "HOW_VALUES",
    "read_stats",
]

log = logging.getLogger("ec_proxy.store")

SCHEMA_VERSION = 2
INDEX_NAME = "index.sqlite3"
LOCK_NAME = "LOCK"
HOW_VALUES = ("patch", "full", "direct")
#: How the proxy last found its EPS (`record_eps`).
EPS_STATES = ("ok", "unreachable", "pin_mismatch", "auth_failed")
#: Events counted since the state folder was made: a certificate that did not
#: match the pin, the EPS not reachable, the EPS refusing the device's key,
#: a save answered 504 because its outcome stayed unknown (spec §7.1).
EPS_COUNTERS = ("pin_mismatch", "unreachable", "auth_failed", "outcome_unknown")

#: Documents whose save statistics are kept one by one; beyond this, the
#: least recently saved ones are folded into one row of their sums
#: (`record_save`), so the totals stay whole and the table bounded.
MAX_STATS_DOCS = 4096
#: The key of that row (no document's key is empty: `DocKey.encode()` starts with its provider).
_FOLDED = b""

#: Why a version was dropped when it was read (`_read_version`), counted for `ec_proxy status`.
DROP_REASONS = ("missing", "corrupt", "unreadable")
#: Errors reading a version that say nothing about the version (the process
#: is short of file descriptors or memory, a signal): the read fails as a
#: StoreError and the version stays. Any other OSError (EIO, EISDIR, ELOOP,
#: EACCES, ...) is the entry's own: it is dropped and deleted.
TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN, errno.ENOBUFS})
#: The folder (under the state folder) where earlier versions of the store moved
#: unreadable entries (now deleted at once); deleted when the store opens.
QUARANTINE_NAME = "quarantine"

#: Added in schema 2 (a schema-1 index gets them by ALTER TABLE): whether the
#: EPS holds the last-synced version too, else the older version it holds
#: (the edge version), if known.
_EDGE_COLUMNS = ("at_edge INTEGER NOT NULL DEFAULT 0", "edge_sha TEXT", "edge_size INTEGER")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS synced (
    doc    BLOB PRIMARY KEY,          -- DocKey.encode()
    sha256 TEXT NOT NULL,
    size   INTEGER NOT NULL,
    used   INTEGER NOT NULL,          -- LRU clock, larger = more recent
    {edge_columns}
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS synced_used ON synced (used);
CREATE INDEX IF NOT EXISTS synced_sha ON synced (sha256);
CREATE INDEX IF NOT EXISTS synced_edge_sha ON synced (edge_sha);
CREATE TABLE IF NOT EXISTS pending (
    token  TEXT PRIMARY KEY,
    doc    BLOB NOT NULL,
    sha256 TEXT,                      -- NULL: a version too large to keep
    size   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pending_sha ON pending (sha256);
CREATE TABLE IF NOT EXISTS stats (
    doc               BLOB PRIMARY KEY,
    provider          INTEGER NOT NULL,
    account           BLOB NOT NULL,
    ref               BLOB NOT NULL,
    saves             INTEGER NOT NULL DEFAULT 0,
    patch_saves       INTEGER NOT NULL DEFAULT 0,
    full_saves        INTEGER NOT NULL DEFAULT 0,
    direct_saves      INTEGER NOT NULL DEFAULT 0,
    sent_bytes        INTEGER NOT NULL DEFAULT 0,
    whole_bytes       INTEGER NOT NULL DEFAULT 0,
    link_bytes        INTEGER NOT NULL DEFAULT 0,
    last_how          TEXT,
    last_reason       TEXT,
    last_at           REAL,
    last_whole_reason TEXT,
    last_whole_at     REAL
) WITHOUT ROWID;
""".format(edge_columns=",\n    ".join(_EDGE_COLUMNS))


class StoreError(Exception):
    """A failure of the device store; the proxy treats it as 'no base' and goes whole."""


class StoreLocked(StoreError):
    """Another process owns the state folder."""

    def __init__(self, folder: Path):
        super().__init__(
            f"state folder {folder} is in use by another process (lock {folder / LOCK_NAME}); "
            "stop the other proxy or give this one its own --state folder"
        )
        self.folder = folder


@dataclass
class DocStats:
    """Save statistics of one document (or, with provider 0, of all of them).

    `sent_bytes`: bytes sent to the EPS; `whole_bytes`: what the app's
    upload would have cost sent directly; `link_bytes`: what the device's
    link carried (sent to the EPS, plus the whole file for direct saves).
    """

    provider: int
    account: bytes
    ref: bytes
    saves: int = 0
    patch_saves: int = 0
    full_saves: int = 0
    direct_saves: int = 0
    sent_bytes: int = 0
    whole_bytes: int = 0
    link_bytes: int = 0
    last_how: str | None = None
    last_reason: str | None = None
    last_at: float | None = None
    last_whole_reason: str | None = None
    last_whole_at: float | None = None
    held_bytes: int = 0

    @property
    def saved_bytes(self) -> int:
        return self.whole_bytes - self.link_bytes

    @property
    def saved_percent(self) -> float | None:
        if self.whole_bytes == 0:
            return None
        return 100.0 * self.saved_bytes / self.whole_bytes


@dataclass
class StoreStats:
    """`docs`: per document, most recently saved first; `total`: their sums."""

    docs: list[DocStats]
    total: DocStats
    documents_held: int
    held_bytes: int
    max_bytes: int | None
    pending: int = 0
    folder: str = ""
    #: Per-document records folded into the total (over `max_stats_docs`); a
    #: document folded, saved again and folded again counts twice.
    folded_docs: int = 0
    #: The EPS as the proxy last found it (`DeviceStore.record_eps`): state,
    #: reason, since, at, url and the counters; empty before the first contact.
    eps: dict = field(default_factory=dict)
    #: Versions dropped when read, per reason (`DROP_REASONS`): missing,
    #: corrupt (failed their SHA-256), unreadable (an I/O error, deleted).
    dropped: dict = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))


def _doc_digest(doc: bytes) -> str:
    """What logs show instead of a file name (spec §8 keeps paths out of logs)."""
    return hashlib.sha256(doc).hexdigest()[:8]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_F = TypeVar("_F", bound=Callable)


def _as_store_error(method: _F) -> _F:
    """SQLite and file-system failures reach callers as StoreError, which the
    proxy handles as "no base" (a whole upload), never as a crash of the flow."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"device store {self.folder}: {method.__name__} failed: {e}") from e
    return wrapper  # type: ignore[return-value]


class DeviceStore:
    """The last-synced store in `folder`, holding at most about `max_bytes` of versions.

    Thread-safe (one lock; the proxy calls it from worker threads). Methods
    raise `StoreError` for failures the caller should treat as "no base".
    """

    def __init__(self, folder: str | os.PathLike, max_bytes: int, max_stats_docs: int = MAX_STATS_DOCS):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if max_stats_docs <= 0:
            raise ValueError(f"max_stats_docs must be positive, got {max_stats_docs}")
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        self.max_stats_docs = int(max_stats_docs)
        self._blobs = self.folder / "blobs"
        self._tmp = self.folder / "tmp"
        self._quarantine = self.folder / QUARANTINE_NAME
        #: Versions whose entry could not be read nor deleted: the next
        #: write of the same content replaces the entry rather than trust it.
        self._unreadable: set[str] = set()
        self._mutex = threading.RLock()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._blobs.mkdir(exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the state folder {self.folder}: {e}") from e
        self._lock_fd = self._take_lock()
        try:
            self._db = self._open_index()
            self._recover()
        except (sqlite3.Error, OSError) as e:
            os.close(self._lock_fd)
            raise StoreError(f"cannot open the device store in {self.folder}: {e}") from e
        except BaseException:
            os.close(self._lock_fd)
            raise

    # ----- opening and recovery -------------------------------------------------

    def _take_lock(self) -> int:
        fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLocked(self.folder) from e
            raise StoreError(f"cannot lock {self.folder / LOCK_NAME}: {e}") from e
        return fd

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are opened explicitly (BEGIN IMMEDIATE)
        # so that every change is one visible unit.
        db = sqlite3.connect(self.folder / INDEX_NAME, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, SCHEMA_VERSION):
            db.close()
            raise sqlite3.DatabaseError(f"index schema version {version}, this proxy knows {SCHEMA_VERSION}")
        if version == 1:
            # Schema 1 had no edge version: its rows are taken as not held by the EPS.
            with DeviceStore._Tx(db):
                for column in _EDGE_COLUMNS:
                    db.execute(f"ALTER TABLE synced ADD COLUMN {column}")
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("PRAGMA quick_check").fetchone()
        return db

    def _open_index(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as e:
            aside = self.folder / f"{INDEX_NAME}.unreadable-{int(time.time())}"
            log.warning("store index %s unreadable (%s); moved to %s, starting empty",
                        self.folder / INDEX_NAME, e, aside.name)
            for suffix in ("", "-wal", "-shm"):
                p = self.folder / (INDEX_NAME + suffix)
                if p.exists():
                    os.replace(p, Path(str(aside) + suffix))
            try:
                return self._connect()
            except sqlite3.DatabaseError as e2:
                raise StoreError(f"cannot create the store index in {self.folder}: {e2}") from e2

    def _recover(self) -> None:
        with self._tx() as db:
            dropped = db.execute("DELETE FROM pending").rowcount
            db.execute("INSERT OR REPLACE INTO meta VALUES ('max_bytes', ?)", (self.max_bytes,))
            self._fold_stats(db)  # a lower bound than the last run's, or an index from before the bound
        if dropped:
            log.info("store: %d pending version(s) of a previous run dropped (outcome unknown)", dropped)
        for p in self._tmp.iterdir():
            self._remove(p)
        if os.path.lexists(self._quarantine):
            # Where earlier versions of the proxy moved unreadable entries aside (now deleted at once).
            if self._remove(self._quarantine):
                log.info("store: the unreadable versions an earlier run moved aside into %s deleted", self._quarantine)
        known = {row[0] for row in self._db.execute("SELECT sha256 FROM synced UNION SELECT edge_sha FROM synced")}
        orphans = 0
        for sub in self._blobs.iterdir():
            if not sub.is_dir():
                self._remove(sub)
                continue
            for p in sub.iterdir():
                if p.name not in known:
                    self._remove(p)
                    orphans += 1
        if orphans:
            log.info("store: %d orphan blob(s) deleted", orphans)
        self._evict()

    @staticmethod
    def _remove(path: Path) -> bool:
        """Deletes a file, or whatever else stands in its place (a folder);
        False, logged, when it cannot be deleted (the store goes on: only
        its bytes are lost)."""
        import shutil

        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            return True
        except OSError as e:
            log.error("store: cannot delete %s: %s", path, e)
            return False

    def close(self) -> None:
        with self._mutex:
            if self._lock_fd < 0:
                return
            self._db.close()
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "DeviceStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- helpers ---------------------------------------------------------------

    class _Tx:
        def __init__(self, db: sqlite3.Connection):
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, exc, tb) -> None:
            if exc_type is None:
                try:
                    self.db.execute("COMMIT")
                    return
                except sqlite3.Error:
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK")
                    raise
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")

    def _tx(self) -> "_Tx":
        return DeviceStore._Tx(self._db)

    def _crash_point(self, stage: str) -> None:
        """Does nothing; crash tests override it to kill the process at `stage`
        ("blob-written": file in place, row not yet committed;
        "row-written": row written, transaction not yet committed)."""

    def _blob_path(self, sha: str) -> Path:
        return self._blobs / sha[:2] / sha

    def _write_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self._blob_path(sha)
        try:
            if sha not in self._unreadable and path.is_file() and path.stat().st_size == len(data):
                return sha  # same content already held; a damaged copy is caught on read
            tmp = self._tmp / f"{sha[:16]}.{secrets.token_hex(4)}"
        except OSError as e:
            raise StoreError(f"cannot write a version into {self._blobs}: {e}") from e
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if not path.parent.exists():
                path.parent.mkdir(exist_ok=True)
                _fsync_dir(self._blobs)
            if os.path.isdir(path) and not os.path.islink(path):
                # A folder where the file goes (an unreadable entry that could not be
                # deleted when it was dropped, or anything else): the rename would
                # fail (EISDIR, ENOTEMPTY) for every write of this content. The
                # blobs folder is the store's own: nothing in it is anyone else's.
                if not self._remove(path):
                    raise OSError(errno.EISDIR, "a folder stands where the version goes and cannot be deleted",
                                  str(path))
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as e:
            try:
                os.unlink(tmp)  # not left in tmp/ until the next open: every failed write would add one
            except OSError:
                pass
            raise StoreError(f"cannot write a version into {self._blobs}: {e}") from e
        self._unreadable.discard(sha)
        self._crash_point("blob-written")
        return sha

    def _drop_blob_if_unused(self, sha: str | None) -> None:
        if sha is None:
            return
        used = self._db.execute(
            "SELECT 1 FROM synced WHERE sha256=? UNION ALL SELECT 1 FROM synced WHERE edge_sha=? "
            "UNION ALL SELECT 1 FROM pending WHERE sha256=? LIMIT 1",
            (sha, sha, sha)).fetchone()
        if not used:
            self._remove(self._blob_path(sha))

    def _next_use(self, db: sqlite3.Connection) -> int:
        return db.execute("SELECT coalesce(max(used), 0) + 1 FROM synced").fetchone()[0]

    def _held_bytes(self) -> int:
        return self._db.execute(_HELD_BYTES).fetchone()[0]

    def _evict(self) -> None:
        while self._held_bytes() > self.max_bytes:
            row = self._db.execute(
                "SELECT doc, sha256, edge_sha FROM synced WHERE sha256 NOT IN "
                "(SELECT sha256 FROM pending WHERE sha256 IS NOT NULL) ORDER BY used LIMIT 1").fetchone()
            if row is None:
                return  # only pending versions left: bounded by the uploads in flight
            doc, sha, edge_sha = row
            with self._tx() as db:
                db.execute("DELETE FROM synced WHERE doc=?", (doc,))
            self._drop_blob_if_unused(sha)
            self._drop_blob_if_unused(edge_sha)
            log.info("store: evicted doc %s (least recently used)", _doc_digest(doc))

    def _set_synced(self, key: bytes, sha: str | None, size: int, settle: str | None = None,
                    at_edge: bool = False) -> None:
        """Makes (sha, size) the document's base, or drops its base when sha is
        None; with `settle`, that pending token goes in the same transaction,
        so the pending row goes exactly when the base changes. `at_edge`: the
        EPS holds this version too; when it does not, the version the EPS
        holds (the old base, if it did, or the edge version before) is kept
        as the edge version."""
        old = self._db.execute("SELECT sha256, size, at_edge, edge_sha, edge_size FROM synced WHERE doc=?",
                               (key,)).fetchone()
        edge_sha, edge_size = None, None
        if sha is not None and not at_edge and old is not None:
            if old[2]:
                edge_sha, edge_size = old[0], old[1]
            else:
                edge_sha, edge_size = old[3], old[4]
            if edge_sha == sha:  # back to the version the EPS holds
                at_edge, edge_sha, edge_size = True, None, None
        with self._tx() as db:
            if settle is not None:
                db.execute("DELETE FROM pending WHERE token=?", (settle,))
            if sha is None:
                db.execute("DELETE FROM synced WHERE doc=?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO synced VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (key, sha, size, self._next_use(db), int(at_edge), edge_sha, edge_size))
            if sha is not None or settle is not None:
                self._crash_point("row-written")
        if old:
            for gone in {old[0], old[3]} - {sha, edge_sha, None}:
                self._drop_blob_if_unused(gone)
        self._evict()

    def _check_open(self) -> None:
        if self._lock_fd < 0:
            raise StoreError(f"the store in {self.folder} is closed")

    # ----- the API ---------------------------------------------------------------

    @_as_store_error
    def has_base(self, doc: DocKey) -> bool:
        """Whether the document has a last-synced version (not read nor checked:
        `base` does that), for deciding whether a diff is worth making."""
        with self._mutex:
            self._check_open()
            return self._has_base(doc)

    @_as_store_error
    def has_base_now(self, doc: DocKey) -> bool | None:
        """`has_base` without waiting: None when another thread is using the
        store (its writes fsync, for milliseconds), so that a caller on an
        event loop never blocks on it."""
        if not self._mutex.acquire(blocking=False):
            return None
        try:
            self._check_open()
            return self._has_base(doc)
        finally:
            self._mutex.release()

    def _has_base(self, doc: DocKey) -> bool:
        if self._db.execute("SELECT 1 FROM synced WHERE doc=?", (doc.encode(),)).fetchone() is not None:
            return True
        return self._sibling(doc) is not None

    #: The account of a key made from a bearer token: `tok:` and 12 hex digits.
    TOKEN_ACCOUNT = len(b"tok:") + 12

    def _sibling(self, doc: DocKey) -> tuple[bytes, str, int] | None:
        """The synced row (key, SHA-256, size) of the same document under
        another bearer token's account, the most recently used: same
        provider and reference, both accounts `tok:` digests with the same
        rest (a Dropbox path root). None for other accounts."""
        n = self.TOKEN_ACCOUNT
        if not doc.account.startswith(b"tok:") or len(doc.account) < n:
            return None
        key, tail = doc.encode(), DocKey(doc.provider, b"x", doc.ref).encode()[3:]  # varint(len(ref)) + ref
        rows = self._db.execute(
            "SELECT doc, sha256, size FROM synced WHERE substr(doc, 1, 1) = ? AND substr(doc, 3, 4) = ? "
            "AND substr(doc, -?) = ? AND doc != ? ORDER BY used DESC LIMIT 16",
            (bytes([doc.provider]), b"tok:", len(tail), tail, key)).fetchall()
        for other, sha, size in rows:
            k = _decode_key(other)
            if (k.provider, k.ref) == (doc.provider, doc.ref) and k.account.startswith(b"tok:") and k.account[n:] == doc.account[n:]:
                return other, sha, size
        return None

    @_as_store_error
    def base(self, doc: DocKey) -> bytes | None:
        """The document's last-synced version, checked against its SHA-256; None if none.

        A version whose file is missing or fails the check is dropped (and
        logged): the next save goes whole and the provider's answer restores it.
        """
        key = doc.encode()
        with self._mutex:
            self._check_open()
            row = self._db.execute("SELECT sha256, size FROM synced WHERE doc=?", (key,)).fetchone()
            if row is None:
                return self._borrowed(doc)
            data = self._read_version(key, *row)
            if data is not None:
                self._touch(key)
            return data

    def _borrowed(self, doc: DocKey) -> bytes | None:
        """The base of `doc` from its sibling under another token (`_sibling`),
        then recorded as `doc`'s own (the same blob, no copy)."""
        sibling = self._sibling(doc)
        if sibling is None:
            return None
        other, sha, size = sibling
        data = self._read_version(other, sha, size)
        if data is None:
            return None
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO synced (doc, sha256, size, used) VALUES (?, ?, ?, ?)",
                       (doc.encode(), sha, size, self._next_use(db)))
        log.info("store: doc %s has no base of its own; the same document under another token (an OAuth refresh) "
                 "lends it its version", _doc_digest(doc.encode()))
        return data

    @_as_store_error
    def edge_base(self, doc: DocKey) -> bytes | None:
        """The base for a patch to the EPS: the version the EPS holds when a
        newer one went straight to the provider (the edge version, checked
        against its SHA-256), else the last-synced version (`base`). An edge
        version that fails its check is dropped, and the last-synced one
        offered."""
        key = doc.encode()
        with self._mutex:
            self._check_open()
            row = self._db.execute("SELECT edge_sha, edge_size FROM synced WHERE doc=?", (key,)).fetchone()
            if row is not None and row[0] is not None:
                data = self._read_version(key, *row)
                if data is not None:
                    self._touch(key)
                    return data
            return self.base(doc)

    def _touch(self, key: bytes) -> None:
        """A read of the document's versions counts as use (LRU)."""
        with self._tx() as db:
            db.execute("UPDATE synced SET used=? WHERE doc=?", (self._next_use(db), key))

    def _read_version(self, key: bytes, sha: str, size: int) -> bytes | None:
        """A version's bytes, checked; a missing, damaged or unreadable one
        is dropped wherever it is named (as a base, an edge version or a
        pending one), counted (`DROP_REASONS`) and logged: the next save of
        the document goes whole (FULL through the EPS), and the version the
        provider then accepts is the new base.

        Unreadable: reading the entry fails with an I/O error of its own
        (EIO from a failing medium, a folder or a symlink loop where the file
        was: EISDIR, ELOOP, ...). Its entry is deleted at once (`_discard`:
        unlinking reads nothing of it), so that no later write of the same
        content takes it for the file (`_write_blob` keeps a file already in
        place); one that cannot be deleted is replaced by that write. An
        error that says nothing about the entry (`TRANSIENT_ERRNOS`: no file
        descriptor or memory left) drops nothing: StoreError, as before."""
        path = self._blob_path(sha)
        error: OSError | None = None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = None
        except OSError as e:
            if e.errno in TRANSIENT_ERRNOS:
                raise StoreError(f"cannot read {path}: {e}") from e
            data, error = None, e
        if data is not None and len(data) == size and hashlib.sha256(data).hexdigest() == sha:
            return data
        why = "unreadable" if error is not None else "missing" if data is None else "corrupt"
        if error is None:
            log.warning("store: version of doc %s is %s; dropped", _doc_digest(key), why)
        orphaned = [row[0] for row in self._db.execute(
            "SELECT edge_sha FROM synced WHERE sha256=? AND edge_sha IS NOT NULL", (sha,))]
        with self._tx() as db:
            db.execute("DELETE FROM synced WHERE sha256=?", (sha,))
            db.execute("UPDATE synced SET edge_sha=NULL, edge_size=NULL WHERE edge_sha=?", (sha,))
            still_pending = db.execute("SELECT 1 FROM pending WHERE sha256=?", (sha,)).fetchone()
            if still_pending:
                # a damaged file must not become a base through accepted() either
                db.execute("UPDATE pending SET sha256=NULL, size=0 WHERE sha256=?", (sha,))
            db.execute("INSERT INTO meta VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET v = v + 1", (f"dropped_{why}",))
        if error is None:
            self._remove(path)
        else:
            log.error("store: version of doc %s cannot be read (%s: %s); dropped, %s; the next save of the "
                      "document goes whole and its accepted version becomes the base",
                      _doc_digest(key), errno.errorcode.get(error.errno or 0, "OSError"), error.strerror or error,
                      self._discard(path, sha))
        for other in orphaned:  # the edge versions of the dropped bases, unless named elsewhere
            self._drop_blob_if_unused(other)
        return None

    def _discard(self, path: Path, sha: str) -> str:
        """Deletes an unreadable entry at once (`_remove`: an unlink, or a
        folder's tree removed; nothing of it is read); says so, for the log.
        An entry that cannot be deleted stays, and `sha` is remembered as
        unreadable: the next write of the same content replaces it rather
        than take it for the file (`_write_blob`). Nothing is moved aside to
        keep: on a failing medium every save would add one more entry until
        a restart."""
        if self._remove(path):
            self._unreadable.discard(sha)
            return "its entry deleted"
        self._unreadable.add(sha)
        return "its entry could not be deleted (the next write of this version replaces it)"

    @_as_store_error
    def pending(self, doc: DocKey, data: bytes) -> str:
        """Records a version the app is uploading; returns the token for accepted()/rejected().

        A version larger than max_bytes is not kept, but still gets a token:
        accepting it drops the document's older base, which the provider no
        longer holds.
        """
        key = doc.encode()
        token = secrets.token_hex(12)
        with self._mutex:
            self._check_open()
            sha = self._write_blob(data) if len(data) <= self.max_bytes else None
            with self._tx() as db:
                db.execute("INSERT INTO pending VALUES (?, ?, ?, ?)",
                           (token, key, sha, len(data) if sha else 0))
                self._crash_point("row-written")
            self._evict()
        return token

    @_as_store_error
    def accepted(self, token: str, at_edge: bool = False) -> bool:
        """The provider accepted the pending version: it becomes the document's base.
        `at_edge`: it went through the EPS, which holds it too.

        False if the token is unknown (already settled, or from before a restart).
        """
        with self._mutex:
            self._check_open()
            row = self._db.execute("SELECT doc, sha256, size FROM pending WHERE token=?", (token,)).fetchone()
            if row is None:
                return False
            key, sha, size = row
            self._set_synced(key, sha, size, settle=token, at_edge=at_edge)
            return True

    @_as_store_error
    def rejected(self, token: str) -> bool:
        """The upload failed or its outcome is unknown: the pending version is forgotten."""
        with self._mutex:
            self._check_open()
            row = self._db.execute("SELECT sha256 FROM pending WHERE token=?", (token,)).fetchone()
            if row is None:
                return False
            with self._tx() as db:
                db.execute("DELETE FROM pending WHERE token=?", (token,))
            self._drop_blob_if_unused(row[0])
            return True

    @_as_store_error
    def downloaded(self, doc: DocKey, data: bytes, at_edge: bool = False) -> None:
        """Records a version the provider served (a 200 download the proxy
        passed, or the file of an accepted save under another of its names);
        `at_edge`: the EPS holds it too (it fetched or saved it)."""
        key = doc.encode()
        with self._mutex:
            self._check_open()
            if len(data) > self.max_bytes:
                self._set_synced(key, None, 0)
                return
            sha = self._write_blob(data)
            self._set_synced(key, sha, len(data), at_edge=at_edge)

    @_as_store_error
    def forget(self, doc: DocKey) -> None:
        """Drops the document's base (e.g. the provider deleted or moved the file).
        Its statistics and any upload still pending are kept."""
        with self._mutex:
            self._check_open()
            self._set_synced(doc.encode(), None, 0)

    @_as_store_error
    def record_save(self, doc: DocKey, sent_bytes: int, whole_bytes: int, how: str, reason: str) -> None:
        """Counts one save of `doc`: how it went ("patch": an edit patch through
        the EPS; "full": the whole file through the EPS; "direct": the whole file
        straight to the provider), why, the bytes sent to the EPS, and the bytes
        a whole upload costs. A document new to the statistics that takes them
        over `max_stats_docs` folds the least recently saved one into the
        sums (`_fold_stats`), in the same transaction."""
        self.record_saves([(doc, sent_bytes, whole_bytes, how, reason)])

    @_as_store_error
    def record_saves(self, saves: "list[tuple[DocKey, int, int, str, str]]") -> None:
        """Counts several saves at once, each as `record_save` does, in one
        transaction: the files of one upload (a Dropbox batch: each of its
        files is one save of its own document)."""
        for doc, sent_bytes, whole_bytes, how, _reason in saves:
            if how not in HOW_VALUES:
                raise ValueError(f"how must be one of {HOW_VALUES}, got {how!r}")
            if sent_bytes < 0 or whole_bytes < 0:
                raise ValueError(f"byte counts must not be negative: sent {sent_bytes}, whole {whole_bytes}")
        if not saves:
            return
        now = time.time()
        with self._mutex:
            self._check_open()
            with self._tx() as db:
                new = 0
                for doc, sent_bytes, whole_bytes, how, reason in saves:
                    new += self._count_save(db, doc, sent_bytes, whole_bytes, how, reason, now)
                if new:
                    self._fold_stats(db)

    @staticmethod
    def _count_save(db: sqlite3.Connection, doc: DocKey, sent_bytes: int, whole_bytes: int, how: str, reason: str,
                    now: float) -> int:
        """Within the caller's transaction: one save added to `doc`'s row;
        1 when the row is new."""
        link = sent_bytes + (whole_bytes if how == "direct" else 0)
        key = doc.encode()
        whole = how != "patch"
        new = db.execute("INSERT OR IGNORE INTO stats (doc, provider, account, ref) VALUES (?, ?, ?, ?)",
                         (key, doc.provider, doc.account, doc.ref)).rowcount
        db.execute(
            f"""UPDATE stats SET saves = saves + 1, {how}_saves = {how}_saves + 1,
                sent_bytes = sent_bytes + ?, whole_bytes = whole_bytes + ?, link_bytes = link_bytes + ?,
                last_how = ?, last_reason = ?, last_at = ?,
                last_whole_reason = CASE WHEN ? THEN ? ELSE last_whole_reason END,
                last_whole_at = CASE WHEN ? THEN ? ELSE last_whole_at END
                WHERE doc = ?""",
            (sent_bytes, whole_bytes, link, how, reason, now, whole, reason, whole, now, key))
        return new

    def _fold_stats(self, db: sqlite3.Connection) -> None:
        """Within the caller's transaction: while more than `max_stats_docs`
        documents have statistics of their own, the least recently saved
        ones are added to the row of folded sums and their rows deleted
        (a crash leaves both or neither)."""
        over = db.execute("SELECT count(*) FROM stats WHERE doc != ?", (_FOLDED,)).fetchone()[0] - self.max_stats_docs
        if over <= 0:
            return
        columns = ", ".join(_STATS_COLUMNS[3:])
        victims = db.execute(f"SELECT doc, {columns} FROM stats WHERE doc != ? ORDER BY last_at, doc LIMIT ?",
                             (_FOLDED, over)).fetchall()
        db.execute("INSERT OR IGNORE INTO stats (doc, provider, account, ref) VALUES (?, 0, ?, ?)", (_FOLDED, b"", b""))
        row = db.execute(f"SELECT {columns} FROM stats WHERE doc = ?", (_FOLDED,)).fetchone()
        folded = DocStats(0, b"", b"", **dict(zip(_STATS_COLUMNS[3:], row)))
        for victim in victims:
            _add_stats(folded, DocStats(0, b"", b"", **dict(zip(_STATS_COLUMNS[3:], victim[1:]))))
        db.execute(f"UPDATE stats SET {', '.join(c + ' = ?' for c in _STATS_COLUMNS[3:])} WHERE doc = ?",
                   (*(getattr(folded, c) for c in _STATS_COLUMNS[3:]), _FOLDED))
        db.executemany("DELETE FROM stats WHERE doc = ?", [(v[0],) for v in victims])
        db.execute("INSERT INTO meta VALUES ('stats_folded_docs', ?) ON CONFLICT(k) DO UPDATE SET v = v + ?",
                   (len(victims), len(victims)))

    @_as_store_error
    def record_eps(self, state: str, reason: str = "", count: str | None = None, url: str = "") -> None:
        """Records how the proxy last found its EPS, for `ec_proxy status`:
        `state` one of EPS_STATES, `reason` a sentence for people (never a
        secret), `count` a counter of EPS_COUNTERS to add one to. `since`
        moves only when the state changes."""
        if state not in EPS_STATES:
            raise ValueError(f"state must be one of {EPS_STATES}, got {state!r}")
        if count is not None and count not in EPS_COUNTERS:
            raise ValueError(f"count must be one of {EPS_COUNTERS}, got {count!r}")
        now = time.time()
        with self._mutex:
            self._check_open()
            with self._tx() as db:
                row = db.execute("SELECT v FROM meta WHERE k='eps_state'").fetchone()
                if row is None or row[0] != state:
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('eps_since', ?)", (now,))
                for k, v in (("eps_state", state), ("eps_reason", reason), ("eps_at", now), ("eps_url", url)):
                    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, v))
                if count is not None:
                    db.execute("INSERT INTO meta VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET v = v + 1", (f"eps_count_{count}",))

    @_as_store_error
    def record_link(self, link: dict) -> None:
        """Records what the proxy's rule believes of its link now
        (`LinkEstimator.summary`), for `ec_proxy status`."""
        with self._mutex:
            self._check_open()
            with self._tx() as db:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('eps_link', ?)", (json.dumps(link, sort_keys=True),))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('eps_link_at', ?)", (time.time(),))

    @_as_store_error
    def stats(self) -> StoreStats:
        """Per-document and total statistics, and what the store holds now."""
        with self._mutex:
            self._check_open()
            return _query_stats(self._db, self.folder)

    @_as_store_error
    def held_bytes(self) -> int:
        """Distinct bytes of the versions held (last-synced and pending)."""
        with self._mutex:
            self._check_open()
            return self._held_bytes()

    def documents(self) -> Iterator[DocKey]:
        """The documents that have a base."""
        with self._mutex:
            self._check_open()
            keys = [row[0] for row in self._db.execute("SELECT doc FROM synced ORDER BY used DESC")]
        for key in keys:
            yield _decode_key(key)


def _decode_key(key: bytes) -> DocKey:
    from ec_protocol import Reader
    return DocKey.read(Reader(key))


#: Distinct bytes of the versions held: last-synced, edge and pending.
_HELD_BYTES = ("SELECT coalesce(sum(size), 0) FROM (SELECT sha256, size FROM synced "
               "UNION SELECT edge_sha, edge_size FROM synced WHERE edge_sha IS NOT NULL "
               "UNION SELECT sha256, size FROM pending WHERE sha256 IS NOT NULL)")

_STATS_COLUMNS = ("provider", "account", "ref", "saves", "patch_saves", "full_saves", "direct_saves",
                  "sent_bytes", "whole_bytes", "link_bytes", "last_how", "last_reason", "last_at",
                  "last_whole_reason", "last_whole_at")
_SUMMED = ("saves", "patch_saves", "full_saves", "direct_saves", "sent_bytes", "whole_bytes", "link_bytes")


def _add_stats(total: DocStats, d: DocStats) -> None:
    """Adds `d`'s counts to `total`, whose last save (and last whole one) becomes `d`'s if later."""
    for name in _SUMMED:
        setattr(total, name, getattr(total, name) + getattr(d, name))
    if d.last_at is not None and (total.last_at is None or d.last_at > total.last_at):
        total.last_how, total.last_reason, total.last_at = d.last_how, d.last_reason, d.last_at
    if d.last_whole_at is not None and (total.last_whole_at is None or d.last_whole_at > total.last_whole_at):
        total.last_whole_reason, total.last_whole_at = d.last_whole_reason, d.last_whole_at


def _query_stats(db: sqlite3.Connection, folder: Path) -> StoreStats:
    held = {row[0]: row[1] for row in db.execute("SELECT doc, size FROM synced")}
    docs = []
    total = DocStats(provider=0, account=b"", ref=b"")
    for row in db.execute(f"SELECT doc, {', '.join(_STATS_COLUMNS)} FROM stats "
                          "ORDER BY last_at DESC"):
        d = DocStats(**dict(zip(_STATS_COLUMNS, row[1:])))
        _add_stats(total, d)
        if bytes(row[0]) == _FOLDED:
            continue  # the sums of documents folded out: in the total only
        d.account, d.ref = bytes(d.account), bytes(d.ref)
        d.held_bytes = held.get(row[0], 0)
        docs.append(d)
    held_bytes = db.execute(_HELD_BYTES).fetchone()[0]
    total.held_bytes = held_bytes
    row = db.execute("SELECT v FROM meta WHERE k='max_bytes'").fetchone()
    pending = db.execute("SELECT count(*) FROM pending").fetchone()[0]
    folded = db.execute("SELECT v FROM meta WHERE k='stats_folded_docs'").fetchone()
    dropped = dict.fromkeys(DROP_REASONS, 0)
    for k, v in db.execute("SELECT k, v FROM meta WHERE k LIKE 'dropped_%'"):
        if k.removeprefix("dropped_") in dropped:
            dropped[k.removeprefix("dropped_")] = int(v)
    return StoreStats(docs=docs, total=total, documents_held=len(held), held_bytes=held_bytes,
                      max_bytes=row[0] if row else None, pending=pending, folder=str(folder), eps=_query_eps(db),
                      folded_docs=int(folded[0]) if folded else 0, dropped=dropped)


def _query_eps(db: sqlite3.Connection) -> dict:
    meta = {k: v for k, v in db.execute("SELECT k, v FROM meta WHERE k LIKE 'eps_%'")}
    if "eps_state" not in meta:
        return {}
    return {
        "state": meta["eps_state"],
        "reason": meta.get("eps_reason") or "",
        "url": meta.get("eps_url") or "",
        "since": meta.get("eps_since"),
        "at": meta.get("eps_at"),
        "counts": {c: int(meta.get(f"eps_count_{c}", 0)) for c in EPS_COUNTERS},
        "link": _link(meta.get("eps_link")),
        "link_at": meta.get("eps_link_at"),
    }


def _link(text) -> dict | None:
    """The rule's view of the link as recorded (`record_link`); None when
    there is none or it is not what `record_link` writes (a damaged row
    hides only this line of `status`)."""
    try:
        link = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return link if isinstance(link, dict) else None


def read_stats(folder: str | os.PathLike) -> StoreStats:
    """The statistics of the store in `folder`, read-only, while a proxy may own it."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if not index.exists():
        raise StoreError(f"no device store in {folder} (no {INDEX_NAME}); is this the proxy's --state folder?")
    try:
        db = sqlite3.connect(f"{index.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return _query_stats(db, folder)
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"cannot read the store index {index}: {e}") from e
