"""Schema version 7 reaches a database a version-1 build created: migrate() re-runs the
idempotent schema.sql, adding cm_run_invocations, cm_effects.resolution, the retention
index, cm_runs.queue, the later statuses, the facts beside each log record (NULL in
the rows already there) and cm_run_restored, and keeps every existing row.
(fixtures/schema_v1.sql is the v1 DDL as shipped.)"""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from crashmatrix.reference_runtime.migrations import SCHEMA_VERSION, migrate

pytestmark = pytest.mark.anyio
V1 = (Path(__file__).parent / "fixtures" / "schema_v1.sql").read_text()


async def test_a_version_1_database_migrates_to_7_keeping_its_rows(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        await conn.execute(V1)
        assert await conn.fetchval("SELECT max(version) FROM cm_schema_version") == 1
        await conn.execute(
            "INSERT INTO cm_runs (run_id, workload, input, status) VALUES ('old', 'w', '{}'::jsonb, 'paused')")
        await conn.execute(
            "INSERT INTO cm_effects (run_id, idem_key, node_id, tool, status, request, lease_epoch) "
            "VALUES ('old', 'k', 'n', 't', 'unknown', '{}'::jsonb, 1)")
        await conn.execute(
            "INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch) VALUES ('old', 1, 'turn-1', '\\x00', 1)")
        assert SCHEMA_VERSION == 7
        assert await migrate(conn) == 7
        assert await migrate(conn) == 7  # idempotent
        assert await conn.fetchval("SELECT max(version) FROM cm_schema_version") == 7
        facts = await conn.fetchrow("SELECT kind, tokens, wall_ms, spawned FROM cm_run_log WHERE run_id = 'old'")
        assert tuple(facts) == (None, None, None, None)  # version 6: a row written before it has no facts
        assert await conn.fetchval("SELECT queue FROM cm_runs WHERE run_id = 'old'") is None
        for status in ("limit_exceeded", "cannot_migrate", "cancelled"):  # versions 3 and 5
            await conn.execute("UPDATE cm_runs SET status = $1 WHERE run_id = 'old'", status)
        await conn.execute("UPDATE cm_runs SET status = 'paused' WHERE run_id = 'old'")
        assert await conn.fetchval("SELECT to_regclass('cm_run_invocations') IS NOT NULL")
        assert await conn.fetchval("SELECT resolution FROM cm_effects WHERE run_id = 'old'") is None
        assert await conn.fetchval("SELECT status FROM cm_runs WHERE run_id = 'old'") == "paused"
        assert await conn.fetchval("SELECT to_regclass('cm_runs_status_updated') IS NOT NULL")
        assert await conn.fetchval("SELECT to_regclass('cm_run_restored') IS NOT NULL")  # version 7
    finally:
        await conn.close()
