"""The crashmatrix adapter and workload for plainrun (lives with the tests: the subject
itself never imports crashmatrix)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import asyncpg

from crashmatrix.harness.adapter import Adapter, EffectEntry, Environment, LogEntry, Observation, RunContext

from .runtime import SCHEMA, Runner, UnshieldedRunner


class PlainWorkload:
    name = "plain"
    conversations = ("three-charges",)
    providers = ("payment",)

    def run_input(self, conversation: str) -> dict[str, Any]:
        return {}


WORKLOAD = PlainWorkload()


class PlainAdapter(Adapter):
    """plainrun, the unlabelled subject."""

    name = "plainrun"
    subject_packages = ("plainrun.runtime",)
    runner = Runner

    async def prepare(self, env: Environment) -> None:
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute(SCHEMA)
        finally:
            await conn.close()

    async def _go(self, ctx: RunContext) -> str:
        conn = await asyncpg.connect(ctx.env.dsn, server_settings={"application_name": ctx.worker_id})
        try:
            async with aiohttp.ClientSession() as session:
                return await self.runner(conn, session, ctx.env.providers["payment"], ctx.worker_id).run(ctx.run_id)
        finally:
            conn.terminate()

    async def start(self, ctx: RunContext) -> str:
        return await self._go(ctx)

    async def resume(self, ctx: RunContext) -> str:
        return await self._go(ctx)

    async def observe(self, env: Environment, run_id: str) -> Observation:
        conn = await asyncpg.connect(env.dsn)
        try:
            status = await conn.fetchval("SELECT status FROM plain_runs WHERE run_id = $1", run_id)
            steps = await conn.fetch("SELECT step, result FROM plain_steps WHERE run_id = $1 ORDER BY step", run_id)
            effects = await conn.fetch("SELECT step, key, status, result FROM plain_effects WHERE run_id = $1", run_id)
        finally:
            await conn.close()
        log = [LogEntry(i + 1, f"step-{r['step']}", (f"step-{r['step'] - 1}",) if r["step"] > 1 else (), "step", 0)
               for i, r in enumerate(steps)]
        return Observation(
            run_id, status or "absent", log=log,
            effects=[EffectEntry(e["key"], f"step-{e['step']}", "charge", e["status"],
                                 json.loads(e["result"]) if e["result"] else None, 0) for e in effects],
            state={"results": [json.loads(r["result"]) for r in steps]},
        )


class UnshieldedPlainAdapter(PlainAdapter):
    """plainrun with its recovery write unshielded (the planted defect)."""

    name = "plainrun-unshielded"
    runner = UnshieldedRunner
