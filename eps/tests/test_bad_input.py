"""Bad input on the device listener: malformed messages, oversized bodies,
wrong secrets, another user's document keys, replays and unknown sessions
get the spec's ERROR (HTTP status, code, stage 0) and change nothing: the
EPS's store has no new or changed file and the provider servers see no
request (issue 3, "Must show": bad input, "clear errors, nothing written").
"""

from __future__ import annotations

import os
import socket

import pytest

import ec_protocol as p

from .e2e import RawDevice, Uploader, dropbox_upload, full_item, log_seq, provider_requests_since, store_snapshot

DOC = b"PK\x03\x04" + bytes(range(256)) * 40  # the bytes do not matter: nothing may reach the provider
LIMITS = {"max_envelope": 16_384, "max_item_size": 1_000_000, "max_patch_size": 100_000, "max_items": 2}
#: Spec §5.1 step 1: the items' files together are at most max_item_size, their patches max_patch_size (§9).
BOUND = LIMITS["max_envelope"] + LIMITS["max_item_size"] + LIMITS["max_patch_size"]


@pytest.fixture(scope="module")
def bound(start_eps):
    """An EPS bound to one Dropbox account, with small limits (spec §9: a deployment MAY lower them)."""
    return start_eps("bound-alice", accounts=[{"provider": "dropbox", "account": "alice"}], limits=LIMITS)


@pytest.fixture
def raw(bound):
    device = RawDevice(bound)
    device.hello()
    return device


@pytest.fixture
def unchanged(lab, bound):
    """Checks, after the test, that nothing was stored and no provider request was made."""
    # One good save first, so the store is not trivially empty.
    before_seq, before_store = log_seq(lab), store_snapshot(bound)
    yield
    assert provider_requests_since(lab, before_seq) == []
    assert store_snapshot(bound) == before_store


def doc(account: str = "alice", name: str = "bad.docx") -> p.DocKey:
    return p.DocKey(p.DROPBOX, account.encode(), ("/e2e/" + name).encode())


def good_save(raw: RawDevice, **kw) -> p.Save:
    return raw.save_message(p.SINGLE, [dropbox_upload("bad.docx")], [full_item(DOC, doc())], **kw)


def expect_error(status: int, msg, http: int, code, authenticated=None) -> p.Error:
    """`code` is one code or a tuple of acceptable ones; `authenticated`
    None when either MAC is right (an ERROR is MACed once the EPS has
    verified the request's MAC, zero before that: spec §3.2)."""
    assert isinstance(msg, p.Error), msg
    codes = code if isinstance(code, tuple) else (code,)
    assert status == http and msg.code in codes and msg.stage == 0, (status, msg)
    if authenticated is not None:
        assert (msg.mac != bytes(16)) == authenticated, msg
    return msg


#: Garbage whose first byte is not the path's version is `unsupported_version`
#: (§4.1, §10 #2); otherwise `malformed`. Both are 400 at stage 0.
GARBAGE = ("malformed", "unsupported_version")
#: Random bytes after a valid header may also decode as a count over one of
#: the limits (`ctx_def_count` 13501, say: CI once drew such bytes), or as a
#: value out of its range, before anything else is wrong: `limit_exceeded`
#: or `invalid_request`, 400 at stage 0 as well (§10). Which one is chance.
RANDOM_GARBAGE = (*GARBAGE, "limit_exceeded", "invalid_request")


@pytest.fixture(scope="module", autouse=True)
def one_good_save(bound):
    device = RawDevice(bound)
    device.hello()
    status, msg = device.send(device.save_message(p.SINGLE, [dropbox_upload("good.docx")], [full_item(DOC + b"good", doc(name="good.docx"))]))
    assert status == 200 and isinstance(msg, p.SaveResult), msg


# ---------------------------------------------------------------- malformed


@pytest.mark.parametrize("body", [b"", b"\x00", os.urandom(64), b"GET / HTTP/1.1\r\n\r\n", bytes([1, 2, 0]) + os.urandom(200)],
                         ids=["empty", "one-byte", "random", "http-text", "random-after-header"])
def test_garbage_body(raw, unchanged, body):
    status, data = raw.post(p.SAVE_PATH, body)
    expect_error(status, p.decode_message(data, path=p.SAVE_PATH), 400, RANDOM_GARBAGE if len(body) >= 64 else GARBAGE,
                 authenticated=False)


def test_truncated_save_at_every_part(raw, unchanged):
    size = len(good_save(raw).encode(raw.secret))
    # Cuts in the header, in the structured part, in the MAC and in the payload.
    for cut in sorted({1, 3, 10, 20, size - len(DOC) - 20, size - len(DOC) - 8, size - len(DOC) + 100, size - 1}):
        encoded = good_save(raw).encode(raw.secret)  # a new seq each time: a cut past the MAC uses one up
        status, data = raw.post(p.SAVE_PATH, encoded[:cut])
        # Cut before the MAC: zero MAC; cut in the payloads: the MAC was checked, so the ERROR is MACed.
        expect_error(status, p.decode_message(data, path=p.SAVE_PATH), 400, "malformed",
                     authenticated=None if cut > len(encoded) - len(DOC) - 16 else False)


def test_trailing_bytes(raw, unchanged):
    status, data = raw.post(p.SAVE_PATH, good_save(raw).encode(raw.secret) + b"\x00")
    msg = p.decode_message(data, path=p.SAVE_PATH)
    assert (status, msg.code, msg.stage) == (400, "malformed", 0), msg


def test_message_type_must_match_path(raw, unchanged):
    hello = p.Hello(1, os.urandom(16), (1,), (1,), 511, "x").encode(raw.secret)
    status, data = raw.post(p.SAVE_PATH, hello)
    # A HELLO's version byte is 0, which the save path already refuses.
    expect_error(status, p.decode_message(data, path=p.SAVE_PATH), 400, GARBAGE)
    fetch = p.Fetch(raw.session_id, raw.next_seq(), os.urandom(8), good_save(raw).requests[0], doc())
    status, data = raw.post(p.SAVE_PATH, fetch.encode(raw.secret))
    expect_error(status, p.decode_message(data, path=p.SAVE_PATH), 400, "malformed")


def test_unknown_path_and_wrong_method(raw, unchanged):
    status, data = raw.post("/ec/1/upload", good_save(raw).encode(raw.secret))
    msg = p.decode_message(data, path="/ec/1/upload") if data else None
    assert status == 404 and msg is not None and msg.code == "unsupported", (status, msg)
    status, data = raw.post(p.SAVE_PATH, b"", method="GET")
    assert status == 405, status
    assert p.decode_message(data, path=p.SAVE_PATH).code == "malformed"
    status, _ = raw.post("/metrics", b"", method="GET")
    assert status == 404, "metrics are on the management listener only"


# ---------------------------------------------------------------- sizes


def test_content_length_over_the_bound(bound, unchanged):
    """A Content-Length over max_envelope + max_item_size + max_patch_size
    is answered 413 too_large without reading the body."""
    host, port = bound.device.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(f"POST {p.SAVE_PATH} HTTP/1.1\r\nHost: eps\r\nContent-Length: {BOUND + 1}\r\n\r\n".encode() + b"\x01\x02\x00")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        head, _, rest = answer.partition(b"\r\n\r\n")
        length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    assert head.startswith(b"HTTP/1.1 413"), head
    msg = p.decode_message(rest[:length], path=p.SAVE_PATH)
    assert (msg.code, msg.stage) == ("too_large", 0)


def test_item_over_max_item_size(raw, unchanged):
    big = os.urandom(LIMITS["max_item_size"] + 1)
    status, msg = raw.send(raw.save_message(p.SINGLE, [dropbox_upload("bad.docx")], [full_item(big, doc())]))
    assert (status, msg.code, msg.stage) == (413, "too_large", 0), msg


def test_envelope_over_max_envelope(raw, unchanged):
    # A huge header field makes the structured part (before the MAC) too big.
    req = dropbox_upload("bad.docx")
    req.headers.append(("X-Padding", "a" * (LIMITS["max_envelope"] + 10)))  # under max_head (64 KiB)
    save = raw.save_message(p.SINGLE, [req], [full_item(DOC, doc())])
    status, data = raw.post(p.SAVE_PATH, save.encode(raw.secret))
    msg = p.decode_message(data, path=p.SAVE_PATH)
    assert (status, msg.code, msg.stage) == (413, "too_large", 0), msg



def test_more_requests_than_any_procedure_takes(raw, unchanged):
    """Three request specifications (every procedure takes one or two):
    `limit_exceeded` when the structured part is decoded (spec §4.5), before
    any request is resolved. Each could have made the EPS copy a context's
    head and body; before, such a SAVE was resolved whole and then refused
    for its shape (`invalid_request`)."""
    req = dropbox_upload("bad.docx")
    save = raw.save_message(p.SINGLE, [req, req, req], [full_item(DOC, doc())])
    status, msg = raw.send(save)
    expect_error(status, msg, 400, "limit_exceeded", authenticated=False)

# ---------------------------------------------------------------- authentication


def test_wrong_secret_on_hello(bound, unchanged):
    device = RawDevice(bound, secret=bytes(32))
    hello = p.Hello(1, os.urandom(16), (1,), (1,), 511, "intruder")
    status, data = device.post(p.HELLO_PATH, hello.encode(device.secret))
    msg = p.decode_message(data, path=p.HELLO_PATH)
    expect_error(status, msg, 401, "auth_failed", authenticated=False)


def test_unknown_key_id(bound, unchanged):
    device = RawDevice(bound, key_id=7)
    status, data = device.post(p.HELLO_PATH, p.Hello(7, os.urandom(16), (1,), (1,), 511, "x").encode(device.secret))
    expect_error(status, p.decode_message(data, path=p.HELLO_PATH), 401, "auth_failed", authenticated=False)


def test_wrong_secret_on_save(raw, unchanged):
    save = good_save(raw)
    status, data = raw.post(p.SAVE_PATH, save.encode(bytes(32)))
    expect_error(status, p.decode_message(data, path=p.SAVE_PATH), 401, "auth_failed", authenticated=False)


def test_client_with_wrong_secret_falls_back(bound, unchanged):
    client = bound.client(secret=b"\x01" * 32)
    out = Uploader("dropbox", "single").save(client, "bad.docx", DOC, None)
    assert isinstance(out, p.Fallback) and out.error is not None and out.error.code == "auth_failed", out


def test_unknown_session(raw, unchanged):
    raw.session_id = os.urandom(8)
    status, msg = raw.send(good_save(raw))
    expect_error(status, msg, 401, "session_unknown", authenticated=True)


def test_replayed_seq(lab, raw, bound):
    status, msg = raw.send(good_save(raw, seq=5))
    assert status == 200, msg
    seq, store = log_seq(lab), store_snapshot(bound)
    # The very same message again (a captured replay), and a new save that reuses the seq.
    replay = good_save(raw, seq=6)
    assert raw.send(replay)[0] == 200
    seq, store = log_seq(lab), store_snapshot(bound)
    status, data = raw.post(p.SAVE_PATH, replay.encode(raw.secret))
    expect_error(status, p.decode_message(data, path=p.SAVE_PATH), 409, "replayed", authenticated=True)
    other = raw.save_message(p.SINGLE, [dropbox_upload("bad.docx")], [full_item(DOC + b"3", doc())], seq=5)
    expect_error(*raw.send(other), 409, "replayed", authenticated=True)
    assert provider_requests_since(lab, seq) == []
    assert store_snapshot(bound) == store


# ---------------------------------------------------------------- document keys


def test_another_users_document_key(raw, unchanged):
    save = raw.save_message(p.SINGLE, [dropbox_upload("bad.docx", token="bob")], [full_item(DOC, doc("bob"))])
    status, msg = raw.send(save)
    expect_error(status, msg, 403, "key_forbidden", authenticated=True)


def test_another_provider_of_the_same_account(raw, unchanged):
    key = p.DocKey(p.GRAPH, b"alice", b"/e2e/bad.docx")
    req = p.ProviderRequest("PUT", "https://graph.microsoft.com/v1.0/me/drive/root:/e2e/bad.docx:/content",
                            [("Authorization", "Bearer alice")])
    status, msg = raw.send(raw.save_message(p.SINGLE, [req], [full_item(DOC, key)]))
    expect_error(status, msg, 403, "key_forbidden", authenticated=True)


def test_host_not_on_the_allowlist(raw, unchanged):
    req = p.ProviderRequest("POST", "https://evil.example.net/2/files/upload", [("Authorization", "Bearer alice")])
    status, msg = raw.send(raw.save_message(p.SINGLE, [req], [full_item(DOC, doc())]))
    expect_error(status, msg, 403, "host_forbidden", authenticated=True)
