"""`python -m ec_proxy.status`: what EdgeCourier saved, per document and in total.

Reads the statistics the proxy records in its state folder (`ec_proxy.store`)
without disturbing a running proxy (a read-only SQLite connection), and
prints, per document and in total: the saves, how many went as a patch,
whole through the EPS or direct to the provider, the bytes the device's link
carried against the bytes whole uploads would have cost, the share saved,
how the last save went, and why the last whole one went whole. `--json`
gives the same for scripts and the demo.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from dataclasses import asdict

from .store import DocStats, StoreError, StoreStats, read_stats

PROVIDER_NAMES = {1: "dropbox", 2: "onedrive", 3: "gdrive", 4: "webdav"}

EPILOG = """\
columns:
  sent    bytes sent to the EPS (edit patches, or whole files the EPS forwarded)
  link    bytes the device's link carried: sent, plus whole files that went
          direct to the provider (EPS unreachable, fallback)
  whole   bytes the same uploads cost without EdgeCourier
  saved   1 - link / whole

how a save went:
  patch   an edit patch through the EPS
  full    the whole file through the EPS (no base yet, patch would not pay, ...)
  direct  the whole file straight to the provider (EPS not usable)

"versions dropped when read" counts the last-synced versions the store
found missing, corrupt (not their SHA-256) or unreadable (an I/O error of
their own, e.g. a failing medium: deleted at once); each costs its document
one whole save.

the EPS line says how the proxy last found its EPS: ok, unreachable,
pin mismatch (its certificate is not the one the enrolment pins: EdgeCourier
is off for this device until that is fixed) or auth failed (it refuses the
device's key), with the reason and counters of those events; below it, the
patch-or-whole rule's view of the link as the proxy last recorded it (rate,
round trip, the EPS's own time, how often the EPS lacked a patch's base)
and how many saves in a row come before it measures the other way again.

reasons are the proxy's codes, e.g. no_base, too_small, cannot_pay,
does_not_pay, direct_faster, patch_faster, explore, explore_direct,
patch_not_smaller, base_unknown, eps_unreachable;
see docs/device-proxy-decision.md.

example:
  python -m ec_proxy.status --state ~/.local/state/edgecourier
"""


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="backslashreplace")


def human(n: int) -> str:
    """Bytes as a short figure, with the exact count for small values."""
    if n < 10_000:
        return f"{n} B"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _percent(d: DocStats) -> str:
    p = d.saved_percent
    return "-" if p is None else f"{p:.1f}%"


def _counts(d: DocStats) -> str:
    return (f"{d.saves} save{'s' if d.saves != 1 else ''} "
            f"({d.patch_saves} patch, {d.full_saves} full, {d.direct_saves} direct): "
            f"sent {human(d.sent_bytes)}, link {human(d.link_bytes)} for {human(d.whole_bytes)} whole, "
            f"saved {_percent(d)}")


def _lasts(d: DocStats) -> str:
    line = f"last: {d.last_how or '-'} ({d.last_reason or '-'}) at {_when(d.last_at)}"
    if d.last_whole_reason is not None and d.last_how == "patch":
        line += f"; last whole: {d.last_whole_reason} at {_when(d.last_whole_at)}"
    return line


def eps_line(eps: dict) -> list[str]:
    """How the proxy last found its EPS, for people."""
    if not eps:
        return ["EPS: not contacted yet"]
    state = eps["state"].replace("_", " ")
    head = f"EPS {eps['url']}: {state.upper() if eps['state'] != 'ok' else 'ok'} since {_when(eps['since'])}"
    if eps["reason"]:
        head += f": {eps['reason']}"
    c = eps["counts"]
    counts = (f"  events: {c['pin_mismatch']} pin mismatch, {c['unreachable']} unreachable, "
              f"{c['auth_failed']} auth failed, {c['outcome_unknown']} save(s) answered 504 (outcome unknown); "
              f"last checked {_when(eps['at'])}")
    lines = [head, counts]
    link = eps.get("link")
    if link:
        link = collections.defaultdict(lambda: float("nan"), link)  # a row from another version may lack a key
        lines.append(f"  the rule's view of the link ({_when(eps['link_at'])}): {link['mbit_s']:.1f} Mbit/s, round trip "
                     f"{link['rtt_ms']:.1f} ms (measurements: {link['exchanges']}); EPS's own time per save "
                     f"{link['eps_overhead_ms']:.1f} ms; base misses {link['base_miss_rate']:.1%} "
                     f"(patches seen: {link['patches_seen']}); next exploration after {link['explore_after_whole']} "
                     f"more whole or {link['explore_after_patched']} more patched saves in a row")
    return lines


def dropped_line(st: StoreStats) -> list[str]:
    """Versions the store dropped when it read them, if any."""
    d = st.dropped
    if not any(d.values()):
        return []
    return [f"  versions dropped when read: {d['missing']} missing, {d['corrupt']} corrupt, {d['unreadable']} "
            f"unreadable (an I/O error: deleted, see the proxy's log); their documents' "
            f"next saves went whole"]


def render_text(st: StoreStats) -> str:
    limit = f" (limit {human(st.max_bytes)})" if st.max_bytes else ""
    out = [f"EdgeCourier device store {st.folder}: {st.documents_held} document(s) held, "
           f"{human(st.held_bytes)}{limit}, {st.pending} upload(s) pending"] + dropped_line(st) + eps_line(st.eps) + [""]
    if not st.docs:
        out.append("no saves recorded yet")
        return "\n".join(out) + "\n"
    for d in st.docs:
        out.append(f"{PROVIDER_NAMES.get(d.provider, str(d.provider))}  {_text(d.account)}  {_text(d.ref)}")
        out.append(f"  {_counts(d)}")
        out.append(f"  {_lasts(d)}")
    if st.folded_docs:
        out.append(f"({st.folded_docs} older per-document record(s), saved longest ago, are counted in the total only)")
    out.append("")
    out.append(f"total: {_counts(st.total)}")
    if st.total.last_whole_reason is not None:
        out.append(f"  last whole save: {st.total.last_whole_reason} at {_when(st.total.last_whole_at)}")
    return "\n".join(out) + "\n"


def _doc_json(d: DocStats) -> dict:
    j = asdict(d)
    j["account"], j["ref"] = _text(d.account), _text(d.ref)
    j["provider_name"] = PROVIDER_NAMES.get(d.provider)
    j["saved_bytes"] = d.saved_bytes
    j["saved_percent"] = None if d.saved_percent is None else round(d.saved_percent, 2)
    return j


def render_json(st: StoreStats) -> str:
    total = _doc_json(st.total)
    for k in ("provider", "account", "ref", "provider_name"):
        total.pop(k)
    return json.dumps({
        "folder": st.folder,
        "documents_held": st.documents_held,
        "held_bytes": st.held_bytes,
        "max_bytes": st.max_bytes,
        "pending": st.pending,
        "eps": st.eps or None,
        "total": total,
        "documents": [_doc_json(d) for d in st.docs],
        "folded_documents": st.folded_docs,
        "dropped": st.dropped,
    }, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ec_proxy.status",
        description="Show what EdgeCourier's device proxy saved: per document and in total, the bytes "
                    "the device's link carried against the bytes whole uploads would have cost, and why "
                    "saves went whole. Safe to run while the proxy runs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, metavar="DIR",
                    help="the proxy's state folder (the one given to the proxy as its state folder)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    try:
        st = read_stats(args.state)
    except StoreError as e:
        print(f"ec_proxy.status: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render_json(st) if args.json else render_text(st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
