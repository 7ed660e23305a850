#!/usr/bin/env python3
"""What mitmproxy's addons cost per event: mitmdump's set against `ec-proxy run`'s.

mitmproxy hands every event of an intercepted request (request headers,
request, response headers, response) to every addon it runs, whether or not
the addon has a hook for it. This times that dispatch with mitmproxy's own
`AddonManager.handle_lifecycle` on a test flow, for

- mitmdump: `DumpMaster`'s addons (mitmproxy's default set, the dumper off,
  as `ec-proxy run` had them before it chose its own);
- ec-proxy: the addons `ec_proxy.cli.mitmproxy_addons()` gives the command.

Neither set includes EdgeCourier's own addons: this is the cost of the rest.
Rounds interleave the two sets, each measured in a process of its own;
each round times `--events` events of each of the four kinds; medians per
event are printed, and their ratio.

    .venv/bin/python experiments/bench/mitm_addons.py
    .venv/bin/python experiments/bench/mitm_addons.py --rounds 5 --events 500 --json out.json
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fmt_time, progress  # noqa: E402


SETS = ("mitmdump", "ec-proxy")


def master_of(name):
    """A master with the addons of set `name` loaded (no listener is started).
    One per process: mitmproxy's `ctx` names the newest master, whose options
    an older master's addons would then read."""
    sys.path.insert(0, os.path.join(common.REPO, "device-proxy"))
    from mitmproxy import master, options
    from mitmproxy.tools.dump import DumpMaster

    from ec_proxy.cli import mitmproxy_addons

    if name == "mitmdump":
        return DumpMaster(options.Options(), with_termlog=False, with_dumper=False)
    m = master.Master(options.Options(), with_termlog=False)
    m.addons.add(*mitmproxy_addons())
    return m


async def per_event(m, events):
    """Seconds per event: `events` events of each of the four request hooks on one test flow."""
    from mitmproxy.proxy.layers.http import HttpRequestHeadersHook, HttpRequestHook, HttpResponseHeadersHook, HttpResponseHook
    from mitmproxy.test import tflow

    flow = tflow.tflow(resp=True)
    hooks = (HttpRequestHeadersHook, HttpRequestHook, HttpResponseHeadersHook, HttpResponseHook)
    start = time.perf_counter()
    for _ in range(events):
        for hook in hooks:
            await m.addons.handle_lifecycle(hook(flow))
    return (time.perf_counter() - start) / (events * len(hooks))


def one(name, events):
    """Child process: prints the addon count and the seconds per event of set `name`."""
    async def measure():
        m = master_of(name)  # a master wants a running event loop
        return {"addons": len(m.addons.chain), "per_event_s": await per_event(m, events)}

    print(json.dumps(asyncio.run(measure())))


def run(args):
    samples = {name: [] for name in SETS}
    addons = {}
    for r in range(args.rounds):
        progress(f"round {r + 1}/{args.rounds}")
        for name in SETS:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--events", str(args.events)],
                                 capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.splitlines()[-1])
            addons[name] = got["addons"]
            samples[name].append(got["per_event_s"])
    return {name: {"addons": addons[name], "per_event_s": statistics.median(s)} for name, s in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--events", type=int, default=500, help="events of each hook per round (default 500)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    parser.add_argument("--one", choices=SETS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one, args.events)
    info = common.machine()
    result = run(args)
    print("## mitmproxy's addon dispatch, per event of an intercepted request (median of the rounds)")
    print("set      | addons | per event")
    print("-------- | -----: | --------:")
    for name, r in result.items():
        print(f"{name:8} | {r['addons']:6} | {fmt_time(r['per_event_s']):>9}")
    ratio = result["ec-proxy"]["per_event_s"] / result["mitmdump"]["per_event_s"]
    saved = 4 * (result["mitmdump"]["per_event_s"] - result["ec-proxy"]["per_event_s"])
    print(f"ec-proxy / mitmdump: {ratio:.2f}x; about {fmt_time(saved)} less per request (4 events)")
    print(common.machine_line(info))
    rows = [{"set": name, **r} for name, r in result.items()]
    common.write_json(args.json, "mitm_addons", vars(args), rows, [], {"ec_proxy_over_mitmdump": ratio})


if __name__ == "__main__":
    main()
