"""Two walls of the reference runtime, on a real PostgreSQL: the operator's cancel
(fencing the worker that runs the run; resumed only by the operator) and a record this
build cannot read (the run parks ``cannot_migrate`` with the reason)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
import pytest

from crashmatrix.harness.services.postgres import PostgresService
from crashmatrix.reference_runtime import Agent, ModelReply, ProbeOutcome, Runtime, Tool, ToolCall, ToolContext, ToolOutcome
from crashmatrix.reference_runtime import cancellation, connect
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.records_pb2 import NodeRecord

pytestmark = pytest.mark.anyio
USER = {"role": "user", "content": "buy one dock"}
_ids = itertools.count(1)


class Model:
    """turn-1 asks for ``tool``; turn-2 answers."""

    def __init__(self, tool: str) -> None:
        self.tool, self.calls = tool, 0

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        if node_id == "turn-1":
            return ModelReply("", [ToolCall(f"call_{next(_ids):08x}", self.tool, {"amount": 12900})], tokens=5)
        return ModelReply("paid", [], tokens=3)


class Payments:
    """Deduplicates on the key; ``gate``: the next call waits for it after applying."""

    def __init__(self) -> None:
        self.applied: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.gate: anyio.Event | None = None
        self.inside = anyio.Event()

    async def charge(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        self.requests += 1
        assert ctx.idem_key
        self.applied.setdefault(ctx.idem_key, {"id": "ch_" + hashlib.sha256(ctx.idem_key.encode()).hexdigest()[:8],
                                               "amount": args["amount"]})
        if self.gate is not None:
            gate, self.gate = self.gate, None
            self.inside.set()
            await gate.wait()
        return ToolOutcome("succeeded", dict(self.applied[ctx.idem_key]))

    async def probe(self, ctx: ToolContext) -> ProbeOutcome:
        assert ctx.idem_key
        if ctx.idem_key in self.applied:
            return ProbeOutcome("applied", ToolOutcome("succeeded", dict(self.applied[ctx.idem_key])))
        return ProbeOutcome("not_applied")


def agent(model: Model, pay: Payments) -> Agent:
    return Agent("mini", model, {"charge": Tool("charge", pay.charge, effect=True, probe=pay.probe)})


async def status(raw: asyncpg.Connection, run_id: str) -> tuple[str, str | None]:
    row = await raw.fetchrow("SELECT status, detail FROM cm_runs WHERE run_id = $1", run_id)
    return row["status"], row["detail"]


async def test_an_operator_cancel_fences_the_worker_and_only_their_resume_continues(
        db: Db, raw: asyncpg.Connection, pg: PostgresService, new_run_id: Callable[[], str]) -> None:
    model, pay = Model("charge"), Payments()
    gate = pay.gate = anyio.Event()
    run_id = new_run_id()
    rt = Runtime(db, agent(model, pay), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "mini", {"messages": [USER]})
    outcome: list[str] = []
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                outcome.append(await rt.run(run_id))

            tg.start_soon(run)
            await pay.inside.wait()  # the charge applied, its record not appended yet
            await cancellation.cancel(raw, run_id, by="test")
            gate.set()  # the tool returns: its append is refused, the worker stops
    assert outcome == ["cancelled"]
    assert await status(raw, run_id) == ("cancelled", "cancelled by test")
    nodes = [r["node_id"] for r in await raw.fetch("SELECT node_id FROM cm_run_log WHERE run_id = $1", run_id)]
    assert nodes == ["turn-1"]  # the charging node was not recorded: its effect is left to resolve
    assert [r["status"] for r in await raw.fetch("SELECT status FROM cm_effects WHERE run_id = $1", run_id)] == ["started"]
    # no worker takes a cancelled run; the operator's resume makes it resumable
    other = await connect(pg.dsn, application_name="cm-test-after-cancel")
    try:
        assert await Runtime(other, agent(model, pay), worker_id="w2", handle_sigterm=False).run(run_id) == "cancelled"
        await cancellation.resume(raw, run_id, by="test")
        assert (await status(raw, run_id))[0] == "paused"
        with anyio.fail_after(15):
            assert await Runtime(other, agent(model, pay), worker_id="w3", handle_sigterm=False).run(run_id) == "completed"
    finally:
        await other.close()
    assert len(pay.applied) == 1 and pay.requests == 1  # the probe found the charge: not made twice
    with pytest.raises(cancellation.CancelRefused, match="already ended"):
        await cancellation.cancel(raw, run_id)
    with pytest.raises(cancellation.CancelRefused, match="not cancelled"):
        await cancellation.resume(raw, run_id)


async def test_a_record_this_build_cannot_read_parks_the_run_with_the_reason(
        db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, pay = Model("charge"), Payments()
    run_id = new_run_id()
    rt = Runtime(db, agent(model, pay), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "mini", {"messages": [USER]})
    assert await rt.run(run_id) == "completed"
    # as if a newer build had written turn-1 and the run were waiting for the rest
    row = await raw.fetchrow("SELECT record FROM cm_run_log WHERE run_id = $1 AND node_id = 'turn-1'", run_id)
    record = NodeRecord.FromString(bytes(row["record"]))
    record.output.format_version = 99
    await raw.execute("UPDATE cm_run_log SET record = $2 WHERE run_id = $1 AND node_id = 'turn-1'", run_id,
                      record.SerializeToString())
    await raw.execute("DELETE FROM cm_run_log WHERE run_id = $1 AND node_id = 'turn-2'", run_id)
    await raw.execute("UPDATE cm_runs SET status = 'paused' WHERE run_id = $1", run_id)
    calls = model.calls
    assert await Runtime(db, agent(model, pay), worker_id="w2", handle_sigterm=False).run(run_id) == "cannot_migrate"
    state, detail = await status(raw, run_id)
    assert state == "cannot_migrate" and detail is not None
    assert "cannot migrate" in detail and "format_version=99 is newer than this build's" in detail, detail
    assert model.calls == calls  # nothing was billed for a turn it could not read
