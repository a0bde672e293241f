"""Budgets and limits (reference_runtime/budgets.py): usage per record, summed on
rehydrate; limits stop a run only before a launch, with status limit_exceeded naming
the limit."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel, lookup

from crashmatrix.reference_runtime import Agent, RunGraph, Runtime, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog

pytestmark = pytest.mark.anyio
LOOP = {f"turn-{i}": [("lookup", {"sku": f"s{i}"}), ("lookup", {"sku": f"t{i}"})] for i in range(1, 10)}


async def go(db: Db, agent: Agent, run_id: str) -> str:
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, agent.name, {"messages": []})
    return await rt.run(run_id)


async def state(db: Db, raw: asyncpg.Connection, run_id: str) -> tuple[str, str, list[str]]:
    status, detail = await raw.fetchrow("SELECT status, detail FROM cm_runs WHERE run_id = $1", run_id)
    nodes = [s.node_id for s in await AppendOnlyLog(db).read(run_id)]
    return status, detail, nodes


async def test_max_turns_stops_before_the_next_turn_after_the_tools_finished(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    model = ScriptedModel(LOOP)
    run_id = new_run_id()
    assert await go(db, Agent("loop", model, {"lookup": Tool("lookup", lookup)}, max_turns=2), run_id) == "limit_exceeded"
    status, detail, nodes = await state(db, raw, run_id)
    assert detail == "max_turns: 2 turns done, limit 2 (not launching turn-3)"
    assert sorted(nodes) == ["turn-1", "turn-1.tool-0", "turn-1.tool-1", "turn-2", "turn-2.tool-0", "turn-2.tool-1"]
    assert model.calls == ["turn-1", "turn-2"]  # turn-3 never called the model
    # a resume of a limited run stops again at once, calling nothing
    assert await Runtime(db, Agent("loop", model, {"lookup": Tool("lookup", lookup)}, max_turns=2), worker_id="w2",
                         handle_sigterm=False).run(run_id) == "limit_exceeded"
    assert model.calls == ["turn-1", "turn-2"]


async def test_max_tokens_counts_recorded_usage(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    run_id = new_run_id()
    agent = Agent("loop", ScriptedModel(LOOP), {"lookup": Tool("lookup", lookup)}, max_tokens=30)
    assert await go(db, agent, run_id) == "limit_exceeded"
    status, detail, nodes = await state(db, raw, run_id)
    assert detail == "max_tokens: 33 used, limit 30"  # 11 per model turn, checked before each launch
    graph = RunGraph.rehydrate(run_id, {}, await AppendOnlyLog(db).read(run_id))
    assert graph.budget()["tokens"] == 33 and [n for n in nodes if "tool" not in n] == ["turn-1", "turn-2", "turn-3"]


async def test_wall_ms_is_recorded_per_node_summed_on_rehydrate_and_limits(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    async def slow(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await anyio.sleep(0.06)
        return ToolOutcome("succeeded", {})

    run_id = new_run_id()
    agent = Agent("slow", ScriptedModel({"turn-1": [("slow", {})], "turn-2": [("slow", {})], "turn-3": "done"}),
                  {"slow": Tool("slow", slow)}, max_wall_ms=50)
    assert await go(db, agent, run_id) == "limit_exceeded"
    status, detail, nodes = await state(db, raw, run_id)
    stored = await AppendOnlyLog(db).read(run_id)
    tool_ms = {s.node_id: s.record.budget.wall_ms for s in stored}["turn-1.tool-0"]
    assert tool_ms >= 60 and detail.startswith("max_wall_ms: ") and detail.endswith(" used, limit 50")
    assert nodes == ["turn-1", "turn-1.tool-0"]
    graph = RunGraph.rehydrate(run_id, {}, stored)
    assert graph.wall_ms() == sum(s.record.budget.wall_ms for s in stored)
    assert "wall_ms" not in graph.budget()  # never compared by the oracle


async def test_no_limit_means_completion(db: Db, new_run_id: Any) -> None:
    agent = Agent("one", ScriptedModel({"turn-1": [("lookup", {"sku": "a"})], "turn-2": "ok"}), {"lookup": Tool("lookup", lookup)},
                  max_turns=None)
    assert await go(db, agent, new_run_id()) == "completed"
