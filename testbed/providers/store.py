"""Files the provider test servers hold, on disk, per provider and account.

Each (provider, account) pair is a `Namespace` kept under
`<state>/<provider>/<account>/`: `blobs/<sha256>` holds content (content
addressed, so old revisions cost nothing when unchanged and stay readable for
Dropbox `rev:` downloads), and `index.json` lists the files, their ids, paths,
revisions and provider extras. The index is rewritten atomically (temporary
file, fsync, rename) after every change, so a killed server restarts with the
old or the new state. Upload sessions are not stored here: they live in memory
in each provider module and are lost on restart (documented in the README).

Paths are kept in two forms: `path` as the client wrote it (display) and a key
used for lookups; Dropbox and OneDrive compare paths case-insensitively,
WebDAV case-sensitively, Drive has no paths at all (ids only).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


@dataclass
class Revision:
    rev: str
    sha256: str
    size: int
    modified: float


@dataclass
class FileRecord:
    id: str
    path: str | None  # display path ("/Docs/a.docx"); None for Drive
    name: str
    created: float
    revisions: list[Revision] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head(self) -> Revision:
        return self.revisions[-1]

    @property
    def version(self) -> int:
        """Number of content versions so far (1 after the first upload)."""
        return len(self.revisions)


def _record_doc(r: FileRecord) -> dict[str, Any]:
    """`r` as index.json holds it: what `dataclasses.asdict` gives (every
    field, in order), without its deep copies (json.dumps only reads them)."""
    return dict(vars(r), revisions=[vars(v) for v in r.revisions])


class StoreError(Exception):
    """The on-disk state cannot be read or written."""


class Namespace:
    """One account's files at one provider."""

    def __init__(self, root: Path, provider: str, account: str, casefold_paths: bool) -> None:
        self.root = root
        self.provider = provider
        self.account = account
        self.casefold_paths = casefold_paths
        self.files: dict[str, FileRecord] = {}
        self.folders: set[str] = set()  # path keys of explicit folders (WebDAV MKCOL, Graph POST children)
        # Display spelling of explicit folders whose key is case-folded (Graph), so
        # listings show the name the client created.
        self.folder_display: dict[str, str] = {}
        self.next_number = 1
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        self._load()

    # -- paths -------------------------------------------------------------

    def key(self, path: str) -> str:
        norm = "/" + "/".join(p for p in path.split("/") if p)
        return norm.lower() if self.casefold_paths else norm

    def by_path(self, path: str) -> FileRecord | None:
        k = self.key(path)
        for rec in self.files.values():
            if rec.path is not None and self.key(rec.path) == k:
                return rec
        return None

    def children(self, folder: str) -> tuple[list[FileRecord], list[str]]:
        """Files and sub-folder keys directly inside `folder` (implicit folders included)."""
        base = self.key(folder).rstrip("/") + "/"
        files, subfolders = [], set()
        for rec in self.files.values():
            if rec.path is None:
                continue
            k = self.key(rec.path)
            if not k.startswith(base):
                continue
            rest = k[len(base) :]
            if "/" in rest:
                subfolders.add(base + rest.split("/", 1)[0])
            else:
                files.append(rec)
        for f in self.folders:
            if f.startswith(base) and "/" not in f[len(base) :] and f != base.rstrip("/"):
                subfolders.add(f)
        return files, sorted(subfolders)

    def folder_exists(self, folder: str) -> bool:
        k = self.key(folder)
        if k == "/" or k in self.folders:
            return True
        return any(rec.path is not None and self.key(rec.path).startswith(k + "/") for rec in self.files.values())

    def all_folders(self) -> dict[str, str]:
        """Every folder, explicit or implied by a file path: key -> display path ("/" included)."""
        out = {"/": "/"}
        for k in self.folders:
            out[k] = self.folder_display.get(k, k)
        for rec in self.files.values():
            if rec.path is None:
                continue
            parts = [p for p in rec.path.split("/") if p][:-1]
            for i in range(1, len(parts) + 1):
                display = "/" + "/".join(parts[:i])
                out.setdefault(self.key(display), display)
        return out

    # -- content -----------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def read(self, rev: Revision) -> bytes:
        try:
            return self.blob_path(rev.sha256).read_bytes()
        except OSError as e:
            raise StoreError(f"{self.provider}/{self.account}: blob {rev.sha256} unreadable: {e}") from e

    def _write_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        target = self.blob_path(digest)
        if not target.exists():
            tmp = target.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        return digest

    def new_id(self, make: Callable[[int], Any]) -> Any:
        """A namespace-wide serial number, shaped by `make` (ids and revs share it)."""
        n = self.next_number
        self.next_number += 1
        return make(n)

    def put(
        self,
        data: bytes,
        *,
        record: FileRecord | None,
        path: str | None,
        name: str,
        new_id: Callable[[int], str],
        new_rev: Callable[[int], str],
        extra: dict[str, Any] | None = None,
        modified: float | None = None,
    ) -> tuple[FileRecord, bool]:
        """Store `data` as a new revision of `record`, or as a new file. Returns (record, created)."""
        digest = self._write_blob(data)
        now = time.time() if modified is None else modified
        created = record is None
        if record is None:
            record = FileRecord(id=self.new_id(new_id), path=path, name=name, created=now)
            self.files[record.id] = record
        else:
            if path is not None:
                record.path = path
            record.name = name
        rev = new_rev(self.new_id(lambda n: n))
        record.revisions.append(Revision(rev=rev, sha256=digest, size=len(data), modified=now))
        if extra:
            record.extra.update(extra)
        self.save()
        return record, created

    def delete(self, record: FileRecord) -> None:
        self.files.pop(record.id, None)
        self.save()

    # -- persistence -------------------------------------------------------

    def save(self) -> None:
        doc = {
            "provider": self.provider,
            "account": self.account,
            "next_number": self.next_number,
            "folders": sorted(self.folders),
            "folder_display": self.folder_display,
            "files": [_record_doc(r) for r in self.files.values()],
        }
        # One json.dumps call, compact: the C encoder. json.dump with an indent
        # runs the pure-Python encoder, and with dataclasses.asdict's deep copies
        # a rewrite took 13-21 ms after 528 revisions (one account of
        # proxy_bench.py's link part), time every upload paid, growing with the
        # account's history as a real provider's does not.
        text = json.dumps(doc, separators=(",", ":"))
        tmp = self.root / "index.json.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.root / "index.json")
        except OSError as e:
            raise StoreError(f"{self.root}: cannot write index: {e}") from e

    def _load(self) -> None:
        path = self.root / "index.json"
        if not path.exists():
            return
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(f"{path}: unreadable index ({e}); remove the state folder or fix it") from e
        self.next_number = doc["next_number"]
        self.folders = set(doc.get("folders", []))
        self.folder_display = dict(doc.get("folder_display", {}))
        for f in doc["files"]:
            revs = [Revision(**r) for r in f.pop("revisions")]
            rec = FileRecord(**f, revisions=revs)
            self.files[rec.id] = rec


# Dropbox, OneDrive and Nextcloud-on-most-filesystems: Dropbox and OneDrive are
# documented as case-insensitive; WebDAV is case-sensitive.
CASEFOLD = {"dropbox": True, "graph": True, "drive": False, "webdav": False}


class Store:
    """All namespaces under one state folder."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self._namespaces: dict[tuple[str, str], Namespace] = {}
        for provider_dir in sorted(p for p in state_dir.iterdir() if p.is_dir() and p.name in CASEFOLD):
            for account_dir in sorted(p for p in provider_dir.iterdir() if p.is_dir()):
                self.namespace(provider_dir.name, account_dir.name)

    def namespace(self, provider: str, account: str) -> Namespace:
        k = (provider, account)
        ns = self._namespaces.get(k)
        if ns is None:
            ns = Namespace(self.state_dir / provider / account, provider, account, CASEFOLD[provider])
            self._namespaces[k] = ns
        return ns

    def namespaces(self) -> Iterator[Namespace]:
        return iter(list(self._namespaces.values()))

    def reset(self) -> None:
        for ns in self._namespaces.values():
            shutil.rmtree(ns.root, ignore_errors=True)
        self._namespaces.clear()


def random_token(nbytes: int = 12) -> str:
    return secrets.token_urlsafe(nbytes)
