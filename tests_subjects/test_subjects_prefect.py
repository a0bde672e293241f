"""Prefect 3 as a subject (harness/adapters/prefect.py): what the matrix found, pinned
for the installed version (measured on prefect 3.9.1, its API server on SQLite).

Run by ``.ci/subjects-heavy`` (the extra is not in ``test``). A failure whose message
says "now" means Prefect changed: re-run the matrices of docs/findings.md's "Prefect".
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("prefect", reason="Prefect adapter tests need the extra: pip install 'crashmatrix[prefect]'")

ADAPTER = "crashmatrix.harness.adapters.prefect:PrefectAdapter"
WL = "crashmatrix.scenarios.realworld.prefect_checkout"
KEYED_CASES = ["kill@step.after[tool-4.0]#1", "kill@log.append.after[tool-4.0]#1", "term@step.before[model-2]#1",
               "cancel@tool.request.after[tool-4.0]#1"]


@pytest.fixture(scope="module")
def keyed(module_cases: Any) -> Any:
    """The keyed cases, one session (the Prefect server starts once)."""
    return module_cases(ADAPTER, f"{WL}:KEYED", KEYED_CASES, goldens=2)


def test_app_is_importable_without_starting_anything(imports_start_nothing: Any) -> None:
    """No thread, connection or event loop at import (docs/adapters.md, lesson 2)."""
    imports_start_nothing("crashmatrix.harness.adapters.prefect", WL)


def test_rerunning_the_flow_skips_persisted_tasks_and_naive_charges_twice(keyed: Any, matrix_cases: Any) -> None:
    """A killed flow run is not resumed; running the flow again is the recovery, and the
    tasks whose results were persisted under their cache keys return them. A kill
    between a charge and its result's write re-runs the task: the keyed tool repeats
    its key, the naive one charges again."""
    traces = keyed.golden_traces["conv1"]
    assert traces[0] == traces[1], "the golden trace is not reproducible"
    for case in keyed.cases[:2]:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
        assert case.extra("payment") == 0
    assert keyed.cases[1].extra("model") == 0, "the persisted task ran again"
    naive = matrix_cases(ADAPTER, f"{WL}:NAIVE", ["kill@step.after[tool-4.0]#1"])
    case = naive.cases[0]
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"}, case.why()
    assert case.extra("payment") == 1


def test_sigterm_ends_the_worker_without_a_drain(keyed: Any) -> None:
    """Prefect's flow engine turns SIGTERM into an exception in the flow
    (``TerminationSignal``) and the process dies of the signal: no drain; the next run
    of the flow recovers as after a kill."""
    case = keyed.cases[2]
    assert case.failed == {"term.drained"}, case.why()
    assert case.workers[0]["signal"] == 15, "now the worker survives SIGTERM?"
    assert case.evidence.observation.status == "completed"


def test_a_cancel_reaches_the_running_task(keyed: Any) -> None:
    """The flow is a coroutine of the worker's loop: a cancel after the charge ends the
    worker before the task's result is written, and the next run re-runs the task with
    the same key (keyed: one charge)."""
    case = keyed.cases[3]
    assert case.result.outcome == "pass", case.why()
    assert [w["role"] for w in case.workers] == ["start", "resume"]
