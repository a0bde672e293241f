"""What the catalogue's mutants share: the adapter base class and the metadata convention.

A mutant is the reference adapter with one runtime component swapped for a defective
subclass (:class:`MutantAdapter`); the product code carries no defect flag. Its class
carries the attributes ``crashmatrix selftest`` reads (:data:`METADATA`):

- ``defect``: one line, what it breaks;
- ``source``: where the defect class comes from (a seed note summarised in docs/design.md,
  or a public report of the same class in another runtime);
- ``caught_by``: the oracle checks that catch it (any one of them counts);
- ``fault_kinds``: the fault kinds that reach it, most telling first;
- ``point_sources``: the crash-point sources needed (``step``, ``label``, ``await``);
- ``conversations``: the smallest set of the workload's conversations that reaches it;
- ``workload``: the workload (default ``checkout``);
- ``baseline``: the clean subject it is a variant of (default ``reference``), which
  must pass the cases that catch the mutant; a build pair ``A>>B`` for a mutant of a
  deploy;
- ``resume_policies``: the resume policies its cases run under (default
  ``("default",)``; ``concurrent``, ``recurring``, ``discovery``, ``input-once``:
  crashmatrix.harness.policies);
- ``crash_with``: for a mutant of a deploy (a defective *new* build), the build spec
  the runs crash under before the mutant resumes them (:mod:`crashmatrix.harness.builds`);
  None (the default): an ordinary mutant;
- ``build_path``: the source tree the mutant's own build imports its app from (put on
  its path), or None.
"""

from __future__ import annotations

import json
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.adapters.reference import ReferenceAdapter, blob_store
from crashmatrix.reference_runtime import EffectLedger, Runtime
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.leases import Lease, LeaseLost
from crashmatrix.reference_runtime.logstore import EffectOutcome, RunStore

METADATA = ("defect", "source", "caught_by", "fault_kinds", "point_sources", "conversations", "workload", "baseline",
            "resume_policies", "crash_with", "build_path")
"""The attribute names of the convention (module docstring)."""


class MutantAdapter(ReferenceAdapter):
    """Base of the catalogue's mutants: the reference adapter whose runtime has one
    component replaced. Subclasses set ``runtime_class`` (a :class:`Runtime`
    subclass), ``execution`` (an :class:`Execution` subclass), or override
    :meth:`make_store` / :meth:`make_ledger`; and the metadata attributes (module
    docstring), of which ``defect``, ``source``, ``caught_by`` and ``fault_kinds`` have no
    default."""

    runtime_class: type[Runtime] = Runtime
    execution: type[Execution] = Execution
    point_sources: tuple[str, ...] = ("step", "label")
    conversations: tuple[str, ...] = ("conv1",)
    workload = "checkout"
    baseline = "reference"
    resume_policies: tuple[str, ...] = ("default",)
    crash_with: str | None = None
    build_path: str | None = None
    #: further keyword arguments of the runtime (``{"launch_batches": False}``: one
    #: record a statement, as most runtimes commit)
    runtime_options: dict[str, Any] = {}

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        """The run store of one worker; None: the runtime's default."""
        return None

    def make_ledger(self, db: Db, ctx: RunContext) -> EffectLedger | None:
        """The effects ledger of one worker; None: the runtime's default."""
        return None

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        cls = self.runtime_class
        if self.execution is not Execution:
            cls = with_execution(cls, self.execution)
        return cls(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=blob_store(ctx.env),
                   store=self.make_store(db, ctx), ledger=self.make_ledger(db, ctx), **self.runtime_options)


def with_execution(runtime: type[Runtime], execution: type[Execution]) -> type[Runtime]:
    """A subclass of ``runtime`` whose attempts use ``execution``."""

    class MutantRuntime(runtime):  # type: ignore[valid-type, misc]
        @property
        def execution_class(self) -> type[Execution]:
            return execution

    MutantRuntime.__name__ = MutantRuntime.__qualname__ = f"{execution.__name__}Runtime"
    return MutantRuntime


async def write_effect_outcome(db: Db, lease: Lease, effect: EffectOutcome) -> None:
    """Move an effect to its final status in a statement of its own (fenced by the
    lease epoch): what the reference runtime never does, since there the final status
    commits in the statement that appends the node's record. Raises :class:`LeaseLost`."""
    ok = await db.fetchval(
        """
        WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $5 FOR SHARE)
        , upd AS (
            UPDATE cm_effects SET status = $3, result = $4::jsonb, lease_epoch = $5, updated_at = now()
             WHERE run_id = $1 AND idem_key = $2 AND EXISTS (SELECT 1 FROM fence) RETURNING 1)
        SELECT count(*) FROM fence
        """,
        lease.run_id, effect.idem_key, effect.status, json.dumps(effect.result, sort_keys=True), lease.epoch,
    )
    if not ok:
        raise LeaseLost(f"run {lease.run_id}: effect {effect.idem_key[:12]} refused, lease epoch {lease.epoch} is stale")
