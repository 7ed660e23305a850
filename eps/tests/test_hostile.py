"""Hostile peers on the device listener (issue 8, spec §14): an EPS must not
be taken down, nor its devices locked out, by anyone on the Wi-Fi.

- A 4 GiB unauthenticated body: the EPS reads at most `max_envelope` (plus
  what the kernel buffers) before the MAC check fails, answers, closes.
- 2,000 idle or slow connections against an EPS with a 1,024 open-file
  limit: it stays up and a device's save during the attack succeeds.
- A slowloris body (before and after authentication) and connections that
  never start TLS: each ends after its timeout.

Each test starts its own EPS (short timeouts, an 8 MiB document limit) so
that its peak memory (VmHWM) is its own; the bound asserted is
64 MiB + 2 x the largest document the instance is configured for.
"""

from __future__ import annotations

import http.client
import os
import resource
import select
import socket
import ssl
import threading
import time
import uuid
from pathlib import Path

import pytest

import ec_protocol as p

from .e2e import RawDevice, Uploader, dropbox_upload, full_item, trace_sequences

MAX_DOC = 8 << 20
LIMITS = {"max_item_size": MAX_DOC, "max_patch_size": MAX_DOC}
TIMEOUTS = {"tls_handshake_timeout_s": 2, "header_timeout_s": 2, "envelope_timeout_s": 2, "body_read_timeout_s": 2}
PEAK_BOUND = 64 * (1 << 20) + 2 * MAX_DOC
GIB = 1 << 30


def vm_hwm(eps) -> int:
    for line in Path(f"/proc/{eps.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def alive(eps) -> bool:
    if eps.proc.poll() is not None:
        return False
    with urllib_open(f"http://{eps.device}/healthz") as body:
        return body == b"ok\n"


def urllib_open(url: str):
    import contextlib
    import urllib.request

    @contextlib.contextmanager
    def cm():
        with urllib.request.urlopen(url, timeout=10) as r:
            yield r.read()

    return cm()


def raise_own_nofile(n: int = 8192) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def legit_save(eps, n: int = 0) -> p.ProviderResponse:
    data = trace_sequences()["docx"][0][0]
    client = eps.client()
    try:
        out = Uploader("dropbox", "single", token="hostile-legit").save(client, f"legit-{uuid.uuid4().hex[:8]}-{n}.docx", data, None)
    finally:
        client.close()
    return out


@pytest.fixture
def hostile(start_eps, request):
    """A fresh EPS per test, started with a 1,024 open-file limit."""
    name = "hostile-" + request.node.name.replace("_", "-")[:40] + "-" + uuid.uuid4().hex[:4]
    eps = start_eps(name, limits=LIMITS, connections=dict(TIMEOUTS), nofile=1024)
    yield eps
    assert eps.proc.poll() is None, "the EPS died"
    eps.stop()


def structured_part(device: RawDevice) -> bytes:
    """A SAVE's structured part (its one FULL item declares 1 byte), MACed with a wrong secret (the peer does not hold the key)."""
    save = device.save_message(p.SINGLE, [dropbox_upload("hostile.docx")],
                               [full_item(b"x", p.DocKey(p.DROPBOX, b"alice", b"/e2e/hostile.docx"))])
    whole = save.encode(os.urandom(32))
    return whole[:-1]  # the one payload byte off


def test_4gib_unauthenticated_body_is_cut_after_max_envelope(hostile):
    device = RawDevice(hostile)
    device.session_id = os.urandom(8)  # an attacker has no session either
    head = structured_part(device)
    host, port = hostile.device.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /ec/1/save HTTP/1.1\r\nHost: eps\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = bytes(1 << 20)
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent, answer, t0 = 0, b"", time.monotonic()
    s.sendall(b"%x\r\n" % len(head) + head + b"\r\n")
    s.setblocking(False)
    try:
        # Streamed from one 1 MiB buffer: 4,096 chunks, nothing allocated per chunk.
        while sent < 4 * GIB and time.monotonic() - t0 < 15:
            r, w, _ = select.select([s], [s], [], 1)
            if r:
                got = s.recv(65536)
                if not got:
                    break
                answer += got
            if w:
                try:
                    sent += s.send(frame)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        s.close()
    print(f"sent {sent / (1 << 20):.1f} MiB before the EPS closed; answer {answer[:12]!r}; peak {vm_hwm(hostile) >> 20} MiB")
    assert sent < 64 << 20, f"the EPS read {sent} bytes of an unauthenticated body"
    assert answer.startswith(b"HTTP/1.1 401") or answer == b"", answer[:200]
    assert alive(hostile)
    assert vm_hwm(hostile) < PEAK_BOUND, vm_hwm(hostile)
    # A device still saves.
    assert legit_save(hostile).succeeded


def test_2000_idle_and_slow_connections_do_not_lock_out_a_device(hostile):
    raise_own_nofile()
    host, port = hostile.device.rsplit(":", 1)
    addr = (host, int(port))
    socks: list[socket.socket] = []
    stop = threading.Event()

    def attack():
        n = 0
        while not stop.is_set():
            try:
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(addr)
                if n % 2:
                    # Slow: the start of a request head, never finished.
                    try:
                        s.send(b"POST /ec/1/save HTTP/1.1\r\nHost: e")
                    except OSError:
                        pass
                socks.append(s)
                n += 1
                if len(socks) > 2000:
                    socks.pop(0).close()
            except OSError:
                time.sleep(0.01)
            if n >= 2000:
                time.sleep(0.002)

    t = threading.Thread(target=attack, daemon=True)
    t.start()
    try:
        while len(socks) < 2000:
            time.sleep(0.05)
        # During the attack (still opening connections), devices save.
        t0 = time.monotonic()
        results = [legit_save(hostile, i) for i in range(3)]
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    try:
        for r in results:
            assert isinstance(r, p.ProviderResponse) and r.succeeded, r
        assert alive(hostile)
        evicted = hostile.metric("ec_eps_connections_evicted_total")
        cap = hostile.metric("ec_eps_connections_max", 'listener="device"')
        held = hostile.metric("ec_eps_connections", 'listener="device"')
        print(f"3 saves during the attack in {took:.2f} s; cap {cap:.0f}, held {held:.0f}, evicted {evicted:.0f}, "
              f"peak {vm_hwm(hostile) >> 20} MiB")
        assert evicted > 0 and held <= cap
        assert vm_hwm(hostile) < PEAK_BOUND
        # The idle and slow ones still held end by the header timeout, while the peer keeps them open.
        time.sleep(TIMEOUTS["header_timeout_s"] + 1)
        assert hostile.metric("ec_eps_connection_timeouts_total", 'kind="headers"') > 0
        assert hostile.metric("ec_eps_connections", 'listener="device"') <= 1
    finally:
        for s in socks:
            s.close()


def closed_within(s: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the EPS closed `s` within `seconds` (anything it answered first)."""
    s.settimeout(0.2)
    got, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True, got
        if not b:
            return True, got
        got += b
    return False, got


def test_slowloris_body_before_authentication(hostile):
    host, port = hostile.device.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /ec/1/save HTTP/1.1\r\nHost: eps\r\nContent-Length: 100000\r\n\r\n\x01")
    t0 = time.monotonic()
    stopped = threading.Event()

    def drip():
        while not stopped.wait(0.5):
            try:
                s.send(b"\x00")  # one byte every 0.5 s: each read makes progress, the whole never arrives
            except OSError:
                return

    threading.Thread(target=drip, daemon=True).start()
    closed, got = closed_within(s, 8)
    stopped.set()
    s.close()
    took = time.monotonic() - t0
    print(f"slowloris before authentication: closed after {took:.1f} s, answer {got[:12]!r}")
    assert closed and took < TIMEOUTS["envelope_timeout_s"] + 2
    assert hostile.metric("ec_eps_connection_timeouts_total", 'kind="envelope"') >= 1
    assert legit_save(hostile).succeeded


def test_a_structured_part_trickled_in_small_pieces_is_decoded_a_few_times(hostile):
    """An unauthenticated SAVE whose 40 kB structured part comes 512 bytes
    at a time, each its own read: the EPS decodes it again only once its
    bytes have doubled, so a peer cannot make it decode a large structured
    part once per byte (work growing with its square)."""
    device = RawDevice(hostile)
    device.session_id = os.urandom(8)
    req = dropbox_upload("trickled.docx")
    req.headers.append(("X-Padding", "a" * 40_000))
    save = device.save_message(p.SINGLE, [req], [full_item(b"x", p.DocKey(p.DROPBOX, b"alice", b"/e2e/trickled.docx"))])
    body = save.encode(os.urandom(32))  # the peer does not hold the key
    host, port = hostile.device.rsplit(":", 1)
    before = hostile.metric("ec_eps_envelope_decodes_total")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"POST /ec/1/save HTTP/1.1\r\nHost: eps\r\nContent-Length: %d\r\n\r\n" % len(body))
        pieces = [body[i:i + 512] for i in range(0, len(body), 512)]
        for piece in pieces:
            s.sendall(piece)
            time.sleep(0.004)
        closed, got = closed_within(s, 5)
    decodes = hostile.metric("ec_eps_envelope_decodes_total") - before
    print(f"{len(pieces)} pieces, {decodes:.0f} decodes, answer {got[:12]!r}")
    assert got.startswith(b"HTTP/1.1 401"), got[:200]
    assert 1 <= decodes <= 12 < len(pieces) // 4, decodes
    assert legit_save(hostile).succeeded



def test_slowloris_payload_after_authentication(hostile):
    device = RawDevice(hostile)
    device.hello()
    data = os.urandom(50_000)
    save = device.save_message(p.SINGLE, [dropbox_upload("slow.docx")],
                               [full_item(data, p.DocKey(p.DROPBOX, b"alice", b"/e2e/slow.docx"))])
    body = save.encode(device.secret)
    head = body[:-len(data)]
    host, port = hostile.device.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /ec/1/save HTTP/1.1\r\nHost: eps\r\nContent-Length: %d\r\n\r\n" % len(body) + head + data[:10])
    t0 = time.monotonic()
    closed, got = closed_within(s, 8)  # the rest never comes
    s.close()
    took = time.monotonic() - t0
    print(f"stalled payload: answered and closed after {took:.1f} s, {got[:12]!r}")
    assert closed and took < TIMEOUTS["body_read_timeout_s"] + 2
    assert hostile.metric("ec_eps_connection_timeouts_total", 'kind="body"') >= 1


def test_a_save_over_max_inflight_is_busy_before_its_payload_is_read(start_eps):
    """`max_inflight` bounds the payloads held, not only the procedures
    running: with one save's payload under way (its device stalled), a
    second save is answered `busy` as soon as its structured part is
    authenticated, before its payload is read. Before, the slot was taken
    only after the payloads were read, so any number of authenticated saves
    could hold payloads at once."""
    eps = start_eps("hostile-inflight-" + uuid.uuid4().hex[:4], limits={**LIMITS, "max_inflight": 1},
                    connections=dict(TIMEOUTS, body_read_timeout_s=6))
    try:
        device = RawDevice(eps)
        device.hello()
        host, port = eps.device.rsplit(":", 1)

        def begin(name: str) -> socket.socket:
            data = os.urandom(50_000)
            save = device.save_message(p.SINGLE, [dropbox_upload(name)],
                                       [full_item(data, p.DocKey(p.DROPBOX, b"alice", b"/e2e/" + name.encode()))])
            body = save.encode(device.secret)
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /ec/1/save HTTP/1.1\r\nHost: eps\r\nContent-Length: %d\r\n\r\n" % len(body)
                      + body[:-len(data)] + data[:10])  # the payload stalls after 10 bytes
            return s

        first = begin("first.docx")
        time.sleep(0.5)  # its structured part authenticated, its payload under way
        second = begin("second.docx")
        t0 = time.monotonic()
        closed, got = closed_within(second, 4)
        took = time.monotonic() - t0
        second.close()
        first.close()
        print(f"second save answered after {took:.2f} s: {got[:40]!r}")
        assert got.startswith(b"HTTP/1.1 503"), got[:300]
        head, _, rest = got.partition(b"\r\n\r\n")
        msg = p.decode_message(rest, path=p.SAVE_PATH)
        assert (msg.code, msg.stage) == ("busy", 0), msg
        assert took < 2, took
        assert legit_save(eps).succeeded  # the slot is free again once the stalled save ended
    finally:
        eps.stop()


def test_saves_stop_at_the_bound_of_in_flight_markers_and_resume_when_they_go(lab, hostile):
    """Every save that starts leaves an in-flight marker (one small file)
    for 16 minutes, so that its retry after a restart is never performed
    twice (spec §5.4, Appendix A item 5). Their number was bounded only by
    their age: a device saving as fast as the provider answers could fill
    the access point's disk, which other instances share. With 16,384 on
    disk (here written beforehand, the EPS restarted over them) a save is
    refused `busy` at stage 0, before its payload is read and before any
    provider request: the device goes directly. Once markers go, saves
    start again."""
    eps = hostile
    eps.stop()
    inflight = eps.state / "inflight"
    inflight.mkdir(exist_ok=True)
    digest = bytes(32)
    for k in range(16_384):
        (inflight / k.to_bytes(8, "big").hex()).write_bytes(digest)
    eps.restart()
    mark = max((e["seq"] for e in lab.providers.log()), default=0)
    refused = legit_save(eps, 1)
    assert isinstance(refused, p.Fallback) and refused.reason == "busy", refused
    assert refused.error is not None and refused.error.stage == 0, refused.error
    assert len(list(inflight.iterdir())) == 16_384  # no marker was written for it
    assert not [e for e in lab.providers.log() if e["seq"] > mark], "a provider request was made"
    for f in list(inflight.iterdir())[:10]:
        f.unlink()  # as markers past their 16 minutes are swept
    time.sleep(1.2)  # the EPS counts a full folder again at most once a second
    assert legit_save(eps, 2).succeeded


def self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import datetime

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eps.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("eps.test")]), critical=False)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    c, k = folder / "cert.pem", folder / "key.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return c, k


def test_connections_that_never_start_tls_time_out(lab, start_eps, tmp_path):
    raise_own_nofile()
    cert, key = self_signed(tmp_path / "tls")
    eps = start_eps("hostile-tls-" + uuid.uuid4().hex[:4], limits=LIMITS, connections=dict(TIMEOUTS), nofile=1024,
                    insecure_plain_http=False, tls={"cert_pem": str(cert), "key_pem": str(key)})
    try:
        host, port = eps.device.rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
        t0 = time.monotonic()
        # A device over TLS still gets in during the silence (its HELLO authenticates).
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
        hello = p.Hello(1, os.urandom(16), (1,), (1,), (1 << 9) - 1, "tls")
        from testbed.lab import TEST_SECRET

        conn.request("POST", p.HELLO_PATH, body=hello.encode(TEST_SECRET))
        r = conn.getresponse()
        assert r.status == 200 and isinstance(p.decode_message(r.read(), path=p.HELLO_PATH), p.HelloOk)
        conn.close()
        results = [closed_within(s, 6) for s in socks[-5:]]
        took = time.monotonic() - t0
        for s in socks:
            s.close()
        timeouts = eps.metric("ec_eps_connection_timeouts_total", 'kind="tls_handshake"')
        print(f"300 silent connections: closed after {took:.1f} s; timeouts {timeouts:.0f}; peak {vm_hwm(eps) >> 20} MiB")
        assert all(c for c, _ in results)
        time.sleep(0.5)
        assert eps.metric("ec_eps_connection_timeouts_total", 'kind="tls_handshake"') >= 200
        assert vm_hwm(eps) < PEAK_BOUND
    finally:
        assert eps.proc.poll() is None
        eps.stop()


def test_metrics_show_the_cap_and_timeouts(hostile):
    text = hostile.metrics()
    for name in ("ec_eps_connections{", "ec_eps_connections_max{", "ec_eps_connections_refused_total",
                 "ec_eps_connections_evicted_total", "ec_eps_timeout_seconds{", "ec_eps_log_suppressed_total"):
        assert name in text, name
    assert hostile.metric("ec_eps_timeout_seconds", 'kind="idle"') == 120
    assert hostile.metric("ec_eps_timeout_seconds", 'kind="headers"') == TIMEOUTS["header_timeout_s"]
    assert hostile.metric("ec_eps_connections_max", 'listener="device"') == 256


def test_repeated_bad_requests_are_logged_at_a_limited_rate(hostile):
    device = RawDevice(hostile)
    before = hostile.log_path.stat().st_size
    for _ in range(300):
        device.post(p.HELLO_PATH, b"\x00garbage")
    time.sleep(0.2)
    grown = hostile.log_path.stat().st_size - before
    print(f"300 bad requests wrote {grown} bytes of log")
    assert grown < 300 * 60, grown
    assert hostile.metric("ec_eps_log_suppressed_total") > 0


def h2_connect(eps, window: int):
    """An HTTP/2 connection (prior knowledge, plain: the lab EPS) whose
    settings and windows from the EPS (1 MiB for the connection, 256 KiB a
    stream) have come, `window` bytes of the connection's at least."""
    import h2.config
    import h2.connection

    host, port = eps.device.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    s.settimeout(5)
    while conn.outbound_flow_control_window < window or conn.remote_settings.initial_window_size < 12 << 10:
        data = s.recv(65536)
        assert data, "the EPS closed the connection"
        conn.receive_data(data)
        s.sendall(conn.data_to_send())
    return s, conn


def h2_post(conn, path: str, length: int, data: bytes) -> int:
    """Opens a stream posting `data` of a body of `length` bytes (ended if it is all of it)."""
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "eps"),
                            ("content-length", str(length))])
    conn.send_data(sid, data, end_stream=len(data) == length)
    return sid


def h2_statuses(s, conn, streams: list[int], seconds: float) -> dict[int, int]:
    """The status of each of `streams` answered within `seconds`."""
    import h2.events

    s.sendall(conn.data_to_send())
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    s.settimeout(0.2)
    while time.monotonic() < deadline and not set(streams) <= set(statuses):
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                statuses[ev.stream_id] = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        s.sendall(conn.data_to_send())
    return {sid: st for sid, st in statuses.items() if sid in streams}


def unauthenticated_save(device: RawDevice) -> bytes:
    """A SAVE whose structured part is 40 kB (a padded header), MACed with a wrong secret."""
    req = dropbox_upload("hostile.docx")
    req.headers.append(("X-Padding", "a" * 40_000))
    save = device.save_message(p.SINGLE, [req], [full_item(b"x", p.DocKey(p.DROPBOX, b"alice", b"/e2e/hostile.docx"))])
    return save.encode(os.urandom(32))


def test_the_streams_of_one_http2_connection_share_its_unauthenticated_allowance(start_eps):
    """Each unauthenticated request may buffer 16 KiB without drawing on the
    shared budget (`connections.preauth_buffer_bytes`). Over HTTP/2 that
    allowance is the connection's, not each stream's: before, one
    connection's 32 streams each held 16 KiB free of the budget (256
    connections: 128 MiB), and here 20 streams of 12 KiB were all held
    until their read timeout (2 s); now the first holds the connection's
    allowance, the next four the budget's 64 KiB, and the rest are answered
    `busy` at once."""
    eps = start_eps("hostile-h2-" + uuid.uuid4().hex[:4], limits=LIMITS,
                    connections={**TIMEOUTS, "envelope_timeout_s": 8, "preauth_buffer_bytes": 64 << 10})
    try:
        device = RawDevice(eps)
        device.session_id = os.urandom(8)
        whole = unauthenticated_save(device)  # of which 12 KiB are sent
        s, conn = h2_connect(eps, 20 * (12 << 10))
        streams = [h2_post(conn, p.SAVE_PATH, len(whole), whole[:12 << 10]) for _ in range(20)]
        statuses = h2_statuses(s, conn, streams, 1.5)  # before the 2 s read timeout ends the held streams
        s.close()
        busy = sorted(sid for sid, st in statuses.items() if st == 503)
        print(f"20 streams of 12 KiB on one connection: {len(busy)} answered busy at once; {statuses}")
        assert len(busy) >= 15, statuses
        assert alive(eps)
        assert legit_save(eps).succeeded
    finally:
        eps.stop()


def test_the_streams_of_a_devices_http2_connection_do_not_wait_on_the_unauthenticated_budget(start_eps):
    """A connection that authenticated a request is a device's: its other
    streams draw on a budget of their own (`max_inflight` x `max_envelope`),
    not on the one unauthenticated requests share. Here an attacker's
    HTTP/2 connection holds the whole shared budget (64 KiB) while one of
    the device's requests holds its connection's 16 KiB (a structured part
    under way) and four HELLOs come on the same connection: before, the four
    were answered `busy`; now they are answered."""
    eps = start_eps("hostile-h2-device-" + uuid.uuid4().hex[:4], limits=LIMITS,
                    connections={**TIMEOUTS, "envelope_timeout_s": 8, "body_read_timeout_s": 8,
                                 "preauth_buffer_bytes": 64 << 10})
    try:
        from testbed.lab import TEST_SECRET

        device = RawDevice(eps)
        device.session_id = os.urandom(8)
        whole = unauthenticated_save(device)
        attacker_s, attacker = h2_connect(eps, 8 * (12 << 10))
        held = [h2_post(attacker, p.SAVE_PATH, len(whole), whole[:12 << 10]) for _ in range(8)]
        statuses = h2_statuses(attacker_s, attacker, held, 1.0)
        assert sorted(statuses.values()) == [503] * 3, f"the shared budget is held by the attacker's streams: {statuses}"

        s, conn = h2_connect(eps, 64 << 10)

        def hello() -> bytes:
            return p.Hello(1, os.urandom(16), (1,), (1,), (1 << 9) - 1, "raw").encode(TEST_SECRET)

        first = hello()
        sid = h2_post(conn, p.HELLO_PATH, len(first), first)
        assert h2_statuses(s, conn, [sid], 3.0) == {sid: 200}, "the device's HELLO is answered"
        under_way = h2_post(conn, p.SAVE_PATH, len(whole), whole[:12 << 10])
        s.sendall(conn.data_to_send())
        time.sleep(0.3)  # read by the EPS: this stream holds the connection's 16 KiB
        hellos = []
        for _ in range(4):
            body = hello()
            hellos.append(h2_post(conn, p.HELLO_PATH, len(body), body))
        statuses = h2_statuses(s, conn, hellos, 1.5)
        print(f"four HELLOs on the device's connection while the shared budget is used up: {statuses}")
        assert statuses == {sid: 200 for sid in hellos}, statuses
        assert under_way not in statuses
        s.close()
        attacker_s.close()
        assert alive(eps)
    finally:
        eps.stop()
