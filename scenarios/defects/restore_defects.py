"""Mutants of the operator's restore (reference_runtime/restore.py): a run moved back to
an earlier record that resumes into a state the world never shared with it.

Caught by the ``restore`` fault kind's checks (:mod:`crashmatrix.harness.faults.restore`).
See the package docstring and :mod:`._base` for the metadata convention.
"""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.adapter import Environment
from crashmatrix.harness.adapters.reference import ReferenceForkAdapter
from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime import restore

from ._base import MutantAdapter

_SOURCE_TIME_TRAVEL = ("LangGraph time travel: invoking a thread from an earlier checkpoint_id runs the nodes after "
                       "it again, and a model asked again returns tool calls with new ids (a new idempotency key, a "
                       "second payment); DBOS fork_workflow, Temporal reset")


class ForgetsRecordedAnswersRuntime(Runtime):
    """The runtime without its replay of the model answers a restore took out of the log:
    the model is asked again."""

    replay_restored = False


class RestoreForgetsLedgerAdapter(MutantAdapter):
    """Defect: the operator's restore deletes the effects ledger's rows of the nodes it
    takes out of the log, as if the effects were undone with the run's state. The
    resumed run replays the model's answers (same tool call ids, same keys), finds no
    row, and sends each effect again: a provider that deduplicates on the key hides the
    double charge, one that does not charges twice. Class: a restored checkpoint resumes
    into a state that never existed together with the world's. Caught by
    ``restore.effect_reapplied`` (a request reached the provider again though the
    runtime promises to replay its record)."""

    name = "defect:restore-forgets-ledger"
    restore_keeps_ledger = False
    defect = "a restore drops the effects ledger's rows after the point: the effects are sent again"
    source = _SOURCE_TIME_TRAVEL
    caught_by = ("restore.effect_reapplied",)
    fault_kinds = ("restore",)
    point_sources = ("label",)


class RestoreRecallsModelAdapter(MutantAdapter):
    """Defect: after a restore the model nodes taken out of the log call the model again
    (:class:`ForgetsRecordedAnswersRuntime`): the new answer's tool calls have new ids,
    so the effects they ask for get new idempotency keys and the provider applies them
    again: the double payment of a restored LangGraph checkpoint. Class: a restored
    checkpoint resumes into a state that never existed together with the world's. Caught by
    ``restore.effect_reapplied`` (and at the end ``provider.payment.ledger_equal``)."""

    name = "defect:restore-recalls-model"
    runtime_class = ForgetsRecordedAnswersRuntime
    defect = "a restored run asks the model again: new tool call ids, new keys, a second charge"
    source = _SOURCE_TIME_TRAVEL
    caught_by = ("restore.effect_reapplied", "provider.payment.ledger_equal")
    fault_kinds = ("restore",)
    point_sources = ("label",)


class RestoreToStartAdapter(MutantAdapter):
    """Defect: the restore ignores the point it is given and moves the run back to its
    start, asking the model again for every node (:class:`ForgetsRecordedAnswersRuntime`):
    answers recorded before the point, which the restore should have kept, are billed
    twice. Class: a model answer billed twice without the runtime saying so. Caught by
    ``restore.model_rebilled``."""

    name = "defect:restore-to-start"
    runtime_class = ForgetsRecordedAnswersRuntime
    defect = "a restore goes back to the run's start, not to its point: answers before the point billed again"
    source = _SOURCE_TIME_TRAVEL
    caught_by = ("restore.model_rebilled",)
    fault_kinds = ("restore",)
    point_sources = ("label",)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        return await super().restore_run(env, run_id, "0")


class RestoreKeepsToolResultsAdapter(MutantAdapter):
    """Defect: the restore takes the model records after the point out of the log but
    leaves the tool records: the restored transcript holds tool results whose calls the
    run has not made yet (never a state the run was in). Class: a restored state that is
    no prefix of a run that could exist. Caught by
    ``restore.state_possible``."""

    name = "defect:restore-keeps-tool-results"
    defect = "a restore keeps the tool results after the point: a transcript that never existed"
    source = _SOURCE_TIME_TRAVEL
    caught_by = ("restore.state_possible",)
    fault_kinds = ("restore",)
    point_sources = ("label",)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        pool: Any = await self._oracle_pool(env.dsn)
        kept = await pool.fetch("SELECT seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned FROM "
                                "cm_run_log WHERE run_id = $1 AND seq > $2 AND kind <> 'model' ORDER BY seq",
                                run_id, int(point))
        await super().restore_run(env, run_id, point)
        async with pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                [(run_id, int(point) + i + 1, *tuple(r)[1:]) for i, r in enumerate(kept)])
        return run_id


class ForkMovesOriginalAdapter(MutantAdapter, ReferenceForkAdapter):
    """Defect: the fork is made by moving the original back to the point and copying it
    from there (a restore plus a copy), so the original loses what it did after the
    point: its status, its transcript and answer are the fork's starting point, while
    the providers kept its effects. Class: a fork that changes the original's outcome.
    Caught by ``restore.fork_original``."""

    name = "defect:fork-moves-original"
    baseline = "reference-fork"
    defect = "a fork moves the original back to the point: the original run's outcome is gone"
    source = ("DBOS fork_workflow and LangGraph forks promise the original's history intact; a fork made as "
              "restore-then-copy breaks it")
    caught_by = ("restore.fork_original",)
    fault_kinds = ("restore",)
    point_sources = ("label",)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        fork_id = await super().restore_run(env, run_id, point)
        await restore.restore(await self._oracle_pool(env.dsn), run_id, int(point), by="crashmatrix")
        return fork_id
