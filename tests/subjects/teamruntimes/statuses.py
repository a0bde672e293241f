"""A runtime with status names of its own (``done``, ``suspended``, ``stopped``), which its
adapter maps to the harness's words (docs/adapters.md, "Statuses") as a team's adapter
would; the keys are uuid4 strings, stored and reused."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.adapter import Environment, Observation, RunContext
from crashmatrix.reference_runtime import Runtime, leases
from crashmatrix.reference_runtime.db import Db

from .keys import StoredKeyExecution, UuidKeyAdapter, _fresh

OWN = {"completed": "done", "paused": "suspended", "interrupted": "stopped", "failed": "error"}
"""Harness word -> this runtime's word (what it stores)."""
HARNESS = {v: k for k, v in OWN.items()}


class OwnStatusRuntime(Runtime):
    """Stores its own status names; the executor speaks the reference's internally."""

    async def run(self, run_id: str) -> str:
        status = await super().run(run_id)
        return OWN.get(status, status)


_set_status = leases.set_status


async def _own_set_status(db: Db, lease: Any, status: str, detail: str | None = None) -> None:
    await _set_status(db, lease, OWN.get(status, status), detail)


class OwnStatusAdapter(UuidKeyAdapter):
    """Statuses ``done``/``suspended``/``stopped``/``error`` in its store, mapped back here."""

    name = "team-own-statuses"

    async def prepare(self, env: Environment) -> None:
        await super().prepare(env)
        from crashmatrix.reference_runtime import connect

        db = await connect(env.dsn, application_name="teamruntimes-prepare")
        try:  # this runtime's schema allows its own words
            await db.conn.execute("ALTER TABLE cm_runs DROP CONSTRAINT IF EXISTS cm_runs_status_check")
        finally:
            await db.close()

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        import crashmatrix.reference_runtime.executor as executor

        executor.set_status = _own_set_status  # this worker's runtime writes its own words
        execution = self.execution

        class Own(OwnStatusRuntime):
            @property
            def execution_class(self) -> Any:
                return execution

        return Own(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=self._blobs(ctx))

    @staticmethod
    def _blobs(ctx: RunContext) -> Any:
        from crashmatrix.harness.adapters.reference import blob_store

        return blob_store(ctx.env)

    async def start(self, ctx: RunContext) -> str:
        return HARNESS.get(status := await super().start(ctx), status)

    async def resume(self, ctx: RunContext) -> str:
        return HARNESS.get(status := await super().resume(ctx), status)

    async def observe(self, env: Environment, run_id: str) -> Observation:
        obs = await super().observe(env, run_id)
        obs.status = HARNESS.get(obs.status, obs.status)
        return obs


class FreshKeyOwnStatusAdapter(OwnStatusAdapter):
    """Planted defect: a fresh key on every attempt."""
    execution = _fresh(StoredKeyExecution)
