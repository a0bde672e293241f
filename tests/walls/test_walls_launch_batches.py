"""Launch batches (the default commit policy; reference_runtime/executor.py
``_LaunchBatch``, docs/runtime.md "Launch batches"): the records of sibling nodes
launched together commit in one statement, in launch order, once each member has its
record or has ended without one; a member that fails or is cancelled does not hold its
siblings back or lose their records."""

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
FANOUT = 6


class Counting(AppendOnlyLog):
    """Counts the batch sizes of ``append_many`` (a subclass that overrode ``append``
    would get one call per record: ``AppendOnlyLog.append_many``)."""

    def __init__(self, db: Db) -> None:
        super().__init__(db)
        self.batches: list[int] = []

    async def append_many(self, lease: Any, first_seq: int, items: list[Any]) -> list[bool]:
        self.batches.append(len(items))
        return await AppendOnlyLog.append_many(self, lease, first_seq, items)


def agent(slow: dict[str, float] | None = None, failing: str | None = None,
          applied: dict[str, Any] | None = None) -> tuple[Agent, dict[str, Any]]:
    """A model turn that asks for FANOUT stamps at once (an effect each) and a lookup,
    then answers. ``slow``: seconds a sku's stamp takes; ``failing``: the sku whose stamp
    raises; ``applied``: the stamps made so far (the provider's side), shared by workers."""
    applied = {} if applied is None else applied

    async def stamp(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await anyio.sleep((slow or {}).get(args["sku"], 0))
        if args["sku"] == failing:
            raise RuntimeError(f"stamp {failing} broke")
        return ToolOutcome("succeeded", applied.setdefault(ctx.idem_key, {"stamped": args["sku"]}))

    async def probe(ctx: ToolContext) -> ProbeOutcome:
        if ctx.idem_key in applied:
            return ProbeOutcome("applied", ToolOutcome("succeeded", applied[ctx.idem_key]))
        return ProbeOutcome("not_applied")

    script = {"turn-1": [("stamp", {"sku": f"e{i}"}) for i in range(FANOUT)] + [("lookup", {"sku": "s0"})],
              "turn-2": "done"}
    tools = {"lookup": Tool("lookup", lookup), "stamp": Tool("stamp", stamp, effect=True, probe=probe)}
    return Agent("fan", ScriptedModel(script), tools), applied


async def started(db: Db, run_id: str, a: Agent, store: Any, **policy: Any) -> Runtime:
    """A runtime for ``a`` on ``store`` (``policy``: its commit keywords), the run created."""
    rt = Runtime(db, a, worker_id="w", handle_sigterm=False, store=store, **policy)
    await rt.create_run(run_id, "fan", {"messages": []})
    return rt


async def test_siblings_commit_in_one_statement_in_launch_order_whichever_finishes_first(
        db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    # the first launched finishes last: the batch still waits for it and keeps launch order
    a, applied = agent(slow={"e0": 0.05})
    store = Counting(db)
    run_id = new_run_id()
    rt = await started(db, run_id, a, store)
    assert await rt.run(run_id) == "completed"
    assert store.batches == [FANOUT + 1]  # the two model turns alone
    log = await AppendOnlyLog(db).read(run_id)
    assert [s.seq for s in log] == list(range(1, FANOUT + 4))
    assert [s.node_id for s in log[1:FANOUT + 2]] == [f"turn-1.tool-{i}" for i in range(FANOUT + 1)]
    effects = await raw.fetch("SELECT status FROM cm_effects WHERE run_id = $1", run_id)
    assert len(effects) == FANOUT == len(applied) and {e["status"] for e in effects} == {"succeeded"}
    graph = RunGraph.rehydrate(run_id, {}, log)
    assert graph.final_answer() == "done" and graph.budget()["tool_calls"] == FANOUT + 1


async def test_without_launch_batches_every_record_goes_alone(db: Db, new_run_id: Any) -> None:
    a, _ = agent()
    store = Counting(db)
    run_id = new_run_id()
    rt = await started(db, run_id, a, store, launch_batches=False)
    assert await rt.run(run_id) == "completed"
    assert store.batches == [] and len(await AppendOnlyLog(db).read(run_id)) == FANOUT + 3


async def test_a_failing_sibling_does_not_hold_back_or_lose_the_others_records(db: Db, new_run_id: Any) -> None:
    a, _ = agent(slow={"e3": 0.05}, failing="e1")
    store = Counting(db)
    run_id = new_run_id()
    rt = await started(db, run_id, a, store)
    with pytest.raises(RuntimeError, match="stamp e1 broke"):
        await rt.run(run_id)
    log = await AppendOnlyLog(db).read(run_id)
    assert store.batches == [FANOUT]  # every sibling but the failed one, in one statement
    assert [s.node_id for s in log[1:]] == [f"turn-1.tool-{i}" for i in range(FANOUT + 1) if i != 1]


async def test_a_cancellation_while_siblings_wait_commits_none_and_leaves_their_effects_unknown(
        db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    a, applied = agent(slow={"e5": 30})
    store = Counting(db)
    run_id = new_run_id()
    rt = await started(db, run_id, a, store)
    with anyio.move_on_after(1.0):
        await rt.run(run_id)
    assert store.batches == [] and len(applied) == FANOUT - 1
    assert [s.node_id for s in await AppendOnlyLog(db).read(run_id)] == ["turn-1"]
    effects = {r["status"] for r in await raw.fetch("SELECT status FROM cm_effects WHERE run_id = $1", run_id)}
    assert effects == {"unknown"}  # never `started`: each may have been applied
    # the resume asks the probes: nothing is stamped twice, the batch commits whole
    store2 = Counting(db)
    rt2 = Runtime(db, agent(applied=applied)[0], worker_id="w2", handle_sigterm=False, store=store2)
    assert await rt2.run(run_id) == "completed"
    assert store2.batches == [FANOUT + 1] and len(applied) == FANOUT


async def test_the_delta_store_takes_a_batch_and_snapshots_across_it(db: Db, new_run_id: Any) -> None:
    run_id = new_run_id()
    rt = await started(db, run_id, agent()[0], DeltaSnapshotStore(db, every=4))
    assert await rt.run(run_id) == "completed"
    read = await DeltaSnapshotStore(db, every=4).read(run_id)
    assert [(s.seq, s.record) for s in read] == [(s.seq, s.record) for s in await AppendOnlyLog(db).read(run_id)]
