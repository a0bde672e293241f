"""Store strategies: the delta-and-snapshot store (reference_runtime/snapshots.py) reads
a snapshot plus the deltas after it, equals the append-only read, survives a resume, and
its known failures (a delta missed, deltas applied out of order) are caught when planted."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel, lookup

from crashmatrix.reference_runtime import Agent, RunGraph, Runtime, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog, CorruptRecord, StoredRecord
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore, check_contiguous

pytestmark = pytest.mark.anyio
SCRIPT: dict[str, Any] = {f"turn-{i}": [("lookup", {"sku": f"s{i}"}), ("lookup", {"sku": f"t{i}"})] for i in range(1, 6)}
SCRIPT["turn-4"] = [("lookup", {"sku": "s4"})]  # one call: the interruption point is deterministic
SCRIPT["turn-6"] = "done"


class MissesADelta(DeltaSnapshotStore):
    """Planted defect: the first delta after the snapshot is dropped (an off-by-one in
    the delta query)."""

    def assemble(self, base: list[StoredRecord], deltas: list[StoredRecord]) -> list[StoredRecord]:
        return base + deltas[1:]


class WrongOrder(DeltaSnapshotStore):
    """Planted defect: deltas applied before the snapshot."""

    def assemble(self, base: list[StoredRecord], deltas: list[StoredRecord]) -> list[StoredRecord]:
        return deltas + base


async def run_interrupted(db: Db, raw: asyncpg.Connection, run_id: str, store: Any, block_at: str) -> Agent:
    """Run with ``store`` until node ``block_at`` starts its tool, cancel there."""
    gate = {"block": True}
    entered = anyio.Event()

    async def maybe_block(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        if gate["block"] and ctx.node_id == block_at:
            entered.set()
            await anyio.sleep_forever()
        return await lookup(ctx, args)

    agent = Agent("snap", ScriptedModel(SCRIPT), {"lookup": Tool("lookup", maybe_block)})
    # one record a statement, so the snapshots fall at 4 and 8 and two deltas follow the
    # last (a launch batch's two tools would make it 4 and 9: test_walls_launch_batches)
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False, store=store, launch_batches=False)
    await rt.create_run(run_id, "snap", {"messages": []})
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            async def cancel() -> None:
                await entered.wait()
                scope.cancel()
            tg.start_soon(cancel)
            await rt.run(run_id)
    gate["block"] = False
    return agent


async def test_snapshot_plus_deltas_equals_the_full_log_and_resumes(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    run_id = new_run_id()
    agent = await run_interrupted(db, raw, run_id, DeltaSnapshotStore(db, every=4), block_at="turn-4.tool-0")
    snaps = [r["upto_seq"] for r in await raw.fetch("SELECT upto_seq FROM cm_run_snapshots WHERE run_id = $1 ORDER BY 1", run_id)]
    assert snaps == [4, 8]
    full = await AppendOnlyLog(db).read(run_id)
    assert len(full) == 10  # turn-1..3 with two tools each, turn-4
    assert [(s.seq, s.node_id) for s in await DeltaSnapshotStore(db, every=4).read(run_id)] == [(s.seq, s.node_id) for s in full]
    rt = Runtime(db, agent, worker_id="w2", handle_sigterm=False, store=DeltaSnapshotStore(db, every=4))
    assert await rt.run(run_id) == "completed"
    log = await AppendOnlyLog(db).read(run_id)
    assert [s.seq for s in log] == list(range(1, 16))
    graph = RunGraph.rehydrate(run_id, {}, log)
    assert graph.final_answer() == "done" and graph.budget()["model_calls"] == 6


@pytest.mark.parametrize("defect", [MissesADelta, WrongOrder])
async def test_planted_delta_defects_are_caught_before_they_corrupt_the_run(
    db: Db, raw: asyncpg.Connection, new_run_id: Any, defect: type[DeltaSnapshotStore]
) -> None:
    run_id = new_run_id()
    agent = await run_interrupted(db, raw, run_id, DeltaSnapshotStore(db, every=4), block_at="turn-4.tool-0")
    rt = Runtime(db, agent, worker_id="w2", handle_sigterm=False, store=defect(db, every=4))
    with pytest.raises(CorruptRecord, match="not contiguous"):
        await rt.run(run_id)
    assert await raw.fetchval("SELECT count(*) FROM cm_run_log WHERE run_id = $1", run_id) == 10  # nothing written


def test_contiguity_check() -> None:
    def rec(seq: int) -> StoredRecord:
        return StoredRecord(seq, f"n{seq}", None)  # type: ignore[arg-type]

    check_contiguous("r", [rec(1), rec(2), rec(3)])
    for bad in ([rec(1), rec(3)], [rec(2), rec(1)], [rec(1), rec(1)], [rec(2)]):
        with pytest.raises(CorruptRecord):
            check_contiguous("r", bad)
