"""Mutants of the write path of a node's record: what is written, when, and with what.

Each subclasses a store (:class:`~crashmatrix.reference_runtime.logstore.AppendOnlyLog`,
:class:`~crashmatrix.reference_runtime.snapshots.DeltaSnapshotStore`) or the
:class:`~crashmatrix.reference_runtime.executor.Execution`, and says which check
catches it (see the package docstring and :mod:`._base` for the metadata).
"""

from __future__ import annotations

import asyncio
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.agent import ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.leases import Lease
from crashmatrix.reference_runtime.logstore import AppendOnlyLog, EffectOutcome, RunStore
from crashmatrix.reference_runtime.records_pb2 import Budget, NodeRecord, NodeSpec
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore

from ._base import MutantAdapter, write_effect_outcome

# -- 1. a delta that loses a field -------------------------------------------------------


class DeltaDropsSpawnedLog(AppendOnlyLog):
    """Defect: the delta written for each record leaves out its ``spawned`` field (the
    delta keeps only what the node produced, output and budget; the graph's shape is
    left to the next full snapshot, which is built from the records in memory and so
    is complete).

    A run that never crashes never reads a delta back. A resume after a crash that
    falls between two snapshots rehydrates the deltas after the last snapshot without
    their successors: the frontier is empty, the run "completes" without its last
    turns. Class: seed 000's shipped delta-and-snapshot design (docs/design.md; catalogue
    item 1); the same class in formancehq/ledger#2044 (an incremental restore ignored
    what a delta recorded after the full checkpoint, so the restored state kept what
    the live one had dropped). Caught at the end by ``state.equal`` (no final answer),
    ``transcript.exact`` and ``provider.payment.ledger_equal`` (the charge never made).
    """

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        delta = NodeRecord()
        delta.CopyFrom(record)  # the executor keeps the complete record in memory
        delta.ClearField("spawned")
        return await super().append(lease, seq, delta, effect)


class DeltaDropsSpawnedStore(DeltaSnapshotStore):
    """The delta-and-snapshot store (a snapshot every 3 records) writing lossy deltas."""

    def __init__(self, db: Db, every: int = 3) -> None:
        super().__init__(db, every=every)
        self.log = DeltaDropsSpawnedLog(db)


class DeltaDropsSpawnedAdapter(MutantAdapter):
    """Mutant: deltas without ``spawned`` (DeltaDropsSpawnedLog)."""

    name = "defect:delta-drops-field"
    defect = "the delta-and-snapshot store's delta loses the record's spawned field"
    source = ("seed 000's delta-and-snapshot store (docs/design.md; catalogue item 1); formancehq/ledger#2044 "
              "(incremental restore lost what a delta recorded after the checkpoint)")
    caught_by = ("state.equal", "transcript.exact", "provider.payment.ledger_equal")
    fault_kinds = ("kill",)
    baseline = "reference-delta"

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        return DeltaDropsSpawnedStore(db, every=3)


# -- 3. the effect's succeeded row outside the record's transaction ----------------------


class OutcomeOutsideRecordExecution(Execution):
    """Defect: the effect's ``succeeded`` (or ``failed``) row is written by a statement
    of its own, committed before the node's record is appended, instead of in the
    statement that appends the record.

    A kill between the two leaves an effect ``succeeded`` whose node has no record.
    Here the resume still ends well (the re-run node finds the stored result), which
    is why only the crash state shows it; a runtime that trusts "succeeded" to mean
    "the transcript has it" loses the tool result. Class: docs/design.md ("``succeeded``
    with the result in the same transaction as the node's log record"; catalogue item
    3); the same dual write in entireio/cli#2038 (a checkpoint made durable before the
    session state that says so: a kill between them repeats the work). Caught at the
    crash state by ``effects.commit_with_record``.
    """

    async def append(
        self, spec: NodeSpec, output: Any, spawned: list[NodeSpec], budget: Budget, effect: EffectOutcome | None,
        *, state_updates: dict[str, Any] | None = None,
    ) -> None:
        if effect is not None:
            await write_effect_outcome(self.rt.db, self.lease, effect)
        await super().append(spec, output, spawned, budget, None, state_updates=state_updates)


class OutcomeOutsideRecordAdapter(MutantAdapter):
    """Mutant: effect outcome committed apart from the record (OutcomeOutsideRecordExecution)."""

    name = "defect:outcome-outside-record"
    execution = OutcomeOutsideRecordExecution
    defect = "the effect's succeeded row is committed apart from the node's record"
    source = "docs/design.md, effects ledger (catalogue item 3); entireio/cli#2038 (durable checkpoint before the state naming it)"
    caught_by = ("effects.commit_with_record",)
    fault_kinds = ("kill",)


# -- 8. the checkpoint written before the node runs --------------------------------------


class CheckpointFirstExecution(Execution):
    """Defect: a tool node's record is appended when the node starts (its call, no
    result yet), and the node's body runs after it; the result reaches only the
    in-memory graph (and the effect's row, by a statement of its own).

    Without a crash nothing shows: the live run reads the results from memory. A crash
    after the early record and before the body finished leaves the node "done" in the
    log: the resume skips it, so its effect is never made, and the next turn reads an
    empty result. Class: seed 000's "record after the node, not before" (docs/design.md,
    reference_runtime; catalogue item 8); peters/horizon#382 (a browser agent that
    checkpointed steps before they were verified, fixed to "persist intent before
    dispatch, checkpoint only verified completions"). Caught at the crash state by
    ``effects.commit_with_record`` (a record whose effect is still ``started``) and at
    the end by ``provider.payment.ledger_equal`` (the charge lost) and ``run.status``
    (the next turn cannot read the result).
    """

    async def run_tool(self, spec: NodeSpec) -> None:
        call = codec.decode(spec.input)["call"]
        early = self.tool_output(call, ToolOutcome("succeeded", None))  # the call, no result yet
        await self.append(spec, early, [], Budget(tool_calls=1), None)
        await super().run_tool(spec)


class CheckpointFirstLog(AppendOnlyLog):
    """The store side of :class:`CheckpointFirstExecution`: a tool node's second append
    (its real end) writes nothing to the log, only the effect's final status."""

    def __init__(self, db: Db) -> None:
        super().__init__(db)
        self.checkpointed: set[str] = set()

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        if record.node_id in self.checkpointed:
            if effect is not None:
                await write_effect_outcome(self.db, lease, effect)
            return False  # "already there": the executor keeps the real record in memory
        written = await super().append(lease, seq, record, effect)
        if record.kind == "tool":
            self.checkpointed.add(record.node_id)
        return written


class CheckpointFirstAdapter(MutantAdapter):
    """Mutant: tool nodes recorded before they run (CheckpointFirstExecution)."""

    name = "defect:checkpoint-before-node"
    execution = CheckpointFirstExecution
    defect = "a tool node's record is written before its body runs"
    source = ("seed 000: record after the node, not before (docs/design.md; catalogue item 8); peters/horizon#382 "
              "(checkpoint only verified completions)")
    caught_by = ("effects.commit_with_record", "provider.payment.ledger_equal", "run.status")
    fault_kinds = ("kill",)

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        return CheckpointFirstLog(db)


# -- 13. durability that lags ------------------------------------------------------------


class LaggingLog(AppendOnlyLog):
    """Defect: an append is acknowledged at once and written later: records wait in
    memory, and once more than ``lag`` are waiting a background task writes the older
    ones (in ``seq`` order, each with its effect's final status, as the reference does).
    :meth:`flush_all` writes the rest when the attempt ends.

    The live run schedules from memory and never notices. A kill loses the last ``lag``
    acknowledged records (a few turns): the resume re-runs them, paying their model
    calls again. Class: docs/design.md ("O(1) bytes per turn", "the append is one
    statement"; catalogue item 13); KempnerInstitute/KempnerForge#102 (async
    checkpointing acknowledged a checkpoint before the background flush made it
    durable: a crash in the window left nothing loadable); langchain-ai/langgraph#8234
    (``put_writes`` and the checkpoint persisted without ordering). Caught at the crash
    state by ``log.acknowledged_durable`` and at the end by ``model.calls_billed``.
    """

    def __init__(self, db: Db, lag: int = 2) -> None:
        super().__init__(db)
        self.lag = lag
        self.waiting: list[tuple[Lease, int, NodeRecord, EffectOutcome | None]] = []
        self.flusher: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        if self.error is not None:
            raise self.error
        self.waiting.append((lease, seq, record, effect))
        if len(self.waiting) > self.lag:
            batch, self.waiting = self.waiting[:-self.lag], self.waiting[-self.lag:]
            self.flusher = asyncio.get_running_loop().create_task(self._write(self.flusher, batch))
        return True

    async def _write(self, previous: asyncio.Task[None] | None, batch: list[Any]) -> None:
        if previous is not None:
            await previous
        try:
            for item in batch:
                await AppendOnlyLog.append(self, *item)
        except BaseException as exc:  # reported at the next append or at flush_all
            self.error = exc

    async def flush_all(self) -> None:
        """Write every waiting record and wait for the background writes."""
        batch, self.waiting = self.waiting, []
        await self._write(self.flusher, batch)
        self.flusher = None
        if self.error is not None:
            raise self.error


class LaggingExecution(Execution):
    """The attempt flushes the lagging store when its scheduler returns (completed,
    drained, stopped), before the run's status is written."""

    async def schedule(self) -> tuple[str, str | None]:
        result = await super().schedule()
        store = self.rt.store
        assert isinstance(store, LaggingLog)
        await store.flush_all()
        return result


class LaggingDurabilityAdapter(MutantAdapter):
    """Mutant: records flushed two behind by a background task (LaggingLog)."""

    name = "defect:lagging-durability"
    execution = LaggingExecution
    defect = "appends are acknowledged before they are durable: a background task flushes two records behind"
    source = ("docs/design.md, append-only run log (catalogue item 13); KempnerInstitute/KempnerForge#102 "
              "(acknowledged before the background flush); langchain-ai/langgraph#8234")
    caught_by = ("log.acknowledged_durable", "model.calls_billed")
    fault_kinds = ("kill",)

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        return LaggingLog(db, lag=2)
