"""The runtime proper (asyncpg + aiohttp only)."""

from __future__ import annotations

import hashlib
import json

import aiohttp
import anyio
import asyncpg

SCHEMA = """
CREATE TABLE IF NOT EXISTS plain_runs (run_id text PRIMARY KEY, status text NOT NULL);
CREATE TABLE IF NOT EXISTS plain_steps (run_id text, step int, result jsonb, PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS plain_effects (run_id text, step int, key text, status text, result jsonb,
                                          PRIMARY KEY (run_id, key));
"""
STEPS = 3


class Runner:
    def __init__(self, conn: asyncpg.Connection, session: aiohttp.ClientSession, payment_url: str, worker: str) -> None:
        self.conn = conn
        self.session = session
        self.payment_url = payment_url
        self.worker = worker

    async def run(self, run_id: str) -> str:
        await self.conn.execute(
            "INSERT INTO plain_runs VALUES ($1, 'running') ON CONFLICT (run_id) DO UPDATE SET status = 'running'", run_id)
        try:
            for step in range(1, STEPS + 1):
                done = await self.conn.fetchval("SELECT 1 FROM plain_steps WHERE run_id = $1 AND step = $2", run_id, step)
                if not done:
                    await self.charge_step(run_id, step)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.conn.execute("UPDATE plain_runs SET status = 'interrupted' WHERE run_id = $1", run_id)
            raise
        await self.conn.execute("UPDATE plain_runs SET status = 'completed' WHERE run_id = $1", run_id)
        return "completed"

    async def charge_step(self, run_id: str, step: int) -> None:
        key = hashlib.sha256(f"{run_id}:{step}".encode()).hexdigest()
        row = await self.conn.fetchrow("SELECT status, result FROM plain_effects WHERE run_id = $1 AND key = $2", run_id, key)
        try:  # from the `started` row to the commit of the step, a cancellation leaves `unknown`
            if row is None:
                await self.conn.execute(
                    "INSERT INTO plain_effects VALUES ($1, $2, $3, 'started', NULL)", run_id, step, key)
            result = await self.call(run_id, key, step)
            async with self.conn.transaction():
                await self.conn.execute(
                    "INSERT INTO plain_steps VALUES ($1, $2, $3::jsonb)", run_id, step, json.dumps(result))
                await self.conn.execute(
                    "UPDATE plain_effects SET status = 'succeeded', result = $3::jsonb WHERE run_id = $1 AND key = $2",
                    run_id, key, json.dumps(result))
        except BaseException:
            await self.record_unknown(run_id, key)
            raise

    async def call(self, run_id: str, key: str, step: int) -> dict:
        body = {"idempotency_key": key, "amount": 1000 * step, "currency": "eur", "card": "4242-4242-4242-4242",
                "metadata": {"run_id": run_id}}
        async with self.session.post(f"{self.payment_url}/charges", json=body,
                                     headers={"X-Crashmatrix-Worker": self.worker}) as resp:
            return await resp.json()

    async def record_unknown(self, run_id: str, key: str) -> None:
        with anyio.CancelScope(shield=True):
            # a BEGIN cancelled in flight leaves the server in a transaction: a write
            # made inside it would be rolled back with it (found by this harness's
            # cancel@Runner.charge_step@4 cases)
            await self.conn.execute("ROLLBACK")  # a warning only when none is open
            await self.conn.execute(
                "UPDATE plain_effects SET status = 'unknown' WHERE run_id = $1 AND key = $2 AND status = 'started'",
                run_id, key)


class UnshieldedRunner(Runner):
    """The defect: the recovery write is not shielded, so the cancellation it records
    cancels it (the effect stays ``started``)."""

    async def record_unknown(self, run_id: str, key: str) -> None:
        async with self.conn.transaction():
            await self.conn.execute(
                "UPDATE plain_effects SET status = 'unknown' WHERE run_id = $1 AND key = $2 AND status = 'started'",
                run_id, key)
