"""Absurd as a subject (harness/adapters/absurd.py): what the matrix found, pinned for
the installed version (measured on absurd-sdk 0.5.1, on the embedded PostgreSQL 18).

A failure whose message says "now" means Absurd changed: re-run the matrices of
docs/findings.md's "Absurd" section.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("absurd_sdk", reason="Absurd adapter tests need the extra: pip install 'crashmatrix[absurd]'")

ADAPTER = "crashmatrix.harness.adapters.absurd:AbsurdAdapter"
WL = "crashmatrix.scenarios.realworld.absurd_checkout"


def test_app_is_importable_without_starting_anything(imports_start_nothing: Any) -> None:
    """No thread, connection or event loop at import (docs/adapters.md, lesson 2)."""
    imports_start_nothing("crashmatrix.harness.adapters.absurd", WL)


KEYED_CASES = ["kill@step.after[tool-4.0]#1", "kill@log.append.after[tool-4.0]#1", "pause@tool.request.before[tool-4.0]#1"]
NAIVE_CASES = ["kill@step.after[tool-4.0]#1", "pause@tool.request.before[tool-4.0]#1", "db-restart@step.before[tool-4.0]#1"]


@pytest.fixture(scope="module")
def keyed(module_cases: Any) -> Any:
    """The keyed cases, one session (a resume waits out the dead worker's lease)."""
    return module_cases(ADAPTER, f"{WL}:KEYED", KEYED_CASES, goldens=2)


@pytest.fixture(scope="module")
def naive(module_cases: Any) -> Any:
    return module_cases(ADAPTER, f"{WL}:NAIVE", NAIVE_CASES)


def test_keyed_survives_kills_and_naive_charges_twice(keyed: Any, naive: Any) -> None:
    """SIGKILL between a charge and its checkpoint: once the dead worker's lease expires
    the next claim sweeps its run and the resume worker re-runs the step
    (at-least-once); the keyed tool repeats its key, the naive one charges again. A
    kill after the checkpoint committed (``log.append.after``) replays it."""
    traces = keyed.golden_traces["conv1"]
    assert traces[0] == traces[1], "the golden trace is not reproducible"
    golden = keyed.cases[0].golden.evidence.observation
    assert golden.status == "completed" and [e.node_id for e in golden.log][-1] == "model-6"
    for case in keyed.cases[:2]:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
        assert case.extra("payment") == 0
        # the second attempt of the task is the one that finished it
        assert case.evidence.observation.lease_epoch == 2
    case = naive.cases[0]
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"}, case.why()
    assert case.extra("payment") == 1


def test_a_woken_zombie_is_fenced_but_its_effect_is_made(keyed: Any, naive: Any) -> None:
    """``pause`` before the charge request: the frozen worker's lease expires, the resume
    worker claims the task and finishes it; the woken zombie sends its charge, then its
    checkpoint write is refused (its run was failed by the sweep: ``AB002``). Durable
    state unchanged (``pause.zombie_fenced`` holds); the keyed charge is deduplicated by
    the provider, the naive one is made twice."""
    assert keyed.cases[2].result.outcome == "pass", keyed.cases[2].why()
    case = naive.cases[1]
    # the zombie's own charge, made after its lease was taken, is what pause.zombie_effects names
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once", "pause.zombie_effects"}, case.why()
    verdicts = {v.check: v for v in case.result.verdicts}
    assert verdicts["pause.zombie_fenced"].valid is True, "now the zombie's writes land?"
    assert case.extra("payment") == 1


def test_a_worker_that_lost_its_database_runs_its_step_effect(naive: Any) -> None:
    """``db-restart`` at the charge step's start: PostgreSQL crashes and comes back; the
    worker goes on with the step (the charge needs no database), its checkpoint write
    fails on the dead connection, and the next attempt charges again (naive)."""
    case = naive.cases[2]
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"}, case.why()
    assert case.extra("payment") == 1


def test_cancel_api_cancels_through_cancel_task_and_the_cancel_is_final(matrix_cases: Any) -> None:
    """``cancel-api``: the adapter cancels with Absurd's ``cancel_task`` while the worker
    is stopped after the charge; the woken worker stops (its next checkpoint write is
    refused: ``CancelledTask``, caught by Absurd's worker), the step in flight is left
    unrecorded (``cancel.step_recorded`` passes). Absurd's cancel is final
    (``cancel_is_final``: ``retry_task`` refuses a task that is not failed), so the case
    ends at its crash state, the task ``cancelled`` (status ``failed``), judged by the
    cancel's checks and the invariants of any run, never compared with the golden run."""
    s = matrix_cases(ADAPTER, f"{WL}:KEYED", ["cancel-api@step.after[tool-4.0]#1"])
    [case] = s.cases
    assert case.result.outcome == "pass", case.why()
    checks = {v.check: v for v in case.result.verdicts}
    assert "payment charge" in checks["cancel.step_recorded"].details
    assert checks["cancel.final"].valid and "'failed'" in checks["cancel.final"].details
    assert checks["cancel.clean_stop"].valid and checks["cancel.honoured"].valid
    # the end checks are the invariants of any run, no comparison with the golden run
    assert "run.status" not in checks and "state.equal" not in checks
    assert checks["effects.applied_once"].valid
    assert [w["role"] for w in case.result.workers] == ["start"]


def test_input_once_the_task_row_holds_the_params(matrix_cases: Any) -> None:
    """The run is acknowledged once the task is spawned; a resume finds the task in its
    queue and needs no input (``--resume input-once``)."""
    s = matrix_cases(ADAPTER, f"{WL}:KEYED", ["kill@step.after[tool-4.0]#1/input-once"])
    [case] = s.cases
    assert case.result.outcome == "pass", case.why()
    assert {v.check: v.valid for v in case.result.verdicts}["run.acknowledged_durable"] is True
