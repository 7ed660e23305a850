#!/usr/bin/env python3
"""Replay a real editing session through EdgeCourier: every save, real documents, a real client.

The session is a keystroke-level recording from ../shared/traces/editing
(josephg/editing-traces by Joseph Gentle and contributors, CC BY 4.0,
https://creativecommons.org/licenses/by/4.0/; the folder is set by
EC_EDITING_TRACES, default ../shared/traces/editing beside the repository).
A save policy picks moments of the session; the text at each becomes an
office document written by LibreOffice (docx/odt: one paragraph per line,
markdown `#` lines as headings; xlsx/ods: one row per line; pptx/odp: a
slide per 8 lines), and an unmodified rclone saves each one in turn to
Dropbox through ec-proxy and the user's EPS, on the netns testbed
(experiments/netlab). With --direct (the default) every version is also
saved straight to the cloud, the baseline of the same run.

Per save and in total: bytes on the device's link (the kernel's counters
of the device's interface, both ways), what ec-proxy sent for the upload,
the whole file (what a direct upload sends), the direct path's link bytes,
the time of each save, how ec-proxy sent it (patch or whole), and the
provider's check (the Dropbox content_hash the provider reports for the
file against the hash of the document LibreOffice wrote).

Save policies: every:S (after S seconds of the recording's time since the
last save), keys:N (every N edits), idle:S (when the author pauses S
seconds or more); the end of the session is always saved.

    .venv/bin/python experiments/replay/replay.py clownschool_flat --policy every:60 --format docx
    .venv/bin/python experiments/replay/replay.py seph-blog1 --policy idle:300 --max-saves 50 --format odt
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPERIMENTS = HERE.parent
sys.path.insert(0, str(EXPERIMENTS / "paper"))
sys.path.insert(0, str(EXPERIMENTS / "netlab"))
sys.path.insert(0, str(EXPERIMENTS / "traces"))
import figures  # noqa: E402
import make_traces as lo  # noqa: E402
import netlab  # noqa: E402
import profiles  # noqa: E402

FORMATS = {"docx": "writer", "odt": "writer", "xlsx": "calc", "ods": "calc", "pptx": "impress", "odp": "impress"}
LINES_PER_SLIDE = 8
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclasses.dataclass
class Save:
    index: int
    edits: int  # transactions applied so far
    at: datetime.datetime
    text: str


def load_session(name: str) -> dict:
    folder = figures.editing_traces()
    path = folder / (name if name.endswith(".json.gz") else f"{name}.json.gz")
    if not path.exists():
        raise SystemExit(f"replay: no editing trace {path} (set {figures.TRACES_ENV}; "
                         f"known: {', '.join(p.name for p in folder.glob('*.json.gz'))})")
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return json.load(file)


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def saves(session: dict, policy: str, max_saves: int | None = None) -> list[Save]:
    """The text at each moment the policy saves (positions count code points: Python str indices)."""
    kind, _, value = policy.partition(":")
    if kind not in ("every", "keys", "idle") or not value:
        raise SystemExit(f"replay: bad policy {policy!r} (every:SECONDS, keys:N or idle:SECONDS)")
    limit = float(value)
    txns = session["txns"]
    text = session.get("startContent", "")
    out: list[Save] = []
    last_save_time = parse_time(txns[0]["time"]) if txns else None
    since = 0
    for i, txn in enumerate(txns):
        for position, deleted, inserted in txn["patches"]:
            text = text[:position] + inserted + text[position + deleted:]
        since += 1
        now = parse_time(txn["time"])
        if kind == "every":
            due = (now - last_save_time).total_seconds() >= limit
        elif kind == "keys":
            due = since >= limit
        else:
            due = i + 1 < len(txns) and (parse_time(txns[i + 1]["time"]) - now).total_seconds() >= limit
        if due or i + 1 == len(txns):
            out.append(Save(len(out) + 1, i + 1, now, text))
            last_save_time, since = now, 0
            if max_saves and len(out) >= max_saves:
                break
    if not max_saves or len(out) < max_saves:
        assert text == session["endContent"], "the replayed text differs from the trace's endContent"
    return out


def clean(line: str) -> str:
    return _XML_INVALID.sub("", line)


def source_for(fmt: str, text: str, save: Save) -> str:
    lines = [clean(line) for line in text.split("\n")]
    meta = lo.Meta(save.at.strftime("%Y-%m-%dT%H:%M:%S"), save.index, save.index)
    app = FORMATS[fmt]
    if app == "writer":
        paragraphs = [lo.Paragraph(lo.HEADING_STYLE if line.startswith("#") else lo.BODY_STYLE,
                                   ((None, line.lstrip("#").strip() if line.startswith("#") else line),))
                      for line in lines]
        return lo.writer_source(paragraphs, meta)
    if app == "calc":
        rows = "".join(f"<table:table-row>{lo.string_cell(line)}</table:table-row>\n" if line else
                       "<table:table-row><table:table-cell/></table:table-row>\n" for line in lines)
        table = ('<office:spreadsheet><table:table table:name="Text">'
                 f'<table:table-column/>\n{rows}</table:table></office:spreadsheet>')
        return lo.flat_document("calc", meta, table)
    deck = []
    for start in range(0, max(len(lines), 1), LINES_PER_SLIDE):
        chunk = lines[start:start + LINES_PER_SLIDE] or [""]
        deck.append(lo.Slide(chunk[0][:80] or f"Slide {len(deck) + 1}", (tuple(chunk[1:]) or ("",),)))
    return lo.impress_source(deck, meta)


def make_documents(fmt: str, points: list[Save], work: Path, say) -> list[Path]:
    """One LibreOffice invocation converts every save of the session."""
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    sources = []
    for save in points:
        path = src / f"save-{save.index:04d}.fodt"
        path.write_text(source_for(fmt, save.text, save), encoding="utf-8")
        sources.append(str(path))
    batch = lo.Batch("replay", FORMATS[fmt], fmt, sources, str(work / "out"))
    lo.convert(lo.soffice_path(), batch, str(work / "profile"), say)
    return [Path(p) for p in batch.outputs()]


def run(args) -> int:
    session = load_session(args.session)
    points = saves(session, args.policy, args.max_saves)
    span = (points[-1].at - parse_time(session["txns"][0]["time"])).total_seconds()
    print(f"{args.session}: {len(session['txns']):,} edits; policy {args.policy}: {len(points)} saves over "
          f"{span / 60:.1f} minutes of the recording; format {args.format}", file=sys.stderr)
    from testbed.providers.hashes import dropbox_content_hash

    rows = []
    progress = figures.Progress(len(points) + 2, "replay")
    with tempfile.TemporaryDirectory(prefix="ec-replay-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the app may run as its own uid (--transparent)
        progress.step(f"LibreOffice writes {len(points)} {args.format} documents")
        documents = make_documents(args.format, points, work / "docs", lambda line: None)
        with netlab.Testbed(args.wifi, args.wan) as bed:
            from system import EdgeCourier

            progress.step(f"starting providers, EPS and ec-proxy on testbed {bed.run}")
            ec = EdgeCourier(bed, work / "system", transparent=args.transparent)
            ec.start()
            paths = ("direct", "edgecourier") if args.direct else ("edgecourier",)
            apps = {p: ec.app(p) for p in paths}
            remote_name = f"{args.session}.{args.format}"
            for save, document in zip(points, documents):
                progress.step(f"save {save.index}")
                data = document.read_bytes()
                row = {"save": save.index, "edits": save.edits, "at": save.at.isoformat(), "chars": len(save.text),
                       "file_bytes": len(data)}
                for path in paths:
                    local = work / path / remote_name
                    local.parent.mkdir(exist_ok=True)
                    local.parent.chmod(0o755)  # the app may run as its own uid (--transparent)
                    local.write_bytes(data)
                    local.chmod(0o644)
                    totals = ec.proxy_totals() if path == "edgecourier" else None
                    before = bed.link_bytes("device")
                    start = time.perf_counter()
                    apps[path].copyto(local, f"replay/{path}/{remote_name}", "--no-check-dest")
                    row[f"{path}_seconds"] = time.perf_counter() - start
                    row[f"{path}_link_bytes"] = bed.link_bytes("device") - before
                    held = ec.provider_file(f"/replay/{path}/{remote_name}")
                    row[f"{path}_provider_ok"] = bool(held) and held["provider_hash"]["content_hash"] == \
                        dropbox_content_hash(data) and held["sha256"] == hashlib.sha256(data).hexdigest()
                    if totals is not None:
                        after = ec.proxy_totals()
                        row["upload_bytes"] = after["sent_bytes"] - totals["sent_bytes"]
                        row["whole_bytes"] = after["whole_bytes"] - totals["whole_bytes"]
                        row["how"] = after["last_how"]
                rows.append(row)
        progress.finish()
    return report(args, rows, span)


def report(args, rows: list[dict], span: float) -> int:
    ok = all(r[k] for r in rows for k in r if k.endswith("_provider_ok"))
    shown = rows if len(rows) <= args.show else rows[: args.show // 2] + rows[-(args.show - args.show // 2):]
    columns = ["save", "edits", "chars", "file B", "EC link B", "EC upload B", "sent as", "EC s"]
    if args.direct:
        columns += ["direct link B", "direct s"]
    table = []
    for r in shown:
        line = [r["save"], f"{r['edits']:,}", f"{r['chars']:,}", f"{r['file_bytes']:,}",
                f"{r['edgecourier_link_bytes']:,}", f"{r['upload_bytes']:,}", r["how"],
                f"{r['edgecourier_seconds']:.2f}"]
        if args.direct:
            line += [f"{r['direct_link_bytes']:,}", f"{r['direct_seconds']:.2f}"]
        table.append(line)
    total = lambda key: sum(r[key] for r in rows)  # noqa: E731
    wifi, wan = profiles.PROFILES[args.wifi], profiles.PROFILES[args.wan]
    notes = [f"{len(rows)} saves" + (f" ({len(rows) - len(shown)} not shown; all in the CSV)" if len(shown) < len(rows) else ""),
             f"testbed: {wifi.describe()}; {wan.describe()}; device: "
             + ("transparent (nftables, no HTTPS_PROXY)" if args.transparent else "HTTPS_PROXY=ec-proxy"),
             "EC link / direct link: kernel counters of the device's interface during the save (both ways, "
             "rclone's API calls and TLS included); EC upload: ec-proxy's count of the upload to the EPS",
             "provider check (content_hash reported by the provider = Dropbox hash of the document, every save"
             f"{' and path' if args.direct else ''}): " + ("all equal" if ok else "MISMATCH"),
             figures.ATTRIBUTION, figures.machine_line()]
    figures.print_table(f"Replay of {args.session} ({args.policy}, {args.format}): per save", columns, table, notes)
    summary = [["whole files (what a direct upload sends)", f"{total('whole_bytes'):,}", "-"],
               ["EdgeCourier: device link", f"{total('edgecourier_link_bytes'):,}",
                f"{total('edgecourier_seconds'):.1f}"],
               ["EdgeCourier: of which uploads to the EPS", f"{total('upload_bytes'):,}", "-"]]
    if args.direct:
        summary.insert(1, ["direct: device link", f"{total('direct_link_bytes'):,}", f"{total('direct_seconds'):.1f}"])
    figures.print_table(f"Replay of {args.session}: totals over {span / 60:.1f} minutes of editing", ["", "bytes", "save time s"],
                        summary, notes=[f"patches: {sum(r['how'] == 'patch' for r in rows)} of {len(rows)} saves"]
                        + ([f"direct / EdgeCourier on the device link: "
                            f"{total('direct_link_bytes') / max(total('edgecourier_link_bytes'), 1):.1f}x"]
                           if args.direct else []))
    out = args.out
    stem = f"replay-{args.session}-{args.format}"
    keys = ["save", "edits", "at", "chars", "file_bytes", "edgecourier_link_bytes", "upload_bytes", "whole_bytes", "how",
            "edgecourier_seconds", "edgecourier_provider_ok"] + (
        ["direct_link_bytes", "direct_seconds", "direct_provider_ok"] if args.direct else [])
    figures.write_csv(out / f"{stem}.csv", keys, [[r[k] for k in keys] for r in rows])
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [r["save"] for r in rows]

    def cumulative(key):
        acc, out_ = 0, []
        for r in rows:
            acc += r[key]
            out_.append(acc / 1e6)
        return out_

    if args.direct:
        ax.plot(xs, cumulative("direct_link_bytes"), label="direct: rclone to the cloud (device link)", color="#d62728")
    ax.plot(xs, cumulative("whole_bytes"), "--", label="whole files (a direct upload's payload)", color="#ff9896")
    ax.plot(xs, cumulative("edgecourier_link_bytes"), label="EdgeCourier (device link)", color="#1f77b4")
    ax.set_xlabel(f"save number ({args.policy} over {span / 60:.0f} minutes of the recording)")
    ax.set_ylabel("cumulative MB on the device's link")
    ax.set_title(f"Replaying {args.session} as {args.format}, saved by rclone")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, figures.ATTRIBUTION, fontsize=6, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / f"{stem}.png")
    print(f"wrote {out / (stem + '.csv')}, {out / (stem + '.png')}")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=figures.ATTRIBUTION)
    parser.add_argument("session", help="a trace of EC_EDITING_TRACES: clownschool_flat or seph-blog1")
    parser.add_argument("--policy", default="every:60", help="every:SECONDS, keys:N or idle:SECONDS (default every:60)")
    parser.add_argument("--format", default="docx", choices=sorted(FORMATS))
    parser.add_argument("--max-saves", type=int, help="stop after this many saves")
    parser.add_argument("--transparent", action="store_true",
                        help="the device as a rooted phone: nftables redirect to ec-proxy, no proxy setting in the app")
    parser.add_argument("--no-direct", dest="direct", action="store_false", help="skip the direct baseline")
    parser.add_argument("--wifi", default=profiles.DEFAULT_WIFI)
    parser.add_argument("--wan", default=profiles.DEFAULT_WAN)
    parser.add_argument("--show", type=int, default=20, help="saves printed (first and last half)")
    parser.add_argument("--out", type=Path, default=figures.DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
