"""CrewAI Flows with ``@persist`` as a subject (harness/adapters/crewai.py): what the
matrix found, pinned for the installed version (measured on crewai 1.15.30).

Run by ``.ci/subjects-heavy`` in a venv of its own (crewai is not in ``test``). A failure
whose message says "now" means CrewAI changed: re-run the matrices of docs/findings.md's
"CrewAI Flows".
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("crewai", reason="CrewAI adapter tests need crewai: pip install 'crashmatrix[crewai]'")

ADAPTER = "crashmatrix.harness.adapters.crewai:CrewAIAdapter"
WL = "crashmatrix.scenarios.realworld.crewai_checkout"


def test_app_is_importable_without_starting_anything(imports_start_nothing: Any) -> None:
    """No thread, connection or event loop at import (docs/adapters.md, lesson 2)."""
    imports_start_nothing("crashmatrix.harness.adapters.crewai", WL)


def test_a_reloaded_flow_continues_from_its_saved_state(matrix_cases: Any) -> None:
    """``kickoff(inputs={"id": ...})`` reloads the last saved state and runs the flow from
    its start method; the router sends it to the next step. A kill after a step's state
    was saved (``log.append.after``) does not run that step again; a kill between a
    charge and the save re-runs it: the keyed key makes it harmless, the naive tool
    charges twice."""
    keyed = matrix_cases(ADAPTER, f"{WL}:KEYED", ["kill@log.append.after[tool-4.0]#1", "kill@step.after[tool-4.0]#1"],
                         goldens=2)
    traces = keyed.golden_traces["conv1"]
    assert traces[0] == traces[1], "the golden trace is not reproducible"
    for case in keyed.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
        assert case.extra("payment") == 0
    assert keyed.cases[0].extra("model") == 0, "now the reloaded flow re-runs a saved step?"
    naive = matrix_cases(ADAPTER, f"{WL}:NAIVE", ["kill@step.after[tool-4.0]#1"])
    case = naive.cases[0]
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"}, case.why()
    assert case.extra("payment") == 1
