"""The EPS learns a base from a FULL upload, says `base_unknown` when it
lacks one (and the device then resends FULL), and never forwards a file
whose hash does not match: a wrong `target_sha256` gives `target_mismatch`,
a corrupt patch `patch_failed`, and in both cases the provider's request log
shows no request and the store no new file (issue 3, "Must show", second point).
"""

from __future__ import annotations

import hashlib

import ec_patch
import pytest

import ec_protocol as p

from .e2e import (
    RawDevice,
    Uploader,
    dropbox_upload,
    full_item,
    log_seq,
    patch_item,
    provider_requests_since,
    sha256,
    store_snapshot,
    trace_sequences,
)


@pytest.fixture(scope="module")
def versions():
    return trace_sequences()["docx"][1]  # the 100k Writer document and its edits


@pytest.fixture
def raw(eps):
    device = RawDevice(eps)
    device.hello()
    return device


def doc(name: str) -> p.DocKey:
    return Uploader("dropbox", "single").doc(name)


def refused_without_effect(lab, eps, raw, save: p.Save, code: str, http: int) -> p.Error:
    """Sends `save`, expects the ERROR `code` at stage 0, and checks that no
    provider request was made and the store is as it was."""
    seq, store = log_seq(lab), store_snapshot(eps)
    status, msg = raw.send(save)
    assert isinstance(msg, p.Error), msg
    assert (status, msg.code, msg.stage) == (http, code, 0), msg
    assert msg.verify(raw.secret, save.mac), "an authenticated request gets an authenticated ERROR"
    assert provider_requests_since(lab, seq) == []
    assert store_snapshot(eps) == store
    return msg


def test_learns_base_from_full_upload(lab, eps, raw, versions):
    v0, v1 = versions[0], versions[1]
    status, msg = raw.send(raw.save_message(p.SINGLE, [dropbox_upload("learn.docx")], [full_item(v0, doc("learn.docx"))]))
    assert status == 200 and isinstance(msg, p.SaveResult), msg
    before = eps.metric("ec_eps_base_unknown_total")
    patch = bytes(ec_patch.diff(v0, v1))
    status, msg = raw.send(raw.save_message(p.SINGLE, [dropbox_upload("learn.docx")], [patch_item(patch, v1, doc("learn.docx"))]))
    assert status == 200 and isinstance(msg, p.SaveResult), msg
    assert eps.metric("ec_eps_base_unknown_total") == before
    held = Uploader("dropbox", "single").held(lab, "learn.docx")
    assert (held["size"], held["sha256"]) == (len(v1), sha256(v1))


def test_patch_against_unknown_base(lab, eps, raw, versions):
    # A base the EPS has never seen: this document's bytes with one byte changed.
    stranger = bytearray(versions[0])
    stranger[100] ^= 0xFF
    patch = bytes(ec_patch.diff(bytes(stranger), versions[2]))
    save = raw.save_message(p.SINGLE, [dropbox_upload("unknown.docx")], [patch_item(patch, versions[2], doc("unknown.docx"))])
    err = refused_without_effect(lab, eps, raw, save, "base_unknown", 409)
    assert err.list == (0,)


def test_client_resends_full_after_base_unknown(lab, eps, client, versions):
    stranger = bytes(versions[0][:-1]) + bytes([versions[0][-1] ^ 1])
    before = eps.metric("ec_eps_base_unknown_total")
    full_before = eps.metric("ec_eps_device_bytes_total", 'kind="full"')
    up = Uploader("dropbox", "single")
    out = up.save(client, "resend.docx", versions[3], stranger)
    assert isinstance(out, p.ProviderResponse) and out.status == 200, out
    assert eps.metric("ec_eps_base_unknown_total") == before + 1
    assert eps.metric("ec_eps_device_bytes_total", 'kind="full"') - full_before == len(versions[3])
    held = up.held(lab, "resend.docx")
    assert (held["size"], held["sha256"]) == (len(versions[3]), sha256(versions[3]))


def test_full_item_with_wrong_hash_is_never_forwarded(lab, eps, raw, versions):
    data = versions[1]
    wrong = hashlib.sha256(data + b"x").digest()
    before = eps.metric("ec_eps_target_mismatch_total")
    save = raw.save_message(p.SINGLE, [dropbox_upload("mismatch.docx")], [full_item(data, doc("mismatch.docx"), wrong)])
    err = refused_without_effect(lab, eps, raw, save, "target_mismatch", 422)
    assert err.list == (0,)
    assert eps.metric("ec_eps_target_mismatch_total") == before + 1
    assert Uploader("dropbox", "single").held(lab, "mismatch.docx") is None


def test_corrupt_patch_fails_and_is_not_forwarded(lab, eps, raw, versions):
    v0, v1 = versions[0], versions[1]
    status, msg = raw.send(raw.save_message(p.SINGLE, [dropbox_upload("corrupt.docx")], [full_item(v0, doc("corrupt.docx"))]))
    assert status == 200, msg
    patch = bytearray(ec_patch.diff(v0, v1))
    # Damage the patch body, past its header (which the EPS checks against the item).
    for i in range(len(patch) - 16, len(patch) - 8):
        patch[i] ^= 0x5A
    save = raw.save_message(p.SINGLE, [dropbox_upload("corrupt.docx")], [patch_item(bytes(patch), v1, doc("corrupt.docx"))])
    err = refused_without_effect(lab, eps, raw, save, "patch_failed", 422)
    assert err.list == (0,) and err.cause, err
    held = Uploader("dropbox", "single").held(lab, "corrupt.docx")
    assert held["sha256"] == sha256(v0), "the provider still holds the last good version"
