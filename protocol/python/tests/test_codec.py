"""Codec tests written from the spec text: varints (§1.2), CBs (§1.3), heads
(§4.3.1, §4.6.1), every message's round trip and truncations (§4), MACs
(§3.2), limits (§9) and §13's worked example where it is fully specified."""

import hashlib
import hmac

import pytest

import ec_protocol as p
from ec_protocol.messages import FLAG_RESP_REF

SECRET = bytes(range(32))
SESSION = bytes.fromhex("a35c0e917b22d408")
DOC = p.DocKey(p.DROPBOX, b"dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc", b"/docs/report.docx")
HEAD = (
    b"POST https://content.dropboxapi.com/2/files/upload\n"
    b"authorization: Bearer EC-TEST-CREDENTIAL-0f1e2d3c\n"
    b'dropbox-api-arg: {"path":"/Docs/report.docx","mode":{".tag":"update","update":"62a1c3e5f0a8e0b200000002c9a7d41"}}\n'
    b"content-type: application/octet-stream\n"
)


def code_of(fn):
    with pytest.raises(p.ProtocolError) as e:
        fn()
    return e.value.code


# ------------------------------------------------------------------ varints


@pytest.mark.parametrize(
    "value,hexbytes",
    [(0, "00"), (3, "03"), (127, "7f"), (128, "8001"), (300, "ac02"), (131072, "808008"),
     (2**31, "8080808008"), (2**64 - 1, "ffffffffffffffffff01")],
)
def test_varint_examples_of_the_patch_spec(value, hexbytes):
    assert p.varint(value).hex() == hexbytes
    r = p.Reader(bytes.fromhex(hexbytes))
    assert r.varint("v") == value and r.remaining == 0


@pytest.mark.parametrize("bad", ["8000", "ff00", "80808000", "ffffffffffffffffff02", "ffffffffffffffffff8100", "80", ""])
def test_varint_rejects_non_shortest_overlong_and_truncated(bad):
    assert code_of(lambda: p.Reader(bytes.fromhex(bad)).varint("v")) == "malformed"


def test_varint_encoder_refuses_out_of_range():
    with pytest.raises(ValueError):
        p.varint(2**64)
    with pytest.raises(ValueError):
        p.varint(-1)


# ------------------------------------------------------------------ CB


def test_cb_modes_round_trip_and_resolve():
    ref = b"<w:t>Hello world, this is the reference text of a context head.</w:t>" * 3
    new = ref.replace(b"world", b"there", 1)
    for cb, expect in [(p.CB.same(), ref), (p.CB.literal(new), new), (p.CB.delta(ref, new), new)]:
        enc = cb.encode()
        back = p.CB.read(p.Reader(enc), "x")
        assert back == cb
        assert back.resolve(ref, 10_000) == expect
    assert p.CB.same().encode() == b"\x00"
    assert p.CB.literal(b"ab").encode() == b"\x02\x02ab"


def test_cb_code_picks_the_smallest_mode():
    ref = bytes(range(256)) * 4
    assert p.CB.code(ref, ref).mode == p.SAME
    assert p.CB.code(ref, ref[:-1] + b"X").mode == p.DELTA
    assert p.CB.code(b"", b"ab").mode == p.LITERAL


def test_cb_delta_from_empty_reference_is_compression():
    value = b"x" * 5000
    cb = p.CB.delta(b"", value)
    assert len(cb.data) < 100
    assert cb.resolve(b"", 5000) == value


def test_cb_unknown_mode_is_malformed():
    assert code_of(lambda: p.CB.read(p.Reader(b"\x03\x00"), "x")) == "malformed"


def test_cb_checks_the_limit_before_decoding_a_middle():
    ref = b"a" * 100
    cb = p.CB.delta(ref, b"a" * 100 + b"b" * 1_000_000)
    assert cb.decoded_length(ref) == 1_000_100
    assert code_of(lambda: cb.resolve(ref, 1_000_099)) == "limit_exceeded"
    assert code_of(lambda: cb.resolve(ref, 1_000_099, over="provider_protocol")) == "provider_protocol"
    assert code_of(lambda: p.CB.literal(b"abc").resolve(b"", 2)) == "limit_exceeded"
    assert code_of(lambda: p.CB.same().resolve(ref, 99)) == "limit_exceeded"


def test_cb_delta_that_does_not_apply_is_malformed():
    ref = b"0123456789" * 10
    cb = p.CB.delta(ref, ref[:50] + b"X" + ref[51:])
    assert code_of(lambda: cb.resolve(b"short", 10_000)) == "malformed"
    frame_corrupt = p.CB(p.DELTA, b"\x00\x00\x01\x05\x03\xff\xff\xff")  # ZSTD middle of garbage
    assert code_of(lambda: frame_corrupt.resolve(ref, 10_000)) == "malformed"


# ------------------------------------------------------------------ heads


def test_canonical_head_lowercases_drops_forbidden_and_keeps_order():
    head = p.canonical_head(
        "PUT",
        "https://graph.microsoft.com/v1.0/me/drive/root:/a.docx:/content",
        [
            ("Host", "graph.microsoft.com"),
            ("Authorization", "Bearer T"),
            ("Content-Length", "10"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Connection", "x"),
            ("Proxy-Authorization", "Basic x"),
            ("TE", "trailers"),
            ("Trailer", "x"),
            ("Upgrade", "h2c"),
            ("Expect", "100-continue"),
            (":authority", "graph.microsoft.com"),
            ("X-B", "2"),
            ("x-a", "1"),
            ("X-B", "3"),
            ("Dropbox-API-Arg", '{"path":"/Dökumente"}'),
        ],
    )
    assert head == (
        b"PUT https://graph.microsoft.com/v1.0/me/drive/root:/a.docx:/content\n"
        b"authorization: Bearer T\nx-b: 2\nx-a: 1\nx-b: 3\n"
        + 'dropbox-api-arg: {"path":"/Dökumente"}\n'.encode()
    )
    parsed = p.parse_head(head)
    assert parsed.method == "PUT" and parsed.get("X-B") == b"2"
    assert parsed.encode() == head


def test_canonical_head_accepts_bytes_and_surrogateescaped_str():
    raw = b"caf\xe9"  # not UTF-8: mitmproxy hands such a value as a surrogate-escaped str
    as_str = raw.decode("utf-8", "surrogateescape")
    h1 = p.canonical_head(b"GET", b"https://h.example/x", [(b"X-V", raw)])
    h2 = p.canonical_head("GET", "https://h.example/x", [("X-V", as_str)])
    assert h1 == h2 == b"GET https://h.example/x\nx-v: caf\xe9\n"


@pytest.mark.parametrize(
    "head,code",
    [
        (b"post https://h.example/\n", "invalid_request"),
        (b"POST https://h.example/", "invalid_request"),
        (b"POSTPOSTPOSTPOSTP https://h.example/\n", "invalid_request"),
        (b"POST http://h.example/\n", "invalid_request"),
        (b"POST https://user:pw@h.example/\n", "invalid_request"),
        (b"POST https://h.example/#frag\n", "invalid_request"),
        (b"POST /relative\n", "invalid_request"),
        (b"POST https://h.example/a b\n", "invalid_request"),
        (b"POST https://h.example/\nHost: h\n", "invalid_request"),
        (b"POST https://h.example/\nhost: h\n", "invalid_request"),
        (b"POST https://h.example/\ncontent-length: 5\n", "invalid_request"),
        (b"POST https://h.example/\nx-a: b\rc\n", "invalid_request"),
        (b"POST https://h.example/\nx-a: b\x00\n", "invalid_request"),
        (b"POST https://h.example/\nx-a:  lead\n", "invalid_request"),
        (b"POST https://h.example/\nx-a: trail\t\n", "invalid_request"),
        (b"POST https://h.example/\nx-a:nospace\n", "invalid_request"),
        (b"POST https://h.example/\nx a: v\n", "invalid_request"),
        (b"POST https://h.example/\n:path: /\n", "invalid_request"),
        (b"POST https://h.example/\n\n", "invalid_request"),
    ],
)
def test_parse_head_rejects(head, code):
    assert code_of(lambda: p.parse_head(head)) == code


def test_head_limits_and_lab_http():
    p.parse_head(b"GET http://lab.example/x\n", allow_http=True)
    lim = p.Limits(max_head=40, max_headers=2, max_url=30)
    assert code_of(lambda: p.parse_head(b"GET https://h.example/\na: 1\nb: 2\nc: 3\n", limits=p.Limits(max_headers=2))) == "limit_exceeded"
    assert code_of(lambda: p.parse_head(b"GET https://h.example/" + b"x" * 40 + b"\n", limits=lim)) == "limit_exceeded"
    assert code_of(lambda: p.parse_head(b"GET https://h.example/" + b"x" * 13 + b"\n", limits=p.Limits(max_url=30))) == "invalid_request"
    p.parse_head(b"GET https://h.example/" + b"x" * 12 + b"\n", limits=p.Limits(max_url=30))


def test_response_head_drops_hop_by_hop_and_length():
    h = p.canonical_response_head(
        409, "Conflict",
        [("Content-Type", "application/json"), ("Content-Length", "12"), ("Connection", "close"),
         ("Transfer-Encoding", "chunked"), ("Retry-After", "5"), ("Set-Cookie", "a=b")],
    )
    assert h == b"409 Conflict\ncontent-type: application/json\nretry-after: 5\nset-cookie: a=b\n"
    r = p.parse_response_head(h)
    assert (r.status, r.reason, r.get("retry-after")) == (409, "Conflict", b"5")
    assert r.for_app(12)[-1] == ("content-length", b"12")
    h2 = p.parse_response_head(b"200 \nx: y\n")
    assert h2.reason == "" and h2.phrase == "OK"
    for bad in [b"20 OK\n", b"200 OK", b"200 OK\nX: y\n", b"abc OK\n"]:
        assert code_of(lambda: p.parse_response_head(bad)) == "malformed"


# ------------------------------------------------------------------ messages


def sha(b):
    return hashlib.sha256(b).digest()


def sample_messages():
    """One instance of every message, with every optional part present somewhere."""
    target = b"new file bytes" * 10
    patch = b"\x89ECP\x01" + b"p" * 20
    save = p.Save(
        SESSION, 42, bytes.fromhex("8f3e610cd24a9715"), p.SINGLE,
        (p.RequestSpec(1, p.CB.delta(HEAD, HEAD.replace(b"62a1", b"62b2")), p.BODY_FILE, 0),),
        (p.Item(p.PATCH, len(target), sha(target), patch),),
        (p.ContextDef(1, HEAD, b"", DOC),),
        bytes.fromhex("21f60e7e33eb2b65"),
    )
    save_multi = p.Save(
        SESSION, 300, b"R" * 8, p.DROPBOX_BATCH,
        (p.RequestSpec(0, p.CB.literal(HEAD), p.BODY_BYTES, None, p.CB.literal(b'{"entries":[]}')),),
        (p.Item(p.FULL, 3, sha(b"abc"), b"abc", DOC, b"sess-1"),
         p.Item(p.PATCH, 5, sha(b"12345"), patch, DOC, b"sess-2")),
    )
    save_wrapped = p.Save(
        SESSION, 7, b"W" * 8, p.SINGLE,
        (p.RequestSpec(2, p.CB.same(), p.BODY_WRAPPED, 0, p.CB.same(), 5),),
        (p.Item(p.FULL, 3, sha(b"abc"), b"abc"),),
        (p.ContextDef(2, HEAD, b"--b\r\n\r\n--b--", None),),
    )
    hello = p.Hello(1, bytes(16), (2, 1), (1,), p.Cap.ALL_V1, "laptop")
    hello_ok = p.HelloOk(1, SESSION, p.Cap.ALL_V1, (1,), tuple(p.Limits().pairs()) + ((99, 5),))
    result = p.SaveResult(p.CB.literal(b"200 OK\ncontent-type: application/json\n"), p.CB.literal(b"{}"),
                          replayed=True, ref_used=True, hash_disagreement=True)
    fetch = p.Fetch(SESSION, 9, b"F" * 8,
                    p.RequestSpec(1, p.CB.same(), p.BODY_EMPTY), DOC, sha(b"old"), True,
                    (p.ContextDef(1, HEAD, b"", None),), b"r" * 8)
    fetch_bytes = p.Fetch(SESSION, 10, b"G" * 8, p.RequestSpec(0, p.CB.literal(HEAD), p.BODY_BYTES, None, p.CB.literal(b"{}")))
    fetch_result = p.FetchResult(
        (p.FetchPart(p.CB.literal(b"302 Found\nlocation: https://x.files.1drv.com/y\n"), p.INLINE, p.CB.literal(b"")),
         p.FetchPart(p.CB.literal(b"200 OK\n"), p.PART_PATCH, None, 3, sha(b"abc"), 4)),
        b"PTCH", ref_used=False, hash_disagreement=True)
    fetch_full = p.FetchResult((p.FetchPart(p.CB.literal(b"200 OK\n"), p.PART_FULL, None, 3, sha(b"abc")),), b"abc")
    fetch_inline = p.FetchResult((p.FetchPart(p.CB.literal(b"404 Not Found\n"), p.INLINE, p.CB.literal(b"nope")),))
    error = p.Error("patch_failed", 0, 0, (0, 3), "codec", "item 0: the patch did not apply")
    error_hello = p.Error("unsupported_version", version=0)
    return [
        (save, None, p.SAVE_PATH), (save_multi, None, p.SAVE_PATH), (save_wrapped, None, p.SAVE_PATH),
        (hello, None, p.HELLO_PATH), (fetch, None, p.FETCH_PATH), (fetch_bytes, None, p.FETCH_PATH),
        (hello_ok, b"q" * 16, p.HELLO_PATH), (result, b"q" * 16, p.SAVE_PATH),
        (fetch_result, b"q" * 16, p.FETCH_PATH), (fetch_full, b"q" * 16, p.FETCH_PATH),
        (fetch_inline, b"q" * 16, p.FETCH_PATH), (error, b"q" * 16, p.SAVE_PATH), (error_hello, b"q" * 16, p.HELLO_PATH),
    ]


def encode(msg, req_mac):
    return msg.encode(SECRET) if req_mac is None else msg.encode(SECRET, req_mac)


@pytest.mark.parametrize("index", range(len(sample_messages())))
def test_round_trip_and_mac(index):
    msg, req_mac, path = sample_messages()[index]
    data = encode(msg, req_mac)
    back = p.decode_message(data, path=path)
    assert back == msg
    assert back.encode() == data
    if req_mac is None:
        assert back.verify(SECRET) and not back.verify(bytes(32))
    else:
        assert back.verify(SECRET, req_mac) and not back.verify(SECRET, b"x" * 16)


@pytest.mark.parametrize("index", range(len(sample_messages())))
def test_every_truncation_is_malformed(index):
    msg, req_mac, path = sample_messages()[index]
    data = encode(msg, req_mac)
    for cut in range(len(data)):
        assert code_of(lambda: p.decode_message(data[:cut], path=path)) == "malformed", cut
    assert code_of(lambda: p.decode_message(data + b"\x00", path=path)) == "malformed"


def test_request_mac_input_is_exactly_the_spec():
    hello = p.Hello(1, bytes(16), (1,), (1,), 0, "")
    data = hello.encode(SECRET)
    signed = data[:-16]
    expect = hmac.new(SECRET, b"ec1q/ec/hello\x00" + signed, hashlib.sha256).digest()[:16]
    assert data[-16:] == expect
    ok = p.HelloOk(1, SESSION, 0, (1,))
    okd = ok.encode(SECRET, expect)
    assert okd[-16:] == hmac.new(SECRET, b"ec1r" + expect + okd[:-16], hashlib.sha256).digest()[:16]


def test_any_flipped_bit_fails_the_mac():
    msg, _, path = sample_messages()[0]
    data = bytearray(msg.encode(SECRET))
    structured = len(msg.signed_part())
    for pos in (3, 11, structured - 1, structured + 3):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        try:
            back = p.decode_message(bytes(flipped), path=path)
        except p.ProtocolError:
            continue
        assert not back.verify(SECRET)


def test_zero_mac_error_never_verifies():
    err = p.Error("auth_failed", mac=bytes(16))
    back = p.decode_message(err.encode(), path=p.SAVE_PATH)
    assert back.code == "auth_failed" and not back.verify(SECRET, b"q" * 16)


def test_version_type_path_and_flags():
    save = sample_messages()[0][0]
    data = bytearray(save.encode(SECRET))
    bad = bytearray(data); bad[0] = 2
    assert code_of(lambda: p.decode_message(bytes(bad), path=p.SAVE_PATH)) == "unsupported_version"
    assert code_of(lambda: p.decode_message(bytes(data), path=p.FETCH_PATH)) == "malformed"
    assert code_of(lambda: p.decode_message(bytes(data), path=p.HELLO_PATH)) == "unsupported_version"
    bad = bytearray(data); bad[1] = 0x04
    assert code_of(lambda: p.decode_message(bytes(bad))) == "malformed"
    for bit in range(1, 8):
        bad = bytearray(data); bad[2] |= 1 << bit
        assert code_of(lambda: p.decode_message(bytes(bad))) == "malformed"
    hello = bytearray(p.Hello(1, bytes(16)).encode(SECRET)); hello[2] = 1
    assert code_of(lambda: p.decode_message(bytes(hello))) == "malformed"
    fr = bytearray(sample_messages()[9][0].encode(SECRET, b"q" * 16)); fr[2] |= 0x01  # REPLAYED is SAVE_RESULT only
    assert code_of(lambda: p.decode_message(bytes(fr))) == "malformed"


def mutate(msg, **changes):
    for k, v in changes.items():
        setattr(msg, k, v)
    return msg.encode(SECRET)


def test_enumerations_and_zero_seq_are_malformed():
    save = sample_messages()[1][0]
    good = save.encode(SECRET)
    assert code_of(lambda: p.decode_message(mutate(save, seq=0))) == "malformed"
    save.seq = 300
    for field_value in [dict(procedure=6)]:
        assert code_of(lambda: p.decode_message(mutate(save, **field_value))) == "malformed"
    save.procedure = p.DROPBOX_BATCH
    assert save.encode(SECRET) == good
    # body_kind 4, payload_kind 2, has_doc 2, provider 5, CB mode 3: found by offset in the encoding
    s = sample_messages()[2][0]
    enc = s.encode(SECRET)
    for bad_value, mutate_at in [(4, "body_kind"), (2, "payload_kind")]:
        structured = bytearray(s.signed_part())
        if mutate_at == "body_kind":
            i = structured.index(bytes([p.BODY_WRAPPED, 0]), 30)
        else:
            i = len(structured) - 1 - 32 - 1 - 1  # FULL item: ... payload_kind, target_size(1), sha(32)
        structured[i] = bad_value
        assert code_of(lambda: p.decode_message(bytes(structured) + enc[len(structured):])) == "malformed"


def test_hello_rules():
    def enc(**kw):
        base = dict(key_id=1, device_nonce=bytes(16), versions=(1,), patch_versions=(1,), caps=0, label="")
        base.update(kw)
        return p.Hello(**base).encode(SECRET)

    assert code_of(lambda: p.decode_message(enc(versions=()))) == "malformed"
    assert code_of(lambda: p.decode_message(enc(versions=(1, 2)))) == "malformed"
    assert code_of(lambda: p.decode_message(enc(versions=(1, 1)))) == "malformed"
    assert code_of(lambda: p.decode_message(enc(patch_versions=()))) == "malformed"
    assert code_of(lambda: p.decode_message(enc(label="x" * 65))) == "limit_exceeded"
    assert p.decode_message(enc(label="é" * 32)).label == "é" * 32
    assert p.decode_message(enc(caps=1 << 63)).caps == 1 << 63  # unknown bits travel, ignored by users


def test_save_limits():
    lim = p.Limits(max_items=1, max_item_size=2, max_patch_size=3, max_contexts=1, max_head=50, max_body_ref=4, max_envelope=200)
    save = sample_messages()[1][0]  # two items
    assert code_of(lambda: p.decode_message(save.encode(SECRET), limits=p.Limits(max_items=1))) == "limit_exceeded"
    assert code_of(lambda: p.decode_message(save.encode(SECRET), limits=p.Limits(max_item_size=2))) == "too_large"
    assert code_of(lambda: p.decode_message(save.encode(SECRET), limits=p.Limits(max_patch_size=3))) == "too_large"
    assert code_of(lambda: p.decode_message(save.encode(SECRET), limits=p.Limits(max_body_ref=4))) == "limit_exceeded"
    assert code_of(lambda: p.decode_message(save.encode(SECRET), limits=p.Limits(max_head=50))) == "limit_exceeded"
    assert code_of(lambda: p.decode_message(save.encode(SECRET), limits=p.Limits(max_envelope=100))) == "too_large"
    first = sample_messages()[0][0]
    assert code_of(lambda: p.decode_message(first.encode(SECRET), limits=p.Limits(max_contexts=0))) == "invalid_request"
    zero_ctx = p.Save(SESSION, 1, b"r" * 8, p.SINGLE, (p.RequestSpec(1, p.CB.same(), p.BODY_FILE, 0),),
                      (p.Item(p.FULL, 1, sha(b"a"), b"a"),), (p.ContextDef(0, HEAD),))
    assert code_of(lambda: p.decode_message(zero_ctx.encode(SECRET))) == "invalid_request"
    no_items = p.Save(SESSION, 1, b"r" * 8, p.SINGLE, (), ())
    assert code_of(lambda: p.decode_message(no_items.encode(SECRET))) == "malformed"
    big_binding = p.Save(SESSION, 1, b"r" * 8, p.DROPBOX_SESSION, (), (p.Item(p.FULL, 1, sha(b"a"), b"a", None, b"b" * 129),))
    assert code_of(lambda: p.decode_message(big_binding.encode(SECRET))) == "limit_exceeded"
    assert lim.max_items == 1


def test_payload_short_or_long_is_malformed():
    save = sample_messages()[0][0]
    data = save.encode(SECRET)
    assert code_of(lambda: p.decode_message(data[:-1])) == "malformed"
    assert code_of(lambda: p.decode_message(data + b"!")) == "malformed"


def test_validate_save():
    msgs = sample_messages()
    p.validate_save(msgs[0][0])
    p.validate_save(msgs[1][0])
    p.validate_save(msgs[2][0])
    same0 = p.Save(SESSION, 1, b"r" * 8, p.SINGLE, (p.RequestSpec(0, p.CB.same(), p.BODY_FILE, 0),), (p.Item(p.FULL, 1, sha(b"a"), b"a"),))
    out_of_range = p.Save(SESSION, 1, b"r" * 8, p.SINGLE, (p.RequestSpec(1, p.CB.same(), p.BODY_FILE, 1),), (p.Item(p.FULL, 1, sha(b"a"), b"a"),))
    unused = p.Save(SESSION, 1, b"r" * 8, p.DROPBOX_BATCH, (p.RequestSpec(1, p.CB.same(), p.BODY_BYTES, None, p.CB.same()),),
                    (p.Item(p.FULL, 1, sha(b"a"), b"a", None, b"s1"), p.Item(p.FULL, 1, sha(b"a"), b"a")))
    shape = p.Save(SESSION, 1, b"r" * 8, p.NEXTCLOUD_CHUNKED, (p.RequestSpec(1, p.CB.same(), p.BODY_EMPTY),), (p.Item(p.FULL, 1, sha(b"a"), b"a"),))
    for bad in (same0, out_of_range, unused, shape):
        assert code_of(lambda: p.validate_save(bad)) == "invalid_request"
    with pytest.raises(p.ProtocolError) as e:
        p.validate_save(unused)
    assert e.value.list == (1,)
    fetch_file = p.Fetch(SESSION, 1, b"r" * 8, p.RequestSpec(1, p.CB.same(), p.BODY_FILE, 0))
    assert code_of(lambda: p.validate_fetch(fetch_file)) == "invalid_request"


def test_error_fields_and_exception():
    err = p.Error("in_progress", 1, 250, (), "", "running")
    back = p.decode_message(err.encode(SECRET, b"m" * 16), path=p.SAVE_PATH)
    exc = back.to_exception()
    assert (exc.code, exc.http, exc.stage, exc.retry_after_ms, exc.detail) == ("in_progress", 503, 1, 250, "running")
    assert p.ProtocolError("base_unknown", list=[0, 2]).http == 409
    for number, (name, http, _) in p.ERROR_TABLE.items():
        data = p.Error(name).encode(SECRET, b"m" * 16)
        assert data[3] == number and p.decode_message(data).code == name
    bad_code = bytearray(p.Error("internal").encode(SECRET, b"m" * 16)); bad_code[3] = 25
    assert code_of(lambda: p.decode_message(bytes(bad_code))) == "malformed"
    bad_stage = bytearray(p.Error("internal").encode(SECRET, b"m" * 16)); bad_stage[4] = 2
    assert code_of(lambda: p.decode_message(bytes(bad_stage))) == "malformed"
    long_cause = p.Error("patch_failed", cause="x" * 33)
    assert code_of(lambda: p.decode_message(long_cause.encode(SECRET, b"m" * 16))) == "malformed"


def test_response_digest():
    h, b = b"200 OK\n", b"{}"
    assert p.response_digest(h, b) == hashlib.sha256(b"\x07" + h + b).digest()[:8]


# ------------------------------------------------------------------ §13


def test_section_13_request_layout_and_budget():
    """§13.1: the structured part is 108 bytes and the body 294, with the
    fixed fields at the offsets of its table. The head delta's frame and the
    hashes are illustrative there, so they are stand-ins of the stated sizes."""
    head_delta = bytes.fromhex("de02" "54" "01" "54" "19") + bytes(25)
    assert len(head_delta) == 31
    target_sha = bytes.fromhex("44a2bf26") + bytes(24) + bytes.fromhex("27763f01")
    patch = bytes.fromhex("89454350010100") + bytes(163)
    save = p.Save(
        SESSION, 42, bytes.fromhex("8f3e610cd24a9715"), p.SINGLE,
        (p.RequestSpec(1, p.CB(p.DELTA, head_delta), p.BODY_FILE, 0),),
        (p.Item(p.PATCH, 43551, target_sha, patch),),
        (), bytes.fromhex("21f60e7e33eb2b65"),
    )
    body = save.encode(SECRET)
    assert len(save.signed_part()) == 108 and len(body) == 294
    assert body[0:3].hex() == "010201"
    assert body[3:11] == SESSION and body[11] == 0x2A
    assert body[12:20].hex() == "8f3e610cd24a9715" and body[20:28].hex() == "21f60e7e33eb2b65"
    assert body[28:32].hex() == "00000101"
    assert body[32:34].hex() == "011f" and body[34:65] == head_delta
    assert body[65:68].hex() == "010001"
    assert body[68:74].hex() == "0000009fd402"
    assert body[74:106] == target_sha and body[106:108].hex() == "aa01"
    assert body[108:124] == p.request_mac(SECRET, p.SAVE_PATH, body[:108])
    assert body[124:131].hex() == "89454350010100"
    framing = b"POST /ec/1/save HTTP/1.1\r\nHost: 192.168.50.1:8443\r\nContent-Length: 294\r\n\r\n"
    assert len(framing) == 74 and len(framing) + len(body) == 368
    decoded = p.decode_message(body, path=p.SAVE_PATH)
    assert decoded.flags & FLAG_RESP_REF and decoded.items[0].payload == patch


def test_section_13_response_layout():
    res = p.SaveResult(p.CB(p.DELTA, bytes(62)), p.CB(p.DELTA, bytes(88)), ref_used=True)
    data = res.encode(SECRET, b"\xe0" * 16)
    assert data[:3].hex() == "018202" and data[3:5].hex() == "013e" and data[67:69].hex() == "0158"
    assert len(data) == 173
    assert len(b"HTTP/1.1 200 OK\r\nContent-Length: 173\r\n\r\n") == 40


def test_real_head_delta_is_small():
    """A revision and date change in a Dropbox head codes as a small DELTA
    with the reference encoder (§13 reports 31 bytes for its head)."""
    arg1 = b'{"path":"/Docs/report.docx","mode":{".tag":"update","update":"62a1c3e5f0a8e0b200000002c9a7d41"},"autorename":false,"client_modified":"2026-11-21T10:02:11Z","mute":false,"strict_conflict":false}'
    arg2 = arg1.replace(b"62a1c3e5f0a8e0b200000002c9a7d41", b"62a1c3e6a9b1e0b200000002c9a7d41").replace(b"10:02:11", b"10:07:48")
    mk = lambda arg: p.canonical_head("POST", "https://content.dropboxapi.com/2/files/upload", [
        ("Authorization", "Bearer sl.u." + "A" * 158), ("User-Agent", "rclone/v1.66.0"), ("Dropbox-API-Arg", arg),
        ("Content-Type", "application/octet-stream"), ("Accept-Encoding", "gzip")])
    h1, h2 = mk(arg1), mk(arg2)
    cb = p.CB.code(h1, h2)
    assert cb.mode == p.DELTA and len(cb.encode()) <= 40
    assert cb.resolve(h1, 65536) == h2


def test_operation_digest_ignores_seq_modes_and_payload_kind():
    """§5.4: the digest ignores seq, resp_ref, context ids, CB modes and
    whether items travel as PATCH or FULL; it changes with the head."""
    target = b"t" * 50
    def save(seq, ctx_id, head_cb, defs, kind, payload, resp_ref=None):
        return p.Save(SESSION, seq, b"r" * 8, p.SINGLE, (p.RequestSpec(ctx_id, head_cb, p.BODY_FILE, 0),),
                      (p.Item(kind, len(target), sha(target), payload),), defs, resp_ref)
    a = save(1, 1, p.CB.same(), (p.ContextDef(1, HEAD, b"", DOC),), p.PATCH, b"\x89ECP\x01")
    b = save(9, 0, p.CB.literal(HEAD), (), p.FULL, target, b"x" * 8)
    b.items = (p.Item(p.FULL, len(target), sha(target), target, DOC),)
    da = p.operation_digest(a, p.resolve_save(a, {}))
    db = p.operation_digest(b, p.resolve_save(b, {}))
    assert da == db
    other = HEAD.replace(b"62a1", b"62a2")
    c = save(2, 0, p.CB.literal(other), (), p.FULL, target)
    c.items = b.items
    assert p.operation_digest(c, p.resolve_save(c, {})) != da


def test_resolve_lists_every_missing_context_and_applies_definitions_first():
    target = b"t"
    s = p.Save(SESSION, 1, b"r" * 8, p.NEXTCLOUD_CHUNKED,
               (p.RequestSpec(4, p.CB.same(), p.BODY_EMPTY), p.RequestSpec(2, p.CB.same(), p.BODY_EMPTY)),
               (p.Item(p.FULL, 1, sha(target), target, DOC),), (p.ContextDef(3, HEAD),))
    contexts = {}
    with pytest.raises(p.ProtocolError) as e:
        p.resolve_save(s, contexts)
    assert e.value.code == "context_unknown" and e.value.list == (2, 4)
    assert 3 in contexts  # the definitions took effect although the request failed
