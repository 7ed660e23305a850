"""Fixtures for the edge manager's tests against the real manager, its
launcher, the real EPS (as a process or a Docker container) and the
provider test servers:

- `lab` (module): the provider test servers, listening on all addresses
  so that an EPS in a container reaches them through the host's address.
- `make_edge` (module): `make_edge(runtime)` starts a real `ec-edge serve`
  whose instances are configured for the lab (`edge_template`); every
  manager it started is closed (its instances deleted) at the module's end.
- `unique`: `unique("alice")` is a user name no other run on this host
  uses now (cgroups and containers are named after instances host-wide,
  and other suites may run at the same time).
"""

from __future__ import annotations

import secrets
import subprocess
from typing import Any, Callable

import pytest

from testbed.edge import EdgeManager
from testbed.lab import Lab

def host_address() -> str:
    """An address of this host that a container reaches it on (docker0's, else the default route's source)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True)
    for word in out.stdout.split():
        if "/" in word and word[0].isdigit():
            return word.split("/")[0]
    out = subprocess.run(["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True)
    words = out.stdout.split()
    if "src" in words:
        return words[words.index("src") + 1]
    raise RuntimeError("no host address a container could reach the provider test servers on")


def edge_template(lab: Lab, runtime: str) -> dict[str, Any]:
    """The instances' configuration beyond what the manager writes: the
    provider host names resolved to the lab's servers, the lab CA trusted
    (the manager copies the CA file into each instance's folder). A
    container does not see the host's loopback: it reaches the servers at
    the host's address."""
    cfg = lab.eps_config()
    if runtime == "docker":
        addr = f"{host_address()}:{lab.providers.tls_port}"
        cfg["upstream"]["resolve"] = {h: addr for h in cfg["upstream"]["resolve"]}
    return cfg


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("edge-lab"), provider_args=("--listen", "0.0.0.0:0")) as lab:
        yield lab


@pytest.fixture(scope="module")
def make_edge(lab) -> Callable[..., EdgeManager]:
    started: list[EdgeManager] = []

    def make(runtime: str = "process", **kw: Any) -> EdgeManager:
        edge = EdgeManager(lab, lab.workdir / f"edge-{runtime}-{len(started)}", runtime=runtime,
                           template=edge_template(lab, runtime), **kw)
        started.append(edge)
        return edge

    yield make
    for edge in started:
        edge.close()


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}{secrets.token_hex(3)}"
