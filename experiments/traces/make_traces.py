#!/usr/bin/env python3
"""Make real LibreOffice-written edit traces for the edit-patch core.

A trace is a pair of files (base, new), both written by LibreOffice, where
new is base after one small user edit and a re-save. We write flat
OpenDocument sources (.fodt / .fods / .fodp) for every base and every edited
version, let headless LibreOffice convert them to each format of their app
(Writer: docx, odt; Calc: xlsx, ods; Impress: pptx, odp), check the results
and lay them out as

    OUT/<trace-name>/base.<ext>, OUT/<trace-name>/new.<ext>, OUT/manifest.json

Speed: one soffice start costs about a second, so every (phase, format) is
one soffice invocation converting many files, and invocations run in
parallel, each with its own private profile. Bases are converted first; the
conversion of a new version starts at least 2 seconds after its base's, so
the two files carry different ZIP timestamps (DOS time has a 2-second
resolution), as a real later re-save would.

Realism: the sources carry document metadata (creator, dates, editing
cycles); an edited version also bumps the modification date, editing cycles
and editing time, as LibreOffice does on every save. A "noedit" trace
converts the very same source again, so it shows what LibreOffice itself
changes between two saves of one document.

With --chain N the Writer traces are instead versions 1 .. N of one typing
session: the same base with 1, 2, .., N characters typed in the middle
(writer-<size>-chain01 .. chainNN), each with one more editing cycle and
one more minute in its metadata. Version k - 1 to version k is a
one-character save, and every version is new: what the save-time benchmarks
send, so that no process has seen the version it diffs or rebuilds
(experiments/bench/proxy_bench.py --chain; made on demand in its own folder).

Every output is checked: it must exist, be a readable ZIP with intact CRCs,
hold its app's body parts, and the edit must show in the body text (new
holds the edited text, base does not); for noedit the body parts must be
identical. The run is cached: if OUT/manifest.json was made by the same
generator version, the same LibreOffice and the same selection, and its files
are in place, nothing is redone unless --force is given.
"""

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime
import filecmp
import html
import json
import os
import queue
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from xml.sax.saxutils import escape

GENERATOR_VERSION = 2
APPS = ("writer", "calc", "impress")
FORMATS = {"writer": ("docx", "odt"), "calc": ("xlsx", "ods"), "impress": ("pptx", "odp")}
SOURCE_EXT = {"writer": "fodt", "calc": "fods", "impress": "fodp"}
DEFAULT_SIZES = ("1k", "100k", "1m")
MULTI_SIZE = "100k"  # the Writer size that also gets the two-edit trace
# --chain N: Writer's edits are "chain01" .. "chainN" instead, the same base
# with 1 .. N characters of CHAIN_WORD typed in the middle, as a user typing
# it makes them, one save a character: versions 1 .. N of one editing session.
CHAIN = "chain"
CHAIN_WORD = "edgecourier sync "
SOFFICE_TIMEOUT = 900  # seconds for one batch; a hung soffice must not hang us
RESAVE_GAP = 2.0  # seconds between a base's and its new version's conversion
SOFFICE_ATTEMPTS = 3  # a batch that crashes soffice (signal 6) is converted again, at most this many times in all

# ZIP members that hold the body (the user's content) of each format.
BODY_PARTS = {
    "docx": re.compile(r"word/document\.xml"),
    "xlsx": re.compile(r"xl/(worksheets/sheet\d+|sharedStrings)\.xml"),
    "pptx": re.compile(r"ppt/slides/slide\d+\.xml"),
    "odt": re.compile(r"content\.xml"),
    "ods": re.compile(r"content\.xml"),
    "odp": re.compile(r"content\.xml"),
}
# Closing tags of paragraphs and cells: they end a line of extracted text.
BLOCK_END = re.compile(r"</(?:w:p|a:p|text:p|text:h|c|v|si|table:table-cell)>")
TAG = re.compile(r"<[^>]*>")


class TraceError(Exception):
    """A failure the user must see: what went wrong and what to do."""


@dataclasses.dataclass(frozen=True)
class Edited:
    """The content of an edited version and text that proves the edit."""

    content: object
    needles: tuple  # strings present in new's body text, absent from base's


# --------------------------------------------------------------------------
# Flat OpenDocument sources

NAMESPACES = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "presentation": "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0",
    "number": "urn:oasis:names:tc:opendocument:xmlns:datastyle:1.0",
    "meta": "urn:oasis:names:tc:opendocument:xmlns:meta:1.0",
    "dc": "http://purl.org/dc/elements/1.1/",
    "of": "urn:oasis:names:tc:opendocument:xmlns:of:1.2",
}
MIMETYPES = {
    "writer": "application/vnd.oasis.opendocument.text",
    "calc": "application/vnd.oasis.opendocument.spreadsheet",
    "impress": "application/vnd.oasis.opendocument.presentation",
}


@dataclasses.dataclass(frozen=True)
class Meta:
    """Document metadata that LibreOffice updates on every save."""

    modified: str
    editing_cycles: int
    editing_minutes: int


BASE_META = Meta("2024-03-05T10:20:31", 3, 25)
RESAVED_META = Meta("2024-03-05T10:27:54", 4, 29)


def chain_meta(edit):
    """The metadata of a chain version: one more editing cycle and one more
    minute than the version before (None for other edits)."""
    if not edit.startswith(CHAIN):
        return None
    k = int(edit[len(CHAIN):])
    modified = datetime.datetime.fromisoformat(RESAVED_META.modified) + datetime.timedelta(minutes=k - 1)
    return Meta(modified.isoformat(), RESAVED_META.editing_cycles + k - 1, RESAVED_META.editing_minutes + k - 1)


def meta_xml(meta):
    return (
        "<office:meta>"
        "<meta:initial-creator>Ada Lovelace</meta:initial-creator>"
        "<meta:creation-date>2024-03-04T09:15:02</meta:creation-date>"
        "<dc:creator>Ada Lovelace</dc:creator>"
        f"<dc:date>{meta.modified}</dc:date>"
        f"<meta:editing-cycles>{meta.editing_cycles}</meta:editing-cycles>"
        f"<meta:editing-duration>PT{meta.editing_minutes}M</meta:editing-duration>"
        "</office:meta>"
    )


def flat_document(app, meta, body, styles="", automatic_styles="", master_styles=""):
    """A whole flat ODF document of `app` around the given body XML.

    Without `styles` the document has no office:styles at all, and LibreOffice
    supplies its default styles (for Impress also the default master's date,
    footer and slide-number fields); an empty office:styles would suppress them.
    """
    xmlns = " ".join(f'xmlns:{p}="{uri}"' for p, uri in NAMESPACES.items())
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<office:document {xmlns} office:version="1.3" office:mimetype="{MIMETYPES[app]}">',
        meta_xml(meta),
        f"<office:styles>{styles}</office:styles>" if styles else "",
        f"<office:automatic-styles>{automatic_styles}</office:automatic-styles>",
        f"<office:master-styles>{master_styles}</office:master-styles>",
        f"<office:body>{body}</office:body>",
        "</office:document>",
    ]
    return "\n".join(part for part in parts if part) + "\n"


# --------------------------------------------------------------------------
# Text: deterministic pseudo-random prose

WORDS = """
the of and to in a is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all we
their has would when if so no will more can out up about into than them
only other time some could these two may first then do any like my now over
such our man me even most made after also did many before must through
years where much your way well down should because each just those people
how too little state good very make world still own see men work long here
get both between life being under never day same another know while last
might us great old year off come since against go came right used take
three report market budget customer project meeting plan results quarter
growth office supplier contract delivery schedule review team service
product network storage region revenue forecast estimate analysis design
""".split()


def sentence_words(rng):
    """The words of one sentence, capitalised and punctuated."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
    if rng.random() < 0.3:
        words[rng.randrange(1, len(words) - 1)] += ","
    words[0] = words[0].capitalize()
    words[-1] += "."
    return words


def sentence(rng):
    return " ".join(sentence_words(rng))


# Writer styles: office:styles must define the paragraph styles we use, or
# LibreOffice falls back to "Standard" and the headings are lost.
BODY_STYLE, HEADING_STYLE = "Text_20_body", "Heading_20_1"
EMPHASIS = ("T1", "T2")  # automatic text styles: bold, italic
WRITER_STYLES = (
    '<style:style style:name="Standard" style:family="paragraph" style:class="text"/>'
    '<style:style style:name="Text_20_body" style:display-name="Text body" '
    'style:family="paragraph" style:parent-style-name="Standard" style:class="text">'
    '<style:paragraph-properties fo:margin-top="0cm" fo:margin-bottom="0.247cm" '
    'fo:line-height="115%"/></style:style>'
    '<style:style style:name="Heading_20_1" style:display-name="Heading 1" '
    'style:family="paragraph" style:parent-style-name="Standard" '
    'style:next-style-name="Text_20_body" style:default-outline-level="1" style:class="text">'
    '<style:paragraph-properties fo:margin-top="0.423cm" fo:margin-bottom="0.212cm" '
    'fo:keep-with-next="always"/>'
    '<style:text-properties fo:font-size="130%" fo:font-weight="bold"/></style:style>'
)
WRITER_AUTOMATIC_STYLES = (
    '<style:style style:name="T1" style:family="text">'
    '<style:text-properties fo:font-weight="bold"/></style:style>'
    '<style:style style:name="T2" style:family="text">'
    '<style:text-properties fo:font-style="italic"/></style:style>'
)


@dataclasses.dataclass(frozen=True)
class Paragraph:
    """A Writer paragraph: its style and its text as (text style or None, text) spans."""

    style: str
    spans: tuple

    @property
    def text(self):
        return "".join(text for _, text in self.spans)

    def with_char(self, offset, char):
        """This paragraph with `char` typed at `offset` of its text."""
        spans = list(self.spans)
        for i, (style, text) in enumerate(spans):
            if offset <= len(text):
                spans[i] = (style, text[:offset] + char + text[offset:])
                return dataclasses.replace(self, spans=tuple(spans))
            offset -= len(text)
        raise ValueError("offset past the end of the paragraph")


def sentence_spans(rng):
    """A sentence as spans; about one in four has a few words in bold or italic."""
    words = sentence_words(rng)
    if rng.random() >= 0.25:
        return [(None, " ".join(words))]
    start = rng.randrange(1, len(words) - 2)
    end = start + rng.randint(1, 2)
    return [(None, " ".join(words[:start]) + " "),
            (rng.choice(EMPHASIS), " ".join(words[start:end])),
            (None, " " + " ".join(words[end:]))]


def merged(spans):
    """Spans with neighbours of the same style joined."""
    result = []
    for style, text in spans:
        if result and result[-1][0] == style:
            result[-1] = (style, result[-1][1] + text)
        else:
            result.append((style, text))
    return tuple(result)


def body_paragraph(rng):
    """A paragraph of 300 to 900 characters of sentences."""
    target = rng.randint(300, 900)
    spans = sentence_spans(rng)
    while sum(len(text) for _, text in spans) < target:
        spans += [(None, " ")] + sentence_spans(rng)
    return Paragraph(BODY_STYLE, merged(spans))


def heading(rng):
    title = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
    return Paragraph(HEADING_STYLE, ((None, title.capitalize()),))


def prose(seed, total_chars):
    """A heading every 5 to 10 paragraphs; about total_chars characters in all."""
    rng = random.Random(seed)
    paragraphs, length, next_heading = [], 0, 0
    while length < total_chars or paragraphs[-1].style == HEADING_STYLE:
        if len(paragraphs) == next_heading:
            paragraphs.append(heading(rng))
            next_heading += rng.randint(5, 10)
        else:
            paragraphs.append(body_paragraph(rng))
        length += len(paragraphs[-1].text)
    return paragraphs


def insert_char(paragraphs, index, offset, char="x"):
    """Type `char` at `offset` of paragraph `index`; return the new list and a needle."""
    new = paragraphs[index].with_char(offset, char)
    needle = new.text[max(0, offset - 12) : offset + 13]
    return paragraphs[:index] + [new] + paragraphs[index + 1 :], needle


def locate(paragraphs, char_offset):
    """(paragraph index, offset in it) of a character offset into all the text."""
    for index, paragraph in enumerate(paragraphs):
        if char_offset <= len(paragraph.text):
            return index, char_offset
        char_offset -= len(paragraph.text)
    raise ValueError("offset past the end of the text")


def writer_edit(paragraphs, edit):
    """Type one character at the start, middle or end of the text, or near both ends."""
    total = sum(len(p.text) for p in paragraphs)
    if edit == "start":
        points = [(0, 0)]
    elif edit == "middle":
        points = [locate(paragraphs, total // 2)]
    elif edit == "end":
        points = [(len(paragraphs) - 1, len(paragraphs[-1].text))]
    elif edit == "multi":
        points = [locate(paragraphs, 40), locate(paragraphs, total - 40)]
    elif edit.startswith(CHAIN):
        # The k-th save of a user typing a word in the middle, one character a save.
        index, offset = locate(paragraphs, total // 2)
        k = int(edit[len(CHAIN):])
        for i in range(k):
            paragraphs, needle = insert_char(paragraphs, index, offset + i, CHAIN_WORD[i % len(CHAIN_WORD)])
        return Edited(paragraphs, (needle,))
    else:
        raise ValueError(edit)
    needles = []
    for index, offset in points:
        paragraphs, needle = insert_char(paragraphs, index, offset)
        needles.append(needle)
    return Edited(paragraphs, tuple(needles))


def paragraph_xml(paragraph):
    inner = "".join(
        escape(text) if style is None
        else f'<text:span text:style-name="{style}">{escape(text)}</text:span>'
        for style, text in paragraph.spans)
    if paragraph.style == HEADING_STYLE:
        return (f'<text:h text:style-name="{HEADING_STYLE}" text:outline-level="1">'
                f"{inner}</text:h>\n")
    return f'<text:p text:style-name="{paragraph.style}">{inner}</text:p>\n'


def writer_source(paragraphs, meta):
    body = "".join(map(paragraph_xml, paragraphs))
    return flat_document("writer", meta, f"<office:text>\n{body}</office:text>",
                         styles=WRITER_STYLES, automatic_styles=WRITER_AUTOMATIC_STYLES)


# --------------------------------------------------------------------------
# Calc: an order list with numbers, text, dates and formulas

# Sheet and deck sizes: a small and a realistic one, as Writer has 1k to 1m.
CALC_SIZES = {"200rows": 200, "5000rows": 5000}
IMPRESS_SIZES = {"5slides": 5, "40slides": 40}
CUSTOMERS = ["Acme Corp", "Globex", "Initech", "Umbrella plc", "Stark Industries",
             "Wayne Enterprises", "Hooli", "Vandelay Imports", "Wonka Ltd", "Tyrell Inc"]
REGIONS = ["North", "South", "East", "West", "Central"]
PRODUCTS = ["Widget", "Gadget", "Sprocket", "Gizmo", "Flange", "Bracket", "Valve"]
CALC_HEADER = ["ID", "Date", "Customer", "Region", "Product", "Quantity", "Unit price", "Total"]
CALC_STYLES = (
    '<number:date-style style:name="N1">'
    '<number:year number:style="long"/><number:text>-</number:text>'
    '<number:month number:style="long"/><number:text>-</number:text>'
    '<number:day number:style="long"/></number:date-style>'
    '<number:number-style style:name="N2">'
    '<number:number number:decimal-places="2" number:min-decimal-places="2" '
    'number:min-integer-digits="1"/></number:number-style>'
    '<style:style style:name="ce1" style:family="table-cell" '
    'style:parent-style-name="Default" style:data-style-name="N1"/>'
    '<style:style style:name="ce2" style:family="table-cell" '
    'style:parent-style-name="Default" style:data-style-name="N2"/>'
    '<style:style style:name="ce3" style:family="table-cell" style:parent-style-name="Default">'
    '<style:text-properties fo:font-weight="bold"/></style:style>'
)


@dataclasses.dataclass(frozen=True)
class Order:
    id: int
    date: datetime.date
    customer: str
    region: str
    product: str
    quantity: int
    unit_price: float  # rounded to cents


def orders(seed, count):
    rng = random.Random(seed)
    start = datetime.date(2024, 1, 2)
    return [
        Order(
            id=1000 + i,
            date=start + datetime.timedelta(days=rng.randrange(365)),
            customer=rng.choice(CUSTOMERS),
            region=rng.choice(REGIONS),
            product=rng.choice(PRODUCTS),
            quantity=rng.randint(1, 99),
            unit_price=rng.randint(150, 25000) / 100,
        )
        for i in range(count)
    ]


def calc_edit(rows, edit):
    """Change a quantity in row 100, or add a new order at the end or after row 100."""
    middle = len(rows) // 2
    if edit == "cell":
        changed = dataclasses.replace(rows[middle], quantity=98765)
        return Edited(rows[:middle] + [changed] + rows[middle + 1 :], ("\n98765\n",))
    added = Order(1000 + len(rows), datetime.date(2024, 12, 30), "Harbor Lane Bakery",
                  "West", "Gizmo", 12, 19.95)
    if edit == "row-end":
        return Edited(rows + [added], ("Harbor Lane Bakery",))
    if edit == "row-middle":
        return Edited(rows[:middle] + [added] + rows[middle:], ("Harbor Lane Bakery",))
    raise ValueError(edit)


def number_text(value):
    """A number as written in office:value, without float noise."""
    return f"{value:.10g}"


def string_cell(text, style=""):
    style = f' table:style-name="{style}"' if style else ""
    return (f'<table:table-cell{style} office:value-type="string">'
            f"<text:p>{escape(text)}</text:p></table:table-cell>")


def order_row(order, row_number):
    total = round(order.quantity * order.unit_price, 2)
    formula = f"of:=[.F{row_number}]*[.G{row_number}]"
    return (
        "<table:table-row>"
        f'<table:table-cell office:value-type="float" office:value="{order.id}">'
        f"<text:p>{order.id}</text:p></table:table-cell>"
        f'<table:table-cell table:style-name="ce1" office:value-type="date" '
        f'office:date-value="{order.date.isoformat()}">'
        f"<text:p>{order.date.isoformat()}</text:p></table:table-cell>"
        + string_cell(order.customer) + string_cell(order.region) + string_cell(order.product)
        + f'<table:table-cell office:value-type="float" office:value="{order.quantity}">'
        f"<text:p>{order.quantity}</text:p></table:table-cell>"
        f'<table:table-cell table:style-name="ce2" office:value-type="float" '
        f'office:value="{number_text(order.unit_price)}">'
        f"<text:p>{order.unit_price:.2f}</text:p></table:table-cell>"
        f'<table:table-cell table:style-name="ce2" table:formula="{formula}" '
        f'office:value-type="float" office:value="{number_text(total)}">'
        f"<text:p>{total:.2f}</text:p></table:table-cell>"
        "</table:table-row>\n"
    )


def calc_source(rows, meta):
    header = "".join(string_cell(name, "ce3") for name in CALC_HEADER)
    body = "".join(order_row(order, row_number) for row_number, order in enumerate(rows, 2))
    table = (
        '<office:spreadsheet><table:table table:name="Orders">'
        f'<table:table-column table:number-columns-repeated="{len(CALC_HEADER)}"/>\n'
        f"<table:table-row>{header}</table:table-row>\n{body}"
        "</table:table></office:spreadsheet>"
    )
    return flat_document("calc", meta, table, automatic_styles=CALC_STYLES)


# --------------------------------------------------------------------------
# Impress: slides with a title placeholder and a text box each

SLIDE_TITLES = ["Quarterly review", "Market overview", "Product roadmap",
                "Budget and forecast", "Next steps"]
IMPRESS_STYLES = (
    '<style:page-layout style:name="PM1"><style:page-layout-properties '
    'fo:margin-top="0cm" fo:margin-bottom="0cm" fo:margin-left="0cm" fo:margin-right="0cm" '
    'fo:page-width="28cm" fo:page-height="15.75cm" style:print-orientation="landscape"/>'
    "</style:page-layout>"
    '<style:style style:name="pr1" style:family="presentation" '
    'style:parent-style-name="Default-title"/>'
    '<style:style style:name="gr1" style:family="graphic"><style:graphic-properties '
    'draw:stroke="none" draw:fill="none" draw:auto-grow-height="true" fo:min-height="1cm"/>'
    "</style:style>"
)
IMPRESS_MASTER = '<style:master-page style:name="Default" style:page-layout-name="PM1"/>'


@dataclasses.dataclass(frozen=True)
class Slide:
    title: str
    boxes: tuple  # each a tuple of paragraphs


def slides(seed, count):
    rng = random.Random(seed)
    titles = [t if i < len(SLIDE_TITLES) else f"{t} ({i // len(SLIDE_TITLES) + 1})"
              for i, t in enumerate(SLIDE_TITLES[i % len(SLIDE_TITLES)] for i in range(count))]
    return [Slide(title, ((sentence(rng), sentence(rng), sentence(rng)),)) for title in titles]


def impress_edit(deck, edit):
    """Retitle slide 2, add a word to slide 3's text box, or add a box to slide 4."""
    deck = list(deck)
    if edit == "title":
        deck[1] = dataclasses.replace(deck[1], title="Market overview and outlook")
        return Edited(deck, ("Market overview and outlook",))
    if edit == "textbox-word":
        box = list(deck[2].boxes[0])
        words = box[0].split(" ")
        words.insert(3, "urgently")
        box[0] = " ".join(words)
        deck[2] = dataclasses.replace(deck[2], boxes=(tuple(box),) + deck[2].boxes[1:])
        return Edited(deck, (" ".join(words[1:6]),))
    if edit == "textbox-add":
        added = ("Owner: Dana Whitfield, due end of April.",)
        deck[3] = dataclasses.replace(deck[3], boxes=deck[3].boxes + (added,))
        return Edited(deck, added)
    raise ValueError(edit)


def text_box(paragraphs, y_cm):
    text = "".join(f"<text:p>{escape(p)}</text:p>" for p in paragraphs)
    return (f'<draw:frame draw:style-name="gr1" draw:layer="layout" svg:x="1.4cm" '
            f'svg:y="{y_cm}cm" svg:width="25.2cm" svg:height="4cm">'
            f"<draw:text-box>{text}</draw:text-box></draw:frame>")


def slide_xml(number, slide):
    title = (
        '<draw:frame presentation:style-name="pr1" draw:layer="layout" '
        'presentation:class="title" presentation:user-transformed="true" '
        'svg:x="1.4cm" svg:y="0.6cm" svg:width="25.2cm" svg:height="2.6cm">'
        f"<draw:text-box><text:p>{escape(slide.title)}</text:p></draw:text-box></draw:frame>"
    )
    boxes = "".join(text_box(box, 4 + 5 * i) for i, box in enumerate(slide.boxes))
    return (f'<draw:page draw:name="page{number}" draw:master-page-name="Default">'
            f"{title}{boxes}</draw:page>\n")


def impress_source(deck, meta):
    pages = "".join(slide_xml(number, slide) for number, slide in enumerate(deck, 1))
    return flat_document("impress", meta, f"<office:presentation>\n{pages}</office:presentation>",
                         automatic_styles=IMPRESS_STYLES, master_styles=IMPRESS_MASTER)


# --------------------------------------------------------------------------
# The plan: which sources, which traces

@dataclasses.dataclass(frozen=True)
class Trace:
    app: str
    edit: str
    size: str | None  # "1k" / "100k" / "1m" for Writer, "200rows" / "5000rows", "5slides" / "40slides"
    base_key: str  # source names, unique over the run
    new_key: str
    needles: tuple

    def name(self, fmt):
        parts = [self.app, self.size, self.edit, fmt]
        return "-".join(p for p in parts if p)


def parse_size(size):
    match = re.fullmatch(r"(\d+)([km]?)", size)
    if not match:
        raise TraceError(f"bad size {size!r}: use a number of characters like 1k, 100k or 1m")
    return int(match[1]) * {"": 1, "k": 1000, "m": 1000_000}[match[2]]


def plan(apps, sizes, chain=0):
    """Return (sources by app: {key: flat XML}, traces). `chain`: Writer's
    edits are the N versions of one typing session (see CHAIN), each saved
    a minute after the one before."""
    sources = {app: {} for app in apps}
    traces = []

    def add(app, base_key, base, edits, make_source, make_edit, size=None):
        sources[app][base_key] = make_source(base, BASE_META)
        for edit in edits:
            new_key = f"{base_key}-{edit}"
            if edit == "noedit":
                sources[app][new_key] = sources[app][base_key]
                needles = ()
            else:
                edited = make_edit(base, edit)
                sources[app][new_key] = make_source(edited.content, chain_meta(edit) or RESAVED_META)
                needles = edited.needles
            traces.append(Trace(app, edit, size, base_key, new_key, needles))

    if "writer" in apps:
        for size in sizes:
            edits = ["start", "middle", "end", "noedit"] + (["multi"] if size == MULTI_SIZE else [])
            if chain:
                edits = [f"{CHAIN}{k:02d}" for k in range(1, chain + 1)]
            add("writer", f"writer-{size}", prose(f"writer-{size}", parse_size(size)), edits,
                writer_source, writer_edit, size)
    if "calc" in apps:
        for size, rows in CALC_SIZES.items():
            add("calc", f"calc-{size}", orders("calc", rows), ["cell", "row-end", "row-middle", "noedit"],
                calc_source, calc_edit, size)
    if "impress" in apps:
        for size, count in IMPRESS_SIZES.items():
            add("impress", f"impress-{size}", slides("impress", count),
                ["title", "textbox-word", "textbox-add", "noedit"], impress_source, impress_edit, size)
    return sources, traces


# --------------------------------------------------------------------------
# Running LibreOffice

def soffice_path():
    path = shutil.which("soffice")
    if not path:
        raise TraceError("soffice not found on PATH: install LibreOffice (Debian: "
                         "libreoffice-writer-nogui libreoffice-calc-nogui "
                         "libreoffice-impress-nogui)")
    return path


def soffice_version(soffice, profile):
    result = subprocess.run([soffice, f"-env:UserInstallation=file://{profile}", "--version"],
                            capture_output=True, text=True, timeout=120)
    version = result.stdout.strip()
    if result.returncode or not version.startswith("LibreOffice"):
        raise TraceError(f"`soffice --version` failed: {result.stdout}{result.stderr}")
    return version


@dataclasses.dataclass
class Batch:
    """One soffice invocation: convert the sources of one app to one format."""

    phase: str  # "base" or "new"
    app: str
    fmt: str
    sources: list  # paths of flat ODF files
    outdir: str
    after: "Batch | None" = None  # start RESAVE_GAP after this batch succeeded
    finished: float | None = None  # time.monotonic() when it succeeded
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def outputs(self):
        return [os.path.join(self.outdir, os.path.splitext(os.path.basename(s))[0]
                             + "." + self.fmt) for s in self.sources]


def convert(soffice, batch, profile, say):
    if batch.after:
        batch.after.done.wait()
        if batch.after.finished is None:
            raise TraceError(f"skipped {batch.app} -> {batch.fmt}: its bases failed")
        time.sleep(max(0.0, batch.after.finished + RESAVE_GAP - time.monotonic()))
    os.makedirs(batch.outdir, exist_ok=True)
    command = [soffice, f"-env:UserInstallation=file://{profile}", "--headless",
               "--norestore", "--convert-to", batch.fmt, "--outdir", batch.outdir,
               *batch.sources]
    started = time.monotonic()
    for attempt in range(1, SOFFICE_ATTEMPTS + 1):
        for output in batch.outputs():  # a crashed attempt's partial files are not results
            if os.path.exists(output):
                os.remove(output)
        try:
            result = subprocess.run(command, capture_output=True, text=True,
                                    timeout=SOFFICE_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise TraceError(f"soffice took over {SOFFICE_TIMEOUT} s converting "
                             f"{batch.app} to {batch.fmt}; is another LibreOffice stuck?") from None
        missing = [o for o in batch.outputs() if not os.path.isfile(o) or os.path.getsize(o) == 0]
        if not missing:
            break
        failure = (f"soffice made no {missing[0]} (exit status {result.returncode}).\n"
                   f"command: {' '.join(command)}\nstdout: {result.stdout}\nstderr: {result.stderr}")
        if result.returncode >= 0 and result.returncode != 134 or attempt == SOFFICE_ATTEMPTS:
            raise TraceError(failure)
        # LibreOffice 7.4 headless now and then aborts on a conversion it does the next time
        # (WrappedTargetRuntimeException, signal 6, seen on a fresh machine's first run).
        say(f"[{batch.phase:4}] {batch.app:7} -> {batch.fmt:4}: soffice crashed (exit status "
            f"{result.returncode}, attempt {attempt} of {SOFFICE_ATTEMPTS}); converting again")
    batch.finished = time.monotonic()
    size = sum(os.path.getsize(s) for s in batch.sources)
    say(f"[{batch.phase:4}] {batch.app:7} -> {batch.fmt:4}: {len(batch.sources):2} files, "
        f"{size / 1e6:5.1f} MB of flat XML, {batch.finished - started:5.1f} s")


def run_batches(soffice, batches, profiles, say):
    """Run batches on as many soffice processes as there are profiles."""
    free = queue.Queue()
    for profile in profiles:
        free.put(profile)

    def run(batch):
        profile = free.get()
        try:
            convert(soffice, batch, profile, say)
        finally:
            free.put(profile)
            batch.done.set()

    # Every base before any new version (so a new version never waits for a
    # base that has not started), biggest first.
    order = sorted(batches, key=lambda b: (b.phase != "base",
                                           -sum(os.path.getsize(s) for s in b.sources)))
    with concurrent.futures.ThreadPoolExecutor(len(profiles)) as pool:
        futures = [pool.submit(run, batch) for batch in order]
        try:
            for future in futures:
                future.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


# --------------------------------------------------------------------------
# Checking outputs

def read_zip(path):
    """{member name: uncompressed bytes}; raises TraceError unless a sound ZIP."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            if bad:
                raise TraceError(f"{path}: member {bad} fails its CRC check")
            return {info.filename: archive.read(info) for info in archive.infolist()}
    except zipfile.BadZipFile as error:
        raise TraceError(f"{path}: not a readable ZIP ({error})") from None


def body_text(fmt, members):
    """Visible text of the body parts, one line per paragraph or cell."""
    xml = "".join(members[name].decode("utf-8") for name in sorted(members)
                  if BODY_PARTS[fmt].fullmatch(name))
    return html.unescape(TAG.sub("", BLOCK_END.sub("\n", xml)))


def check_trace(name, fmt, trace, base_path, new_path):
    """Check one trace; return the names of the members whose content changed."""
    base, new = read_zip(base_path), read_zip(new_path)
    texts = {}
    for path, members in ((base_path, base), (new_path, new)):
        if not any(BODY_PARTS[fmt].fullmatch(n) for n in members):
            raise TraceError(f"{path}: no body part ({BODY_PARTS[fmt].pattern}) in "
                             f"{sorted(members)}")
        texts[path] = body_text(fmt, members)
        if "<office:document" in texts[path]:
            raise TraceError(f"{path}: LibreOffice imported its flat XML source as plain text")
    changed = sorted(n for n in base.keys() | new.keys() if base.get(n) != new.get(n))
    changed_body = [n for n in changed if BODY_PARTS[fmt].fullmatch(n)]
    if trace.edit != "noedit" and filecmp.cmp(base_path, new_path, shallow=False):
        raise TraceError(f"{name}: base and new are the same bytes")
    if trace.edit == "noedit":
        if changed_body:
            raise TraceError(f"{name}: a save with no edit changed body parts {changed_body}")
        return changed
    if not changed_body:
        raise TraceError(f"{name}: the edit changed no body part (changed: {changed})")
    for needle in trace.needles:
        if needle not in texts[new_path] or needle in texts[base_path]:
            raise TraceError(f"{name}: edited text {needle!r} should be in new's body "
                             f"and not in base's")
    return changed


# --------------------------------------------------------------------------
# The whole run

def write_sources(work, sources):
    """Write every source once under work/src/<app>/; return {key: path}.

    Sources must be well-formed: LibreOffice imports a file it cannot parse
    as plain text, so a broken source would still give a "document".
    """
    paths = {}
    for app, by_key in sources.items():
        folder = os.path.join(work, "src", app)
        os.makedirs(folder, exist_ok=True)
        for key, xml in by_key.items():
            try:
                ElementTree.fromstring(xml)
            except ElementTree.ParseError as error:
                raise TraceError(f"generated source {key} is not well-formed XML: {error}")
            paths[key] = os.path.join(folder, f"{key}.{SOURCE_EXT[app]}")
            with open(paths[key], "w", encoding="utf-8") as file:
                file.write(xml)
    return paths


def make_batches(work, traces, source_paths):
    """Two batches per (app, format): the bases, then the new versions."""
    batches = []
    for app in dict.fromkeys(t.app for t in traces):
        app_traces = [t for t in traces if t.app == app]
        for fmt in FORMATS[app]:
            base = Batch("base", app, fmt,
                         [source_paths[k] for k in dict.fromkeys(t.base_key for t in app_traces)],
                         os.path.join(work, "out", fmt))
            new = Batch("new", app, fmt, [source_paths[t.new_key] for t in app_traces],
                        os.path.join(work, "out", fmt), after=base)
            batches += [base, new]
    return batches


def place_trace(out, work, trace, fmt):
    """Copy one trace's files into OUT and check them; return its manifest entry."""
    name = trace.name(fmt)
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    entry = {"name": name, "format": fmt, "app": trace.app, "edit": trace.edit,
             "size": trace.size}
    for role, key in (("base", trace.base_key), ("new", trace.new_key)):
        target = os.path.join(folder, f"{role}.{fmt}")
        shutil.copyfile(os.path.join(work, "out", fmt, f"{key}.{fmt}"), target)
        entry[role] = os.path.relpath(target, out)
        entry[f"{role}_bytes"] = os.path.getsize(target)
    base_path, new_path = (os.path.join(out, entry[r]) for r in ("base", "new"))
    entry["changed_parts"] = check_trace(name, fmt, trace, base_path, new_path)
    return entry


def read_manifest(out):
    try:
        with open(os.path.join(out, "manifest.json"), encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def up_to_date(manifest, out, selection, soffice_version_string):
    """Whether the manifest comes from this generator, LibreOffice and selection,
    and its files are in place."""
    if (not manifest or manifest.get("generator_version") != GENERATOR_VERSION
            or manifest.get("soffice_version") != soffice_version_string
            or manifest.get("selection") != selection):
        return False
    return all(os.path.isfile(path) and os.path.getsize(path) == entry[f"{role}_bytes"]
               for entry in manifest["traces"] for role in ("base", "new")
               for path in [os.path.join(out, entry[role])])


def remove_old_traces(out, manifest):
    """Remove the manifest and the trace folders it lists, so no stale trace stays."""
    for entry in (manifest or {}).get("traces", []):
        name = entry.get("name", "")
        if re.fullmatch(r"[a-z0-9-]+", name):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out, "manifest.json"))


def write_manifest(out, manifest):
    path = os.path.join(out, "manifest.json")
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        json.dump(manifest, file, indent=1)
        file.write("\n")
    os.replace(path + ".tmp", path)


def generate(args, say):
    soffice = soffice_path()
    selection = {"apps": list(args.only), "sizes": list(args.sizes)}
    if args.chain:
        selection["chain"] = args.chain
    with tempfile.TemporaryDirectory(prefix="make-traces-") as work:
        profiles = [os.path.join(work, f"profile{i}") for i in range(args.jobs)]
        version = soffice_version(soffice, profiles[0])
        old = read_manifest(args.out)
        if not args.force and up_to_date(old, args.out, selection, version):
            say(f"{args.out}/manifest.json is up to date (generator {GENERATOR_VERSION}, "
                f"{version}); use --force to remake it")
            return
        started = time.monotonic()
        os.makedirs(args.out, exist_ok=True)
        remove_old_traces(args.out, old)
        sources, traces = plan(args.only, args.sizes, args.chain)
        paths = write_sources(work, sources)
        say(f"wrote {len(paths)} flat ODF sources; converting with {version}, "
            f"{args.jobs} soffice processes")
        run_batches(soffice, make_batches(work, traces, paths), profiles, say)
        say(f"conversions done after {time.monotonic() - started:.1f} s; checking traces")
        entries = [place_trace(args.out, work, trace, fmt)
                   for trace in traces for fmt in FORMATS[trace.app]]
        write_manifest(args.out, {"generator_version": GENERATOR_VERSION,
                                  "soffice_version": version, "selection": selection,
                                  "traces": entries})
        say(f"made and checked {len(entries)} traces in {args.out} "
            f"in {time.monotonic() - started:.1f} s")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Make edit traces (base, new) written by headless LibreOffice: Writer "
                    "(docx, odt), Calc (xlsx, ods) and Impress (pptx, odp) documents, each "
                    "with one small edit or none, laid out as OUT/<trace>/base.<ext>, "
                    "OUT/<trace>/new.<ext> and OUT/manifest.json.",
        epilog="Example: python3 experiments/traces/make_traces.py --out /tmp/traces")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--only", choices=APPS, action="append",
                        help="make only this app's traces (repeatable; default: all)")
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                        help="Writer body-text sizes in characters, comma separated "
                             f"(default: {','.join(DEFAULT_SIZES)}; the two-edit 'multi' "
                             f"trace is made at {MULTI_SIZE} when listed)")
    parser.add_argument("--chain", type=int, default=0, metavar="N",
                        help="Writer: instead of the start/middle/end/noedit edits, the N versions of one "
                             "typing session (writer-<size>-chain01 .. chainNN: 1 .. N characters typed in "
                             "the middle, one save each; for timing saves that are each new to the proxy "
                             "and the EPS, as a user's are)")
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 4),
                        help="soffice processes to run at once (default: CPUs, at most 4)")
    parser.add_argument("--force", action="store_true",
                        help="remake even if OUT/manifest.json is up to date")
    parser.add_argument("--quiet", action="store_true", help="print errors only")
    args = parser.parse_args(argv)
    args.only = [app for app in APPS if app in (args.only or APPS)]
    args.sizes = list(dict.fromkeys(s.strip() for s in args.sizes.split(",") if s.strip()))
    for size in args.sizes:
        try:
            parse_size(size)
        except TraceError as error:
            parser.error(str(error))
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not 0 <= args.chain <= 99:
        parser.error("--chain must be between 0 and 99")
    return args


def main(argv=None):
    args = parse_args(argv)
    lock = threading.Lock()

    def say(line):
        if not args.quiet:
            with lock:
                print(line, flush=True)

    try:
        generate(args, say)
    except TraceError as error:
        print(f"make_traces: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
