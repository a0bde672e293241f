"""Apache Burr as a subject (harness/adapters/burr.py): what the matrix found, pinned for
the installed version (measured on apache-burr 0.43.0).

A failure whose message says "now" means Burr changed: re-run the matrices of
docs/findings.md's "Apache Burr" section and update it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("burr", reason="Burr adapter tests need the extra: pip install 'crashmatrix[burr]'")

ADAPTER = "crashmatrix.harness.adapters.burr:BurrAdapter"
WL = "crashmatrix.scenarios.realworld.burr_checkout"


def test_app_is_importable_without_starting_anything() -> None:
    """Workers fork from a parent that imported the adapter and workload: no thread, no
    connection, no event loop at import (docs/adapters.md, lesson 2)."""
    import subprocess
    import sys

    code = ("import threading, crashmatrix.harness.adapters.burr, " + WL + "; "
            "assert threading.active_count() == 1, threading.enumerate(); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_keyed_survives_kills_and_naive_charges_twice(matrix_cases: Any) -> None:
    """SIGKILL between a charge and Burr's save of the tool step: the keyed tool repeats
    its key (one charge), the naive one charges again."""
    keyed = matrix_cases(ADAPTER, f"{WL}:KEYED", ["kill@step.after[tool-4.0]#1", "kill@log.append.before[tool-4.0]#1",
                                                   "kill@log.append.after[model-4]#1"], goldens=2)
    traces = keyed.golden_traces["conv1"]
    assert traces[0] == traces[1], "the golden trace is not reproducible"
    golden = keyed.cases[0].golden.evidence.observation
    assert golden.status == "completed" and [e.node_id for e in golden.log][-1] == "finish"
    for case in keyed.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
    assert keyed.cases[0].extra("payment") == 0

    naive = matrix_cases(ADAPTER, f"{WL}:NAIVE", ["kill@step.after[tool-4.0]#1"])
    case = naive.cases[0]
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"}, case.why()
    assert case.extra("payment") == 1


def test_a_cancelled_step_is_saved_as_completed_and_skipped_on_resume(matrix_cases: Any) -> None:
    """The Burr finding (docs/findings.md): a cancel inside the ``model`` action of turn 4
    (whose reply asks for the charge) is saved by Burr's persister hook as ``model``
    *completed* with the state from before it, so the resume goes on from the stale
    state: the run completes without the charge and the receipt."""
    s = matrix_cases(ADAPTER, f"{WL}:KEYED", ["cancel@model.call.before[model-4]#1"])
    case = s.cases[0]
    assert case.result.outcome == "fail", "now passes: Burr no longer saves a cancelled step as completed?"
    assert {"log.clean_prefix", "log.acknowledged_durable", "transcript.exact",
            "provider.payment.ledger_equal", "provider.mail.ledger_equal"} <= case.failed, case.why()
    assert case.evidence.observation.status == "completed"
    assert case.extra("payment") == -1 and case.extra("mail") == -1
    why = dict(case.why())
    assert "recorded twice" in why["log.clean_prefix"] and "model-4" in why["log.acknowledged_durable"]


def test_burr_itself_saves_a_cancelled_action_as_completed(tmp_path) -> None:
    """The mechanism, on Burr alone (no harness): an action cancelled at an await leaves
    a row ``position=<action>, status=completed`` holding the state from before it."""
    from burr.core import ApplicationBuilder, State, action, default
    from burr.core.persistence import SQLitePersister

    @action(reads=["n"], writes=["n"])
    async def slow(state: State) -> State:
        await asyncio.sleep(10)
        return state.update(n=state["n"] + 1)

    async def main() -> None:
        # check_same_thread off: Burr's __del__ closes the connection again, on whatever
        # thread collects it (another test's thread, here)
        persister = SQLitePersister(str(tmp_path / "burr.sqlite"), connect_kwargs={"check_same_thread": False})
        persister.initialize()
        app = (ApplicationBuilder().with_actions(slow=slow).with_transitions(("slow", "slow", default))
               .with_state(n=0).with_entrypoint("slow").with_state_persister(persister)
               .with_identifiers(app_id="a").build())
        task = asyncio.ensure_future(app.astep())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rows = persister.connection.execute("SELECT position, status, state FROM burr_state").fetchall()
        persister.connection.close()
        assert [(p, s, json.loads(st)["n"]) for p, s, st in rows] == [("slow", "completed", 0)], \
            f"now saves {rows}: Burr changed how it records a cancelled action"

    asyncio.run(main())


def test_input_once_and_discovery_on_the_keyed_app(matrix_cases: Any) -> None:
    """A resume reads the saved rows before the input (``--resume input-once``), and a
    worker given no run id finds the app through Burr's ``list_app_ids`` under the
    case's scope (``--resume discovery``)."""
    s = matrix_cases(ADAPTER, f"{WL}:KEYED", ["kill@step.after[tool-4.0]#1/input-once",
                                              "kill@step.after[tool-4.0]#1/discovery"])
    once, found = s.cases
    for case in s.cases:
        assert case.result.outcome == "pass", case.why()
    assert {v.check: v.valid for v in once.result.verdicts}["run.acknowledged_durable"] is True
    [verdict] = [v for v in found.result.verdicts if v.check == "discovery.found"]
    assert verdict.valid and "recovered 1 app(s)" in verdict.details, verdict.details
