"""Dropbox upload sessions on the device (spec §6.2, §6.3): start,
append_v2 and finish, and finish_batch_v2 over several sessions.

The device issues session ids `pid_upload_session:ec-…`; an id without
that prefix is Dropbox's own and passes through. Offsets are checked as
Dropbox does (`incorrect_offset` with `correct_offset`), errors are 409
with an `error_summary` and a tagged `error`, wrapped in `lookup_failed`
on finish.
"""

from __future__ import annotations

import json
from typing import Optional, Union

import ec_protocol as ecp

from ..recognise import AppRequest, Kind, Recognised
from ..recognise.dropbox import _doc  # one normalisation for every Dropbox path
from ..recognise.dropbox import content_hash as dropbox_content_hash
from .common import (
    DEVICE_MARK,
    Answer,
    GatheredFile,
    GatheredUpload,
    Handler,
    Outcome,
    ProviderSessions,
    Session,
    empty_body,
    json_answer,
)

DROPBOX_ID_PREFIX = "pid_upload_session:" + DEVICE_MARK
#: The shelf's key prefix of a Dropbox session.
KEY = "dbx:"


def _dropbox_error(tag: str, extra: Optional[dict] = None, wrap: Optional[str] = None) -> Answer:
    inner = {".tag": tag, **(extra or {})}
    if wrap:
        return json_answer(409, "Conflict", {"error_summary": f"{wrap}/{tag}/..", "error": {".tag": wrap, wrap: inner}})
    return json_answer(409, "Conflict", {"error_summary": f"{tag}/..", "error": inner})


def _per_call_hash_mismatch(rec: Recognised) -> Optional[Answer]:
    """Dropbox `content_hash` on start / append_v2 / finish is "a hash of the
    file content uploaded in this call" (the Dropbox SDK 12.x sends one on
    every call): checked against this request's body, as Dropbox does."""
    want = (rec.args or {}).get("content_hash")
    if want is None:
        return None
    if not isinstance(want, str) or want.lower() != dropbox_content_hash(rec.request.body or b""):
        return _dropbox_error("content_hash_mismatch")
    return None


def without_call_hash(req: AppRequest) -> AppRequest:
    """The gathered finish without the top-level `content_hash` of its
    `Dropbox-API-Arg` (spec §6.2: the device MAY leave it out). It
    described the finish's own body, which the device has checked
    (`_per_call_hash_mismatch`) and which reaches Dropbox in the EPS's
    start / append_v2; the EPS removes it from the finish it sends anyway,
    with the same byte-exact cut, so Dropbox gets the same request and the
    device link saves its 64 hex digits (random in every head delta).
    Left for the EPS: an argument that is not ASCII JSON in the header, or
    names the member twice (the EPS refuses that)."""
    raw = req.header("dropbox-api-arg")
    if raw is None or not raw.isascii() or "content_hash" not in raw:
        return req
    try:
        pairs = json.loads(raw, object_pairs_hook=lambda kv: kv)
    except ValueError:
        return req
    if not isinstance(pairs, list) or [k for k, _ in pairs].count("content_hash") != 1:
        return req
    from ..direct.dropbox import _without_member  # the replay's cut, the EPS's (json_splice::remove_member)

    try:
        new = _without_member(raw, "content_hash")
    except Exception:  # noqa: BLE001 - anything odd is the EPS's to judge
        return req
    headers = tuple((n, new if n.lower() == "dropbox-api-arg" else v) for n, v in req.headers)
    return AppRequest(req.method, req.url, headers, req.body)


#: A batch entry's failure that Dropbox documents as retryable: the app
#: sends the entry again (its session is kept).
RETRY_LATER = {".tag": "too_many_write_operations"}
#: A batch entry naming a session that does not exist (any more): Dropbox's
#: answer for a session whose file it committed already.
NOT_FOUND = {".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}}


def failure(error: dict) -> dict:
    """A failed entry of UploadSessionFinishBatchResult."""
    return {".tag": "failure", "failure": error}


def batch_entries(body: Optional[bytes]) -> Optional[list]:
    """The `entries` of a finish_batch_v2 request body, or None."""
    try:
        value = json.loads(body or b"null")
    except ValueError:
        return None
    entries = value.get("entries") if isinstance(value, dict) else None
    return entries if isinstance(entries, list) else None


#: CommitInfo's members as Dropbox defaults them when left out.
COMMIT_DEFAULTS = {"mode": "add", "autorename": False, "mute": False, "strict_conflict": False}


def _commit(value: object) -> object:
    """A CommitInfo with Dropbox's defaults filled in and a void union
    member (`"overwrite"`) written as its tagged form (`{".tag": "overwrite"}`)."""
    if not isinstance(value, dict):
        return value
    out = {**COMMIT_DEFAULTS, **value}
    if isinstance(out.get("mode"), str):
        out["mode"] = {".tag": out["mode"]}
    return out


def same_entry(a: object, b: object) -> bool:
    """Whether two UploadSessionFinishArg (a batch entry, or a finish's
    argument) ask for the same: the same cursor and commit (members left
    out as Dropbox defaults them). Their `content_hash` describes a call's
    own body, not the commit."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a == b
    return a.get("cursor") == b.get("cursor") and _commit(a.get("commit")) == _commit(b.get("commit"))


def batch_results(body: bytes, count: int) -> Optional[list[dict]]:
    """The per-entry results of a finish_batch_v2 answer: Dropbox answers
    200 for the batch and one result per entry, in the entries' order,
    `.tag` `success` (the file's metadata) or `failure`
    (UploadSessionFinishBatchResult; spec §6.3). None when the answer is
    not that shape or has another number of entries."""
    entries = batch_entries(body)
    if entries is None or len(entries) != count or not all(isinstance(e, dict) for e in entries):
        return None
    return entries


def batch_accepted(body: bytes, count: int) -> tuple[bool, ...]:
    """Per entry of a finish_batch_v2 that Dropbox answered 2xx, whether it
    committed that entry's file (`batch_results`). An answer that is not
    that shape, or has another number of entries, accepts none: a version
    not recorded costs at most a larger next patch, one recorded that the
    provider does not hold would be a wrong base."""
    results = batch_results(body, count)
    if results is None:
        return (False,) * count
    return tuple(e.get(".tag") == "success" for e in results)


class DropboxSessions(ProviderSessions):
    """upload_session start / append_v2 / finish / finish_batch_v2."""

    def handlers(self) -> dict[Kind, Handler]:
        return {
            Kind.SESSION_START: self.start,
            Kind.SESSION_APPEND: self.append,
            Kind.SESSION_FINISH: self.finish,
            Kind.BATCH_FINISH: self.batch,
        }

    def _session(self, rec: Recognised, sid: str, wrap: Optional[str]) -> Union[Session, Answer, None]:
        if not sid.startswith(DROPBOX_ID_PREFIX):
            return None
        s = self.shelf.get(KEY + sid)
        if s is None or s.account != rec.account:
            return _dropbox_error("not_found", wrap=wrap)
        return s

    def start(self, rec: Recognised) -> Outcome:
        bad = _per_call_hash_mismatch(rec)
        if bad is not None:
            return bad
        sid = DROPBOX_ID_PREFIX + self.shelf.serial_id()
        s = Session(KEY + sid, ecp.DROPBOX, rec.account, data=bytearray(rec.request.body or b""), closed=rec.close)
        self.shelf.add(s)
        if not self.shelf.grew(s):
            return _dropbox_error("payload_too_large")
        return json_answer(200, "OK", {"session_id": sid})

    def append(self, rec: Recognised) -> Outcome:
        found = self._session(rec, rec.session or "", None)
        if not isinstance(found, Session):
            return found
        if rec.offset != len(found.data):
            return _dropbox_error("incorrect_offset", {"correct_offset": len(found.data)})
        if found.closed:
            return _dropbox_error("closed")
        bad = _per_call_hash_mismatch(rec)
        if bad is not None:
            return bad
        found.data += rec.request.body or b""
        found.closed = rec.close
        if not self.shelf.grew(found):
            return _dropbox_error("not_found")
        return json_answer(200, "OK", None)

    def finish(self, rec: Recognised) -> Outcome:
        found = self._session(rec, rec.session or "", "lookup_failed")
        if not isinstance(found, Session):
            return found
        if rec.offset != len(found.data):
            return _dropbox_error("incorrect_offset", {"correct_offset": len(found.data)}, wrap="lookup_failed")
        body = rec.request.body or b""
        if found.closed and body:
            return _dropbox_error("closed", wrap="lookup_failed")
        bad = _per_call_hash_mismatch(rec)
        if bad is not None:
            return bad
        if rec.doc is None:
            return None  # a commit the device cannot key: let Dropbox judge it (it will not know the id)
        sid = (rec.session or "").encode()
        file = GatheredFile(bytes(found.data) + body, rec.doc, rec.name, binding=sid)
        finish = without_call_hash(empty_body(rec.request))
        return GatheredUpload(ecp.DROPBOX, ecp.DROPBOX_SESSION, (finish,), (file,), (found.key,))

    def batch(self, rec: Recognised) -> Outcome:
        entries = (rec.args or {}).get("entries")
        if not isinstance(entries, list):
            return None
        ids = [e.get("cursor", {}).get("session_id") if isinstance(e, dict) and isinstance(e.get("cursor"), dict) else None for e in entries]
        if not any(isinstance(i, str) and i.startswith(DROPBOX_ID_PREFIX) for i in ids):
            return None  # the provider's own sessions

        files, keys, failures = [], [], []
        for entry, sid in zip(entries, ids):
            commit = entry.get("commit") if isinstance(entry, dict) else None
            offset = entry["cursor"].get("offset") if sid is not None else None
            s = self.shelf.get(KEY + sid) if isinstance(sid, str) and sid.startswith(DROPBOX_ID_PREFIX) else None
            if s is None or s.account != rec.account:
                failures.append({".tag": "lookup_failed", "lookup_failed": {".tag": "not_found"}})
            elif offset != len(s.data):
                failures.append({".tag": "lookup_failed", "lookup_failed": {".tag": "incorrect_offset", "correct_offset": len(s.data)}})
            elif not s.closed:
                failures.append({".tag": "lookup_failed", "lookup_failed": {".tag": "not_closed"}})
            else:
                doc, name = _doc(rec.account, commit.get("path") if isinstance(commit, dict) else None)
                if doc is None:
                    failures.append({".tag": "path", "path": {".tag": "malformed_path"}})
                else:
                    failures.append(None)
                    files.append(GatheredFile(bytes(s.data), doc, name, binding=sid.encode()))
                    keys.append(s.key)
        if any(f is not None for f in failures):
            # One bad entry: answer the batch here. The good entries fail with
            # Dropbox's retryable too_many_write_operations and keep their
            # sessions, so the app's retry can commit them.
            results = [{".tag": "failure", "failure": f or {".tag": "too_many_write_operations"}} for f in failures]
            return json_answer(200, "OK", {"entries": results})
        return GatheredUpload(ecp.DROPBOX, ecp.DROPBOX_BATCH, (rec.request,), tuple(files), tuple(keys))
