#!/usr/bin/env python3
"""The edge service (EPS) figures of issue 3: binary size, idle memory, the
time a one-character edit of a 1 MB-text .docx adds to an upload, and many
users saving at once.

Everything runs against the real pieces: the static `ec-eps` from .venv/bin
(one process per user, started by testbed/lab.py), the provider test servers
(testbed/providers, over TLS under the providers' real host names), and the
device's own client (`ec_protocol.EpsClient`). The baseline for every time is
the same upload sent **directly** to the same provider server in the same
run (a Python client with one persistent TLS connection, the same headers,
the same bytes): the provider server is Python and the machine is shared,
so the difference EPS minus direct is what this measures, not an absolute.

1. size: the stripped static .venv/bin/ec-eps, the unstripped build it was
   made from, and `file`'s verdict (static or not).
2. rss: one instance alone, right after start and after a HELLO, a FULL
   save, a few PATCH saves and a few seconds idle: VmRSS, VmHWM, RssAnon
   (private heap, stacks, relocated data) and RssFile (pages of the binary
   itself, shared by every instance and reclaimable), PSS; for variants of
   the environment (glibc MALLOC_ARENA_MAX=1).
3. latency: the trace writer-1m-middle-docx (LibreOffice, 1 MB of text, one
   character typed); the device's patch is made before timing; per round,
   interleaved: (a) the SAVE round trip device -> EPS -> provider -> EPS ->
   device, (b) the same upload done directly; (c) = (a) - (b). Saves
   alternate base -> new -> base so each is a one-character edit. Also the
   EPS's own histograms (rebuild, provider request, save) from /metrics.
4. concurrency: N users (N EPS processes, N client threads, one Dropbox
   account each), every user seeds a base with one FULL save, then all N
   save a PATCH of a LibreOffice trace at the same instant (a barrier),
   for --rounds rounds; beside it the same bursts sent directly. p50 / p99
   / max, errors, and the RSS and PSS of the N instances.

A wrong result (a provider holding a file whose SHA-256 differs from the
device's, or any failed save) makes the script exit non-zero; an unmet goal
is only reported.

    .venv/bin/python experiments/bench/eps_bench.py [--reps 30] [--users 1,10,100] [--json out.json]
    .venv/bin/python experiments/bench/eps_bench.py --quick
"""

import argparse
import hashlib
import http.client
import io
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import common  # noqa: E402
import speed  # noqa: E402  (its parallel-capacity measure)
from common import fmt_bytes, fmt_time, goal, progress  # noqa: E402

SECTIONS = ("size", "rss", "latency", "concurrency")
RSS_GOAL = 5 * 1024 * 1024  # bytes, idle RSS of one instance
OVERHEAD_GOAL = 0.050  # seconds beyond the provider's own time
LATENCY_TRACE = "writer-1m-middle-docx"
UPLOAD_URL = "https://content.dropboxapi.com/2/files/upload"
UPLOAD_HOST = "content.dropboxapi.com"
UNSTRIPPED = os.path.join(common.REPO, "target", "x86_64-unknown-linux-gnu", "eps", "ec-eps")  # `make build`, profile eps


def lab_modules():
    lab = common.lab_module()
    import ec_protocol

    return ec_protocol, lab


quantile = common.quantile


def dropbox_headers(account, path):
    return [("Authorization", f"Bearer {account}"),
            ("Dropbox-API-Arg", json.dumps({"path": path, "mode": "overwrite"})),
            ("Content-Type", "application/octet-stream")]


# --------------------------------------------------------------------------
# Memory of a process

def memory(pid):
    """VmRSS, VmHWM, RssAnon, RssFile (bytes), Threads, and Pss (+ Pss_Anon,
    Pss_File when the kernel reports them) from /proc."""
    out = {}
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
            elif key == "Threads":
                out[key] = int(value)
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            key, _, value = line.partition(":")
            if key in ("Pss", "Pss_Anon", "Pss_File"):
                out[key] = int(value.split()[0]) * 1024
    return out


# --------------------------------------------------------------------------
# A direct client of the provider servers: the baseline

class _SniConnection(http.client.HTTPSConnection):
    """Connects to the test server's address but presents the provider's
    host name (SNI and certificate check), as the EPS does through its
    resolver override."""

    def __init__(self, address, port, server_name, context):
        super().__init__(address, port, context=context, timeout=120)
        self._server_name = server_name
        self._ctx = context

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self._server_name)


class DirectClient:
    """One persistent TLS connection to the provider servers."""

    def __init__(self, providers, host=UPLOAD_HOST):
        context = ssl.create_default_context(cafile=str(providers.ca))
        self.host = host
        self.conn = _SniConnection("127.0.0.1", providers.tls_port, host, context)

    def post(self, path, headers, body):
        """(status, response body)"""
        self.conn.request("POST", path, body=body, headers={"Host": self.host, **dict(headers)})
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self):
        self.conn.close()


# --------------------------------------------------------------------------
# Metrics of the EPS

def histograms(text, name):
    """{labels: {"sum", "count", "buckets": [(le, cumulative)]}} of one histogram."""
    out = {}
    pattern = re.compile(rf"^{name}_(sum|count|bucket)(\{{[^}}]*\}})? (\S+)")
    for line in text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        kind, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        le = re.search(r'le="([^"]+)"', labels)
        key = re.sub(r',?le="[^"]+"', "", labels).replace("{,", "{").replace("{}", "")
        entry = out.setdefault(key, {"sum": 0.0, "count": 0.0, "buckets": []})
        if kind == "bucket":
            entry["buckets"].append((float(le.group(1)), value))
        else:
            entry[kind] = value
    return out


def histogram_delta(before, after):
    """Observations between two scrapes: count, mean, and the upper bound of
    the bucket holding the median (the buckets double from 1 ms)."""
    rows = {}
    for key, entry in after.items():
        old = before.get(key, {"sum": 0.0, "count": 0.0, "buckets": []})
        count = entry["count"] - old["count"]
        if count <= 0:
            continue
        old_buckets = dict(old["buckets"])
        buckets = [(le, n - old_buckets.get(le, 0.0)) for le, n in entry["buckets"]]
        median_le = next((le for le, n in buckets if n >= count / 2), None)
        rows[key] = {"count": count, "mean": (entry["sum"] - old["sum"]) / count,
                     "median_bucket_le": median_le}
    return rows


# --------------------------------------------------------------------------
# 1. Binary size

def bench_size():
    _, lab = lab_modules()
    stripped = str(lab.EPS_BIN)
    verdict = subprocess.run(["file", "-b", stripped], capture_output=True, text=True).stdout.strip()
    rows = [{"binary": stripped, "bytes": os.path.getsize(stripped), "file": verdict}]
    if os.path.exists(UNSTRIPPED):
        rows.append({"binary": UNSTRIPPED, "bytes": os.path.getsize(UNSTRIPPED),
                     "file": subprocess.run(["file", "-b", UNSTRIPPED], capture_output=True,
                                            text=True).stdout.strip()})
    static = "statically linked" in verdict or "static-pie linked" in verdict
    crates = code_by_crate(UNSTRIPPED) if os.path.exists(UNSTRIPPED) else []
    common.table("EPS binary", ["binary", "size", "MiB", "file says"],
                 [[os.path.relpath(r["binary"], common.REPO), fmt_bytes(r["bytes"]),
                   f"{r['bytes'] / 2**20:.1f}", r["file"][:90]] for r in rows],
                 notes=["the unstripped build (profile eps) keeps its symbols for the table below; "
                        "`make build` strips it into .venv/bin"])
    if crates:
        total = sum(size for _, size in crates)
        common.table("Largest contributors to ec-eps code and read-only data (symbol sizes)",
                     ["crate / symbol", "size", "share"],
                     [[name, fmt_bytes(size), f"{100 * size / total:.1f}%"] for name, size in crates[:15]],
                     notes=[f"{fmt_bytes(total)} in text and rodata symbols of the unstripped binary "
                            "(`nm -S -C`), grouped by the first path segment of the demangled name"])
    goals = [goal("ec-eps is one static binary", static, verdict.split(",")[3].strip()
                  if verdict.count(",") > 3 else verdict)]
    return {"size": rows}, goals


def code_by_crate(binary):
    """[(crate, bytes)] of text and read-only symbols, largest first."""
    try:
        out = subprocess.run(["nm", "-S", "-C", "--size-sort", binary], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    sizes = {}
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4 or parts[2] not in "tTrR":
            continue
        name = re.sub(r"^(core::ptr::drop_in_place<|_<|<)", "", parts[3].lstrip("<&*( ")).lstrip("<&*( ")
        match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
        crate = match.group(1) if match else ("(C code and other)" if parts[2] in "tT" else "(data)")
        sizes[crate] = sizes.get(crate, 0) + int(parts[1], 16)
    return sorted(sizes.items(), key=lambda kv: -kv[1])


# --------------------------------------------------------------------------
# 2. Idle memory

# glibc malloc settings (the static binary reads them from the environment):
# one arena instead of one per worker thread, and a fixed mmap threshold, so
# freed patch and rebuild buffers go back to the system instead of raising
# glibc's dynamic thresholds and staying in the heap.
RSS_VARIANTS = (
    ("default", {}, {}),
    ("MALLOC_ARENA_MAX=1", {"MALLOC_ARENA_MAX": "1"}, {}),
    ("arena_max=1, mmap/trim threshold 128 KiB",
     {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=131072:"
                        "glibc.malloc.trim_threshold=131072"}, {}),
    # The document contents the core keeps for the next patch, let go of
    # before the reading (by default after 30 s without a save).
    ("kept_content_idle_s 1", {}, {"kept_content_idle_s": 1}),
)


def bench_rss(workdir, idle, saves, traces, trace_name):
    p, lab_mod = lab_modules()
    trace = trace_pair(traces, trace_name)
    rows = []
    with lab_mod.Lab(os.path.join(workdir, "rss")) as lab:
        for variant, env, config in RSS_VARIANTS:
            eps = lab.start_eps(f"rss-{len(rows)}", env=env, **config)
            time.sleep(0.5)
            start = memory(eps.proc.pid)
            client = eps.client()
            doc = p.DocKey(p.DROPBOX, b"rss", b"/rss/doc.docx")
            headers = dropbox_headers("rss", "/rss/doc.docx")
            versions = [trace[0], trace[1]]
            previous = None
            for i in range(saves + 1):
                target = versions[i % 2]
                outcome = client.save_single("POST", UPLOAD_URL, headers, target, previous, doc)
                if not isinstance(outcome, p.ProviderResponse) or not outcome.succeeded:
                    raise common.BenchError(f"rss: save {i} failed: {outcome!r}")
                previous = target
            time.sleep(idle)
            after = memory(eps.proc.pid)
            client.close()
            eps.stop()
            for when, m in (("after start", start), (f"{saves + 1} saves + {idle:g} s idle", after)):
                rows.append({"variant": variant, "when": when, **m})
    common.table(f"Idle memory of one EPS instance (saves of {trace_name})",
                 ["variant", "when", "VmRSS", "VmHWM", "RssAnon", "RssFile", "Pss", "threads"],
                 [[r["variant"], r["when"], fmt_kib(r["VmRSS"]), fmt_kib(r["VmHWM"]),
                   fmt_kib(r["RssAnon"]), fmt_kib(r["RssFile"]), fmt_kib(r["Pss"]),
                   str(r["Threads"])] for r in rows],
                 notes=["RssFile = pages of the ec-eps binary mapped from the page cache "
                        "(code and read-only data): shared by every instance of the same file, "
                        "clean, reclaimable",
                        "RssAnon = the instance's own memory (heap, stacks, relocated data)",
                        "Pss divides shared pages among every process mapping them, including "
                        "other ec-eps processes running on this machine at the time"])
    goals = []
    for variant, what in (("default", "within 30 s of a save"), ("kept_content_idle_s 1", "contents let go of")):
        row = next(r for r in rows if r["variant"] == variant and r["when"] != "after start")
        goals.append(goal(f"idle RSS of one instance < 5 MB ({what})", row["VmRSS"] < RSS_GOAL,
                          f"VmRSS {fmt_kib(row['VmRSS'])} (own memory RssAnon "
                          f"{fmt_kib(row['RssAnon'])}, binary pages RssFile {fmt_kib(row['RssFile'])})"))
    return {"rss": rows}, goals


def fmt_kib(n):
    return f"{n / 1024:.0f} KiB" if n < 10 * 2**20 else f"{n / 2**20:.1f} MiB"


# --------------------------------------------------------------------------
# 3. Rebuild-and-forward time

trace_pair = common.trace_pair


def capacity_sample(docx):
    with zipfile.ZipFile(io.BytesIO(docx)) as archive:
        return archive.read("word/document.xml")


def bench_latency(workdir, reps, traces, trace_name, env, wait_quiet):
    p, lab_mod = lab_modules()
    base, new = trace_pair(traces, trace_name)
    # The rebuild deflates on every CPU, so its time depends on whether the
    # second CPU is free: measured before and after as speed.py does.
    sample = capacity_sample(new)
    capacity = [speed.parallel_capacity(sample)]
    deadline = time.monotonic() + wait_quiet
    while capacity[0] < 1.7 and time.monotonic() < deadline:
        progress(f"  latency: parallel capacity {capacity[0]:.2f}; waiting for a quieter machine")
        time.sleep(10)
        capacity[0] = speed.parallel_capacity(sample)
    versions = (base, new)
    eps_path, direct_path = "/bench/latency.docx", "/bench/direct.docx"
    doc = p.DocKey(p.DROPBOX, b"bench", eps_path.encode())
    eps_headers = dropbox_headers("bench", eps_path)
    direct_headers = dropbox_headers("bench", direct_path)
    # The device's patches, made before any timing (both directions, since
    # the saves alternate base -> new -> base).
    items = [p.make_item(versions[(i + 1) % 2], doc, versions[i % 2]) for i in range(2)]
    for item in items:
        if item.patch is None:
            raise common.BenchError("the device made no patch for the one-character edit")
    patch_bytes = [len(item.patch) for item in items]
    request = p.ProviderRequest("POST", UPLOAD_URL, eps_headers)

    times = {"eps": [], "direct": []}
    with lab_mod.Lab(os.path.join(workdir, "latency")) as lab:
        eps = lab.start_eps("latency", env=env)
        client = eps.client()
        direct = DirectClient(lab.providers)
        # Seed: the EPS learns the base from a FULL save; the direct path
        # gets its file too, so both then overwrite an existing file; one
        # warm-up round opens the connections.
        outcome = client.save_single("POST", UPLOAD_URL, eps_headers, base, None, doc)
        if not isinstance(outcome, p.ProviderResponse) or not outcome.succeeded:
            raise common.BenchError(f"latency: seeding save failed: {outcome!r}")
        status, body = direct.post("/2/files/upload", direct_headers, base)
        if status != 200:
            raise common.BenchError(f"latency: direct upload failed: {status} {body[:200]!r}")
        before = eps.metrics()
        load_before = os.getloadavg()[0]
        for rep in range(reps):
            if rep % 10 == 0:
                progress(f"  latency: round {rep + 1}/{reps}")
            item = items[rep % 2]  # rep 0 sends new (patch against base), rep 1 base, ...
            start = time.perf_counter()
            outcome = client.save(p.SINGLE, [request], [item])
            times["eps"].append(time.perf_counter() - start)
            if not isinstance(outcome, p.ProviderResponse) or outcome.status != 200:
                raise common.BenchError(f"latency: EPS save {rep} failed: {outcome!r}")
            start = time.perf_counter()
            status, body = direct.post("/2/files/upload", direct_headers, item.target)
            times["direct"].append(time.perf_counter() - start)
            if status != 200:
                raise common.BenchError(f"latency: direct upload {rep} failed: {status} {body[:200]!r}")
        after = eps.metrics()
        capacity.append(speed.parallel_capacity(sample))
        last = items[(reps - 1) % 2].target
        held = {f["path"].lower(): f for f in lab.providers.files("dropbox")}
        for path in (eps_path, direct_path):
            if held.get(path, {}).get("sha256") != hashlib.sha256(last).hexdigest():
                raise common.BenchError(f"latency: the provider holds a wrong {path}: {held.get(path)}")
        base_unknown = eps.metric("ec_eps_base_unknown_total")
        device_in = eps.metric("ec_eps_device_bytes_total", 'direction="in"')
        client.close()
        direct.close()

    if base_unknown:
        raise common.BenchError(f"latency: the EPS reported base_unknown {base_unknown:g} times")
    diffs = [a - b for a, b in zip(times["eps"], times["direct"])]
    eps_hist = {name: histogram_delta(histograms(before, name), histograms(after, name))
                for name in ("ec_eps_save_seconds", "ec_eps_rebuild_seconds",
                             "ec_eps_provider_request_seconds")}

    def row(label, values):
        return [label, fmt_time(statistics.median(values)), fmt_time(quantile(values, 0.9)),
                fmt_time(min(values)), fmt_time(max(values))]

    common.table(f"Rebuild-and-forward: one typed character in {trace_name} "
                 f"({fmt_bytes(len(new))} file, patch {fmt_bytes(patch_bytes[0])}), {reps} rounds",
                 ["path", "median", "p90", "min", "max"],
                 [row("(a) device -> EPS (patch) -> provider, round trip", times["eps"]),
                  row("(b) device -> provider directly (whole file)", times["direct"]),
                  row("(c) = (a) - (b), paired per round", diffs)],
                 notes=[f"1-minute load average before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
                        "(2 CPUs; the rebuild deflates on both)",
                        f"parallel capacity before / after (speed.py's measure, 2.0 = both CPUs free): "
                        f"{capacity[0]:.2f} / {capacity[1]:.2f}",
                        f"median(a) - median(b) = {fmt_time(statistics.median(times['eps']) - statistics.median(times['direct']))}",
                        "(b) is a persistent TLS connection from Python to the same test server, "
                        "same headers, same bytes, same host name"])
    hist_rows = []
    for name, entries in eps_hist.items():
        for labels, h in entries.items():
            hist_rows.append([name + labels, f"{h['count']:.0f}", fmt_time(h["mean"]),
                              f"<= {fmt_time(h['median_bucket_le'])}"])
    common.table("The EPS's own histograms over the timed rounds (/metrics)",
                 ["histogram", "count", "mean", "median bucket"], hist_rows,
                 notes=["ec_eps_rebuild_seconds: applying the patch and checking SHA-256; "
                        "provider_request: one HTTP exchange with the provider"])
    overhead = statistics.median(diffs)
    goals = [goal("rebuild-and-forward adds < 50 ms to the provider's own time",
                  overhead < OVERHEAD_GOAL,
                  f"median (a)-(b) {fmt_time(overhead)}, p90 {fmt_time(quantile(diffs, 0.9))} "
                  f"over {reps} rounds")]
    data = {"latency": {"trace": trace_name, "file_bytes": len(new), "patch_bytes": patch_bytes,
                        "reps": reps, "seconds": times, "parallel_capacity": capacity, "paired_diff": diffs,
                        "eps_histograms": eps_hist, "device_bytes_in": device_in}}
    return data, goals


# --------------------------------------------------------------------------
# 4. Many users at once

def concurrency_traces(traces):
    """The LibreOffice traces with an edit (every app and format), in a fixed order."""
    manifest = common.load_manifest(traces)
    pairs = [(t["name"], common.read(os.path.join(traces, t["base"])),
              common.read(os.path.join(traces, t["new"])), t["format"])
             for t in manifest["traces"] if t["edit"] != "noedit"]
    if not pairs:
        raise common.BenchError(f"no traces with an edit in {traces}")
    return pairs


def burst(workers, fn):
    """Runs fn(i) on every worker thread at one instant; returns [(seconds, error)]."""
    barrier = threading.Barrier(len(workers) + 1)
    results = [None] * len(workers)

    def run(i):
        barrier.wait()
        start = time.perf_counter()
        try:
            error = fn(i)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
            error = f"{type(exc).__name__}: {exc}"
        results[i] = (time.perf_counter() - start, error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    barrier.wait()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - started


def bench_concurrency(workdir, users_list, rounds, traces, env):
    p, lab_mod = lab_modules()
    pairs = concurrency_traces(traces)
    rows, errors_seen = [], []
    for users in users_list:
        progress(f"  concurrency: {users} users")
        with lab_mod.Lab(os.path.join(workdir, f"users-{users}")) as lab:
            instances = [lab.start_eps(f"u{i}", env=env) for i in range(users)]
            clients = [eps.client() for eps in instances]
            directs = [DirectClient(lab.providers) for _ in range(users)]
            work = []
            for i in range(users):
                name, base, new, fmt = pairs[i % len(pairs)]
                path = f"/docs/{name}.{fmt}"
                doc = p.DocKey(p.DROPBOX, f"u{i}".encode(), path.encode())
                items = [p.make_item(new, doc, base), p.make_item(base, doc, new)]
                work.append({"doc": doc, "path": path, "base": base, "items": items,
                             "request": p.ProviderRequest("POST", UPLOAD_URL, dropbox_headers(f"u{i}", path)),
                             "direct_headers": dropbox_headers(f"u{i}", f"/direct/{name}.{fmt}")})

            def seed(i):
                w = work[i]
                outcome = clients[i].save(p.SINGLE, [w["request"]], [p.SaveItem(w["base"], w["doc"])])
                if not isinstance(outcome, p.ProviderResponse) or outcome.status != 200:
                    return f"seed: {outcome!r}"
                status, body = directs[i].post("/2/files/upload", w["direct_headers"], w["base"])
                return None if status == 200 else f"seed direct: {status} {body[:100]!r}"

            results, _ = burst(work, seed)
            seed_errors = [e for _, e in results if e]
            if seed_errors:
                raise common.BenchError(f"concurrency: seeding failed: {seed_errors[:3]}")

            lat = {"eps": [], "direct": []}
            walls = {"eps": [], "direct": []}
            errors = []
            for rnd in range(rounds):
                def eps_save(i, rnd=rnd):
                    outcome = clients[i].save(p.SINGLE, [work[i]["request"]], [work[i]["items"][rnd % 2]])
                    ok = isinstance(outcome, p.ProviderResponse) and outcome.status == 200
                    return None if ok else repr(outcome)[:200]

                def direct_save(i, rnd=rnd):
                    status, body = directs[i].post("/2/files/upload", work[i]["direct_headers"],
                                                   work[i]["items"][rnd % 2].target)
                    return None if status == 200 else f"{status} {body[:100]!r}"

                for kind, fn in (("eps", eps_save), ("direct", direct_save)):
                    results, wall = burst(work, fn)
                    walls[kind].append(wall)
                    lat[kind] += [t for t, _ in results]
                    errors += [f"{kind} round {rnd}: {e}" for _, e in results if e]

            # What the provider holds must be what every device saved last.
            held = {(f["account"], f["path"].lower()): f["sha256"] for f in lab.providers.files("dropbox")}
            wrong = 0
            for i, w in enumerate(work):
                want = hashlib.sha256(w["items"][(rounds - 1) % 2].target).hexdigest()
                if held.get((f"u{i}", w["path"].lower())) != want:
                    wrong += 1
            base_unknown = sum(eps.metric("ec_eps_base_unknown_total") for eps in instances)
            mems = [memory(eps.proc.pid) for eps in instances]
            for client in clients:
                client.close()
            for direct in directs:
                direct.close()
        if wrong:
            errors.append(f"{wrong} provider files differ from the device's")
        errors_seen += errors
        rows.append({"users": users, "rounds": rounds, "patch_saves": users * rounds,
                     "eps_seconds": lat["eps"], "direct_seconds": lat["direct"],
                     "eps_burst_wall": walls["eps"], "direct_burst_wall": walls["direct"],
                     "errors": errors, "base_unknown": base_unknown,
                     "rss_total": sum(m["VmRSS"] for m in mems),
                     "pss_total": sum(m["Pss"] for m in mems),
                     "anon_total": sum(m["RssAnon"] for m in mems),
                     "loadavg_1min": os.getloadavg()[0]})

    table_rows = []
    for r in rows:
        for kind in ("eps", "direct"):
            values = r[f"{kind}_seconds"]
            table_rows.append([
                str(r["users"]), "EPS (patch)" if kind == "eps" else "direct (file)",
                str(len(values)), fmt_time(statistics.median(values)), fmt_time(quantile(values, 0.99)),
                fmt_time(max(values)), fmt_time(statistics.median(r[f"{kind}_burst_wall"])),
                str(sum(e.startswith(kind) for e in r["errors"])),
                fmt_kib(r["rss_total"]) if kind == "eps" else "-",
                fmt_kib(r["pss_total"]) if kind == "eps" else "-",
                fmt_kib(r["anon_total"]) if kind == "eps" else "-",
                f"{r['loadavg_1min']:.1f}" if kind == "eps" else "-"])
    common.table("Concurrent saves: N users, one EPS process each, all saving at once",
                 ["users", "path", "saves", "p50", "p99", "max", "burst wall", "errors",
                  "EPS RSS sum", "EPS PSS sum", "EPS anon sum", "load"], table_rows,
                 notes=[f"{len(pairs)} LibreOffice traces (docx, odt, xlsx, ods, pptx, odp; 5 kB-406 kB) "
                        "assigned to users in turn; Dropbox /2/files/upload; each user seeds a base "
                        "with one FULL save first",
                        "p50/p99/max over every save of every round; burst wall = median time "
                        "from the barrier to the last save of a round",
                        "PSS sum counts the shared binary pages once in total, RSS sum once per instance; "
                        "anon = the instances' own memory (RssAnon), after the last round",
                        "load = 1-minute load average at the end (2 CPUs)"])
    goals = []
    for r in rows:
        if r["users"] == max(users_list):
            goals.append(goal(f"{r['users']} concurrent saves from {r['users']} users, zero errors",
                              not r["errors"],
                              f"{len(r['errors'])} errors; EPS p50 {fmt_time(statistics.median(r['eps_seconds']))}, "
                              f"p99 {fmt_time(quantile(r['eps_seconds'], 0.99))} vs direct p50 "
                              f"{fmt_time(statistics.median(r['direct_seconds']))}, "
                              f"p99 {fmt_time(quantile(r['direct_seconds'], 0.99))}"))
    for e in errors_seen[:10]:
        progress(f"  error: {e}")
    return {"concurrency": rows}, goals, bool(errors_seen)


# --------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=common.DEFAULT_TRACES,
                        help="folder with the traces' manifest.json (default: .cache/traces)")
    parser.add_argument("--only", action="append", choices=SECTIONS,
                        help="run only this part (repeatable; default: all)")
    parser.add_argument("--reps", type=int, help="latency rounds (default 40; quick: 5)")
    parser.add_argument("--users", help="user counts for the concurrency part, comma separated "
                                        "(default 1,10,100; quick: 1,4)")
    parser.add_argument("--rounds", type=int, help="concurrent bursts per user count (default 5; quick: 2)")
    parser.add_argument("--idle", type=float, help="seconds idle before the RSS reading (default 5; quick: 1)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="the latency part waits up to SECONDS for two free CPUs before timing")
    parser.add_argument("--eps-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment of the EPS instances of the latency and concurrency "
                             "parts (repeatable), e.g. MALLOC_ARENA_MAX=1")
    parser.add_argument("--quick", action="store_true",
                        help="few rounds, few users, the 100k trace (seconds, not minutes)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    args = parser.parse_args(argv)
    reps = args.reps or (5 if args.quick else 40)
    users = [int(u) for u in (args.users or ("1,4" if args.quick else "1,10,100")).split(",")]
    rounds = args.rounds or (2 if args.quick else 5)
    idle = args.idle if args.idle is not None else (1.0 if args.quick else 5.0)
    trace_name = "writer-100k-middle-docx" if args.quick else LATENCY_TRACE
    sections = args.only or SECTIONS
    eps_env = dict(item.split("=", 1) for item in args.eps_env)

    info = common.machine()
    print(f"# EPS benchmarks{' (quick)' if args.quick else ''}")
    print(common.machine_line(info))
    print(f"EPS environment (latency, concurrency): {eps_env or 'default'}\n", flush=True)
    data, goals, failed = {}, [], False
    try:
        with tempfile.TemporaryDirectory(prefix="eps-bench-") as workdir:
            if "size" in sections:
                d, g = bench_size()
                data.update(d)
                goals += g
            if "rss" in sections:
                d, g = bench_rss(workdir, idle, 4, args.traces, trace_name)
                data.update(d)
                goals += g
            if "latency" in sections:
                d, g = bench_latency(workdir, reps, args.traces, trace_name, eps_env, args.wait_quiet)
                data.update(d)
                goals += g
            if "concurrency" in sections:
                d, g, failed = bench_concurrency(workdir, users, rounds, args.traces, eps_env)
                data.update(d)
                goals += g
    except common.BenchError as error:
        print(f"eps_bench: {error}", file=sys.stderr)
        return 1
    common.print_goals(goals)
    common.write_json(args.json, "eps_bench",
                      {"reps": reps, "users": users, "rounds": rounds, "idle_s": idle,
                       "trace": trace_name, "quick": args.quick, "eps_env": eps_env, "sections": list(sections)},
                      [], goals, extra=data)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
