"""The certifier's pure logic: truths, the comparison of an answer with the ledger,
verdicts and exit codes, and documentation of every public name and window."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import crashmatrix.harness.certify as certify
from crashmatrix.harness.certify import Answer, Certificate, Check, Truth, WindowResult, window_names
from crashmatrix.harness.certify._bench import compare
from crashmatrix.reference_runtime.agent import ToolOutcome

ROOT = Path(__file__).resolve().parents[2]
OUTCOME = ToolOutcome("succeeded", {"charge_id": "ch_1", "amount": 5})
APPLIED = Truth(True, OUTCOME, rows=1, attempts=1)
NOT_APPLIED = Truth(False)


def test_truth_refuses_inconsistent_combinations() -> None:
    for bad in (dict(applied=True), dict(applied=True, outcome=OUTCOME, rows=0),
                dict(applied=False, outcome=OUTCOME), dict(applied=False, rows=1)):
        with pytest.raises(ValueError, match="Truth"):
            Truth(**bad)  # type: ignore[arg-type]
    assert APPLIED.to_json() == {"answer": "applied", "outcome": {"status": "succeeded", "result": OUTCOME.result},
                                 "rows": 1, "attempts": 1}


@pytest.mark.parametrize(
    ("answer", "truth", "allow", "ok", "starts"),
    [
        (Answer("applied", {"status": "succeeded", "result": OUTCOME.result}), APPLIED, False, True, "applied"),
        (Answer("not_applied"), NOT_APPLIED, False, True, "not_applied"),
        (Answer("not_applied"), APPLIED, False, False, "lie: the probe says not_applied"),
        (Answer("applied", {"status": "succeeded", "result": {}}), NOT_APPLIED, False, False,
         "lie: the probe says applied"),
        (Answer("applied", {"status": "succeeded", "result": {"charge_id": "ch_2", "amount": 5}}), APPLIED, False,
         False, "lie: the probe's result"),
        (Answer("applied", {"status": "failed", "result": OUTCOME.result}), APPLIED, False, False, "lie:"),
        (Answer("cannot_tell"), APPLIED, False, False, "undecided"),
        (Answer("cannot_tell"), APPLIED, True, True, "cannot tell"),
        (Answer("raised", error="KeyError: 'x'"), APPLIED, True, False, "probe raised: KeyError"),
        (Answer("late", error="no answer within 5 ms"), NOT_APPLIED, True, False, "probe late"),
    ],
)
def test_compare_tells_lies_from_answers(answer: Answer, truth: Truth, allow: bool, ok: bool, starts: str) -> None:
    got_ok, detail = compare(answer, truth, allow_cannot_tell=allow)
    assert (got_ok, detail[: len(starts)]) == (ok, starts)


def test_verdicts_merge_and_map_to_exit_codes() -> None:
    passing = WindowResult("a", "", checks=[Check("reached", True), Check("agrees", True)])
    lying = WindowResult("b", "", checks=[Check("reached", True), Check("agrees", False, "lie")])
    unreached = WindowResult("c", "", checks=[Check("reached", False), Check("agrees", False)])
    broken = WindowResult("d", "", error="boom")
    assert [w.verdict for w in (passing, lying, unreached, broken)] == ["pass", "fail", "error", "error"]

    def cert(*windows: WindowResult) -> Certificate:
        return Certificate("t", "p", "x", "s", None, {}, list(windows))

    assert (cert(passing).verdict, cert(passing).exit_code) == ("certified", 0)
    assert (cert(passing, lying, unreached).verdict, cert(passing, lying).exit_code) == ("refused", 1)
    assert (cert(passing, broken).verdict, cert(passing, broken).exit_code) == ("error", 3)
    assert cert().verdict == "error"  # nothing judged is never a pass
    assert cert(passing, lying).failing() == ["b"]
    assert cert(passing, lying).to_json()["failing_windows"] == ["b"]


def test_every_public_name_and_window_is_documented() -> None:
    missing = [n for n in certify.__all__ if (inspect.isclass(getattr(certify, n)) or inspect.isfunction(
        getattr(certify, n))) and not (getattr(certify, n).__doc__ or "").strip()]
    assert not missing
    table = certify.windows.__doc__ or ""
    doc = (ROOT / "docs" / "probes.md").read_text()
    for name in window_names():
        assert f"| {name} |" in table, f"window {name} missing from the windows module's table"
        assert f"`{name}`" in doc, f"window {name} missing from docs/probes.md"
