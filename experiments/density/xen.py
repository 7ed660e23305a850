#!/usr/bin/env python3
"""Density of the `xen` backend: how many idle EPS guests a nested Xen host
holds, what each costs Xen, and how fast each starts.

    sudo .venv/bin/python experiments/density/xen.py --count 8 --memory-mb 4096 --json out.json

This machine has no Xen, so the measurement runs inside a Xen host nested
under QEMU TCG (`unikernel/xen-host`, booted by `testbed.xenhost.XenEdge`):
the real `ec-edge serve --runtime xen` in its dom0, N users and N instances
made and started one at a time through its operator API (the instances'
memory limit is the API's minimum, 16 MiB, so each guest gets 48 MiB: the
limit plus the appliance's 32), then Xen's own accounting read in dom0
(`xl info`'s free_memory before and after, `xl list`). Starts stop at the
first failure (Xen out of memory, or --count reached).

Reported: fitted, Xen memory per guest (free_memory's drop / guests), how
many guests the host's free memory would hold at that rate, start-to-ready
per instance (the manager's `ready_seconds`; median, p95, max), dom0's
memory, and the appliance's size. Everything runs emulated (Xen, dom0 and
the guests): times are TCG's, not a real access point's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from testbed.lab import Lab  # noqa: E402
from testbed.xenhost import APPLIANCE_DIR, XenEdge  # noqa: E402

MiB = 1 << 20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=8, help="guests to start at most (default 8)")
    p.add_argument("--memory-mb", type=int, default=4096, help="the nested host's memory (default 4096)")
    p.add_argument("--dom0-mb", type=int, default=1024,
                   help="dom0's memory (default 1024: its root, holding each instance's state folder and disk, is in RAM)")
    p.add_argument("--json", type=Path, help="write the results here too")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ec-density-xen-"))
    results: dict = {"count_asked": a.count, "nested_host_mb": a.memory_mb, "dom0_mb": a.dom0_mb}
    try:
        with Lab(work, provider_args=("--listen", "0.0.0.0:0")) as lab:
            t0 = time.monotonic()
            edge = XenEdge(lab, work / "xen", slots=a.count, memory_mb=a.memory_mb, run_args=("--dom0-mem", str(a.dom0_mb)))
            results["host_and_manager_ready_s"] = round(time.monotonic() - t0, 1)
            print(f"nested Xen host and manager ready in {results['host_and_manager_ready_s']} s", flush=True)
            try:
                before = edge.xen_info()
                op = edge.operator()
                ready: list[float] = []
                fitted = 0
                for i in range(a.count):
                    user = f"dx{i}"
                    edge.add_user(user)
                    op.call("POST", "/v1/instances", {"user": user, "service": "default", "limits": {"memory_bytes": 16 * MiB}})
                    t1 = time.monotonic()
                    try:
                        v = op.call("POST", f"/v1/instances/{user}-default/start")
                    except Exception as e:  # noqa: BLE001 - the first failure ends the run, and is reported
                        results["first_failure"] = {"after": fitted, "message": str(e)[:2000]}
                        print(f"start {i + 1} failed: {str(e)[:300]}", flush=True)
                        break
                    fitted += 1
                    ready.append(v["ready_seconds"])
                    print(f"guest {fitted}/{a.count}: ready in {v['ready_seconds']:.1f} s "
                          f"(start call {time.monotonic() - t1:.1f} s)", flush=True)
                time.sleep(10)  # let the guests settle (their EPS idle)
                after = edge.xen_info()
                free0, free1 = int(before["info"]["free_memory"]), int(after["info"]["free_memory"])
                per_guest = (free0 - free1) / fitted if fitted else None
                views = op.call("GET", "/v1/instances")["instances"]
                results.update(
                    fitted=fitted,
                    xen_total_memory_mib=int(before["info"]["total_memory"]),
                    xen_free_before_mib=free0,
                    xen_free_after_mib=free1,
                    xen_mib_per_guest=round(per_guest, 1) if per_guest else None,
                    guests_that_fit_by_memory=int(free0 / per_guest) if per_guest else None,
                    running=sum(1 for v in views if v["state"] == "running"),
                    memory_bytes_reported=[v["memory_bytes"] for v in views],
                    ready_s={"median": round(statistics.median(ready), 1), "p95": round(sorted(ready)[int(0.95 * (len(ready) - 1))], 1),
                             "max": round(max(ready), 1), "all": [round(r, 1) for r in ready]} if ready else None,
                    dom0_free_k_after=after["dom0_free_k"],
                    domains_after=len(after["domains"]),
                    appliance_bytes={f.name: f.stat().st_size for f in APPLIANCE_DIR.iterdir() if f.is_file()},
                )
            finally:
                edge.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0 if results.get("fitted") else 1


if __name__ == "__main__":
    sys.exit(main())
