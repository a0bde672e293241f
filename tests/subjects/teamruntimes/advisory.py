"""A team's runtime whose exclusivity is a PostgreSQL session advisory lock: a worker
takes a run only if it gets the run's lock, and a second worker is refused with its own
error (``RunBusy``) while the first one's connection stands, even if that first worker
is frozen. Writes stay fenced by the lease epoch. Correct, with weaker liveness (a
frozen worker keeps its run until it wakes or its connection goes), and it declares so
(``takes_over_live_owner = False``), so a ``pause`` case wakes the frozen worker as the
owner instead of judging a takeover that the runtime refuses by design. From the
blind set of 2026-12-02 (docs/benchmarks.md): without the declaration, 11 of its
``pause`` cases failed ``pause.zombie_fenced``, ``pause.zombie_effects`` and
``resume.runs``."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.adapters.reference import ReferenceAdapter, blob_store
from crashmatrix.reference_runtime.executor import Runtime
from crashmatrix.reference_runtime.leases import Lease


class RunBusy(RuntimeError):
    """Another live worker holds the run's advisory lock."""


class AdvisoryRuntime(Runtime):
    async def acquire_lease(self, run_id: str) -> Lease:
        if not await self.db.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 7919))", run_id):
            raise RunBusy(f"run {run_id}: held by another live worker (advisory lock)")
        return await super().acquire_lease(run_id)


class UndeclaredAdvisoryAdapter(ReferenceAdapter):
    """The runtime as a team first adapts it, without the declaration."""

    name = "team-advisory-undeclared"

    def make_runtime(self, db: Any, agent: Any, ctx: Any) -> Runtime:
        return AdvisoryRuntime(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=blob_store(ctx.env))


class AdvisoryAdapter(UndeclaredAdvisoryAdapter):
    name = "team-advisory"
    takes_over_live_owner = False
