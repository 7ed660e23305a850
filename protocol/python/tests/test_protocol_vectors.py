"""The shared codec vectors of protocol/vectors (written by the Rust side),
checked by this independent implementation as the manifest's `how_to_check`
says: valid vectors decode to the expected fields, MACs, resolved heads,
bodies, keys and digests, and re-encode byte for byte; invalid ones raise the
expected code."""

import hashlib
import json
from pathlib import Path

import ec_patch
import pytest

import ec_protocol as p

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
MANIFEST = VECTORS / "manifest.json"
DATA = json.loads(MANIFEST.read_text())
CONST = DATA["constants"]
SECRET = bytes.fromhex(CONST["secret"])
SESSION = bytes.fromhex(CONST["session_id"])


def hx(b):
    return None if b is None else b.hex()


def cb_json(cb):
    return {"mode": cb.mode} if cb.mode == p.SAME else {"mode": cb.mode, "data": cb.data.hex()}


def doc_json(d):
    return None if d is None else {"provider": d.provider, "account": d.account.hex(), "ref": d.ref.hex()}


def def_json(d):
    return {"ctx_id": d.ctx_id, "head": d.head.hex(), "body": d.body.hex(), "doc": doc_json(d.doc)}


def spec_json(s):
    out = {"ctx_id": s.ctx_id, "head": cb_json(s.head), "body_kind": s.body_kind}
    if s.item is not None:
        out["item"] = s.item
    if s.body is not None:
        out["bytes"] = cb_json(s.body)
    if s.split is not None:
        out["split"] = s.split
    return out


def header_json(m):
    return {"session_id": m.session_id.hex(), "seq": m.seq, "request_id": m.request_id.hex(), "resp_ref": hx(m.resp_ref)}


def flags_json(m):
    return {"replayed": getattr(m, "replayed", False), "ref_used": m.ref_used, "hash_disagreement": m.hash_disagreement}


def item_json(i):
    out = {"doc": doc_json(i.doc), "binding": i.binding.hex(), "payload_kind": i.payload_kind,
           "target_size": i.target_size, "target_sha256": i.target_sha256.hex(),
           "payload_sha256": hashlib.sha256(i.payload).hexdigest()}
    if i.payload_kind == p.PATCH:
        out["payload_len"] = len(i.payload)
    return out


def part_json(part):
    out = {"head": cb_json(part.head), "body_kind": part.body_kind}
    if part.body_kind == p.INLINE:
        out["body"] = cb_json(part.body)
    else:
        out["target_size"] = part.target_size
        out["target_sha256"] = part.target_sha256.hex()
        if part.body_kind == p.PART_PATCH:
            out["payload_len"] = part.payload_len
    return out


def decoded_json(m):
    if isinstance(m, p.Hello):
        return {"key_id": m.key_id, "device_nonce": m.device_nonce.hex(), "versions": list(m.versions),
                "patch_versions": list(m.patch_versions), "caps": m.caps, "label": m.label}
    if isinstance(m, p.HelloOk):
        return {"chosen_version": m.chosen_version, "session_id": m.session_id.hex(), "caps": m.caps,
                "patch_versions": list(m.patch_versions), "limits": [list(x) for x in m.limits]}
    if isinstance(m, p.Save):
        return {"header": header_json(m), "procedure": m.procedure, "ctx_defs": [def_json(d) for d in m.ctx_defs],
                "requests": [spec_json(s) for s in m.requests], "items": [item_json(i) for i in m.items]}
    if isinstance(m, p.Fetch):
        return {"header": header_json(m), "follow_redirect": m.follow_redirect,
                "ctx_defs": [def_json(d) for d in m.ctx_defs], "request": spec_json(m.request),
                "doc": doc_json(m.doc), "have_sha256": hx(m.have_sha256)}
    if isinstance(m, p.SaveResult):
        return {"flags": flags_json(m), "head": cb_json(m.head), "body": cb_json(m.body)}
    if isinstance(m, p.FetchResult):
        return {"flags": flags_json(m), "parts": [part_json(x) for x in m.parts]}
    if isinstance(m, p.Error):
        return {"code": m.code, "code_number": p.errors.CODE_NUMBER[m.code], "stage": m.stage,
                "retry_after_ms": m.retry_after_ms, "list": list(m.list), "cause": m.cause,
                "detail": m.detail, "version": m.version}
    raise AssertionError(type(m))


def resolved_request_json(r):
    out = {"body_kind": r.body_kind, "head": r.head_bytes.hex(), "head_text": r.head_bytes.decode("utf-8"), "host": r.host}
    if r.item is not None:
        out["item"] = r.item
    if r.body is not None:
        out["bytes"] = r.body.hex()
    if r.split is not None:
        out["split"] = r.split
    return out


def contexts_from_state(state):
    out = {}
    for cid, c in state.get("contexts", {}).items():
        doc = c.get("doc")
        out[int(cid)] = p.ContextDef(
            int(cid), bytes.fromhex(c["head"]), bytes.fromhex(c["body"]),
            None if doc is None else p.DocKey(doc["provider"], bytes.fromhex(doc["account"]), bytes.fromhex(doc["ref"])),
        )
    return out


def check_request(v, data):
    """Steps 1-5 of how_to_check; returns (message, resolved, contexts)."""
    msg = p.decode_message(data, path=v["path"])
    if isinstance(msg, p.Hello):
        if msg.key_id != CONST["key_id"] or not msg.verify(SECRET):
            raise p.ProtocolError("auth_failed")
        if not set(msg.versions) & set(CONST["eps_versions"]):
            raise p.ProtocolError("unsupported_version")
        return msg, max(set(msg.versions) & set(CONST["eps_versions"])), None
    if msg.session_id != SESSION:
        raise p.ProtocolError("session_unknown" if msg.verify(SECRET) else "auth_failed")
    if not msg.verify(SECRET):
        raise p.ProtocolError("auth_failed")
    contexts = contexts_from_state(v["state"])
    if isinstance(msg, p.Save):
        return msg, p.resolve_save(msg, contexts), contexts
    return msg, p.resolve_fetch(msg, contexts), contexts


def check_response(v, data):
    state = v["state"]
    msg = p.decode_message(data)
    req_mac = bytes.fromhex(state["request_mac"])
    authentic = msg.verify(SECRET, req_mac)
    if isinstance(msg, p.Error):
        if not authentic and msg.mac != bytes(16):
            raise p.ProtocolError("auth_failed")
        return msg, authentic
    if not authentic:
        raise p.ProtocolError("auth_failed")
    return msg, True


def by_name(kind):
    return [v for v in DATA["vectors"] if ("error" in v["expect"]) == (kind == "invalid")]


def ids(vs):
    return [v["name"] for v in vs]


def read(v):
    return (VECTORS / v["file"]).read_bytes()


VALID = by_name("valid")
INVALID = by_name("invalid")


def test_manifest_is_not_empty():
    assert len(VALID) >= 10 and len(INVALID) >= 30


def test_limits_are_the_defaults():
    assert [tuple(x) for x in DATA["limits"]] == p.Limits().pairs()


@pytest.mark.parametrize("v", VALID, ids=ids(VALID))
def test_valid_vector(v):
    data = read(v)
    exp = v["expect"]
    if v["direction"] == "request":
        msg, resolved, contexts = check_request(v, data)
        assert decoded_json(msg) == exp["decoded"]
        assert msg.mac.hex() == exp["mac"]
        assert msg.encode(SECRET) == data
        if isinstance(msg, p.Hello):
            assert resolved == exp["chosen_version"]
            return
        assert len(msg.signed_part()) == exp["s_len"]
        if "payload_offset" in exp:
            assert exp["payload_offset"] == exp["s_len"] + 16
        assert {str(k): def_json(c) | {} for k, c in contexts.items()} == {
            k: dict(c, ctx_id=int(k)) for k, c in exp["contexts_after"].items()
        }
        r = exp["resolved"]
        if isinstance(msg, p.Save):
            assert [resolved_request_json(q) for q in resolved.requests] == r["requests"]
            assert [doc_json(d) for d in resolved.docs] == r["docs"]
            assert [k.hex() for k in resolved.store_keys] == r["store_keys"]
            for k, item in enumerate(msg.items):
                base = (VECTORS / v["state"]["bases"][k]).read_bytes() if item.payload_kind == p.PATCH else None
                target = ec_patch.apply(base, item.payload) if base is not None else item.payload
                assert len(target) == item.target_size and hashlib.sha256(target).digest() == item.target_sha256
        else:
            req, doc = resolved
            assert resolved_request_json(req) == r["request"]
            assert doc_json(doc) == r["doc"]
            assert p.store_key(doc).hex() == r["store_key"]
        return
    msg, authentic = check_response(v, data)
    assert decoded_json(msg) == exp["decoded"]
    assert msg.mac.hex() == exp["mac"]
    assert msg.encode() == data
    if isinstance(msg, p.Error):
        assert authentic == exp["authenticated"]
        assert msg.to_exception().http == exp["http"]
        return
    if isinstance(msg, p.HelloOk):
        return
    ref = v["state"].get("reference")
    ref_head, ref_body = (bytes.fromhex(ref["head"]), bytes.fromhex(ref["body"])) if msg.ref_used else (b"", b"")
    limit = p.Limits().max_response_body
    if isinstance(msg, p.SaveResult):
        head = msg.head.resolve(ref_head, limit)
        body = msg.body.resolve(ref_body, limit)
        p.parse_response_head(head)
        assert {"head": head.hex(), "head_text": head.decode("utf-8"), "body": body.hex(),
                "digest": p.response_digest(head, body).hex()} == exp["resolved"]
        return
    got = []
    for part in msg.parts:
        head = part.head.resolve(ref_head, limit)
        p.parse_response_head(head)
        entry = {"head": head.hex(), "head_text": head.decode("utf-8")}
        body = b""
        if part.body_kind == p.INLINE:
            body = part.body.resolve(ref_body, limit)
            entry["body"] = body.hex()
        entry["digest"] = p.response_digest(head, body).hex()
        got.append(entry)
    assert got == exp["resolved"]["parts"]
    assert hashlib.sha256(msg.payload).hexdigest() == exp["payload_sha256"]
    last = msg.parts[-1]
    if last.body_kind == p.PART_PATCH:
        target = ec_patch.apply((VECTORS / v["state"]["have"]).read_bytes(), msg.payload)
    else:
        target = msg.payload
    assert len(target) == last.target_size and hashlib.sha256(target).digest() == last.target_sha256


@pytest.mark.parametrize("v", INVALID, ids=ids(INVALID))
def test_invalid_vector(v):
    data = read(v)
    exp = v["expect"]
    with pytest.raises(p.ProtocolError) as e:
        if v["direction"] == "request":
            check_request(v, data)
        else:
            check_response(v, data)
    assert e.value.code == exp["error"], str(e.value)
    assert e.value.http == exp["http"]
    assert list(e.value.list) == exp["list"]


SAVES = [v for v in VALID if v["message"] == "SAVE"]


@pytest.mark.parametrize("v", SAVES, ids=ids(SAVES))
def test_operation_digest(v):
    msg, resolved, _ = check_request(v, read(v))
    assert p.operation_digest(msg, resolved).hex() == v["expect"]["resolved"]["operation_digest"]
