"""LangGraph's time travel under the ``restore`` fault kind (harness/faults/restore.py):
what the runtime does when a thread is taken back to an earlier checkpoint, measured
through the matrix. LangGraph documents a fresh attempt ("nodes after the checkpoint
re-execute, including any LLM calls, API requests, and interrupts"); these tests pin
what that means for a keyed workload and for a person's answers."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph")

LG = "crashmatrix.harness.adapters.langgraph:LangGraphSqliteSyncAdapter"
CHECKOUT = "crashmatrix.scenarios.realworld.langgraph_checkout:KEYED"
H = "crashmatrix.scenarios.realworld.langgraph_human"


def test_time_travel_before_the_charge_charges_again_under_a_renumbered_key(matrix_cases: Any) -> None:
    """Back to the checkpoint before the tools node: the model is asked again and the
    charge goes out again, under a new key (the keyed workload names the superstep,
    which the copy of the checkpoint numbers on by one): a second payment, as the
    promised fresh attempt allows, once each; a point after the effects changes nothing."""
    before, after = matrix_cases(LG, CHECKOUT, ["restore@checkpoint.put.before[checkpoint-s2]#1",
                                                "restore@checkpoint.put.after[checkpoint-s11]#1"]).cases
    verdicts = {v.check: v for v in before.result.verdicts}
    assert verdicts["restore.effect_reapplied"].valid is True
    assert "fresh attempt: 2 effect(s) applied anew" in verdicts["restore.effect_reapplied"].details
    assert verdicts["restore.model_rebilled"].valid is True and verdicts["restore.state_possible"].valid is True
    assert "the key changed between attempts" in dict(before.why())["provider.payment.ledger_equal"], before.why()
    assert before.extra("payment") == 1 and before.extra("mail") == 1
    assert before.result.workers[0]["restored"]["fork"] is False  # the same thread, a new head
    assert after.result.outcome == "pass", after.why()


def test_time_travel_asks_the_person_again_and_a_restore_that_replays_the_answers_is_caught(matrix_cases: Any) -> None:
    """Back to before the review: LangGraph raises both interrupts again and the scripted
    person answers again (``restore.approval_respent`` holds). A restore that writes the
    person's later answers back into the thread instead spends them unasked: the check
    fails on it, at the same case."""
    case_id = "approve/restore@human.answer.before[human-review-1]#1"
    [clean] = matrix_cases(f"{H}:SequentialAdapter", f"{H}:SEQUENTIAL_KEYED", [case_id]).cases
    [mutant] = matrix_cases("crashmatrix.scenarios.defects.restore_langgraph_defects:RestoreReplaysApprovalAdapter",
                            f"{H}:SEQUENTIAL_KEYED", [case_id]).cases
    assert {v.check: v.valid for v in clean.result.verdicts}["restore.approval_respent"] is True
    assert "restore.approval_respent" in mutant.failed, mutant.why()
    assert "consumed 1 time(s) after the restore, asked 0" in dict(mutant.why())["restore.approval_respent"]
