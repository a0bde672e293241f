"""A person in the loop on LangGraph (scenarios/realworld/langgraph_human.py): what the
matrices found, pinned for the installed version (measured on langgraph 1.2.24,
langgraph-prebuilt 1.1.3). A failure whose message says "now" means LangGraph changed:
re-run docs/findings.md's "A person in the loop" matrices and update it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs crashmatrix[langgraph]")

H = "crashmatrix.scenarios.realworld.langgraph_human"


def test_a_crash_between_two_interrupts_then_invoke_none_answers_the_second_with_the_first(matrix_cases: Any) -> None:
    """LangGraph issue 8837 through the matrix: the worker answered the first interrupt
    and was killed while the person considered the second; a resume that recovers the
    thread with ``invoke(None)`` hands the second interrupt the first answer again."""
    [case] = matrix_cases(f"{H}:SequentialNoneAdapter", f"{H}:SEQUENTIAL_KEYED",
                          ["approve/kill@human.wait[human-review-2]#1"]).cases
    assert {v.check: v.valid for v in case.golden.verdicts}["interrupt.answers"] is True
    why = dict(case.why())
    assert why.get("interrupt.answers") == "review#2 was answered with the answer scripted for review#1", (
        f"now: {why}; LangGraph no longer re-delivers a consumed resume value (issue 8837)?")
    assert "provider.mail.ledger_equal" in why  # the receipt went to the wrong address
    assert [w["role"] for w in case.workers] == ["start", "resume"]


def _golden(adapter: str, workload: str, conversation: str) -> Any:
    from crashmatrix.harness.session import open_session

    async def main() -> Any:
        async with open_session(adapter, workload) as explorer:
            return await explorer.golden(conversation)

    return asyncio.run(main())


def test_a_toolnode_given_the_whole_message_reruns_the_completed_sibling_in_a_fault_free_run() -> None:
    """LangGraph PR 3126 / issue 6626: one tool call interrupts, its sibling completes;
    after the answer the node runs again from its top and the sibling is sent again, in
    the golden run itself (so it is no baseline)."""
    golden = _golden(f"{H}:WholeAdapter", f"{H}:WHOLE_KEYED", "parallel")
    assert golden.evidence.observation.status == "completed"
    broken = {v.check: v.details for v in golden.broken}
    assert "interrupt.siblings_kept" in broken and "Reserve dock-1" in broken["interrupt.siblings_kept"], (
        f"now: {broken}; a ToolNode given the whole message no longer re-runs its completed calls?")
    assert [r["attempts"] for r in golden.evidence.ledgers["mail"]] == [2]  # one key, sent twice


def test_one_task_per_call_keeps_the_completed_sibling(matrix_cases: Any) -> None:
    [case] = matrix_cases(f"{H}:SendAdapter", f"{H}:SEND_KEYED", ["parallel/kill@human.wait[human-tools-1]#1"]).cases
    assert case.golden.broken == [] and case.result.outcome == "pass", case.why()
    assert [r["attempts"] for r in case.evidence.ledgers["mail"]] == [1]
