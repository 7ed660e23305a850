#!/usr/bin/env python3
"""Where issue 13's byte goals stand: patch sizes of three kinds of save.

(a) A .pptx saved again with no edit, for decks of several slide counts and
    master counts (goal: under 600 B whatever the deck). LibreOffice writes a
    fresh random GUID into every slide-number field of every layout and
    master on each save, and a new random id to each chart axis (`c:axId`):
    those ids are the floor, reported beside the patch.
    Each made deck is measured a second time ("-crossed") with its saves
    stamped across a two-second boundary of the DOS clock, as LibreOffice
    stamps a large deck's members now and then: the base's last fifth of
    members 2 s later than the others, the new file's last member (the
    files' times rewritten in place, nothing else). With --corpus-decks, also every .pptx and .odp deck of the shared corpus
    (EC_SHARED: real decks by PowerPoint, Google Slides, python-pptx, Lotus
    Symphony, StarOffice, NeoOffice, older LibreOffice...), opened and saved
    as .pptx by LibreOffice the same way. With --corpus-resaves, every .docx,
    .xlsx, .odt and .ods of the corpus saved again in its own format with no
    edit: a table of what any save of a real document costs, no goal.
(b) A one-word edit in the middle of a document of about 300 KB of text
    (.docx and .odt), with the document re-zipped by other deflaters than
    zlib: Info-ZIP `zip`, 7-Zip, Go's archive/zip, and Rust's flate2
    (miniz_oxide backend and zlib-rs backend), LibreOffice's own (zlib) as a
    reference (goal: under 1 KB). Also zstd -19 --patch-from of the whole
    file and the time of `ecsync diff` (median of --reps runs).
(c) A 5,000-row sheet with formulas (=B*2, a row difference =B{r}-B{r-1},
    a moving =SUM over 5 rows, column totals) and repeated text cells
    (shared strings in .xlsx), as .xlsx and .ods: a row inserted in the
    middle, through LibreOffice's API as a user would (formulas below shift),
    goal under 2 KB; one cell changed in the middle (a number that formulas
    read, and a text cell), goal under 400 B.

Every document is written by LibreOffice (headless, driven through its
Python-UNO bridge by byte_goals_uno.py under the system Python): a flat ODF
source is converted, opened and saved twice (so the base is a document
LibreOffice has already re-saved, as a user's file is), then opened again,
edited (or not) and saved with the app's Save. `ecsync inspect --json` tells
which members changed, their content delta and their recipe.

The documents are made once per set of inputs in .cache/byte_goals/<key>/
(key: a hash of the generator version, the sizes, the LibreOffice version
and the worker's source); --no-cache makes them in a temporary folder.
Nothing is written in the repository's tracked folders.

    .venv/bin/python experiments/bench/byte_goals.py [--csv out.csv] [--json out.json]
    .venv/bin/python experiments/bench/byte_goals.py --goals a --slides 1,10,50 --masters 1,3
    .venv/bin/python experiments/bench/byte_goals.py --quick   # small sizes, a few minutes

Tools: LibreOffice (soffice) and the system Python's uno module (Debian
python3-uno); zip (zip), 7-Zip (7zip: `7zz`, or p7zip-full: `7z`), Go
(golang-go), cargo (rustup) with network access the first time (flate2,
zlib-rs), zstd. A missing tool stops the run with the package to install.
"""

import argparse
import csv
import datetime
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "traces"))
import common  # noqa: E402
import make_traces as mt  # noqa: E402
from common import BenchError, fmt_bytes, fmt_time, goal, progress  # noqa: E402

sys.path.insert(0, common.REPO)
from testbed import rezip as rezip_tools  # noqa: E402
from testbed.rezip import DEFLATERS, RezipError, rezip  # noqa: E402
from testbed.rezip import build as build_rezippers  # noqa: E402
from testbed.shared import corpus  # noqa: E402

GENERATOR_VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "byte_goals_uno.py")
SYSTEM_PYTHON = "/usr/bin/python3"
CACHE = os.path.join(common.REPO, ".cache", "byte_goals")

GOAL_A, GOAL_B, GOAL_C_ROW, GOAL_C_CELL = 600, 1000, 2000, 400  # bytes, exclusive
FILTERS = {"pptx": "Impress MS PowerPoint 2007 XML", "docx": "MS Word 2007 XML",
           "odt": "writer8", "xlsx": "Calc MS Excel 2007 XML", "ods": "calc8"}
#: The corpus folders --corpus-resaves takes (the decks are --corpus-decks').
RESAVE_FORMATS = ("docx", "xlsx", "odt", "ods")
GUID = re.compile(rb"\{[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}\}")
# A chart axis's id (DrawingML charts): LibreOffice draws each axis a new
# random one on every save, and writes it in c:axId and c:crossAx.
AXIS_ID = re.compile(rb'<c:axId val="(\d+)"')
CHART = re.compile(r"ppt/charts/chart\d+\.xml")
NEW_WORD = "zebra"

# Packages to name when a tool is missing (Debian bookworm); the re-zippers' are in testbed/rezip.py.
PACKAGES = {"soffice": "libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui",
            "zstd": "zstd", "uno": "python3-uno"}


def need(name, candidates=None):
    """The path of a tool, or a clear error naming the Debian package to install."""
    return rezip_tools.need(name, candidates, packages=PACKAGES)


run = rezip_tools.run


# --------------------------------------------------------------------------
# Sources (flat ODF) of the three kinds of document

def deck_source(count, masters):
    """A flat .fodp with `count` slides spread over `masters` master pages."""
    deck = mt.slides("byte-goals-deck", count)
    names = [f"Master{i + 1}" for i in range(masters)]
    master_styles = "".join(f'<style:master-page style:name="{n}" style:page-layout-name="PM1"/>'
                            for n in names)
    pages = "".join(mt.slide_xml(i, slide).replace('draw:master-page-name="Default"',
                                                   f'draw:master-page-name="{names[i % masters]}"')
                    for i, slide in enumerate(deck, 1))
    return mt.flat_document("impress", mt.BASE_META,
                            f"<office:presentation>\n{pages}</office:presentation>",
                            automatic_styles=mt.IMPRESS_STYLES, master_styles=master_styles)


def text_source(chars):
    return mt.writer_source(mt.prose("byte-goals-text", chars), mt.BASE_META)


SHEET_HEADER = ["ID", "Quantity", "Customer", "Region", "Double", "Change", "Sum of 5"]
CUSTOMERS, REGIONS = mt.CUSTOMERS, mt.REGIONS


def sheet_rows(count):
    rng = random.Random("byte-goals-sheet")
    return [(1000 + i, rng.randint(1, 99), rng.choice(CUSTOMERS), rng.choice(REGIONS))
            for i in range(count)]


def _number(value, formula=None):
    f = f' table:formula="{formula}"' if formula else ""
    return (f'<table:table-cell{f} office:value-type="float" office:value="{value}">'
            f"<text:p>{value}</text:p></table:table-cell>")


def sheet_source(count):
    """A flat .fods: ID, quantity, two repeated texts, and formulas per row:
    =B*2, =B{r}-B{r-1} (a cross-row reference) and =SUM(B{r-4}:B{r}); under
    the rows, =SUM totals of the columns."""
    rows = sheet_rows(count)
    out = ["<table:table-row>" + "".join(mt.string_cell(h) for h in SHEET_HEADER)
           + "</table:table-row>\n"]
    quantities = [q for _, q, _, _ in rows]
    for i, (ident, qty, customer, region) in enumerate(rows):
        r = i + 2
        previous = quantities[i - 1] if i else 0
        first = max(2, r - 4)
        window = sum(quantities[first - 2:i + 1])
        change = (_number(qty - previous, f"of:=[.B{r}]-[.B{r - 1}]") if i
                  else _number(qty, f"of:=[.B{r}]"))
        out.append("<table:table-row>" + _number(ident) + _number(qty)
                   + mt.string_cell(customer) + mt.string_cell(region)
                   + _number(2 * qty, f"of:=[.B{r}]*2") + change
                   + _number(window, f"of:=SUM([.B{first}:.B{r}])") + "</table:table-row>\n")
    last = count + 1
    total = sum(quantities)
    out.append("<table:table-row>" + _number(count) + _number(total, f"of:=SUM([.B2:.B{last}])")
               + mt.string_cell("Total") + mt.string_cell("")
               + _number(2 * total, f"of:=SUM([.E2:.E{last}])") + "</table:table-row>\n")
    table = ('<office:spreadsheet><table:table table:name="Sheet1">'
             f'<table:table-column table:number-columns-repeated="{len(SHEET_HEADER)}"/>\n'
             + "".join(out) + "</table:table></office:spreadsheet>")
    return mt.flat_document("calc", mt.BASE_META, table)


# --------------------------------------------------------------------------
# Making the documents with LibreOffice

def plan(args):
    """(sources {name: text}, jobs before the re-save gap, jobs after, documents).

    documents: {key: {"goal", "fmt", "variant", "base", "new", ...}} with
    paths relative to the work folder.
    """
    sources, early, late, docs = {}, [], [], {}

    def warm(name, source, fmt, optional=False):
        """Convert `source` to fmt and re-save it args.warmup times: returns the base's name.

        LibreOffice's .pptx import/export is not idempotent: the first
        re-saves of a converted deck rewrite masters and shape ids; from the
        third on, each save changes only the field GUIDs and shrinks every
        shape by 360 EMU. The base is such a settled document."""
        early.append({"op": "convert", "src": source, "dst": f"{name}-g0.{fmt}",
                      "filter": FILTERS[fmt], "optional": optional})
        previous = f"{name}-g0.{fmt}"
        for i in range(1, args.warmup + 1):
            dst = f"{name}-base.{fmt}" if i == args.warmup else f"{name}-g{i}.{fmt}"
            early.append({"op": "resave", "src": previous, "dst": dst, "optional": optional})
            previous = dst
        return previous

    def corpus_resave(path, name, fmt, goal, optional=False):
        """A corpus file (copied in, its bytes keyed by hash) converted to fmt, warmed, then
        saved once more with no edit: its entry in `docs`."""
        sources[f"{name}{path.suffix}"] = path
        base = warm(name, f"{name}{path.suffix}", fmt, optional)
        late.append({"op": "resave", "src": base, "dst": f"{name}-new.{fmt}", "optional": optional})
        docs[name] = {"goal": goal, "fmt": fmt, "variant": "no edit", "base": base,
                      "new": f"{name}-new.{fmt}", "source": f"{path.parent.name}/{path.name}"}
        return docs[name]

    if "a" in args.goals and args.corpus_decks:
        # Real decks, as .pptx.
        for path in sorted([*corpus("pptx").glob("*.pptx"), *corpus("odp").glob("*.odp")]):
            corpus_resave(path, f"corpus-{path.stem}", "pptx", "a").update(slides=None, masters=None)
    if "r" in args.goals:
        # Real documents in their own format (LibreOffice's own export). A file LibreOffice
        # cannot open or save is said and left out.
        for path in sorted(p for fmt in RESAVE_FORMATS for p in corpus(fmt).glob(f"*.{fmt}")):
            corpus_resave(path, f"corpus-{path.suffix[1:]}-{path.stem}", path.suffix[1:], "r",
                          optional=True)
    if "a" in args.goals:
        for masters in args.masters:
            for count in args.slides:
                name = f"deck-{count}s-{masters}m"
                sources[f"{name}.fodp"] = deck_source(count, masters)
                base = warm(name, f"{name}.fodp", "pptx")
                late.append({"op": "resave", "src": base, "dst": f"{name}-new.pptx"})
                docs[name] = {"goal": "a", "fmt": "pptx", "slides": count, "masters": masters,
                              "variant": "no edit", "base": base, "new": f"{name}-new.pptx"}
    if "b" in args.goals:
        sources["text.fodt"] = text_source(args.text_kb * 1000)
        for fmt in ("docx", "odt"):
            base = warm(f"text-{fmt}", "text.fodt", fmt)
            late.append({"op": "replace_word", "src": base, "dst": f"text-{fmt}-new.{fmt}",
                         "skip": 20, "word": NEW_WORD})
            docs[f"text-{fmt}"] = {"goal": "b", "fmt": fmt, "variant": "one word",
                                   "base": base, "new": f"text-{fmt}-new.{fmt}"}
    if "c" in args.goals:
        sources["sheet.fods"] = sheet_source(args.rows)
        middle = args.rows // 2 + 1  # 0-based index of the row that becomes the new one
        r = middle + 1  # its 1-based number
        inserted = [99999, 42, "Harbor Lane Bakery", "West", f"=B{r}*2", f"=B{r}-B{r - 1}",
                    f"=SUM(B{r - 4}:B{r})"]
        edits = {
            "row inserted": {"op": "insert_row", "row": middle, "cells": inserted},
            "number cell": {"op": "set_cell", "cell": f"B{r}", "value": 98765},
            "text cell": {"op": "set_cell", "cell": f"C{r}", "value": "Harbor Lane Bakery"},
            "no edit": {"op": "resave"},
        }
        for fmt in ("xlsx", "ods"):
            base = warm(f"sheet-{fmt}", "sheet.fods", fmt)
            for variant, job in edits.items():
                slug = variant.replace(" ", "-")
                late.append({**job, "src": base, "dst": f"sheet-{fmt}-{slug}.{fmt}"})
                docs[f"sheet-{fmt}-{slug}"] = {"goal": "c", "fmt": fmt, "variant": variant,
                                               "base": base, "new": f"sheet-{fmt}-{slug}.{fmt}"}
    return sources, early, late, docs


def soffice_version(soffice):
    with tempfile.TemporaryDirectory(prefix="ec-byte-goals-") as profile:
        return run([soffice, f"-env:UserInstallation=file://{profile}", "--version"]).strip()


def run_worker(soffice, folder, jobs):
    """Run LibreOffice jobs (paths relative to folder) in one soffice process."""
    if not os.access(SYSTEM_PYTHON, os.X_OK) or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import uno"], capture_output=True).returncode:
        raise BenchError(f"{SYSTEM_PYTHON} cannot import LibreOffice's uno module: install the "
                         f"Debian package {PACKAGES['uno']}")

    def absolute(job):
        return {k: os.path.join(folder, v) if k in ("src", "dst") else v for k, v in job.items()}

    with tempfile.TemporaryDirectory(prefix="ec-byte-goals-profile-") as profile:
        spec = os.path.join(folder, "jobs.json")
        with open(spec, "w", encoding="utf-8") as file:
            json.dump({"soffice": soffice, "profile": profile,
                       "jobs": [absolute(j) for j in jobs]}, file, indent=1)
        # The worker's lines as they come: a corpus run makes hundreds of documents.
        with subprocess.Popen(["nice", SYSTEM_PYTHON, WORKER, spec], stderr=subprocess.PIPE,
                              text=True) as worker:
            for line in worker.stderr:
                progress(line.rstrip("\n"))
        if worker.returncode:
            raise BenchError(f"the LibreOffice worker failed ({worker.returncode})")


def make_documents(args, which):
    """The work folder with the documents of goal `which` (cached by their inputs)."""
    soffice = need("soffice")
    sources, early, late, docs = plan(argparse.Namespace(**{**vars(args), "goals": which}))
    version = soffice_version(soffice)
    with open(WORKER, "rb") as file:
        worker_hash = hashlib.sha256(file.read()).hexdigest()
    def keyed(source):
        # A corpus file by the SHA-256 of its bytes, a made source by its text.
        return hashlib.sha256(source.read_bytes()).hexdigest() if isinstance(source, Path) else source

    key_data = json.dumps([GENERATOR_VERSION, version, worker_hash,
                           sorted((name, keyed(source)) for name, source in sources.items()),
                           early, late], sort_keys=True)
    key = hashlib.sha256(key_data.encode()).hexdigest()[:16]
    if args.no_cache:
        folder = tempfile.mkdtemp(prefix="ec-byte-goals-")
    else:
        folder = os.path.join(args.cache, key)
        if os.path.isfile(os.path.join(folder, "done.json")):
            progress(f"documents: cached in {folder}")
            return folder, docs, version
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    progress(f"documents: making {len(docs)} pairs with {version} in {folder}")
    for name, text in sources.items():
        if isinstance(text, Path):
            shutil.copyfile(text, os.path.join(folder, name))
            continue
        with open(os.path.join(folder, name), "w", encoding="utf-8") as file:
            file.write(text)
    # The re-saves come at least 2 s after the bases: a later ZIP timestamp.
    run_worker(soffice, folder, early + [{"op": "sleep", "seconds": 2.2}] + late)
    for doc in docs.values():
        for role in ("base", "new"):
            if doc["goal"] == "r" and not os.path.isfile(os.path.join(folder, doc[role])):
                doc["unsaved"] = True  # the worker said why
                continue
            check_zip(os.path.join(folder, doc[role]))
    with open(os.path.join(folder, "done.json"), "w", encoding="utf-8") as file:
        json.dump({"key": key, "soffice": version, "docs": docs}, file, indent=1)
    return folder, docs, version


def check_zip(path):
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile as error:
        raise BenchError(f"{path} is not a valid ZIP: {error}") from None
    if bad:
        raise BenchError(f"{path}: member {bad} has a bad CRC")


# --------------------------------------------------------------------------
# Re-zipping with other deflaters

# --------------------------------------------------------------------------
# Measuring

def measure(base, new, work, reps):
    """Patch size, zstd size, median diff time, inspect JSON and the random ids changed."""
    ecsync = common.tool("ecsync")
    patch = os.path.join(work, "patch.ecp")
    times = []
    for _ in range(reps):
        times.append(common.run_timed([ecsync, "diff", base, new, "-o", patch]))
    info = json.loads(run([ecsync, "inspect", patch, "--base", base, "--json"]))
    zstd_out = os.path.join(work, "patch.zst")
    subprocess.run([need("zstd"), "-q", "-f", "-19", f"--patch-from={base}", new, "-o", zstd_out],
                   check=True, stderr=subprocess.DEVNULL)
    guids = 0
    with zipfile.ZipFile(base) as a, zipfile.ZipFile(new) as b:
        names = set(a.namelist())
        for member in b.namelist():
            if member in names:
                old, now = a.read(member), b.read(member)
                if old != now:
                    guids += len(set(GUID.findall(now)) - set(GUID.findall(old)))
        # Charts are renamed between saves (chart102.xml -> chart135.xml):
        # the axis ids of all charts, whatever their names.
        axis_ids = [set(AXIS_ID.findall(b"".join(z.read(n) for n in z.namelist() if CHART.fullmatch(n))))
                    for z in (a, b)]
    new_ids = axis_ids[1] - axis_ids[0]
    return {"patch": os.path.getsize(patch), "zstd": os.path.getsize(zstd_out),
            "file": os.path.getsize(new), "seconds": common.median(times), "inspect": info,
            "new_guids": guids, "new_axis_ids": len(new_ids),
            # A random decimal id of d digits holds d * log2(10) bits at most.
            "axis_id_bytes": sum(len(v) for v in new_ids) * math.log2(10) / 8}


def member_group(name):
    """Members grouped by kind: 'ppt/slideLayouts/slideLayout7.xml' -> 'ppt/slideLayouts/*'."""
    return re.sub(r"\d+(\.xml(\.rels)?)$", r"*\1", name)


def members_summary(info, limit=6):
    """'name: mode/middle bytes/recipe(recipe bytes)' of the biggest changed members."""
    members = sorted(info.get("rebuilt_members", []), key=lambda m: -(m.get("middle_bytes") or 0))
    parts = [f"{m['name']} {m.get('content_mode')}: {m.get('middle')} {m.get('middle_bytes')} B, "
             f"{m.get('recipe')} {m.get('recipe_bytes')} B" for m in members[:limit]]
    if len(members) > limit:
        parts.append(f"+{len(members) - limit} more")
    return "; ".join(parts) or "none"


def groups_table(title, measured):
    rows = []
    for label, m in measured:
        groups = {}
        for member in m["inspect"].get("rebuilt_members", []):
            g = groups.setdefault(member_group(member["name"] or "(added)"), [0, 0, 0, set()])
            g[0] += 1
            g[1] += member.get("middle_bytes") or 0
            g[2] += member.get("recipe_bytes") or 0
            g[3].add(f"{member.get('middle')}/{member.get('recipe')}")
        for name, (count, middle, recipe, kinds) in sorted(groups.items(), key=lambda x: -x[1][1]):
            rows.append([label, name, count, middle, recipe, ", ".join(sorted(kinds))])
    common.table(title, ["document", "members", "count", "delta bytes", "recipe bytes",
                         "delta/recipe"], rows,
                 notes=["delta bytes: the members' content deltas (literal or zstd) before the "
                        "patch's segments are compressed together; recipe bytes: recipe fields "
                        "(PREFLATE corrections included)"])


def sections(info):
    """The patch's bytes by section (and its kind when it is not a ZIP patch)."""
    kind = "" if info.get("kind") == "zip" else f"kind {info.get('kind')}: "
    return kind + ", ".join(f"{k} {v}" for k, v in info.get("sections", {}).items())


def stamped_later(src, dst, later_from):
    """A copy of the ZIP `src` whose members from index `later_from` on carry
    a DOS time 2 s later, in their local and central records: what a writer
    that stamps each member as it writes it makes of a save that crosses a
    two-second boundary of the DOS clock (LibreOffice's saves of a large
    deck do, now and then). Nothing else changes."""
    data = bytearray(common.read(src))
    with zipfile.ZipFile(src) as archive:
        infos = archive.infolist()
    eocd = data.rfind(b"PK\x05\x06")
    central = struct.unpack_from("<I", data, eocd + 16)[0]
    places = [info.header_offset + 10 for info in infos[later_from:]]
    for k in range(len(infos)):
        if data[central:central + 4] != b"PK\x01\x02":
            raise BenchError(f"{src}: central record {k} not where the directory says")
        if k >= later_from:
            places.append(central + 12)
        names, extra, comment = struct.unpack_from("<HHH", data, central + 28)
        central += 46 + names + extra + comment
    for at in places:
        time, date = struct.unpack_from("<HH", data, at)
        when = datetime.datetime(1980 + (date >> 9), (date >> 5) & 0xF, date & 0x1F,
                                 time >> 11, (time >> 5) & 0x3F, 2 * (time & 0x1F)) + datetime.timedelta(seconds=2)
        struct.pack_into("<HH", data, at, (when.hour << 11) | (when.minute << 5) | (when.second // 2),
                         ((when.year - 1980) << 9) | (when.month << 5) | when.day)
    with open(dst, "wb") as file:
        file.write(data)


def goal_a(folder, docs, work, args, out_rows, goals):
    measured, rows = [], []
    pairs = []
    for key, doc in docs.items():
        if doc["goal"] != "a":
            continue
        pairs.append((key, doc, os.path.join(folder, doc["base"]), os.path.join(folder, doc["new"])))
        if doc.get("slides"):
            # The made deck again, its saves stamped across a two-second boundary: the
            # base's last fifth of members 2 s later, the new file's last member.
            crossed = (os.path.join(work, f"{key}-crossed-base.pptx"), os.path.join(work, f"{key}-crossed-new.pptx"))
            with zipfile.ZipFile(pairs[-1][2]) as archive:
                count = len(archive.infolist())
            stamped_later(pairs[-1][2], crossed[0], count - count // 5)
            stamped_later(pairs[-1][3], crossed[1], count - 1)
            pairs.append((f"{key}-crossed", doc, *crossed))
    for key, doc, base, new in pairs:
        progress(f"(a) {key}: ecsync diff")
        m = measure(base, new, work, args.reps)
        with zipfile.ZipFile(new) as archive:
            layouts = sum(1 for n in archive.namelist()
                          if re.fullmatch(r"ppt/slideLayouts/slideLayout\d+\.xml", n))
            masters = sum(1 for n in archive.namelist()
                          if re.fullmatch(r"ppt/slideMasters/slideMaster\d+\.xml", n))
            slides = sum(1 for n in archive.namelist() if re.fullmatch(r"ppt/slides/slide\d+\.xml", n))
        floor = 16 * m["new_guids"] + round(m["axis_id_bytes"])
        measured.append((key, m))
        met = m["patch"] < GOAL_A
        # What a patch cannot do without: the fixed header, the header stream and the new GUIDs.
        fixed = m["inspect"].get("sections", {})
        least = fixed.get("fixed", 0) + fixed.get("header_stream", 0) + floor
        rows.append([doc.get("source", key), slides, masters, layouts, fmt_bytes(m["file"]), m["patch"],
                     f"< {GOAL_A}", "yes" if met else "NO", len(m["inspect"].get("rebuilt_members", [])),
                     m["new_guids"], m["new_axis_ids"], floor, least, f"{m['patch'] / least:.2f}x" if least else "-",
                     m["zstd"], sections(m["inspect"])])
        out_rows.append({"goal": "a", "document": key, "format": "pptx", "variant": "no edit",
                         "deflater": "libreoffice", "file_bytes": m["file"],
                         "patch_bytes": m["patch"], "goal_bytes": GOAL_A, "met": met,
                         "zstd_bytes": m["zstd"], "diff_seconds": m["seconds"],
                         "changed_members": len(m["inspect"].get("rebuilt_members", [])),
                         "random_id_floor_bytes": floor, "least_bytes": least, "slides": slides})
        over = f"; floor with the header {least} B: under {GOAL_A} B is out of reach" if least >= GOAL_A else ""
        goals.append(goal(f"(a) {key}: a .pptx save with no edit < {GOAL_A} B", met,
                          f"{m['patch']} B (random-id floor {floor} B{over})"))
    if rows:
        common.table(f"Goal (a): .pptx opened and saved again with no edit (goal < {GOAL_A} B)",
                     ["deck", "slides", "masters", "layouts", "file", "EC patch", "goal", "met",
                      "changed members", "new GUIDs", "new axis ids", "random-id floor", "floor + header",
                      "patch / (floor + header)", "zstd -19", "patch sections (B)"], rows,
                     notes=["random-id floor: 16 B of entropy per slide-number field id LibreOffice "
                            "draws afresh on every save (new GUIDs in changed members), and "
                            "d * log2(10) bits per new chart axis id of d digits (c:axId)",
                            "floor + header: the random-id floor, the fixed header and the header "
                            "stream (the members' new times and sizes), which every such patch carries",
                            "deck: a made deck's name, or the corpus file a real deck was saved from"])
        groups_table("Goal (a): where the bytes go, by member kind", measured)


def goal_b(folder, docs, work, args, out_rows, goals):
    tools = build_rezippers(args.deflaters)
    rows, details = [], []
    for key, doc in docs.items():
        if doc["goal"] != "b":
            continue
        base, new = os.path.join(folder, doc["base"]), os.path.join(folder, doc["new"])
        for deflater in ("libreoffice", *args.deflaters):
            if deflater == "libreoffice":
                b, n = base, new
            else:
                progress(f"(b) {key}: re-zipping with {deflater}")
                b = rezip(deflater, tools, base, os.path.join(work, f"{key}-{deflater}-base."
                                                              f"{doc['fmt']}"), work)
                n = rezip(deflater, tools, new, os.path.join(work, f"{key}-{deflater}-new."
                                                             f"{doc['fmt']}"), work)
            progress(f"(b) {key} {deflater}: ecsync diff x{args.reps}")
            m = measure(b, n, work, args.reps)
            met = m["patch"] < GOAL_B
            changed = m["inspect"].get("rebuilt_members", [])
            rows.append([doc["fmt"], deflater, fmt_bytes(m["file"]), m["patch"], f"< {GOAL_B}",
                         "yes" if met else "NO", m["zstd"], fmt_time(m["seconds"]),
                         ", ".join(f"{c['name']}: {c.get('recipe')} {c.get('recipe_bytes')} B"
                                   for c in changed) or "none"])
            for c in changed:
                details.append([doc["fmt"], deflater, c["name"], c.get("content_mode"),
                                c.get("recipe"), c.get("recipe_bytes"), c.get("middle"),
                                c.get("middle_bytes")])
            out_rows.append({"goal": "b", "document": key, "format": doc["fmt"],
                             "variant": "one word", "deflater": deflater, "file_bytes": m["file"],
                             "patch_bytes": m["patch"], "goal_bytes": GOAL_B, "met": met,
                             "zstd_bytes": m["zstd"], "diff_seconds": m["seconds"],
                             "changed_members": len(changed)})
            goals.append(goal(f"(b) {doc['fmt']} by {deflater}: a one-word edit < {GOAL_B} B",
                              met, f"{m['patch']} B"))
            if args.validate and deflater != "libreoffice":
                args.to_open.extend([b, n])
    if rows:
        common.table(f"Goal (b): one word changed in {args.text_kb} KB of text, re-zipped by "
                     f"other deflaters (goal < {GOAL_B} B)",
                     ["format", "deflater", "file", "EC patch", "goal", "met", "zstd -19",
                      "diff time", "changed members: recipe (recipe bytes)"], rows,
                     notes=["libreoffice: the document as LibreOffice wrote it (zlib)",
                            f"diff time: median of {args.reps} `ecsync diff` runs (self-check "
                            "included)"])
        common.table("Goal (b): changed members, recipes and content deltas",
                     ["format", "deflater", "member", "mode", "recipe", "recipe bytes", "delta",
                      "delta bytes"], details,
                     notes=["recipe bytes of PREFLATE are its corrections; RAW carries the "
                            "member's deflate stream itself"])


def goal_c(folder, docs, work, args, out_rows, goals):
    rows, measured = [], []
    for key, doc in docs.items():
        if doc["goal"] != "c":
            continue
        progress(f"(c) {key}: ecsync diff")
        m = measure(os.path.join(folder, doc["base"]), os.path.join(folder, doc["new"]), work,
                    args.reps)
        limit = {"row inserted": GOAL_C_ROW, "no edit": None}.get(doc["variant"], GOAL_C_CELL)
        met = m["patch"] < limit if limit else None
        measured.append((f"{doc['fmt']} {doc['variant']}", m))
        rows.append([doc["fmt"], doc["variant"], fmt_bytes(m["file"]), m["patch"],
                     f"< {limit}" if limit else "(reference)",
                     "-" if met is None else "yes" if met else "NO", m["zstd"],
                     fmt_time(m["seconds"]), sections(m["inspect"]),
                     members_summary(m["inspect"], 4)])
        out_rows.append({"goal": "c", "document": key, "format": doc["fmt"],
                         "variant": doc["variant"], "deflater": "libreoffice",
                         "file_bytes": m["file"], "patch_bytes": m["patch"], "goal_bytes": limit,
                         "met": met, "zstd_bytes": m["zstd"], "diff_seconds": m["seconds"],
                         "changed_members": len(m["inspect"].get("rebuilt_members", []))})
        if limit:
            goals.append(goal(f"(c) {doc['fmt']} {doc['variant']} in {args.rows} rows < {limit} B",
                              met, f"{m['patch']} B"))
    if rows:
        common.table(f"Goal (c): a {args.rows}-row sheet with formulas and shared strings "
                     f"(goals: row inserted < {GOAL_C_ROW} B, cell changed < {GOAL_C_CELL} B)",
                     ["format", "edit", "file", "EC patch", "goal", "met", "zstd -19",
                      "diff time", "patch sections (B)", "biggest changed members"], rows,
                     notes=["no edit: the same base opened and saved again (what any save "
                            "costs)"])
        groups_table("Goal (c): where the bytes go, by member kind", measured)


def corpus_resaves(folder, docs, work, args, out_rows, goals):
    """Every corpus .docx .xlsx .odt .ods saved again by LibreOffice with no edit: what any save
    of a real document costs (no goal of its own; `ecsync diff` checks each patch applies back)."""
    rows, failed = [], []
    for key, doc in docs.items():
        if doc["goal"] != "r":
            continue
        if doc.get("unsaved"):
            failed.append(doc["source"])
            continue
        progress(f"(r) {doc['source']}: ecsync diff")
        m = measure(os.path.join(folder, doc["base"]), os.path.join(folder, doc["new"]), work,
                    args.reps)
        changed = m["inspect"].get("rebuilt_members", [])
        rows.append([doc["source"], fmt_bytes(m["file"]), m["patch"], m["zstd"],
                     f"{m['patch'] / m['zstd']:.3f}" if m["zstd"] else "-", len(changed),
                     fmt_time(m["seconds"]), members_summary(m["inspect"], 3)])
        out_rows.append({"goal": "r", "document": key, "source": doc["source"],
                         "format": doc["fmt"], "variant": "no edit", "deflater": "libreoffice",
                         "file_bytes": m["file"], "patch_bytes": m["patch"], "goal_bytes": None,
                         "met": None, "zstd_bytes": m["zstd"], "diff_seconds": m["seconds"],
                         "changed_members": len(changed)})
    if rows or failed:
        rows.sort(key=lambda r: -r[2])
        common.table("Corpus documents saved again by LibreOffice with no edit (largest patch first)",
                     ["corpus file", "file", "EC patch", "zstd -19", "EC / zstd",
                      "changed members", "diff time", "biggest changed members"], rows,
                     notes=["each converted to its own format by LibreOffice and saved "
                            f"{args.warmup} times before (the base), then once more",
                            "LibreOffice could not open or save: " + (", ".join(failed) or "none")])


def validate_documents(paths):
    """Let LibreOffice open every re-zipped document (it must still be a document)."""
    if not paths:
        return
    progress(f"validating: LibreOffice opens the {len(paths)} re-zipped documents")
    folder = tempfile.mkdtemp(prefix="ec-byte-goals-open-")
    try:
        jobs = [{"op": "convert", "src": p, "dst": os.path.join(folder, f"{i}.txt"),
                 "filter": "Text"} for i, p in enumerate(paths)]
        run_worker(need("soffice"), folder, jobs)
        for i, path in enumerate(paths):
            text = os.path.join(folder, f"{i}.txt")
            if not os.path.isfile(text) or os.path.getsize(text) < 1000:
                raise BenchError(f"LibreOffice could not read the re-zipped {path}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def parse_list(text, kind=str):
    return [kind(x) for x in text.split(",") if x]




def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Measures issue 13's goals (a) .pptx re-save "
        "with no edit < 600 B, (b) one-word edit under non-zlib deflaters < 1 KB, "
        "(c) 5,000-row sheet: row inserted < 2 KB, cell changed < 400 B.",
        epilog="See the module docstring (experiments/bench/byte_goals.py) for how the "
               "documents are made and which packages the tools come from.")
    parser.add_argument("--goals", default="abc", help="which goals to measure (default abc; r: the corpus re-saves alone, "
                        "as --corpus-resaves)")
    parser.add_argument("--slides", default="1,10,50", type=lambda s: parse_list(s, int),
                        help="(a) slide counts (default 1,10,50)")
    parser.add_argument("--corpus-decks", action="store_true",
                        help="(a) also every .pptx and .odp of the shared corpus (EC_SHARED), opened "
                        "and saved again as .pptx by LibreOffice")
    parser.add_argument("--corpus-resaves", action="store_true",
                        help="also every .docx .xlsx .odt .ods of the shared corpus (EC_SHARED) saved "
                        "again by LibreOffice in its own format with no edit (what any save of a real "
                        "document costs; a table, no goal)")
    parser.add_argument("--masters", default="1", type=lambda s: parse_list(s, int),
                        help="(a) master pages in the source (default 1; LibreOffice's .pptx export "
                        "writes 1 or 2 masters of 12 layouts each whatever this is)")
    parser.add_argument("--text-kb", type=int, default=300,
                        help="(b) thousands of characters of text (default 300)")
    parser.add_argument("--deflaters", default=",".join(DEFLATERS), type=parse_list,
                        help=f"(b) re-zippers (default {','.join(DEFLATERS)})")
    parser.add_argument("--rows", type=int, default=5000, help="(c) sheet rows (default 5000)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="times LibreOffice re-saves a converted document before it is the "
                        "base (default 3: a .pptx settles after 2)")
    parser.add_argument("--reps", type=int, default=3, help="ecsync diff runs per pair, "
                        "median time reported (default 3)")
    parser.add_argument("--no-validate", dest="validate", action="store_false",
                        help="(b) skip letting LibreOffice open the re-zipped documents")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (slides 1,3; 1 master; 20 KB text; 300 rows; 1 rep)")
    parser.add_argument("--cache", default=CACHE, help=f"document cache (default {CACHE})")
    parser.add_argument("--no-cache", action="store_true",
                        help="make the documents in a temporary folder, removed at the end")
    parser.add_argument("--csv", help="also write one row per measured pair to this CSV file")
    parser.add_argument("--json", help="also write the rows and goals to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.slides, args.masters, args.text_kb, args.rows, args.reps = [1, 3], [1], 20, 300, 1
    unknown = set(args.deflaters) - set(DEFLATERS)
    if unknown or set(args.goals) - set("abcr"):
        parser.error(f"unknown deflaters {sorted(unknown)} or goals {args.goals!r}")
    args.to_open = []
    if args.corpus_resaves and "r" not in args.goals:
        args.goals += "r"
    try:
        common.tool("ecsync")
        need("zstd")
        made = {g: make_documents(args, g) for g in "abcr" if g in args.goals}
        print(common.machine_line(common.machine()))
        for g, (folder, _, version) in made.items():
            print(f"({g}) documents by {version} in {folder}")
        print()
        out_rows, goals = [], []
        steps = {"a": goal_a, "b": goal_b, "c": goal_c, "r": corpus_resaves}
        with tempfile.TemporaryDirectory(prefix="ec-byte-goals-work-") as work:
            for g, (folder, docs, _) in made.items():
                steps[g](folder, docs, work, args, out_rows, goals)
                if g == "b":
                    validate_documents(args.to_open)
        if args.no_cache:
            for folder, _, _ in made.values():
                shutil.rmtree(folder, ignore_errors=True)
    except (BenchError, RezipError) as error:
        sys.exit(f"byte_goals: {error}")
    common.print_goals(goals)
    if args.csv:
        fields = sorted({k for r in out_rows for k in r},
                        key=lambda k: list(out_rows[0]).index(k) if k in out_rows[0] else 99)
        with open(args.csv, "w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=fields)
            writer.writeheader()
            writer.writerows(out_rows)
    params = {k: v for k, v in vars(args).items() if k not in ("to_open",)}
    common.write_json(args.json, "byte_goals", params, out_rows, goals)


if __name__ == "__main__":
    main()
