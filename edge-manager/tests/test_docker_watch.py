"""The manager watches containers through the engine's events: a container
killed behind its back is reported as crashed, with the engine's exit
reason and its last log lines, and restarted by its policy, without waiting
for the slow sweep that asks the engine about every container (every 20 s)."""

from __future__ import annotations

import subprocess
import time

from testbed.edge import EdgeManager


def test_a_killed_container_is_seen_through_events_and_restarted(make_edge, unique):
    edge: EdgeManager = make_edge("docker")
    user = unique("carol")
    op = edge.operator()
    op.call("POST", "/v1/users", {"user": user})
    op.call("POST", "/v1/instances", {"user": user, "service": "dropbox"})
    inst = op.call("POST", f"/v1/instances/{user}-dropbox/start")
    assert inst["state"] == "running" and inst["runtime"] == "docker"
    names = subprocess.run(["docker", "ps", "--filter", f"label=edgecourier.instance={user}-dropbox", "--format", "{{.ID}}"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert len(names) == 1, names
    killed_at = time.monotonic()
    subprocess.run(["docker", "kill", "--signal", "KILL", names[0]], check=True, capture_output=True)
    seen = None
    while time.monotonic() - killed_at < 15:
        i = op.call("GET", f"/v1/instances/{user}-dropbox")
        if i["crashes"] == 1:
            seen = time.monotonic() - killed_at
            break
        time.sleep(0.1)
    # The sweep runs every 20 s: a crash seen well before that came through the events.
    assert seen is not None and seen < 10, seen
    assert "137" in i["last_exit"]["reason"] or "signal 9" in i["last_exit"]["reason"], i["last_exit"]
    assert "EPS ready" in i["last_exit"]["log_tail"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        i = op.call("GET", f"/v1/instances/{user}-dropbox")
        if i["state"] == "running" and i["starts"] == 2:
            break
        time.sleep(0.2)
    assert i["state"] == "running" and i["starts"] == 2, i
