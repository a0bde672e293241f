"""Mutants of what a resume does with what the crash left: the model call, the tool
result, the effect's state, the trace context, the waiting run itself.

See the package docstring and :mod:`._base` for the metadata convention.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from crashmatrix.harness.adapter import Environment, RunContext
from crashmatrix.reference_runtime import EffectLedger, Runtime
from crashmatrix.reference_runtime.agent import ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.effects import EffectRow
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.graph import RunGraph, node_order
from crashmatrix.reference_runtime.leases import Lease
from crashmatrix.reference_runtime.logstore import EffectOutcome
from crashmatrix.reference_runtime.records_pb2 import Budget, NodeSpec

from ._base import MutantAdapter

# -- 2. a resume that replays the model call of a recorded turn --------------------------


class ReplaysModelCallExecution(Execution):
    """Defect: a resume calls the model again for the last recorded model turn (to
    rebuild in-memory conversation state it did not keep), discards the reply and
    keeps the recorded one.

    The durable state ends equal to the golden run's; only the bill differs: that turn
    is paid twice, though its record shows it was not in flight. Class: docs/design.md (the
    model calls billed check; catalogue item 2); alibaba/open-code-review#1034 (a
    resumed scan calls the dedup model again on restored results instead of restoring
    the canonical one); seangalliher/ProbOS#1281 (a resume discards the restored plan
    and repeats the decomposition call). Caught at the end by ``model.calls_billed``.
    """

    async def schedule(self) -> tuple[str, str | None]:
        recorded = [n for n, r in self.graph.records.items() if r.kind == "model"]
        if recorded:  # a resume: warm up from the last turn
            last = max(recorded, key=node_order)
            await self.rt.agent.model.complete(self.graph.run_id, last, self.graph.transcript(upto=last))
        return await super().schedule()


class ReplaysModelCallAdapter(MutantAdapter):
    """Mutant: a resume re-pays the last recorded model turn (ReplaysModelCallExecution)."""

    name = "defect:replays-model-call"
    execution = ReplaysModelCallExecution
    defect = "a resume calls the model again for the last recorded turn"
    source = ("docs/design.md, model calls billed (catalogue item 2); alibaba/open-code-review#1034, "
              "seangalliher/ProbOS#1281 (resumes that repeat a recorded model call)")
    caught_by = ("model.calls_billed",)
    fault_kinds = ("kill",)


# -- 4. a messages reducer that appends a recovered tool result twice --------------------


class DuplicatesRecoveredResultExecution(Execution):
    """Defect: when a resume recovers a tool call's result from an earlier attempt (the
    probe says the provider applied it), the messages reducer appends the recovered
    result and then the node's own return of the same result: two tool messages with
    one ``tool_call_id``.

    Class: catalogue item 4 (a reducer without deduplication by message id);
    xorbitsai/xagent#2283 (resumed tool outcomes must be projected onto the original
    call, "no second tool row"); cline/cline#3236 (each resumed attempt appends its
    block again). Caught at the end by ``transcript.exact`` (a duplicated message).
    """

    def __init__(self, runtime: Runtime, graph: RunGraph, lease: Lease) -> None:
        super().__init__(runtime, graph, lease)
        self.recovered: set[str] = set()

    async def resolve(self, tool: Any, ctx: ToolContext) -> ToolOutcome | None:
        outcome = await super().resolve(tool, ctx)
        if outcome is not None:
            self.recovered.add(ctx.node_id)
        return outcome

    async def append(
        self, spec: NodeSpec, output: Any, spawned: list[NodeSpec], budget: Budget, effect: EffectOutcome | None,
        *, state_updates: dict[str, Any] | None = None,
    ) -> None:
        if spec.node_id in self.recovered:  # the recovered pending write, then the node's return
            output = {**output, "messages": output["messages"] * 2}
        await super().append(spec, output, spawned, budget, effect, state_updates=state_updates)


class DuplicatesRecoveredResultAdapter(MutantAdapter):
    """Mutant: a recovered tool result appended twice (DuplicatesRecoveredResultExecution)."""

    name = "defect:duplicate-tool-result"
    execution = DuplicatesRecoveredResultExecution
    defect = "the messages reducer appends a tool result recovered on resume twice"
    source = "catalogue item 4; xorbitsai/xagent#2283 (no second tool row on resume), cline/cline#3236"
    caught_by = ("transcript.exact",)
    fault_kinds = ("kill",)


# -- 6. no unknown state: a cancelled call recorded as failed, and retried ---------------


class NoUnknownLedger(EffectLedger):
    """Defect: the ledger has no ``unknown``: a cancelled (or ambiguous) call is written
    ``failed`` (still inside the executor's shield, so the write lands), and a failed
    row without a result is taken for a call that never happened, so the resume makes
    the call again without asking the probe.

    With a provider that deduplicates on the key the retry is harmless here, which is
    why only the crash state shows it; against one that does not, the charge lands
    twice. Class: seed 000's three outcomes (docs/design.md, effects ledger: ``unknown``, as
    Jepsen's info, is not ``failed``; catalogue item 6); LionSR/TeXRA#12087 (an
    interrupted activity retried by default, "one user cancel into up to ten further
    provider calls"). Caught at the crash state by ``cancel.left_unknown``.
    """

    async def mark_unknown(self, lease: Lease, idem_key: str) -> None:
        await super().mark_unknown(lease, idem_key)  # fenced: started -> unknown, then "unknown means failed"
        await self.db.execute(
            "UPDATE cm_effects SET status = 'failed', updated_at = now() "
            "WHERE run_id = $1 AND idem_key = $2 AND status = 'unknown' AND lease_epoch = $3",
            lease.run_id, idem_key, lease.epoch,
        )

    async def get(self, run_id: str, idem_key: str) -> EffectRow | None:
        row = await super().get(run_id, idem_key)
        if row is not None and row.status == "failed" and row.result is None:
            return None  # "it failed, so it is safe to retry"
        return row


class NoUnknownAdapter(MutantAdapter):
    """Mutant: cancelled calls recorded as failed and retried (NoUnknownLedger)."""

    name = "defect:no-unknown-state"
    defect = "a cancelled call is recorded failed instead of unknown, and retried"
    source = "seed 000: succeeded / failed / unknown (docs/design.md; catalogue item 6); LionSR/TeXRA#12087"
    caught_by = ("cancel.left_unknown",)
    fault_kinds = ("cancel",)

    def make_ledger(self, db: Db, ctx: RunContext) -> EffectLedger | None:
        return NoUnknownLedger(db)


# -- 10. trace context not stored --------------------------------------------------------


class TraceNotStoredRuntime(Runtime):
    """Defect: the run's trace context lives only in the worker's memory, so a resume
    finds none and starts an unlinked trace. (Planted where the reference stores it:
    whatever the run row holds is dropped when a worker takes the run, as if the column
    were never written.)

    Class: seed 000's trace wall (docs/design.md, "Trace context"; catalogue item 10);
    mastra-ai/mastra#20771 (trace continuity lost across suspend and resume: a new
    trace id, no parent, no link); n8n-io/n8n#38033. Caught at the end by
    ``trace.continues`` (a resume without a link).
    """

    async def acquire_lease(self, run_id: str) -> Lease:
        lease = await super().acquire_lease(run_id)
        await self.db.execute("UPDATE cm_runs SET traceparent = NULL WHERE run_id = $1", run_id)
        return lease


class TraceNotStoredAdapter(MutantAdapter):
    """Mutant: trace context not stored (TraceNotStoredRuntime)."""

    name = "defect:trace-not-stored"
    runtime_class = TraceNotStoredRuntime
    defect = "the trace context is not stored, so a resume starts an unlinked trace"
    source = "seed 000: trace links (docs/design.md; catalogue item 10); mastra-ai/mastra#20771, n8n-io/n8n#38033"
    caught_by = ("trace.continues",)
    fault_kinds = ("kill",)


# -- 12. retention that deletes a paused run ---------------------------------------------


async def delete_idle_runs(conn: asyncpg.Connection, *, older_than: timedelta, run_ids: list[str]) -> list[str]:
    """The defective retention pass: deletes every run (of ``run_ids``) that nobody is
    running and that has not changed for ``older_than``, with its log, effects and
    invocations. Returns the deleted run ids. (The reference's
    :func:`~crashmatrix.reference_runtime.retention.delete_finished_runs` deletes only
    finished runs.)"""
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT run_id FROM cm_runs WHERE run_id = ANY($1::text[]) AND status <> 'running' "
            "AND updated_at < now() - $2::interval FOR UPDATE SKIP LOCKED",
            run_ids, older_than,
        )
        ids = [r["run_id"] for r in rows]
        for table in ("cm_run_log", "cm_effects", "cm_run_invocations", "cm_runs"):
            await conn.execute(f"DELETE FROM {table} WHERE run_id = ANY($1::text[])", ids)
    return ids


class RetentionDeletesPausedAdapter(MutantAdapter):
    """Mutant: retention keyed on age and "not running", not on "finished".

    Defect: the retention pass deletes runs nobody is running once they are old
    enough, which takes a run a drained worker left ``paused`` (or a cancelled one left
    ``interrupted``) with its effects ledger; the resume then submits the run again
    from its input and pays, charges and mails a second time. The harness runs the
    pass in the adapter's ``between_crash_and_resume`` hook, with a zero retention
    period (standing in for a run that waits past the period) and scoped to the case's
    own run (cases share the database). Class: docs/design.md ("Retention never deletes a
    run that is paused or waiting for a human"; catalogue item 12);
    intrafind/ihub-apps#2319 (a ledger retention sweep that deleted paused workflow
    executions on age alone); Altinn/altinn-studio#20005. Caught at the end by
    ``provider.payment.ledger_equal`` and ``model.calls_billed``.
    """

    name = "defect:retention-deletes-paused"
    defect = "retention deletes runs that are paused or interrupted, not only finished ones"
    source = ("docs/design.md, retention (catalogue item 12); intrafind/ihub-apps#2319 (a sweep deleting paused "
              "executions on age alone), Altinn/altinn-studio#20005")
    caught_by = ("provider.payment.ledger_equal", "model.calls_billed")
    fault_kinds = ("term", "cancel")

    async def between_crash_and_resume(self, env: Environment, run_id: str) -> None:
        pool = await self._oracle_pool(env.dsn)
        async with pool.acquire() as conn:
            await delete_idle_runs(conn, older_than=timedelta(0), run_ids=[run_id])
