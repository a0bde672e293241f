"""The oracle is not vacuous: known-defective runtime variants (mutants), each found
through the registry, are caught, naming the check and the crash point; and a plan
whose point is never reached is a harness error, never a pass."""

from __future__ import annotations

import asyncio

import pytest

from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan
from crashmatrix.harness.session import open_session


def _failures(subject: str, kind: str) -> dict[str, set[str]]:
    report = asyncio.run(run_matrix("checkout", subject, kinds=(kind,), conversations=("conv1",), replay_failures=0))
    assert report.counts["harness-error"] == 0, [r.error for r in report.results if r.error][:3]
    out: dict[str, set[str]] = {}
    for r in report.results:
        if r.outcome == "fail":
            out[r.case.id] = {v.check for v in r.failed}
    return out


def test_unkeyed_retry_is_caught_as_a_double_charge() -> None:
    failures = _failures("defect:unkeyed-retry", "kill")
    # killed after the payment provider answered, before the node's record committed
    case = "checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1"
    assert case in failures, sorted(failures)[:10]
    assert "provider.payment.ledger_equal" in failures[case]
    assert "effects.ledger_equal" in failures[case]
    # the receipt too: the mail provider's ledger shows a second message
    assert "provider.mail.ledger_equal" in failures["checkout/conv1/kill@log.append.before[turn-5.tool-0]#1"]
    # and nothing is reported where the key could not matter (before the request left)
    assert "checkout/conv1/kill@effect.started.before[turn-4.tool-0]#1" not in failures


def test_unshielded_unknown_write_is_caught_at_the_crash_state() -> None:
    failures = _failures("defect:unshielded-unknown", "cancel")
    case = "checkout/conv1/cancel@tool.request.before[turn-4.tool-0]#1"
    assert case in failures, sorted(failures)[:10]
    assert "cancel.left_unknown" in failures[case]
    assert all("cancel.left_unknown" in checks for checks in failures.values())


def test_drain_that_keeps_launching_is_caught() -> None:
    failures = _failures("defect:drain-keeps-launching", "term")
    case = "checkout/conv1/term@step.after[turn-2]#1"
    assert case in failures, sorted(failures)[:10]
    assert "term.drained" in failures[case]


def test_reference_runtime_passes_the_cases_the_mutants_fail() -> None:
    cases = [Case.parse(c) for c in (
        "checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1",
        "checkout/conv1/cancel@tool.request.before[turn-4.tool-0]#1",
        "checkout/conv1/term@step.after[turn-2]#1",
    )]
    report = asyncio.run(run_matrix("checkout", "reference", cases=cases))
    assert [r.outcome for r in report.results] == ["pass"] * 3, [
        (r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results]


def test_a_fault_whose_point_is_never_reached_is_a_harness_error() -> None:
    async def go() -> None:
        async with open_session() as explorer:
            golden = await explorer.golden("conv1")
            never = Case("checkout", "conv1", FaultPlan((Fault("kill", CrashPoint("label", "tool.request.before", "turn-99.tool-0")),)))
            result = await explorer.run_case(never, golden)
            assert result.outcome == "harness-error"
            assert "never fired" in (result.error or "")
            too_many = Case("checkout", "conv1", FaultPlan((Fault("kill", CrashPoint("label", "log.append.after", "turn-2", 2)),)))
            result = await explorer.run_case(too_many, golden)
            assert result.outcome == "harness-error"

    asyncio.run(go())


@pytest.mark.parametrize("name", ["defect:unkeyed-retry", "defect:unshielded-unknown", "defect:drain-keeps-launching"])
def test_mutants_are_registered_with_docstrings(name: str) -> None:
    from crashmatrix.harness import registry

    adapter = registry.subject(name)
    assert adapter.name == name
    assert "Caught" in (adapter.execution.__doc__ or ""), "a mutant's docstring names the check that catches it"
