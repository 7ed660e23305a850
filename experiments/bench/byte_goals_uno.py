"""LibreOffice worker of byte_goals.py: runs under the system Python that has
LibreOffice's `uno` module (Debian package python3-uno), not the repo's venv.

    /usr/bin/python3 experiments/bench/byte_goals_uno.py JOBS.json

JOBS.json: {"soffice": path, "profile": folder, "jobs": [job, ...]}; a job is
{"op": ..., "src": path, "dst": path, ...} with op one of

- convert: load src (a flat ODF source), store it to dst with "filter";
- resave: copy src to dst, open dst, save it (XStorable.store: what the
  app's Save does), no edit;
- replace_word: as resave, but first replace the word after the first
  "skip" words of the middle paragraph with "word";
- insert_row: as resave, but first insert one row before 0-based row "row"
  of the first sheet (formulas below it shift, as when a user inserts a row)
  and fill it with "cells" (a list of numbers, strings and "=formulas");
- set_cell: as resave, but first set cell "cell" (e.g. "B2500") to "value";
- sleep: wait "seconds" (so a re-save gets a later ZIP timestamp).

One soffice process serves all jobs; it is started here with a private
profile and ended here. Progress lines go to stderr.
"""

import json
import os
import shutil
import subprocess
import sys
import time

try:
    import uno
    from com.sun.star.beans import PropertyValue
    from com.sun.star.connection import NoConnectException
except ImportError as error:  # pragma: no cover - depends on the system
    sys.exit(f"byte_goals_uno: cannot import LibreOffice's uno module ({error}): "
             f"install the Debian package python3-uno")


def prop(name, value):
    p = PropertyValue()
    p.Name, p.Value = name, value
    return p


def url(path):
    return uno.systemPathToFileUrl(os.path.abspath(path))


def connect(soffice, profile):
    pipe = f"ec_byte_goals_{os.getpid()}"
    process = subprocess.Popen(
        [soffice, f"-env:UserInstallation={url(profile)}", "--headless", "--invisible",
         "--nologo", "--nodefault", "--norestore", "--nolockcheck",
         f"--accept=pipe,name={pipe};urp;StarOffice.ComponentContext"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    local = uno.getComponentContext()
    resolver = local.ServiceManager.createInstanceWithContext(
        "com.sun.star.bridge.UnoUrlResolver", local)
    deadline = time.monotonic() + 120
    while True:
        try:
            context = resolver.resolve(
                f"uno:pipe,name={pipe};urp;StarOffice.ComponentContext")
            break
        except NoConnectException:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit(f"byte_goals_uno: soffice did not accept a connection "
                         f"(exit status {process.poll()})")
            time.sleep(0.5)
    desktop = context.ServiceManager.createInstanceWithContext(
        "com.sun.star.frame.Desktop", context)
    return process, desktop


def load(desktop, path):
    doc = desktop.loadComponentFromURL(url(path), "_blank", 0,
                                       (prop("Hidden", True),))
    if doc is None:
        raise RuntimeError(f"LibreOffice could not open {path}")
    return doc


def replace_word(doc, skip, word):
    paragraphs = []
    enum = doc.Text.createEnumeration()
    while enum.hasMoreElements():
        paragraph = enum.nextElement()
        if paragraph.supportsService("com.sun.star.text.Paragraph") and \
                len(paragraph.String) > 200:
            paragraphs.append(paragraph)
    paragraph = paragraphs[len(paragraphs) // 2]
    cursor = doc.Text.createTextCursorByRange(paragraph.Start)
    for _ in range(skip):
        cursor.gotoNextWord(False)
    cursor.gotoEndOfWord(True)
    old = cursor.String
    cursor.String = word
    return old


def fill_cell(cell, value):
    if isinstance(value, str) and value.startswith("="):
        cell.Formula = value
    elif isinstance(value, str):
        cell.String = value
    else:
        cell.Value = value


def run(job, desktop):
    op = job["op"]
    if op == "sleep":
        time.sleep(job["seconds"])
        return ""
    if op == "convert":
        doc = load(desktop, job["src"])
        try:
            doc.storeToURL(url(job["dst"]), (prop("FilterName", job["filter"]),))
        finally:
            doc.close(True)
        return ""
    shutil.copyfile(job["src"], job["dst"])
    doc = load(desktop, job["dst"])
    note = ""
    try:
        if op == "replace_word":
            note = f"replaced {replace_word(doc, job['skip'], job['word'])!r}"
        elif op == "insert_row":
            sheet = doc.Sheets.getByIndex(0)
            sheet.Rows.insertByIndex(job["row"], 1)
            for column, value in enumerate(job["cells"]):
                fill_cell(sheet.getCellByPosition(column, job["row"]), value)
            doc.calculateAll()
        elif op == "set_cell":
            sheet = doc.Sheets.getByIndex(0)
            fill_cell(sheet.getCellRangeByName(job["cell"]), job["value"])
            doc.calculateAll()
        elif op != "resave":
            raise ValueError(f"unknown op {op}")
        doc.store()
    finally:
        doc.close(True)
    return note


def stop(process, desktop):
    try:
        desktop.terminate()
    except Exception:  # noqa: BLE001 - the bridge dies with the process
        pass
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main():
    with open(sys.argv[1], encoding="utf-8") as file:
        spec = json.load(file)
    process, desktop = connect(spec["soffice"], spec["profile"])
    try:
        for job in spec["jobs"]:
            start = time.monotonic()
            name = os.path.basename(job.get("dst", ""))
            if job.get("optional") and not os.path.exists(job["src"]):
                print(f"  soffice {job['op']:12} {name} skipped: its source was not made",
                      file=sys.stderr, flush=True)
                continue
            try:
                note = run(job, desktop)
            except Exception as error:  # noqa: BLE001 - LibreOffice's own exceptions, by name
                if not job.get("optional"):
                    raise
                # A real document LibreOffice cannot open or save: said, nothing half-made left
                # to be measured, and the caller leaves it out.
                if os.path.exists(job["dst"]):
                    os.remove(job["dst"])
                print(f"  soffice {job['op']:12} {name} failed: {type(error).__name__}: {error}",
                      file=sys.stderr, flush=True)
                # LibreOffice may have gone down with the file: a fresh one for the jobs after.
                stop(process, desktop)
                process, desktop = connect(spec["soffice"], spec["profile"])
                continue
            if job["op"] != "sleep":
                print(f"  soffice {job['op']:12} {name} "
                      f"({time.monotonic() - start:.1f} s) {note}", file=sys.stderr, flush=True)
    finally:
        stop(process, desktop)


if __name__ == "__main__":
    main()
