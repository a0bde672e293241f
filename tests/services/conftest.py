"""Fixtures for the services tests: one shared embedded PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crashmatrix.harness.services.postgres import DSN_ENV, PostgresService, start_postgres


@pytest.fixture(scope="session")
def embedded_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresService]:
    """One embedded server shared by the tests that only read or add sessions."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(DSN_ENV, raising=False)
        service = start_postgres(tmp_path_factory.mktemp("pg"))
    yield service
    service.close()
