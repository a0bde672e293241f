"""DBOS's ``fork_workflow`` under the ``restore`` fault kind (harness/faults/restore.py):
a fork from the step after the newest recorded one runs the rest again under its own
workflow id (a fresh attempt, as DBOS documents), and leaves the original as it was."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("dbos")

DBOS = "crashmatrix.harness.adapters.dbos:DBOSSqliteAdapter"
CHECKOUT = "crashmatrix.scenarios.realworld.dbos_checkout:KEYED"


def test_a_fork_charges_again_under_its_own_id_and_leaves_the_original(matrix_cases: Any) -> None:
    [case] = matrix_cases(DBOS, CHECKOUT, ["restore@log.append.after[tool-2]#1"]).cases
    assert case.result.outcome == "pass", case.why()
    restored = case.result.workers[0]["restored"]
    assert restored["fork"] is True and restored["run"] == f"{case.result.run_id}~fork-3"
    verdicts = {v.check: v for v in case.result.verdicts}
    assert "fresh attempt: 2 effect(s) applied anew" in verdicts["restore.effect_reapplied"].details
    assert verdicts["restore.fork_original"].valid is True
    assert case.extra("payment") == 0  # the original's own ledger: one charge, the fork's is under its id
