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
from typing import Any, Callable

import pytest

from testbed.edge import EdgeManager, edge_template, vm_args
from testbed.lab import Lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(tmp_path_factory.mktemp("edge-lab"), provider_args=("--listen", "0.0.0.0:0")) as lab:
        yield lab


@pytest.fixture(scope="module")
def make_edge(lab) -> Callable[..., EdgeManager]:
    started: list[EdgeManager] = []

    def make(runtime: str = "process", **kw: Any) -> EdgeManager:
        if runtime == "microvm":
            kw["extra"] = (*vm_args(lab), *kw.get("extra", ()))
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
