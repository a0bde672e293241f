"""Retention (reference_runtime/retention.py): finished runs older than the cutoff go,
with their log, effects and invocations; a paused, running, interrupted, pending or
needs_human run is never deleted, however old."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest

from crashmatrix.reference_runtime.retention import FINISHED, delete_finished_runs

pytestmark = pytest.mark.anyio
STATUSES = ("pending", "running", "paused", "interrupted", "completed", "failed", "needs_human", "limit_exceeded")


async def make_run(raw: asyncpg.Connection, run_id: str, status: str, age: timedelta) -> None:
    await raw.execute(
        "INSERT INTO cm_runs (run_id, workload, input, status, updated_at) VALUES ($1, 'w', '{}'::jsonb, $2, now() - $3::interval)",
        run_id, status, age,
    )
    await raw.execute("INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch) VALUES ($1, 1, 'turn-1', '\\x00', 1)", run_id)
    await raw.execute(
        "INSERT INTO cm_effects (run_id, idem_key, node_id, tool, status, request, lease_epoch) "
        "VALUES ($1, 'k', 'turn-1.tool-0', 'charge', 'succeeded', '{}'::jsonb, 1)", run_id)
    await raw.execute("INSERT INTO cm_run_invocations (run_id, lease_epoch, worker) VALUES ($1, 1, 'w1')", run_id)


async def rows(raw: asyncpg.Connection, run_id: str) -> tuple[int, int, int, int]:
    return tuple([await raw.fetchval(f"SELECT count(*) FROM {t} WHERE run_id = $1", run_id)
                  for t in ("cm_runs", "cm_run_log", "cm_effects", "cm_run_invocations")])  # type: ignore[return-value]


async def test_only_old_finished_runs_are_deleted(raw: asyncpg.Connection, new_run_id: Any) -> None:
    tag = new_run_id()
    old = {s: f"{tag}-old-{s}" for s in STATUSES}
    new = {s: f"{tag}-new-{s}" for s in STATUSES}
    for s in STATUSES:
        await make_run(raw, old[s], s, timedelta(days=30))
        await make_run(raw, new[s], s, timedelta(minutes=5))
    report = await delete_finished_runs(raw, older_than=timedelta(days=7), limit=100_000)
    ours = sorted(r for r in report.runs if r.startswith(tag))
    assert ours == sorted(old[s] for s in FINISHED)
    for s in STATUSES:
        expected_old = (0, 0, 0, 0) if s in FINISHED else (1, 1, 1, 1)
        assert await rows(raw, old[s]) == expected_old, s
        assert await rows(raw, new[s]) == (1, 1, 1, 1), s  # younger than the cutoff
    assert report.log_rows >= 2 and report.effect_rows >= 2 and report.invocation_rows >= 2
    # never-finished runs survive even an "everything older than now" pass
    await delete_finished_runs(raw, cutoff=datetime.now(timezone.utc) + timedelta(days=1), limit=100_000)
    for s in STATUSES:
        alive = 0 if s in FINISHED else 1
        assert (await rows(raw, new[s]))[0] == alive, s
        assert (await rows(raw, old[s]))[0] == alive, s


async def test_argument_errors(raw: asyncpg.Connection) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        await delete_finished_runs(raw)
    with pytest.raises(ValueError, match="timezone-aware"):
        await delete_finished_runs(raw, cutoff=datetime(2020, 1, 1))
    with pytest.raises(ValueError, match="negative"):
        await delete_finished_runs(raw, older_than=timedelta(days=-1))
