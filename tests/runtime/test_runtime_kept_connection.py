"""The connection a worker process keeps from one run to the next (``ConnectionKeeper``),
on a real PostgreSQL: handed back reset and renamed, never inside a transaction, never
when it no longer answers."""

from __future__ import annotations

import asyncpg
import pytest

from crashmatrix.harness.services.postgres import PostgresService
from crashmatrix.reference_runtime.db import ConnectionKeeper

pytestmark = pytest.mark.anyio


async def _session(conn: asyncpg.Connection) -> tuple[int, str, str]:
    row = await conn.fetchrow("SELECT pg_backend_pid() AS pid, current_setting('application_name') AS name, "
                              "current_setting('statement_timeout') AS timeout")
    assert row is not None
    return row["pid"], row["name"], row["timeout"]


async def test_the_next_run_gets_the_kept_connection_reset_under_its_own_name(pg: PostgresService) -> None:
    keeper = ConnectionKeeper()
    first = await keeper.connect(pg.dsn, application_name="cmw-first")
    pid, name, default_timeout = await _session(first.conn)
    assert name == "cmw-first"
    await first.execute("SET statement_timeout = 4321")
    await first.execute("SELECT pg_advisory_lock(77)")
    keeper.release(first)

    second = await keeper.connect(pg.dsn, application_name="cmw-second")
    try:
        assert await _session(second.conn) == (pid, "cmw-second", default_timeout)
        held = await second.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", pid)
        assert held == 0
    finally:
        await second.close()


async def test_a_connection_released_inside_a_transaction_is_closed(pg: PostgresService) -> None:
    keeper = ConnectionKeeper()
    first = await keeper.connect(pg.dsn, application_name="cmw-in-tx")
    pid, _, _ = await _session(first.conn)
    transaction = first.conn.transaction()
    await transaction.start()
    keeper.release(first)
    assert first.conn.is_closed()

    second = await keeper.connect(pg.dsn, application_name="cmw-after-tx")
    try:
        assert (await _session(second.conn))[0] != pid
    finally:
        await second.close()


async def test_a_kept_connection_whose_server_process_ended_is_replaced(pg: PostgresService,
                                                                        raw: asyncpg.Connection) -> None:
    keeper = ConnectionKeeper()
    first = await keeper.connect(pg.dsn, application_name="cmw-doomed")
    pid, _, _ = await _session(first.conn)
    keeper.release(first)
    await raw.fetchval("SELECT pg_terminate_backend($1)", pid)

    second = await keeper.connect(pg.dsn, application_name="cmw-replaced")
    try:
        new_pid, name, _ = await _session(second.conn)
        assert new_pid != pid and name == "cmw-replaced"
    finally:
        await second.close()


async def test_one_connection_is_kept_and_another_dsn_gets_its_own(pg: PostgresService,
                                                                   fresh_database: str) -> None:
    keeper = ConnectionKeeper()
    main = await keeper.connect(pg.dsn, application_name="cmw-main")
    keeper.release(main)
    other = await keeper.connect(fresh_database, application_name="cmw-other")
    assert main.conn.is_closed()  # not kept for this DSN: closed, not left open
    assert await other.fetchval("SELECT current_database()") == fresh_database.rsplit("/", 1)[1].split("?")[0]
    keeper.release(other)

    again = await keeper.connect(pg.dsn, application_name="cmw-main-again")
    try:
        assert other.conn.is_closed()
        assert await again.fetchval("SELECT current_database()") == "crashmatrix"
    finally:
        await again.close()
