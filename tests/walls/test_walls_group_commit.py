"""Group commit (``Runtime(group_commit=True)``; reference_runtime/executor.py
``Execution.commit``, ``append_many`` in the stores): records of nodes that finish
together go in one statement, with their effects; ``seq`` stays contiguous and in commit
order; the delta store still snapshots; without it and without launch batches, and for
a store subclass that overrides ``append``, every record gets its own call."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel, lookup

from crashmatrix.reference_runtime import Agent, ProbeOutcome, RunGraph, Runtime, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore

pytestmark = pytest.mark.anyio
FANOUT = 8


class Counting(AppendOnlyLog):
    """Counts the store's statements: batch sizes of ``append_many``, lone ``append``s."""

    def __init__(self, db: Db) -> None:
        super().__init__(db)
        self.batches: list[int] = []

    async def append_many(self, lease: Any, first_seq: int, items: list[Any]) -> list[bool]:
        self.batches.append(len(items))
        return await super().append_many(lease, first_seq, items)


class OverridesAppend(Counting):
    """A subclass with its own ``append`` (as a mutant has): never bypassed by a batch."""

    singles = 0

    async def append(self, lease: Any, seq: int, record: Any, effect: Any) -> bool:
        type(self).singles += 1
        return await AppendOnlyLog.append(self, lease, seq, record, effect)


def agent() -> tuple[Agent, dict[str, Any]]:
    applied: dict[str, Any] = {}

    async def stamp(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await anyio.lowlevel.checkpoint()
        return ToolOutcome("succeeded", applied.setdefault(ctx.idem_key, {"stamped": args["sku"]}))

    async def probe(ctx: ToolContext) -> ProbeOutcome:
        return ProbeOutcome("applied", ToolOutcome("succeeded", applied[ctx.idem_key])) if ctx.idem_key in applied else ProbeOutcome("not_applied")

    calls = [("lookup", {"sku": f"s{i}"}) for i in range(FANOUT // 2)] + [("stamp", {"sku": f"e{i}"}) for i in range(FANOUT // 2)]
    script = {"turn-1": calls, "turn-2": "done"}
    return Agent("fan", ScriptedModel(script), {"lookup": Tool("lookup", lookup), "stamp": Tool("stamp", stamp, effect=True, probe=probe)}), applied


async def run(db: Db, run_id: str, store: Any, **kw: Any) -> tuple[str, dict[str, Any]]:
    a, applied = agent()
    rt = Runtime(db, a, worker_id="w", handle_sigterm=False, store=store, **kw)
    await rt.create_run(run_id, "fan", {"messages": []})
    return await rt.run(run_id), applied


async def test_a_fanout_commits_in_fewer_statements_than_records(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    store = Counting(db)
    run_id = new_run_id()
    status, applied = await run(db, run_id, store, group_commit=True)
    assert status == "completed"
    log = await AppendOnlyLog(db).read(run_id)
    assert [s.seq for s in log] == list(range(1, FANOUT + 3))
    assert store.batches and max(store.batches) > 1 and sum(store.batches) <= FANOUT  # the tools, batched
    effects = await raw.fetch("SELECT status, result FROM cm_effects WHERE run_id = $1", run_id)
    assert len(effects) == FANOUT // 2 == len(applied) and {e["status"] for e in effects} == {"succeeded"}
    graph = RunGraph.rehydrate(run_id, {}, log)
    assert graph.final_answer() == "done" and graph.budget()["tool_calls"] == FANOUT


async def test_without_group_commit_or_with_an_overridden_append_each_record_goes_alone(db: Db, new_run_id: Any) -> None:
    store = Counting(db)
    status, _ = await run(db, new_run_id(), store, launch_batches=False)  # the default's batches: test_walls_launch_batches
    assert status == "completed" and store.batches == []
    OverridesAppend.singles = 0
    store = OverridesAppend(db)
    status, _ = await run(db, new_run_id(), store, group_commit=True)
    assert status == "completed" and OverridesAppend.singles == FANOUT + 2


async def test_the_delta_store_snapshots_across_a_batch(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    run_id = new_run_id()
    status, _ = await run(db, run_id, DeltaSnapshotStore(db, every=4), group_commit=True)
    assert status == "completed"
    snaps = [r["upto_seq"] for r in await raw.fetch("SELECT upto_seq FROM cm_run_snapshots WHERE run_id = $1 ORDER BY 1", run_id)]
    assert snaps and all(s >= 4 for s in snaps) and len(snaps) <= (FANOUT + 2) // 4
    read = await DeltaSnapshotStore(db, every=4).read(run_id)
    assert [(s.seq, s.record) for s in read] == [(s.seq, s.record) for s in await AppendOnlyLog(db).read(run_id)]
