"""Mutants of the reference runtime's executor (see the package docstring)."""

from __future__ import annotations

import uuid
from typing import Any

from crashmatrix.harness.crashpoint import EFFECT_UNKNOWN_BEFORE, crashpoint
from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime.effects import idempotency_key
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.leases import Lease

from ._base import MutantAdapter


class UnkeyedRetryExecution(Execution):
    """Defect: the tool call's idempotency key changes with every attempt (it mixes in
    a fresh nonce), so a resume re-runs an interrupted call as a new effect.

    Class: seed 000's "retry without a stable key" (docs/design.md, effects ledger; mutant
    14 of the catalogue issue). Caught at the end by ``provider.payment.ledger_equal``
    (the charge applied twice), ``provider.mail.ledger_equal`` (the receipt sent twice)
    and ``effects.ledger_equal`` for any fault between the provider's answer and the
    commit of the node's record.
    """

    def effect_key(self, call: dict[str, Any]) -> str:
        return idempotency_key(self.graph.run_id, f"{call['id']}:{uuid.uuid4().hex}")


class UnshieldedUnknownExecution(Execution):
    """Defect: the ``unknown`` row is written without a shield, so the cancellation it
    records cancels the write itself and the effect stays ``started``.

    Class: seed 000's cancellation wall (docs/design.md, "Fault kinds, precisely": an
    unshielded recovery write is lost). Caught at the crash state by
    ``cancel.left_unknown`` for cancels during a tool request.
    """

    async def mark_unknown(self, key: str) -> None:
        crashpoint(EFFECT_UNKNOWN_BEFORE)
        await self.rt.ledger.mark_unknown(self.lease, key)
        crashpoint("effect.unknown.after")


class DrainKeepsLaunchingExecution(Execution):
    """Defect: the SIGTERM handler is installed but the scheduler ignores it and keeps
    launching nodes during the drain (a deploy then kills work it should have left).

    Class: seed 000's drain wall. Caught at the crash state by ``term.drained`` (a node
    launched after the signal was recorded; the run is not left ``paused``).
    """

    def may_launch(self) -> bool:
        return self.stop is None and self.error is None


class UnfencedLeaseRuntime(Runtime):
    """Defect: taking a run over records the new owner but keeps the epoch, so a lease
    is a name, not a fencing token: a paused worker that wakes up after another took its
    run over still writes (its status, its effect rows) as if it owned the run.

    Class: the zombie worker of a GC pause or SIGSTOP (docs/design.md, "Run ownership";
    mutant 11 of the catalogue issue). Caught by ``pause.zombie_fenced`` (the durable
    state changes after the zombie wakes) for pause faults.
    """

    async def acquire_lease(self, run_id: str) -> Lease:
        row = await self.db.fetchrow(
            "UPDATE cm_runs SET lease_owner = $2, status = 'running', updated_at = now() "
            "WHERE run_id = $1 RETURNING lease_epoch",
            run_id,
            self.worker_id,
        )
        if row is None:
            raise LookupError(f"run_id={run_id!r} does not exist")
        epoch = row["lease_epoch"] or 1
        if not row["lease_epoch"]:
            await self.db.execute("UPDATE cm_runs SET lease_epoch = 1 WHERE run_id = $1", run_id)
        return Lease(run_id, self.worker_id, epoch)


_MutantAdapter = MutantAdapter  # the name mutants elsewhere in the catalogue may import


class UnfencedLeaseAdapter(MutantAdapter):
    """Mutant: leases without a fencing epoch (UnfencedLeaseRuntime)."""

    name = "defect:unfenced-lease"
    runtime_class = UnfencedLeaseRuntime
    defect = "taking a run over keeps the lease epoch: a woken zombie still writes"
    source = "docs/design.md, run ownership: the zombie worker of a GC pause or SIGSTOP (catalogue item 11)"
    caught_by = ("pause.zombie_fenced",)
    fault_kinds = ("pause",)


class UnkeyedRetryAdapter(MutantAdapter):
    """Mutant: idempotency key changes per attempt (UnkeyedRetryExecution)."""

    name = "defect:unkeyed-retry"
    execution = UnkeyedRetryExecution
    defect = "the idempotency key changes per attempt, so a resumed call is a new effect"
    source = "seed 000: a retry without a stable key (docs/design.md, effects ledger; catalogue item 14)"
    caught_by = ("provider.payment.ledger_equal", "provider.mail.ledger_equal", "effects.ledger_equal")
    fault_kinds = ("kill",)


class UnshieldedUnknownAdapter(MutantAdapter):
    """Mutant: cancellation's unknown write not shielded (UnshieldedUnknownExecution)."""

    name = "defect:unshielded-unknown"
    execution = UnshieldedUnknownExecution
    defect = "the unknown row is written unshielded, so the cancellation cancels it"
    source = "seed 000: the cancellation wall (docs/design.md, fault kinds: an unshielded recovery write is lost; catalogue item 5)"
    caught_by = ("cancel.left_unknown",)
    fault_kinds = ("cancel",)


class DrainKeepsLaunchingAdapter(MutantAdapter):
    """Mutant: keeps launching nodes during a SIGTERM drain (DrainKeepsLaunchingExecution)."""

    name = "defect:drain-keeps-launching"
    execution = DrainKeepsLaunchingExecution
    defect = "the scheduler keeps launching nodes after SIGTERM"
    source = "seed 000: the drain wall (docs/design.md, fault kinds: term; catalogue item 9)"
    caught_by = ("term.drained",)
    fault_kinds = ("term",)
