"""Fixtures: one fault proxy API for the session (embedded, or ``TOXIPROXY_URL``)."""

from __future__ import annotations

from typing import Iterator

import pytest

from crashmatrix.harness.faultproxy import EmbeddedToxiproxy

from ._support import IS_REAL, REAL_URL, Api, EchoServer, TcpServer


def pytest_report_header(config: pytest.Config) -> str:
    where = f"real Toxiproxy at {REAL_URL}" if IS_REAL else "embedded server (seed 0)"
    return f"faultproxy: conformance tests against {where}"


@pytest.fixture(scope="session")
def api_url() -> Iterator[str]:
    if IS_REAL:
        yield REAL_URL
        return
    with EmbeddedToxiproxy(seed=0) as tp:
        yield tp.url


@pytest.fixture
def api(api_url: str) -> Iterator[Api]:
    client = Api(api_url)
    try:
        yield client
    finally:
        client.cleanup()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def upstream() -> Iterator[TcpServer]:
    with TcpServer() as server:
        yield server

