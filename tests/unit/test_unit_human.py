"""The scripted operator and the checks of what a run did with its answers."""

from __future__ import annotations

from typing import Any

import pytest

from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.human import Answer, OperatorScript, check_answers, check_siblings, record
from crashmatrix.harness.oracle import Evidence

SCRIPT = OperatorScript((Answer("review", 1, {"ok": True}, takes_s=3600), Answer("review", 2, {"to": "Ada"}, 1800)))


def _run(*records: dict[str, Any], ledgers: dict[str, list[dict[str, Any]]] | None = None) -> Evidence:
    transcript = [{"role": "user", "content": "buy"}, *({"role": "human", **r} for r in records)]
    return Evidence(Observation("r", "completed", state={"transcript": transcript}), ledgers or {}, {})


def test_the_script_answers_by_node_and_ordinal_on_the_simulated_clock() -> None:
    first, second = SCRIPT.answers
    assert SCRIPT.find("review", 2) == second and SCRIPT.find("review", 3) is None
    assert SCRIPT.answered_at(first) == "2026-01-01T01:00:00+00:00"
    assert SCRIPT.answered_at(second) == "2026-01-01T01:30:00+00:00"  # the person's time adds up
    assert SCRIPT.delivered(second) == {"to": "Ada", "answered_at": "2026-01-01T01:30:00+00:00"}
    assert OperatorScript((Answer("n", 1, "yes"),)).delivered(Answer("n", 1, "yes")) == "yes"
    with pytest.raises(ValueError, match="n#1 more than once"):
        OperatorScript((Answer("n", 1, "a"), Answer("n", 1, "b")))


def test_answers_consumed_once_by_the_right_interrupt() -> None:
    first, second = (SCRIPT.delivered(a) for a in SCRIPT.answers)
    golden = _run(record("review", 1, first), record("review", 2, second))
    assert check_answers(SCRIPT, golden, None).valid
    stale = check_answers(SCRIPT, _run(record("review", 1, first), record("review", 2, first)), golden)
    assert stale.valid is False and "review#2 was answered with the answer scripted for review#1" in stale.details
    twice = check_answers(SCRIPT, _run(record("review", 1, first), record("review", 1, first),
                                       record("review", 2, second)), golden)
    assert twice.valid is False and "review#1 consumed 2 times" in twice.details
    missing = check_answers(SCRIPT, _run(record("review", 1, first)), golden)
    assert missing.valid is False and "review#2 answered in the golden run, never here" in missing.details
    # a record inside a tool result's JSON content counts too
    inside = Evidence(Observation("r", "completed", state={"transcript": [
        {"role": "tool", "content": '{"interrupt": "review#1", "answer": {"ok": false}}'}]}), {}, {})
    assert check_answers(SCRIPT, inside, None).valid is False


def _mail(attempts: int = 1, body: str = "reserve") -> dict[str, Any]:
    return {"op": "message", "request": {"to": "w", "body": body}, "attempts": attempts}


def test_a_request_sent_again_without_a_fault_is_a_sibling_run_again() -> None:
    assert check_siblings(_run(ledgers={"mail": [_mail(), _mail(body="other")]}), 0).valid
    rerun = check_siblings(_run(ledgers={"mail": [_mail(attempts=2)]}), 0)  # stable key: one row, 2 attempts
    assert rerun.valid is False and "sent 2 times (at most 1)" in rerun.details
    naive = check_siblings(_run(ledgers={"mail": [_mail(), _mail()]}), 0)  # fresh keys: two rows
    assert naive.valid is False
    assert check_siblings(_run(ledgers={"mail": [_mail(attempts=2)]}), faults=1).valid  # the fault's retry
    assert check_siblings(_run(ledgers={"mail": [_mail(attempts=3)]}), faults=1).valid is False
