"""Sub-agents (reference_runtime/subagents.py) in process: the child's nodes are scoped
rows of the run's log; a cancellation anywhere in the child (or between the child's
completion record and the parent's) resumes without re-running a completed child node,
without paying its model calls twice and without repeating its effect; the parent's
conversation holds the child's answer, never its turns. (The harness matrix with real
SIGKILLs inside the child: tests/walls/test_walls_workload_matrices.py, ``research``.)"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel, lookup

from crashmatrix.harness import crashpoint as crashpoint_module
from crashmatrix.reference_runtime import (
    Agent, ProbeOutcome, RunGraph, Runtime, SubAgent, Tool, ToolContext, ToolOutcome,
)
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.graph import node_order
from crashmatrix.reference_runtime.logstore import AppendOnlyLog
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore
from crashmatrix.reference_runtime.subagents import SubAgentError, agent_for, scope_of

pytestmark = pytest.mark.anyio
CHILD = "turn-1.tool-1"  # the sub-agent node: the parent's second call of turn-1
PARENT_SCRIPT: dict[str, Any] = {
    "turn-1": [("lookup", {"sku": "dock-1"}), ("investigate", {"task": "is dock-1 in stock?"})],
    "turn-2": "dock-1: in stock, noted",
}
CHILD_SCRIPT: dict[str, Any] = {
    f"{CHILD}:turn-1": [("lookup", {"sku": "dock-1"}), ("lookup", {"sku": "dock-2"})],
    f"{CHILD}:turn-2": [("note", {"text": "dock-1 in stock"})],
    f"{CHILD}:turn-3": "in stock",
}


class Notes:
    """A provider with its own ledger: ``note`` is an effect keyed by the runtime."""

    def __init__(self) -> None:
        self.applied: dict[str, dict[str, Any]] = {}

    async def note(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await anyio.lowlevel.checkpoint()
        assert ctx.idem_key is not None
        result = self.applied.setdefault(ctx.idem_key, {"note": args["text"], "n": len(self.applied) + 1})
        return ToolOutcome("succeeded", result)

    async def probe(self, ctx: ToolContext) -> ProbeOutcome:
        await anyio.lowlevel.checkpoint()
        assert ctx.idem_key is not None
        if ctx.idem_key in self.applied:
            return ProbeOutcome("applied", ToolOutcome("succeeded", self.applied[ctx.idem_key]))
        return ProbeOutcome("not_applied")


def build(notes: Notes) -> tuple[Agent, ScriptedModel, ScriptedModel]:
    parent_model, child_model = ScriptedModel(PARENT_SCRIPT), ScriptedModel(CHILD_SCRIPT)
    child = Agent("investigator", child_model, {
        "lookup": Tool("lookup", lookup), "note": Tool("note", notes.note, effect=True, probe=notes.probe)})
    parent = Agent("researcher", parent_model, {"lookup": Tool("lookup", lookup), "investigate": SubAgent("investigate", child)})
    return parent, parent_model, child_model


async def run_until(db: Db, agent: Agent, run_id: str, at: tuple[str, str] | None, store: Any = None,
                    group_commit: bool = False) -> str:
    """Run; with ``at`` = (label, node), cancel the run's scope the first time that node
    reaches that label (the cancel lands at the next await, as the harness's does)."""
    rt = Runtime(db, agent, worker_id="w", handle_sigterm=False, store=store, group_commit=group_commit)
    await rt.create_run(run_id, "sub", {"messages": [{"role": "user", "content": "check dock-1"}]})
    outcome = "cancelled"
    with anyio.CancelScope() as scope:
        def hook(name: str, task: str) -> None:
            if at == (name, task):
                crashpoint_module.disarm()
                scope.cancel()

        if at is not None:
            crashpoint_module.arm(hook)
        try:
            outcome = await rt.run(run_id)
        finally:
            crashpoint_module.disarm()
    return outcome


async def test_child_nodes_are_scoped_rows_and_the_parent_gets_the_answer(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    notes = Notes()
    agent, parent_model, child_model = build(notes)
    run_id = new_run_id()
    assert await run_until(db, agent, run_id, None) == "completed"
    log = await AppendOnlyLog(db).read(run_id)
    nodes = [s.node_id for s in log]
    assert sorted(nodes, key=node_order) == [
        "turn-1", "turn-1.tool-0", CHILD, f"{CHILD}:turn-1", f"{CHILD}:turn-1.tool-0", f"{CHILD}:turn-1.tool-1",
        f"{CHILD}:turn-2", f"{CHILD}:turn-2.tool-0", f"{CHILD}:turn-3", "turn-2"]
    # the parent's sub-agent node is appended after the child's completion record
    assert nodes.index(CHILD) > nodes.index(f"{CHILD}:turn-3")
    assert {s.record.kind for s in log if s.node_id == CHILD} == {"subagent"}
    graph = RunGraph.rehydrate(run_id, {"messages": [{"role": "user", "content": "check dock-1"}]}, log)
    assert graph.final_answer() == "dock-1: in stock, noted" and graph.final_answer(scope=CHILD) == "in stock"
    # what the parent's turn-2 saw: its own conversation plus the sub-agent's answer
    seen = graph.transcript(upto="turn-2")
    assert [m["role"] for m in seen] == ["user", "assistant", "tool", "tool"]
    assert seen[-1]["content"] == {"answer": "in stock"} and seen[-1]["name"] == "investigate"
    # what the child's turn-2 saw: its task, its own turn-1 and tools; nothing of the parent
    child_seen = graph.transcript(upto=f"{CHILD}:turn-2")
    assert child_seen[0] == {"role": "user", "content": "is dock-1 in stock?"}
    assert [m["role"] for m in child_seen] == ["user", "assistant", "tool", "tool"]
    # the whole transcript: the run's conversation, then the child's, tagged with its scope
    whole = graph.transcript()
    assert [m.get("scope") for m in whole] == [None] * 5 + [CHILD] * 7
    assert child_model.calls == [f"{CHILD}:turn-1", f"{CHILD}:turn-2", f"{CHILD}:turn-3"]
    assert graph.budget() == {"tokens": 11 * 3 + 7 * 2, "model_calls": 5, "tool_calls": 4}
    assert len(notes.applied) == 1
    effect_nodes = [r["node_id"] for r in await raw.fetch("SELECT node_id FROM cm_effects WHERE run_id = $1", run_id)]
    assert effect_nodes == [f"{CHILD}:turn-2.tool-0"]


POINTS = [
    ("model.call.after", f"{CHILD}:turn-2"),  # the child's second model call answered, not recorded
    ("tool.request.after", f"{CHILD}:turn-2.tool-0"),  # the child's effect applied, not recorded
    ("log.append.after", f"{CHILD}:turn-3"),  # the child's completion record is in
    ("log.append.before", CHILD),  # the parent's record of the sub-agent is not
]


@pytest.mark.parametrize("store_kind", ["append-only", "delta", "group-commit"])
@pytest.mark.parametrize("at", POINTS, ids=[f"{n}[{t}]" for n, t in POINTS])
async def test_a_crash_inside_the_child_resumes_without_redoing_it(
    db: Db, raw: asyncpg.Connection, new_run_id: Any, at: tuple[str, str], store_kind: str,
) -> None:
    def store() -> Any:
        return DeltaSnapshotStore(db, every=3) if store_kind == "delta" else None

    notes = Notes()
    agent, parent_model, child_model = build(notes)
    run_id = new_run_id()
    group = store_kind == "group-commit"
    assert await run_until(db, agent, run_id, at, store(), group) == "cancelled"
    recorded_before = {s.node_id for s in await AppendOnlyLog(db).read(run_id)}
    assert await run_until(db, agent, run_id, None, store(), group) == "completed"
    log = await AppendOnlyLog(db).read(run_id)
    assert [s.seq for s in log] == list(range(1, 11)) and len({s.node_id for s in log}) == 10
    # every model node was billed once, except the one in flight when the cancel landed
    billed = Counter(parent_model.calls + child_model.calls)
    in_flight = at[1] if at[0] == "model.call.after" else None
    assert billed == Counter({n: 2 if n == in_flight else 1 for n in billed}), billed
    assert len(billed) == 5 and recorded_before  # every model node ran; the crash left records
    # the effect applied exactly once; its ledger row succeeded with its node's record
    assert len(notes.applied) == 1
    assert await raw.fetchval("SELECT status FROM cm_effects WHERE run_id = $1", run_id) == "succeeded"
    graph = RunGraph.rehydrate(run_id, {}, log)
    assert graph.final_answer() == "dock-1: in stock, noted" and graph.done()


def test_agent_for_resolves_nested_scopes_and_refuses_strangers() -> None:
    from crashmatrix.reference_runtime import codec
    from crashmatrix.reference_runtime.records_pb2 import NodeSpec

    inner = Agent("inner", ScriptedModel({}), {})
    middle = Agent("middle", ScriptedModel({}), {"deeper": SubAgent("deeper", inner)})
    root = Agent("root", ScriptedModel({}), {"ask": SubAgent("ask", middle), "lookup": Tool("lookup", lookup)})

    def spec(node: str, name: str, kind: str = "subagent") -> NodeSpec:
        return NodeSpec(node_id=node, kind=kind, input=codec.encode({"call": {"name": name, "arguments": {"task": "t"}}}))

    specs = {"turn-1.tool-0": spec("turn-1.tool-0", "ask"), "turn-1.tool-0:turn-1.tool-0": spec("turn-1.tool-0:turn-1.tool-0", "deeper"),
             "turn-1.tool-1": spec("turn-1.tool-1", "lookup", kind="tool")}
    assert agent_for(root, specs, "turn-3") is root
    assert agent_for(root, specs, "turn-1.tool-0:turn-2") is middle
    assert agent_for(root, specs, "turn-1.tool-0:turn-1.tool-0:turn-1") is inner
    assert scope_of("turn-1.tool-0:turn-1.tool-0:turn-1") == "turn-1.tool-0:turn-1.tool-0"
    with pytest.raises(SubAgentError, match="not a sub-agent node"):
        agent_for(root, specs, "turn-1.tool-1:turn-1")
    with pytest.raises(SubAgentError, match="not a sub-agent node"):
        agent_for(root, specs, "turn-9.tool-0:turn-1")


async def test_a_subagent_call_without_a_task_fails_before_anything_is_recorded(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    child = Agent("c", ScriptedModel({}), {})
    agent = Agent("p", ScriptedModel({"turn-1": [("investigate", {"topic": "x"})]}), {"investigate": SubAgent("investigate", child)})
    run_id = new_run_id()
    rt = Runtime(db, agent, worker_id="w", handle_sigterm=False)
    await rt.create_run(run_id, "sub", {"messages": []})
    with pytest.raises(BaseException, match="needs a non-empty string argument 'task'"):
        await rt.run(run_id)
    assert await raw.fetchval("SELECT count(*) FROM cm_run_log WHERE run_id = $1", run_id) == 0
    assert await raw.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id) == "failed"


@pytest.mark.parametrize("k", [1, 2])
async def test_no_node_is_launched_after_a_cancellation(db: Db, new_run_id: Any, k: int) -> None:
    """Found by the research matrix (cancel at log.append.before of a fan-out tool): the
    nodes that ended just before the cancellation set the event the scheduler waits on,
    the scheduler woke before the cancellation reached it and launched the cancelled,
    still-pending child turn again, whose model call went out (billed) before its first
    await. The scheduler now checks for cancellation before it launches anything."""
    child_model = ScriptedModel({"turn-1.tool-3:turn-1": "done"})
    parent_model = ScriptedModel({"turn-1": [("lookup", {"sku": f"s{i}"}) for i in range(3)] + [("investigate", {"task": "t"})]})
    agent = Agent("p", parent_model, {"lookup": Tool("lookup", lookup),
                                      "investigate": SubAgent("investigate", Agent("c", child_model, {}))})
    run_id = new_run_id()
    assert await run_until(db, agent, run_id, ("log.append.before", f"turn-1.tool-{k}")) == "cancelled"
    assert child_model.calls == ["turn-1.tool-3:turn-1"] and parent_model.calls == ["turn-1"]
