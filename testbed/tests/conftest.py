"""Fixtures for the testbed tests: one provider server per session (reset before
each test) and a client for it; the machinery is in `harness.py`."""

from __future__ import annotations

import pytest

from testbed.tests.harness import Client, Server, start_server, stop_server


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    srv = start_server(tmp_path_factory.mktemp("testbed"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def session_client(server) -> Client:
    c = Client(server.tls_port, server.plain_port, server.ready["ca"])
    yield c
    c.close()


@pytest.fixture
def client(session_client) -> Client:
    session_client.admin("POST", "reset")
    return session_client
