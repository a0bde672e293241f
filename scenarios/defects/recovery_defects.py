"""Mutants of what happens around recovery: a zombie that still reaches a provider, a
crash loop nobody stops, a sweep that misses dead workers' runs, two resumers that both
apply a call, a run acknowledged before it is stored.

See the package docstring and :mod:`._base` for the metadata convention.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.crashpoint import TOOL_REQUEST_AFTER, TOOL_REQUEST_BEFORE, crashpoint
from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime.agent import ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.effects import idempotency_key
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.leases import Lease, LeaseLost

from ._base import MutantAdapter

class _Rekeying:
    """A tool whose request goes out under a fresh idempotency key when, at the request,
    the run's lease is no longer this worker's (everything else is the tool's): the
    worker took the long wait for a timeout. Decided by the stored lease epoch, not a
    clock, so a slow golden run never rekeys."""

    def __init__(self, tool: Any, execution: Execution) -> None:
        self._tool, self._execution = tool, execution

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tool, name)

    async def fn(self, ctx: ToolContext, arguments: dict[str, Any]) -> ToolOutcome:
        epoch = await self._execution.rt.db.fetchval("SELECT lease_epoch FROM cm_runs WHERE run_id = $1", ctx.run_id)
        if epoch != self._execution.lease.epoch:
            ctx = dataclasses.replace(ctx, idem_key=idempotency_key(ctx.run_id, f"{ctx.node_id}:retry:{uuid.uuid4().hex}"))
        result: ToolOutcome = await self._tool.fn(ctx, arguments)
        return result


class StaleCallRekeyExecution(Execution):
    """Defect: a call that waited so long between its ``started`` row and its request
    that the run's lease moved on is taken as timed out and sent under a fresh
    idempotency key (the retry-with-a-new-key mistake providers warn about: a retry must
    reuse its key).

    A worker's own attempt never waits that long, so kills, cancels and SIGTERMs pass:
    a resume resolves the started row with the probe under the row's key. A worker
    paused between its ``started`` row and its request (a GC pause, a frozen VM) wakes
    after another worker took its run over and made the call: its request, under a new
    key, charges again. Its durable writes are still fenced (``pause.zombie_fenced``
    holds); the provider's own ledger shows the second charge. Class: a
    zombie's effect (a duplicate charge reached the provider while the fenced store
    said valid). Caught by ``pause.zombie_effects`` (and at the end by
    ``provider.payment.ledger_equal``).
    """

    async def run_effect(self, tool: Any, ctx: ToolContext, call: dict[str, Any]) -> ToolOutcome:
        return await super().run_effect(_Rekeying(tool, self), ctx, call)


class ZombieChargesAdapter(MutantAdapter):
    """Mutant: a stale call is re-sent under a fresh key (StaleCallRekeyExecution)."""

    name = "defect:zombie-charges"
    execution = StaleCallRekeyExecution
    defect = "a call that waited too long is re-sent under a fresh key, so a woken zombie charges again"
    source = ("a zombie's effect reaches the provider while the fenced store says valid; "
              "providers' idempotency rule: a retry reuses its key")
    caught_by = ("pause.zombie_effects",)
    fault_kinds = ("pause",)
    point_sources = ("label",)


# -- recovery as production does it: resume policies' mutants ------------------


class NoAttemptLimitRuntime(Runtime):
    """Defect: no attempt limit: a run that crashes at the same point in every worker is
    taken over again forever (reference_runtime/attempts.py switched off).

    Class: a crash loop (Celery ``acks_late``: a poison message redelivered
    forever, 228 charges in 60 s). A harness that only caps its resumes would hide
    it; under the ``recurring`` policy the harness stops the case at its own bound and
    says so. Caught by ``recurring.bounded``.
    """

    max_attempts_without_progress = None


class NoAttemptLimitAdapter(MutantAdapter):
    """Mutant: no attempt limit (NoAttemptLimitRuntime)."""

    name = "defect:no-attempt-limit"
    runtime_class = NoAttemptLimitRuntime
    defect = "a run that crashes at the same point in every worker is resumed forever"
    source = "a crash that recurs on every attempt (Celery acks_late: 228 charges in 60 s)"
    caught_by = ("recurring.bounded",)
    fault_kinds = ("kill",)
    resume_policies = ("recurring",)


class LiveOnlySweepRuntime(Runtime):
    """Defect: the sweep takes over only runs that said they stopped (``interrupted``,
    ``paused``, ``pending``), never one left ``running`` by a worker that died without a
    word: its lease expires and nothing reads the expiry.

    Class: Prefect issue 16746 (runs stay ``Running`` forever after their worker dies):
    an abandoned run must be *found*. Cancels and
    SIGTERMs pass (their runs say they stopped); kills are caught by
    ``discovery.found``.
    """

    async def recover(self, queue: str, clock_offset_s: float = 0.0) -> dict[str, str]:
        rows = await self.db.fetch(
            "SELECT run_id FROM cm_runs WHERE queue = $1 AND status IN ('interrupted', 'paused', 'pending') "
            "ORDER BY created_at, run_id", queue)
        return {r["run_id"]: await self.run(r["run_id"]) for r in rows}


class LiveOnlySweepAdapter(MutantAdapter):
    """Mutant: the sweep misses runs left running (LiveOnlySweepRuntime)."""

    name = "defect:no-sweep"
    runtime_class = LiveOnlySweepRuntime
    defect = "the sweep never takes over a run left running by a worker that died: its lease expiry is not read"
    source = "Prefect issue 16746: runs stay Running forever after their worker dies"
    caught_by = ("discovery.found",)
    fault_kinds = ("kill",)
    resume_policies = ("discovery",)


async def rekey(db: Db, lease: Lease, old: str, new: str) -> None:
    """Give the effect row ``old`` the key ``new`` (fenced by ``lease``); raises
    :class:`LeaseLost`."""
    ok = await db.fetchval(
        """
        WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $4 FOR SHARE)
        , upd AS (
            UPDATE cm_effects SET idem_key = $3, lease_epoch = $4, updated_at = now()
             WHERE run_id = $1 AND idem_key = $2 AND EXISTS (SELECT 1 FROM fence) RETURNING 1)
        SELECT count(*) FROM fence
        """,
        lease.run_id, old, new, lease.epoch,
    )
    if not ok:
        raise LeaseLost(f"run {lease.run_id}: effect {old[:12]} refused, lease epoch {lease.epoch} is stale")


class FreshKeyRetryExecution(Execution):
    """Defect: a call its probe says was not applied is retried under a key of this
    attempt's own (the old one is taken as "used up"), and the row takes the new key
    once the provider answered.

    Alone, a resume is right: the old key was never applied, the new one is applied
    once, the row and the provider agree. Two resumers at once both probe the old key
    (not applied: neither has called yet), both retry under keys of their own, and the
    provider applies both; the loser's row update is refused (fenced), too late. Class:
    DBOS issue 742 (a stale pending list re-executes queued work when two recovery
    passes overlap): recovery that double-applies under two resumers.
    Caught by ``concurrent.effects_once``.
    """

    async def run_effect(self, tool: Any, ctx: ToolContext, call: dict[str, Any]) -> ToolOutcome:
        old = ctx.idem_key
        assert old is not None
        row = await self.rt.ledger.get(self.graph.run_id, old)
        if row is None or row.status not in ("started", "unknown") or row.resolution is not None:
            return await super().run_effect(tool, ctx, call)
        resolved = await self.resolve(tool, ctx)
        if resolved is not None:
            return resolved
        ctx.idem_key = idempotency_key(self.graph.run_id, f"{call['id']}:retry:{self.lease.epoch}")
        crashpoint(TOOL_REQUEST_BEFORE)
        outcome: ToolOutcome = await tool.fn(ctx, call["arguments"])
        crashpoint(TOOL_REQUEST_AFTER)
        await rekey(self.rt.db, self.lease, old, ctx.idem_key)
        return outcome


class FreshKeyRetryAdapter(MutantAdapter):
    """Mutant: a not-applied call retried under a fresh key (FreshKeyRetryExecution)."""

    name = "defect:fresh-key-retry"
    execution = FreshKeyRetryExecution
    defect = "a call the probe says was not applied is retried under a new key: two resumers charge twice"
    source = ("DBOS issue 742: overlapping recovery passes re-execute queued work; "
              "recovery that double-applies under two resumers")
    caught_by = ("concurrent.effects_once",)
    fault_kinds = ("kill",)
    point_sources = ("label",)
    resume_policies = ("concurrent",)


class AcksOnReceiptAdapter(MutantAdapter):
    """Mutant: the run is acknowledged when the worker receives it, before it is
    stored (the submit is written later, once the worker has connected).

    A worker that dies in between (while it connects) leaves an accepted run that does
    not exist; a harness that hands every resumer the input recreates it, and the end
    state is right. Class: LangGraph issue 8764 (an accepted run silently dropped):
    a run lost before its first durable write. Caught at the crash state by
    ``run.acknowledged_durable`` (and, under ``input-once``, the run never finishes).
    """

    name = "defect:acks-before-write"
    defect = "the run is acknowledged on receipt, before it is stored: a crash in between loses an accepted run"
    source = "LangGraph issue 8764: an accepted run silently dropped"
    caught_by = ("run.acknowledged_durable",)
    fault_kinds = ("kill",)
    point_sources = ("await",)
    resume_policies = ("input-once",)

    async def start(self, ctx: RunContext) -> str:
        ctx.accepted()  # "202 Accepted", before anything is written
        return await super().start(ctx)
