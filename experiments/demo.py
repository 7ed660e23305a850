#!/usr/bin/env python3
"""EdgeCourier demo: what one save of an office document costs, with and without.

1. Writes a Writer document with about 100 KB of text and has LibreOffice
   save it as .docx (the last-synced version).
2. Types one character in the middle and has LibreOffice save it again.
3. Makes the EdgeCourier edit patch, rebuilds the new file from the old one
   and the patch, and checks the SHA-256 is the one LibreOffice wrote.
4. Prints what the save would cost on the wire: the whole file (what every
   cloud client uploads today), zstd's --patch-from delta of the whole file,
   and the EdgeCourier patch.
5. Runs the whole system on this machine: the edge manager (`ec-edge`,
   process runtime) runs on the "access point"; the operator adds the user,
   and the laptop joins with the credential it was given
   (`python -m ec_proxy join`), which gets it its own EPS (`ec-eps`,
   started by the manager as an unprivileged process in its own cgroup)
   and runs the device proxy (`ec-proxy`: mitmproxy and the EdgeCourier
   addon) through it. Debian's rclone syncs the two saves to Dropbox
   through the proxy; the EPS uploads them to a local Dropbox that follows
   Dropbox's API documentation (`testbed/providers`, reached as the real
   host names over TLS with a test CA). Checks that the provider holds the
   exact bytes (its content_hash, and rclone's own check), prints the bytes
   on the device's link against a whole upload, and the manager's view of
   the instance (`ec-edge list`).
6. Summarises all the LibreOffice edit traces (`make traces`).

Run it with `make demo` (which builds everything first).
"""

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "traces"))

import ec_patch  # noqa: E402  (the Rust core, built by `make build`)
import make_traces as lo  # noqa: E402  (LibreOffice driving, shared with the trace generator)


def zstd_patch_from(base: Path, new: Path) -> int:
    out = subprocess.run(["zstd", "-19", "-q", "-c", f"--patch-from={base}", str(new)],
                         check=True, capture_output=True)
    return len(out.stdout)


def save_with_libreoffice(work: Path, name: str, paragraphs, meta, soffice, profile) -> Path:
    source = work / f"{name}.fodt"
    source.write_text(lo.writer_source(paragraphs, meta), encoding="utf-8")
    batch = lo.Batch("demo", "writer", "docx", [str(source)], str(work / name))
    lo.convert(soffice, batch, str(profile), lambda line: print(f"   {line}"))
    return Path(batch.outputs()[0])


def live_edit(work: Path) -> None:
    soffice = lo.soffice_path()
    profile = work / "profile"
    print("1. LibreOffice saves a document with 100 KB of text as .docx")
    paragraphs = lo.prose("demo", 100_000)
    base = save_with_libreoffice(work, "base", paragraphs, lo.BASE_META, soffice, profile)
    time.sleep(1.1)  # a later save gets later ZIP timestamps, as in real life
    print("2. one character typed in the middle, saved again")
    edited = lo.writer_edit(paragraphs, "middle")
    new = save_with_libreoffice(work, "new", edited.content, lo.RESAVED_META, soffice, profile)
    base_bytes, new_bytes = base.read_bytes(), new.read_bytes()

    print("3. EdgeCourier: diff on the device, rebuild on the edge")
    t0 = time.perf_counter()
    patch = ec_patch.diff(base_bytes, new_bytes)
    t1 = time.perf_counter()
    rebuilt = ec_patch.apply(base_bytes, patch)
    t2 = time.perf_counter()
    same = hashlib.sha256(rebuilt).hexdigest() == hashlib.sha256(new_bytes).hexdigest()
    print(f"   patch made in {1000 * (t1 - t0):.1f} ms (verified), file rebuilt in {1000 * (t2 - t1):.1f} ms")
    print(f"   rebuilt SHA-256 {hashlib.sha256(rebuilt).hexdigest()[:16]}... "
          f"{'equals' if same else 'DIFFERS FROM'} what LibreOffice wrote")
    if not same:
        raise SystemExit("demo: the rebuilt file differs: this is a bug, please report it")
    info = ec_patch.inspect(patch, base_bytes)
    for m in info["rebuilt_members"]:
        print(f"     {m['name']}: {m['middle']} middle of {m['middle_bytes']} bytes, recipe {m['recipe']}")

    print("\n4. What this save costs on the wire")
    rows = [("whole file (today's cloud clients)", len(new_bytes)),
            ("zstd -19 --patch-from (whole-file delta)", zstd_patch_from(base, new)),
            ("EdgeCourier edit patch", len(patch))]
    for label, size in rows:
        print(f"   {label:44} {size:>9,} bytes  {100 * size / len(new_bytes):6.2f}%")
    print(f"   saved: {len(new_bytes) - len(patch):,} of {len(new_bytes):,} bytes "
          f"({len(new_bytes) / len(patch):.0f}x less than the whole file)")
    return base_bytes, new_bytes


def proxy_totals(proxy) -> dict:
    out = subprocess.run([sys.executable, "-m", "ec_proxy", "status", "--state", str(proxy.state), "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)["total"]


def instance_view(edge, instance: str, saves: int, timeout: float = 10) -> dict:
    """The manager's view of the instance once it has gathered the EPS's counters for `saves` saves."""
    deadline = time.monotonic() + timeout
    while True:
        view = edge.operator().call("GET", f"/v1/instances/{instance}")
        if view["saves"] >= saves or time.monotonic() > deadline:
            return view
        time.sleep(0.25)


def through_the_system(work: Path, base_bytes: bytes, new_bytes: bytes) -> None:
    """Step 5: ec-edge gives the user an EPS; the laptop joins; rclone -> ec-proxy -> the user's EPS -> the local Dropbox."""
    import secrets

    from testbed.edge import EdgeManager, join_proxy
    from testbed.lab import Lab
    from testbed.providers.hashes import dropbox_content_hash
    from testbed.rclone import RcloneRemote, write_save

    print("\n5. The whole system on this machine: rclone (Debian's, unmodified) -> ec-proxy (mitmproxy)")
    print("   -> the user's EPS (ec-eps, started by the edge manager ec-edge) -> a local Dropbox (testbed, real TLS and host names)")
    work.chmod(0o711)  # the EPS runs as a uid of its own and must reach its folder below this one
    user = f"demo-{secrets.token_hex(2)}"  # cgroups are named after instances host-wide: not "demo" for every run
    with Lab(work / "lab") as lab, EdgeManager(lab, work / "edge", runtime="process") as edge:
        credential = edge.add_user(user)
        print(f"   operator: `ec-edge add-user {user}` -> a credential for the user's devices "
              f"(ecu1.{user}.<secret>.<the manager's key pin {credential.rsplit('.', 1)[1][:12]}…>)")
        proxy, seconds = join_proxy(lab, edge.device_addr, "demo-laptop", credential)
        joined = json.loads((proxy.state / "edge" / "enrolment.json").read_text())
        inst = joined["instance"]
        print(f"   laptop: `python -m ec_proxy join --credential @FILE --service dropbox` -> joined in {joined['join_seconds']:.2f} s:")
        print(f"     the manager created {inst['id']} ({inst['runtime']} runtime, {inst['limits']['memory_bytes'] >> 20} MiB, "
              f"{inst['limits']['cpu_millis'] / 1000:g} CPU), ready in {inst['ready_seconds']:.2f} s, at {joined['enrolment']['url']};")
        print(f"     the enrolment bundle (key id, secret, the EPS's pin) is kept owner-only in the laptop's state folder;"
              f" proxying {seconds:.1f} s after the command started")
        eps_log = edge.state / "logs" / f"{inst['id']}.log"
        remote = RcloneRemote("dropbox", lab.providers, proxy.url, proxy.ca, work / "rclone", account="demo-user")
        local = work / "sync"
        local.mkdir()
        rows = []
        for i, (label, data) in enumerate((("first save (whole file; both sides learn it)", base_bytes),
                                           ("second save (one character typed)", new_bytes))):
            write_save(local / "report.docx", data, i)
            before = proxy_totals(proxy)
            t0 = time.perf_counter()
            remote.copy(local, "Documents")
            seconds = time.perf_counter() - t0
            after = proxy_totals(proxy)
            held = [f for f in lab.providers.files("dropbox") if f["path"].lower() == "/documents/report.docx"]
            if not held or held[0]["provider_hash"]["content_hash"] != dropbox_content_hash(data):
                raise SystemExit(f"demo: the provider does not hold what rclone uploaded; logs: {proxy.log_path}, {eps_log}")
            rows.append((label, after["sent_bytes"] - before["sent_bytes"], after["whole_bytes"] - before["whole_bytes"], seconds))
        report = remote.check(local, "Documents")
        print(f"   {'':46} {'device link':>12} {'whole upload':>13} {'rclone copy':>12}")
        for label, sent, whole, seconds in rows:
            print(f"   {label:46} {sent:>10,} B {whole:>11,} B {1000 * seconds:>9.0f} ms")
        verdict = " ".join(line.split(": ", 2)[-1] for line in report.strip().splitlines() if "matching" in line or "differences" in line)
        print(f"   rclone check (Dropbox content_hash): {verdict}")
        sent, whole = rows[1][1], rows[1][2]
        print(f"   the edit cost {sent:,} bytes on the device's link instead of {whole:,} ({whole / max(sent, 1):.0f}x less)")
        print("   (device link: both directions between ec-proxy and ec-eps, HTTP framing included;")
        print("    `python -m ec_proxy status --state <folder>` shows these counts per document)")
        view = instance_view(edge, inst["id"], len(rows))
        print(f"   the edge manager's view (`ec-edge list`; {view['saves']} saves, {view['bytes_saved']:,} bytes the device's link did not carry):")
        for line in edge.cli("list").stdout.rstrip().splitlines():
            print(f"     {line.rstrip()}")


def trace_summary(traces: Path) -> None:
    manifest = json.loads((traces / "manifest.json").read_text())
    by_format = defaultdict(list)
    for t in manifest["traces"]:
        base, new = traces / t["base"], traces / t["new"]
        b, n = base.read_bytes(), new.read_bytes()
        patch = ec_patch.diff(b, n)
        assert ec_patch.apply(b, patch) == n, t["name"]
        by_format[t["format"]].append((len(n), len(patch), zstd_patch_from(base, new)))
    print(f"\n6. Over all {len(manifest['traces'])} LibreOffice edit traces (each rebuilt exactly):")
    print(f"   {'format':6} {'traces':>6} {'median file':>12} {'median zstd':>12} {'median ours':>12} {'median ratio':>13}")
    for fmt in ("docx", "odt", "xlsx", "ods", "pptx", "odp"):
        rows = by_format.get(fmt, [])
        if not rows:
            continue
        med = lambda i: statistics.median(r[i] for r in rows)  # noqa: E731
        ratio = statistics.median(r[2] / r[1] for r in rows)
        print(f"   {fmt:6} {len(rows):>6} {med(0):>12,.0f} {med(2):>12,.0f} {med(1):>12,.0f} {ratio:>12.1f}x")
    print("   (ratio = zstd's whole-file delta / EdgeCourier patch; see docs/benchmarks.md)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, help="folder of LibreOffice edit traces (make traces) to summarise")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edgecourier-demo-") as work:
        base_bytes, new_bytes = live_edit(Path(work))
        through_the_system(Path(work), base_bytes, new_bytes)
    if args.traces:
        trace_summary(args.traces)


if __name__ == "__main__":
    main()
