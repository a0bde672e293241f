"""The sweep: a worker that starts after a crash finds the runs nobody is running.

Wall (nobody hands the new worker the run id; Prefect issue 16746: runs stay
``Running`` forever after their worker dies): a run's lease records when it expires
(:mod:`.leases`, ``LEASE_SECONDS`` after it was taken); a worker that dies holds it
until then, and nothing else says the run is abandoned. :func:`abandoned_runs` lists
the runs of a queue that are not terminal and whose lease has expired or was never
taken (``pending``: submitted, then the worker died), oldest first; a recovering worker
takes each over (:meth:`.executor.Runtime.run` steals the lease with a new epoch, so a
sweeper that overlaps another is fenced) and runs it. Whatever status a run was left
in (``running`` by a killed worker, ``interrupted`` by a cancel, ``paused`` by a drain)
only the lease decides.

``clock_offset_s`` is added to the database's clock when judging expiry: a test
harness advances time instead of waiting a lease out; production passes 0. Runs
filed under no queue (``queue`` NULL) are never swept: their caller resumes them by id.
"""

from __future__ import annotations

from .db import Db

TERMINAL = ("completed", "failed", "needs_human", "limit_exceeded")
"""Statuses after which no worker runs a run again."""


async def abandoned_runs(db: Db, queue: str, clock_offset_s: float = 0.0, limit: int = 100) -> list[str]:
    """Run ids of ``queue`` that are not terminal and whose lease expired (or was never
    taken) by ``now() + clock_offset_s``, oldest first, at most ``limit``."""
    rows = await db.fetch(
        """
        SELECT run_id FROM cm_runs
         WHERE queue = $1 AND status <> ALL($2::text[])
           AND (lease_expires_at IS NULL OR lease_expires_at < now() + make_interval(secs => $3))
         ORDER BY created_at, run_id
         LIMIT $4
        """,
        queue,
        list(TERMINAL),
        float(clock_offset_s),
        limit,
    )
    return [r["run_id"] for r in rows]
