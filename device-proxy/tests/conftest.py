"""Fixtures shared by the device proxy's end-to-end tests (one set per test
module, module-scoped): `lab` (provider test servers), `eps` (a real
ec-eps for the module's user), `proxy` (ec-proxy in front of it) and
`clean_faults` (the provider servers' faults disarmed around a test),
`small` (three saves of a 43 kB .docx).
A module that needs something else defines its own fixture of that name."""

import pytest

from app_client import Versions, trace_versions
from testbed.lab import Eps, Lab, Proxy


def _module(request) -> str:
    return request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")


@pytest.fixture(scope="module")
def lab(request, tmp_path_factory):
    with Lab(tmp_path_factory.mktemp(_module(request))) as lab:
        yield lab


@pytest.fixture
def clean_faults(lab):
    lab.providers.clear_faults()
    yield
    lab.providers.clear_faults()


@pytest.fixture(scope="module")
def eps(request, lab) -> Eps:
    return lab.start_eps(f"{_module(request)}-user")


@pytest.fixture(scope="module")
def proxy(request, lab, eps) -> Proxy:
    return lab.start_proxy(f"{_module(request)}-laptop", eps)


@pytest.fixture(scope="module")
def small() -> Versions:
    """Three saves of a 43 kB .docx (100 KB of text)."""
    return trace_versions("writer-100k-middle-docx", "writer-100k-end-docx")
