"""Retention: delete finished runs older than a cutoff, and nothing else.

Failure this wall prevents (docs/design.md, "Retention never deletes a run that is paused or
waiting for a human"): a cleanup job keyed on age alone deletes the run that has waited
three days for an approval, or the one a drained worker left ``paused`` for the next,
and with it the effects ledger that said which charges were already made, so the
resumed (or re-submitted) run charges again. Here only runs whose status is *finished*
(:data:`FINISHED`: ``completed``, ``failed``, ``limit_exceeded``) and whose last change is older than the
cutoff are deleted; ``pending``, ``running``, ``paused``, ``interrupted`` and
``needs_human`` runs are never touched, whatever their age.

The status test and the delete are one statement per table inside one transaction, and
the run rows are locked (``FOR UPDATE SKIP LOCKED``) before anything is deleted, so a
run that a worker resumes concurrently (its lease acquisition updates the row) is either
not selected or not deleted. A run's log, effects and invocation rows go with it.
Blobs are content-addressed and may be shared between runs; they are not deleted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

FINISHED = ("completed", "failed", "limit_exceeded")
"""The only statuses retention deletes."""


@dataclass(frozen=True)
class RetentionReport:
    """What one pass deleted."""

    runs: list[str]
    log_rows: int
    effect_rows: int
    invocation_rows: int


async def delete_finished_runs(
    conn: asyncpg.Connection,
    *,
    older_than: timedelta | None = None,
    cutoff: datetime | None = None,
    limit: int = 1000,
    workload: str | None = None,
) -> RetentionReport:
    """Delete up to ``limit`` finished runs last updated before the cutoff.

    Give either ``cutoff`` (an aware datetime) or ``older_than`` (relative to the
    database's ``now()``); ``workload`` limits the pass to that workload's runs. Returns
    the deleted run ids (sorted) and row counts.
    """
    if (older_than is None) == (cutoff is None):
        raise ValueError("give exactly one of older_than= or cutoff=")
    if cutoff is not None and cutoff.tzinfo is None:
        raise ValueError("cutoff must be timezone-aware")
    if older_than is not None and older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    async with conn.transaction():
        if cutoff is None:
            cutoff = await conn.fetchval("SELECT now() - $1::interval", older_than)
        runs = await conn.fetch(
            "SELECT run_id FROM cm_runs WHERE status = ANY($1::text[]) AND updated_at < $2 "
            "AND ($4::text IS NULL OR workload = $4) ORDER BY updated_at LIMIT $3 FOR UPDATE SKIP LOCKED",
            list(FINISHED),
            cutoff,
            limit,
            workload,
        )
        ids = sorted(r["run_id"] for r in runs)
        if not ids:
            return RetentionReport([], 0, 0, 0)
        log = await conn.execute("DELETE FROM cm_run_log WHERE run_id = ANY($1::text[])", ids)
        eff = await conn.execute("DELETE FROM cm_effects WHERE run_id = ANY($1::text[])", ids)
        inv = await conn.execute("DELETE FROM cm_run_invocations WHERE run_id = ANY($1::text[])", ids)
        # re-check the status in the delete itself: belt and braces against a caller that
        # edits statuses without taking the row lock
        deleted = await conn.fetch(
            "DELETE FROM cm_runs WHERE run_id = ANY($1::text[]) AND status = ANY($2::text[]) RETURNING run_id",
            ids,
            list(FINISHED),
        )
        if len(deleted) != len(ids):
            raise RuntimeError("retention: a selected run changed status under its row lock")
    return RetentionReport(ids, _count(log), _count(eff), _count(inv))


def _count(tag: str) -> int:
    return int(tag.rsplit(" ", 1)[-1])
