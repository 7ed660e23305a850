"""EpsClient resend and fallback rules (spec §7) against a SCRIPTED stand-in
for the EPS (tests/scripted_eps.py), built from this package's own codec.

These are fixture tests, acceptable only until the real EPS exists; the
end-to-end behaviour must then be tested against eps/."""


import ec_patch
import pytest

import ec_protocol as p
from scripted_eps import DROP, SECRET, ScriptedEps, serve, sha

DOC = p.DocKey(p.DROPBOX, b"dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc", b"/docs/report.docx")
URL = "https://content.dropboxapi.com/2/files/upload"


def headers(rev="62a1", token="sl.u.TOKEN"):
    return [
        ("Host", "content.dropboxapi.com"),
        ("Authorization", f"Bearer {token}"),
        ("Dropbox-API-Arg", '{"path":"/Docs/report.docx","mode":{".tag":"update","update":"%s"}}' % rev),
        ("Content-Type", "application/octet-stream"),
        ("Content-Length", "999"),
    ]


BASE = b"PK\x03\x04" + b"the last-synced document body " * 200
NEW = BASE.replace(b"synced", b"SYNCED", 1)


@pytest.fixture
def eps():
    eps = ScriptedEps()
    server = serve(eps)
    eps.server = server
    eps.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield eps
    eps.server.shutdown()
    eps.server.server_close()


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def client(eps, **kw):
    bundle = p.EnrolmentBundle(eps.url, 1, SECRET, plain_http=True)
    return p.EpsClient(bundle, label="test", **kw)


def test_save_patch_then_same_context_and_resp_ref(eps):
    c = client(eps)
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse), out
    assert (out.status, out.reason, out.body) == (200, "OK", b"{}")
    assert out.headers == [("content-type", b"application/json"), ("content-length", b"2")]
    first = eps.saves()[0]
    save = first.msg
    assert save.seq == 1 and save.resp_ref is None
    assert len(save.ctx_defs) == 1 and save.ctx_defs[0].doc == DOC
    assert save.requests[0].head.mode == p.SAME
    assert save.items[0].payload_kind == p.PATCH and save.items[0].doc is None
    assert ec_patch.apply(BASE, save.items[0].payload) == NEW
    assert first.heads[0].get("authorization") == b"Bearer sl.u.TOKEN"
    assert first.heads[0].get("host") is None

    newer = NEW.replace(b"body", b"BODY", 1)
    out2 = c.save_single("POST", URL, headers(rev="62b2"), newer, NEW, DOC)
    assert isinstance(out2, p.ProviderResponse) and out2.body == b"{}"
    second = eps.saves()[1]
    assert second.msg.seq == 2 and second.msg.ctx_defs == ()
    assert second.msg.requests[0].head.mode == p.DELTA
    assert second.heads[0].get("dropbox-api-arg").endswith(b'"62b2"}}')
    assert second.msg.resp_ref == p.response_digest(b"200 OK\ncontent-type: application/json\n", b"{}")
    assert second.msg.request_id != save.request_id


def test_new_token_gets_a_new_context(eps):
    c = client(eps)
    c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    c.save_single("POST", URL, headers(token="refreshed"), NEW, BASE, DOC)
    a, b = eps.saves()
    assert b.msg.ctx_defs and b.msg.ctx_defs[0].ctx_id != a.msg.ctx_defs[0].ctx_id


def test_base_unknown_resends_full_with_same_request_id(eps):
    c = client(eps)
    calls = []

    def script(seen, default):
        calls.append(seen)
        if len(calls) == 1:
            return eps.error(seen.msg, "base_unknown", lst=[0])
        return default

    eps.script = script
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse)
    a, b = (s.msg for s in eps.saves())
    assert a.request_id == b.request_id and b.seq == a.seq + 1
    assert a.items[0].payload_kind == p.PATCH and b.items[0].payload_kind == p.FULL
    assert b.items[0].payload == NEW


def test_second_base_unknown_takes_the_direct_path(eps):
    c = client(eps)
    eps.script = lambda seen, default: eps.error(seen.msg, "base_unknown", lst=[0])
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "base_unknown"
    assert len(eps.saves()) == 2


def test_session_unknown_says_hello_and_redefines(eps):
    c = client(eps)
    c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    eps.sessions.clear()
    eps.forget_contexts()
    out = c.save_single("POST", URL, headers(rev="x"), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse)
    hellos = [s for s in eps.seen if isinstance(s.msg, p.Hello)]
    assert len(hellos) == 2
    last = eps.saves()[-1].msg
    assert last.ctx_defs and last.seq == 1
    assert eps.saves()[-2].msg.request_id == last.request_id


def test_context_unknown_resends_the_listed_definitions(eps):
    c = client(eps)
    c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    eps.forget_contexts()
    out = c.save_single("POST", URL, headers(rev="x"), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse)
    a, b = (s.msg for s in eps.saves()[1:])
    assert a.ctx_defs == () and [d.ctx_id for d in b.ctx_defs] == [a.requests[0].ctx_id]
    assert a.request_id == b.request_id


def test_replayed_gets_a_new_seq_once(eps):
    c = client(eps)
    n = []

    def script(seen, default):
        n.append(1)
        return eps.error(seen.msg, "replayed") if len(n) <= 2 else default

    eps.script = script
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "replayed"
    seqs = [s.msg.seq for s in eps.saves()]
    assert seqs == [1, 2]


@pytest.mark.parametrize("code,status", [("provider_timeout", 504), ("provider_truncated", 502), ("provider_protocol", 502)])
def test_stage_1_errors_answer_the_app(eps, code, status):
    c = client(eps)
    eps.script = lambda seen, default: eps.error(seen.msg, code)
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.AppError) and out.status == status and out.error.code == code


def test_stage_0_errors_take_the_direct_path(eps):
    c = client(eps)
    eps.script = lambda seen, default: eps.error(seen.msg, "host_forbidden")
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "host_forbidden"


def test_auth_failed_pauses_the_eps(eps):
    clock = FakeClock()
    bundle = p.EnrolmentBundle(eps.url, 1, bytes(32), plain_http=True)  # wrong secret
    c = p.EpsClient(bundle, clock=clock, sleep=clock.sleep)
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.error.code == "auth_failed" and not out.error.authenticated
    before = eps.received
    assert c.save_single("POST", URL, headers(), NEW, BASE, DOC).reason == "eps_paused"
    assert eps.received == before
    clock.now += 301
    c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert eps.received == before + 1


def test_unauthenticated_error_never_changes_state(eps):
    c = client(eps)
    c.hello()
    sid = c._session.session_id
    eps.script = lambda seen, default: eps.error(seen.msg, "session_unknown", zero_mac=True)
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "unauthenticated_error"
    assert c._session.session_id == sid and len([s for s in eps.seen if isinstance(s.msg, p.Hello)]) == 1


def test_in_progress_waits_and_resends(eps):
    clock = FakeClock()
    c = client(eps, clock=clock, sleep=clock.sleep)
    n = []

    def script(seen, default):
        n.append(1)
        return eps.error(seen.msg, "in_progress", retry_after_ms=1500) if len(n) <= 2 else default

    eps.script = script
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse)
    assert clock.slept == [1.5, 1.5]
    assert len({s.msg.request_id for s in eps.saves()}) == 1


def test_transport_failure_retries_same_request_id_twice(eps):
    c = client(eps)
    n = []

    def script(seen, default):
        n.append(1)
        return DROP if len(n) <= 2 else default

    eps.script = script
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse)
    msgs = [s.msg for s in eps.saves()]
    assert len(msgs) == 3 and len({m.request_id for m in msgs}) == 1
    assert [m.seq for m in msgs] == [1, 2, 3]
    assert all(m.ctx_defs for m in msgs)  # unknown whether the first definitions took effect


def test_eps_that_stays_unreachable_after_sending_means_504_never_direct(eps):
    """§7.1: the request was sent and no answer came: the outcome is unknown.
    The client asks again (same request_id, backoff) for the retry window,
    then answers the app 504; it never takes the direct path."""
    clock = FakeClock()
    c = client(eps, clock=clock, sleep=clock.sleep, retry_window=30)
    eps.script = lambda seen, default: DROP
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.AppError) and out.status == 504 and out.reason == "outcome_unknown", out
    msgs = [s.msg for s in eps.saves()]
    assert len({m.request_id for m in msgs}) == 1
    # Immediately, then 0.1 s doubling up to 2 s, until 30 s have passed.
    assert clock.slept[:7] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert sum(clock.slept) == pytest.approx(30.0)
    assert len(msgs) == len(clock.slept) + 2


def test_retry_window_is_an_option(eps):
    clock = FakeClock()
    c = client(eps, clock=clock, sleep=clock.sleep, retry_window=5)
    eps.script = lambda seen, default: DROP
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.AppError) and out.status == 504
    assert sum(clock.slept) == pytest.approx(5.0)


def test_eps_restarting_after_a_lost_answer_is_asked_again_until_it_answers(eps):
    """The EPS dies after the request was sent (DROP), its port refuses
    connections for a while (a restart), then a new process with no
    sessions answers from its outcome record: the client keeps asking
    through the refusals (which prove nothing about the first
    transmission), says HELLO again, and hands on the provider's answer."""
    clock = FakeClock()
    port = int(eps.url.rsplit(":", 1)[1])
    holder = {"server": None}

    def script(seen, default):
        if holder["server"] is None:
            return DROP  # the dying EPS
        return eps.ok(seen.msg, 200, "OK", body=b'{"rev":"2"}', replayed=True)

    def sleep(s):
        clock.sleep(s)
        if len(clock.slept) == 1:
            eps.server.shutdown()
            eps.server.server_close()
        if len(clock.slept) == 6:
            eps.sessions.clear()  # a restarted EPS has no sessions
            holder["server"] = serve(eps, port=port)

    eps.script = script
    c = client(eps, clock=clock, sleep=sleep)
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    if holder["server"] is not None:
        eps.server = holder["server"]
    assert isinstance(out, p.ProviderResponse) and out.replayed and out.body == b'{"rev":"2"}', out
    saves = [s.msg for s in eps.saves()]
    assert len({m.request_id for m in saves}) == 1
    hellos = [s for s in eps.seen if isinstance(s.msg, p.Hello)]
    assert len(hellos) == 2  # the first session, and one after the restart


@pytest.mark.parametrize("code", ["host_forbidden", "busy_then_host_forbidden", "request_id_conflict"])
def test_stage_0_answer_after_a_lost_one_is_504_not_direct(eps, code):
    """A stage-0 ERROR to a retry does not prove the lost transmission
    never reached a provider: 504, never the direct path."""
    clock = FakeClock()
    c = client(eps, clock=clock, sleep=clock.sleep)
    n = []

    def script(seen, default):
        n.append(1)
        if len(n) == 1:
            return DROP
        if code.startswith("busy") and len(n) == 2:
            return eps.error(seen.msg, "busy", retry_after_ms=200)
        return eps.error(seen.msg, code.rsplit("_then_", 1)[-1])

    eps.script = script
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.AppError) and out.status == 504 and out.reason == "outcome_unknown", out


def test_outcome_unknown_answer_after_restart_is_504(eps):
    """The EPS's answer for a save it started before a restart (its in-flight
    marker): provider_timeout, stage 1. The app gets 504."""
    n = []

    def script(seen, default):
        n.append(1)
        return DROP if len(n) == 1 else eps.error(seen.msg, "provider_timeout", stage=1)

    eps.script = script
    out = client(eps).save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.AppError) and out.status == 504 and out.reason == "provider_timeout", out
    assert len(eps.saves()) == 2


def test_unauthenticated_answers_after_a_lost_one_are_no_answer(eps):
    clock = FakeClock()
    n = []

    def script(seen, default):
        n.append(1)
        if len(n) == 1:
            return DROP
        if len(n) <= 3:
            return eps.error(seen.msg, "malformed", zero_mac=True)
        return default

    eps.script = script
    out = client(eps, clock=clock, sleep=clock.sleep).save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse) and out.status == 200, out


def test_eps_stopped_between_saves_means_direct_not_an_unknown_outcome(eps):
    """The EPS stops between two saves and closes the kept-alive connection:
    the next save must not be written into the closed connection (that
    would look like a lost answer and hold the app for the retry window):
    the client opens a new connection, which is refused, so nothing was
    sent and the direct path is taken at once."""
    import socket
    import time

    c = client(eps, retry_window=30)
    c.hello()
    # The far end closes: our half-close makes the server's handler see EOF and close its side.
    c._transport.conn.sock.shutdown(socket.SHUT_WR)
    eps.server.shutdown()
    eps.server.server_close()
    time.sleep(0.2)
    t0 = time.monotonic()
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "eps_unreachable", out
    assert time.monotonic() - t0 < 5


def test_fetch_still_goes_direct_when_the_eps_stays_unreachable(eps):
    """A download repeats nothing at the provider: after two resends the
    device fetches directly, as before."""
    eps.script = lambda seen, default: DROP
    out = client(eps).fetch(p.ProviderRequest("GET", "https://content.dropboxapi.com/2/files/download", headers(), p.BODY_EMPTY), DOC)
    assert isinstance(out, p.Fallback) and out.reason == "eps_unreachable"
    assert len(eps.saves()) == 3


def test_bad_response_mac_is_a_transport_failure(eps):
    c = client(eps)
    n = []

    def script(seen, default):
        n.append(1)
        if len(n) == 1:
            status, data = default
            return status, data[:-1] + bytes([data[-1] ^ 1])
        return default

    eps.script = script
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse)
    assert len(eps.saves()) == 2


def test_connection_refused_is_direct_path():
    bundle = p.EnrolmentBundle("http://127.0.0.1:9", 1, SECRET, plain_http=True)
    out = p.EpsClient(bundle).save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "eps_unreachable"


def test_capability_missing_and_empty_file(eps):
    eps.caps = p.Cap.SINGLE
    c = client(eps)
    assert c.save(p.GRAPH_SESSION, [p.ProviderRequest("POST", URL, headers(), p.BODY_BYTES)], [p.make_item(NEW, DOC, None)]).reason == "capability_missing"
    assert c.save_single("POST", URL, headers(), b"", BASE, DOC).reason == "empty_file"
    assert c.fetch(p.ProviderRequest("GET", URL, [], p.BODY_EMPTY), DOC).reason == "capability_missing"


def test_provider_errors_are_responses(eps):
    c = client(eps)
    eps.script = lambda seen, default: eps.ok(seen.msg, 429, "Too Many Requests", [("retry-after", "7")], b'{"error":"too_many"}')
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.ProviderResponse) and not out.succeeded
    assert out.status == 429 and ("retry-after", b"7") in out.headers


# ---------------------------------------------------------------- fetch


def fetch_script(eps, have, new, *, corrupt=False, kind=p.PART_PATCH):
    def script(seen, default):
        msg = seen.msg
        assert msg.have_sha256 == (sha(have) if have is not None else None)
        head = b"200 OK\ndropbox-api-result: {}\n"
        if kind == p.PART_PATCH:
            payload = bytes(ec_patch.diff(have, new))
            part = p.FetchPart(p.CB.literal(head), p.PART_PATCH, None, len(new), sha(new + (b"x" if corrupt else b"")), len(payload))
        else:
            payload = new
            part = p.FetchPart(p.CB.literal(head), p.PART_FULL, None, len(new), sha(new + (b"x" if corrupt else b"")))
        res = p.FetchResult((part,), payload)
        return 200, res.encode(eps.secret, msg.mac)

    return script


@pytest.mark.parametrize("kind", [p.PART_PATCH, p.PART_FULL])
def test_fetch_rebuilds_and_checks(eps, kind):
    c = client(eps)
    eps.script = fetch_script(eps, BASE, NEW, kind=kind)
    req = p.ProviderRequest("POST", "https://content.dropboxapi.com/2/files/download",
                            [("Authorization", "Bearer t"), ("Dropbox-API-Arg", '{"path":"/a"}')], p.BODY_EMPTY)
    out = c.fetch(req, DOC, BASE)
    assert isinstance(out, p.FetchResponse), out
    assert out.final.body == NEW and out.file_sha256 == sha(NEW)
    assert ("content-length", str(len(NEW)).encode()) in out.final.headers


@pytest.mark.parametrize("kind", [p.PART_PATCH, p.PART_FULL])
def test_fetch_with_wrong_target_hash_fetches_directly(eps, kind):
    c = client(eps)
    eps.script = fetch_script(eps, BASE, NEW, corrupt=True, kind=kind)
    req = p.ProviderRequest("GET", "https://graph.microsoft.com/v1.0/me/drive/items/1/content", [], p.BODY_EMPTY)
    out = c.fetch(req, DOC, BASE)
    assert isinstance(out, p.Fallback) and out.reason in ("fetch_target_mismatch", "fetch_patch_failed")


def test_bundle_rules():
    with pytest.raises(ValueError):
        p.EnrolmentBundle("http://h:1", 1, SECRET)  # plain HTTP not allowed
    with pytest.raises(ValueError):
        p.EnrolmentBundle("https://h:1", 1, SECRET)  # TLS needs a pin
    with pytest.raises(ValueError):
        p.EnrolmentBundle("http://h:1", 1, b"short", plain_http=True)
    b = p.EnrolmentBundle.from_dict({"url": "https://h:1", "key_id": 1, "secret": SECRET.hex(), "spki_sha256": "00" * 32})
    assert SECRET.hex() not in repr(b) and str(SECRET) not in repr(b)


def test_target_mismatch_on_patch_resends_full_then_direct(eps):
    c = client(eps)
    eps.script = lambda seen, default: eps.error(seen.msg, "target_mismatch", lst=[0])
    out = c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    assert isinstance(out, p.Fallback) and out.reason == "target_mismatch"
    kinds = [s.msg.items[0].payload_kind for s in eps.saves()]
    assert kinds == [p.PATCH, p.FULL]


def test_target_mismatch_on_full_item_is_direct_at_once(eps):
    c = client(eps)
    eps.script = lambda seen, default: eps.error(seen.msg, "target_mismatch", lst=[0])
    out = c.save_single("POST", URL, headers(), NEW, None, DOC)
    assert isinstance(out, p.Fallback) and len(eps.saves()) == 1


def test_result_under_a_non_200_status_is_not_trusted(eps):
    c = client(eps)
    n = []

    def script(seen, default):
        n.append(1)
        return (500, default[1]) if len(n) == 1 else default

    eps.script = script
    assert isinstance(c.save_single("POST", URL, headers(), NEW, BASE, DOC), p.ProviderResponse)
    assert len(eps.saves()) == 2


def test_ranged_fetch_goes_direct(eps):
    c = client(eps)
    req = p.ProviderRequest("GET", "https://graph.microsoft.com/v1.0/me/drive/items/1/content", [("Range", "bytes=0-9")], p.BODY_EMPTY)
    assert c.fetch(req, DOC, BASE).reason == "ranged_fetch"


# ---- what a save costs on the link (issue 11): contexts and response references


def test_a_field_new_in_every_request_travels_as_a_delta_not_a_redefinition(eps):
    """A per-call hash (64 hex digits, new each time) makes every head's
    delta larger than 64 B, but a redefinition would carry the whole head
    each time: the context stays, the head goes as a DELTA (§4.3.2)."""
    c = client(eps)
    import hashlib

    def hashed(n):
        h = hashlib.sha256(b"%d" % n).hexdigest()
        return headers(rev=h) + [("X-Call-Hash", hashlib.sha256(b"x%d" % n).hexdigest())]

    for n in range(4):
        out = c.save_single("POST", URL, hashed(n), NEW, BASE, DOC)
        assert isinstance(out, p.ProviderResponse), out
    saves = eps.saves()
    assert len(saves[0].msg.ctx_defs) == 1
    for s in saves[1:]:
        assert s.msg.ctx_defs == (), "redefined for a field that changes with every request"
        assert s.msg.requests[0].head.mode == p.DELTA


def test_a_change_that_persists_redefines_the_context_once(eps):
    """A head that moved for good (a long new value, over
    PERSISTENT_REDEFINE_BYTES as a delta, that stays) is redefined once,
    then travels as SAME."""
    c = client(eps)
    import hashlib

    long_a, long_b = (b"".join(hashlib.sha256(b"%s%d" % (t, i)).digest() for i in range(10)).hex() for t in (b"a", b"b"))

    def h(v):
        return headers() + [("X-Grant", v)]

    c.save_single("POST", URL, h(long_a), NEW, BASE, DOC)
    c.save_single("POST", URL, h(long_b), NEW, BASE, DOC)   # a delta: maybe random
    c.save_single("POST", URL, h(long_b), NEW, BASE, DOC)   # the same again: it persists
    c.save_single("POST", URL, h(long_b), NEW, BASE, DOC)
    s = eps.saves()
    assert s[1].msg.ctx_defs == () and s[1].msg.requests[0].head.mode == p.DELTA
    assert len(s[2].msg.ctx_defs) == 1 and s[2].msg.requests[0].head.mode == p.SAME
    assert s[3].msg.ctx_defs == () and s[3].msg.requests[0].head.mode == p.SAME


def test_a_new_addressing_form_borrows_a_context_instead_of_defining_one(eps):
    """The same file saved under another key (an id instead of a path):
    its head is coded against the existing context (the item names its
    document), with no definition; another credential never borrows."""
    c = client(eps)
    by_id = p.DocKey(p.GRAPH, b"drive1", b"id:1TB!1")
    by_path = p.DocKey(p.GRAPH, b"drive1", b"root:/docs/report.docx:")
    h = [("Authorization", "Bearer " + "t" * 300), ("Content-Type", "application/octet-stream")]
    c.save_single("PUT", "https://graph.microsoft.com/v1.0/drives/d1/items/root:/Docs/Report.docx:/content", h, NEW, BASE, by_path)
    c.save_single("PUT", "https://graph.microsoft.com/v1.0/drives/d1/items/1TB!1/content", h, NEW, BASE, by_id)
    other = [("Authorization", "Bearer " + "u" * 300), ("Content-Type", "application/octet-stream")]
    c.save_single("PUT", "https://graph.microsoft.com/v1.0/drives/d1/items/1TB!1/content", other, NEW, BASE, by_id)
    first, second, third = eps.saves()
    assert second.msg.ctx_defs == ()
    assert second.msg.requests[0].ctx_id == first.msg.ctx_defs[0].ctx_id
    assert second.msg.requests[0].head.mode == p.DELTA and len(second.msg.requests[0].head.encode()) < 64
    assert second.msg.items[0].doc == by_id
    assert second.heads[0].url.endswith("/items/1TB!1/content")
    assert len(third.msg.ctx_defs) == 1, "another token got a context of its own"


def test_a_save_names_the_last_save_response_not_a_download_in_between(eps):
    """§4.6.2: after save, download, save, the second save names the first
    save's response (its metadata is the one to code against)."""
    c = client(eps)
    c.save_single("POST", URL, headers(), NEW, BASE, DOC)
    saved = p.response_digest(b"200 OK\ncontent-type: application/json\n", b"{}")
    eps.script = fetch_script(eps, BASE, NEW, kind=p.PART_PATCH)
    req = p.ProviderRequest("POST", "https://content.dropboxapi.com/2/files/download",
                            [("Authorization", "Bearer sl.u.TOKEN"), ("Dropbox-API-Arg", '{"path":"/a"}')], p.BODY_EMPTY)
    assert isinstance(c.fetch(req, DOC, BASE), p.FetchResponse)
    eps.script = None
    c.save_single("POST", URL, headers(rev="62b2"), NEW, BASE, DOC)
    last = eps.saves()[-1].msg
    assert isinstance(last, p.Save) and last.resp_ref == saved


def test_a_response_names_the_document_under_its_other_keys_too(eps):
    """`response_aliases`: a created file's answer names its id; the next
    save, addressed by that id, names that answer in resp_ref."""
    created = p.DocKey(p.DRIVE, b"acct", b"new:report.docx")
    by_id = p.DocKey(p.DRIVE, b"acct", b"1tb0001")
    c = client(eps, response_aliases=lambda doc, body: [by_id] if doc == created else [])
    c.save_single("POST", "https://www.googleapis.com/upload/drive/v3/files?uploadType=media", headers(), NEW, BASE, created)
    c.save_single("PATCH", "https://www.googleapis.com/upload/drive/v3/files/1tb0001?uploadType=media", headers(), NEW, BASE, by_id)
    assert eps.saves()[-1].msg.resp_ref == p.response_digest(b"200 OK\ncontent-type: application/json\n", b"{}")
