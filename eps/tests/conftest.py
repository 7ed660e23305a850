"""Fixtures of the EPS end-to-end tests (eps/tests).

Every test here runs the real static `ec-eps` binary (`.venv/bin/ec-eps`)
against the provider test servers (`testbed.providers`) through the lab
harness (`testbed/lab.py`), with the real device codec
(`ec_protocol.EpsClient`). Starting the servers costs about a second, so
each test module shares one lab.

Fixtures (names are stable; other test modules of this folder rely on them):

- `lab` (module): a `testbed.lab.Lab` in a fresh temporary folder, its
  provider servers started with `--nextcloud-min-chunk 0` so that Nextcloud
  chunked uploads may use small chunks.
- `eps` (module): one EPS instance (`testbed.lab.Eps`) of that lab, named
  after the module, bound to every account (`*`), with the small provider
  chunk sizes of `e2e.SMALL_CHUNKS` (so upload sessions of the lab's
  documents take several provider requests).
- `client` (function): a fresh `ec_protocol.EpsClient` of `eps` (its own
  session), closed after the test.
- `start_eps` (module): a factory `start_eps(name, **config)` that starts
  another EPS in `lab` (same arguments as `Lab.start_eps`: `accounts=`,
  `upstream=`, `limits=`, `binary=`, `env=`); each name once per module.
- `clean_faults` (function): disarms the provider servers' faults before
  and after the test.

Helpers (documents, app requests per provider and upload style, provider
hashes, store snapshots, the provider request log) are in `eps/tests/e2e.py`:
`from .e2e import Uploader, UPLOADERS, trace_sequences, ...`.
"""

from __future__ import annotations

import pytest

from testbed.lab import EPS_BIN, Lab

from .e2e import SMALL_CHUNKS

if not EPS_BIN.exists():  # pragma: no cover - a setup problem, said plainly
    raise RuntimeError(f"{EPS_BIN} is missing: run `make build` first")


@pytest.fixture(scope="module")
def lab(tmp_path_factory, request):
    name = request.module.__name__.rsplit(".", 1)[-1]
    with Lab(tmp_path_factory.mktemp(name), provider_args=("--nextcloud-min-chunk", "0")) as lab:
        yield lab


@pytest.fixture(scope="module")
def start_eps(lab):
    def start(name: str, **config):
        upstream = dict(SMALL_CHUNKS)
        upstream.update(config.pop("upstream", {}) or {})
        return lab.start_eps(name, upstream=upstream, **config)

    return start


@pytest.fixture(scope="module")
def eps(start_eps, request):
    return start_eps(request.module.__name__.rsplit(".", 1)[-1].replace("_", "-"))


@pytest.fixture
def client(eps):
    c = eps.client()
    yield c
    c.close()


@pytest.fixture
def clean_faults(lab):
    lab.providers.clear_faults()
    yield
    lab.providers.clear_faults()
