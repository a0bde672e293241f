"""Fixtures for the reference-runtime tests: one real embedded PostgreSQL per session,
migrated once; each test gets its own connection and fresh run ids."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import pytest

from crashmatrix.harness.services.postgres import DSN_ENV, PostgresService, start_postgres
from crashmatrix.reference_runtime import connect, migrate
from crashmatrix.reference_runtime.db import Db


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresService]:
    """An embedded server (never a user's DSN: some tests create databases and write
    schema versions), migrated once."""
    import asyncio

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(DSN_ENV, raising=False)
        service = start_postgres(tmp_path_factory.mktemp("runtime-pg"))
    try:
        async def _migrate() -> None:
            conn = await asyncpg.connect(service.dsn)
            try:
                await migrate(conn)
            finally:
                await conn.close()

        asyncio.run(_migrate())
        yield service
    finally:
        service.close()


def dsn_for(service: PostgresService, database: str) -> str:
    """The service's DSN with another database name."""
    base, _, query = service.dsn.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{database}" + (f"?{query}" if query else "")


@pytest.fixture
async def fresh_database(pg: PostgresService, anyio_backend: str) -> AsyncIterator[str]:
    """A new, empty (unmigrated) database on the server; its DSN. Dropped afterwards."""
    name = f"cm_t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield dsn_for(pg, name)
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def db(pg: PostgresService, anyio_backend: str) -> AsyncIterator[Db]:
    """One runtime connection (a :class:`Db`) on the migrated database."""
    handle = await connect(pg.dsn, application_name=f"cm-test-{uuid.uuid4().hex[:8]}")
    try:
        yield handle
    finally:
        await handle.close()


@pytest.fixture
async def raw(pg: PostgresService, anyio_backend: str) -> AsyncIterator[asyncpg.Connection]:
    """A second, plain connection for looking behind the runtime's back."""
    conn = await asyncpg.connect(pg.dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def new_run_id() -> Callable[[], str]:
    """A factory of fresh run ids (cases share the database; ids never repeat)."""
    return lambda: f"cm-run-{uuid.uuid4().hex[:16]}"
