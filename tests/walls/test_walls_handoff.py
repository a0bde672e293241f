"""Hand-off (reference_runtime/handoff.py): an effect the probe cannot decide stops the
run in needs_human naming it; an operator resolves it as applied (with the result) or
not applied; the run then continues, without a second charge when applied."""

from __future__ import annotations

import hashlib
from typing import Any

import asyncpg
import pytest
from _walls_support import ScriptedModel

from crashmatrix.reference_runtime import Agent, OutcomeUnknown, ProbeOutcome, RunGraph, Runtime, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.handoff import HandoffError, pending, resolve
from crashmatrix.reference_runtime.logstore import AppendOnlyLog

pytestmark = pytest.mark.anyio
SCRIPT = {"turn-1": [("charge", {"amount": 12900})], "turn-2": "paid"}


class Flaky:
    """A payment provider whose answers are lost and whose probe cannot tell."""

    def __init__(self, apply: bool) -> None:
        self.apply = apply
        self.applied: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.lose = True

    async def charge(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        self.requests += 1
        assert ctx.idem_key
        if self.apply or not self.lose:
            self.applied.setdefault(ctx.idem_key, {"id": "ch_" + hashlib.sha256(ctx.idem_key.encode()).hexdigest()[:8], "amount": args["amount"]})
        if self.lose:
            raise OutcomeUnknown("connection reset")
        return ToolOutcome("succeeded", self.applied[ctx.idem_key])

    async def probe(self, ctx: ToolContext) -> ProbeOutcome:
        return ProbeOutcome("cannot_tell")


def agent(p: Flaky) -> Agent:
    return Agent(name="pay", model=ScriptedModel(SCRIPT), tools={"charge": Tool("charge", p.charge, effect=True, probe=p.probe)})


async def stuck_run(db: Db, raw: asyncpg.Connection, run_id: str, p: Flaky) -> str:
    rt = Runtime(db, agent(p), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "pay", {"messages": []})
    assert await rt.run(run_id) == "needs_human"
    detail = await raw.fetchval("SELECT detail FROM cm_runs WHERE run_id = $1", run_id)
    [effect] = await pending(raw, run_id)
    assert effect.tool == "charge" and effect.status == "unknown" and effect.request == {"amount": 12900}
    assert "charge" in detail and effect.idem_key[:12] in detail and "turn-1.tool-0" in detail
    return effect.idem_key


async def test_resolved_as_applied_the_run_continues_with_the_operators_result(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    p = Flaky(apply=True)
    run_id = new_run_id()
    key = await stuck_run(db, raw, run_id, p)
    requests = p.requests
    await resolve(raw, run_id, key, applied=True, result=p.applied[key], operator="alice")
    assert (await raw.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id)) == "paused"
    assert await pending(raw, run_id) == []
    p.lose = False
    assert await Runtime(db, agent(p), worker_id="w2", handle_sigterm=False).run(run_id) == "completed"
    assert p.requests == requests  # not called again
    row = await raw.fetchrow("SELECT status, result FROM cm_effects WHERE run_id = $1", run_id)
    assert row["status"] == "succeeded"
    graph = RunGraph.rehydrate(run_id, {"messages": []}, await AppendOnlyLog(db).read(run_id))
    assert graph.transcript()[1]["content"] == p.applied[key] and graph.final_answer() == "paid"


async def test_resolved_as_not_applied_the_call_is_made_again_once(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    p = Flaky(apply=False)
    run_id = new_run_id()
    key = await stuck_run(db, raw, run_id, p)
    assert p.applied == {}
    await resolve(raw, run_id, key, applied=False)
    p.lose = False
    assert await Runtime(db, agent(p), worker_id="w2", handle_sigterm=False).run(run_id) == "completed"
    assert list(p.applied) == [key]
    row = await raw.fetchrow("SELECT status, resolution FROM cm_effects WHERE run_id = $1", run_id)
    assert row["status"] == "succeeded" and row["resolution"] is None  # the decision was consumed


async def test_resolve_refuses_what_it_must(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    p = Flaky(apply=True)
    run_id = new_run_id()
    key = await stuck_run(db, raw, run_id, p)
    with pytest.raises(HandoffError, match="needs the provider's result"):
        await resolve(raw, run_id, key, applied=True)
    with pytest.raises(HandoffError, match="not an undecided effect"):
        await resolve(raw, run_id, "0" * 64, applied=False)
    await resolve(raw, run_id, key, applied=False)
    with pytest.raises(HandoffError, match="is 'paused', not waiting for a human"):
        await resolve(raw, run_id, key, applied=True, result={"id": "x"})
    with pytest.raises(HandoffError, match="does not exist"):
        await resolve(raw, "no-such-run", key, applied=False)


async def test_the_second_resume_after_not_applied_stops_again_if_still_undecidable(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    p = Flaky(apply=False)
    run_id = new_run_id()
    key = await stuck_run(db, raw, run_id, p)
    await resolve(raw, run_id, key, applied=False)
    assert await Runtime(db, agent(p), worker_id="w2", handle_sigterm=False).run(run_id) == "needs_human"
    assert [e.idem_key for e in await pending(raw, run_id)] == [key]
