"""crashmatrix.harness.coverage: recovery branches counted per matrix, cells whose fault
could not take effect reported as not run."""

from __future__ import annotations

import pytest

from crashmatrix.harness import coverage
from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.adapters.reference import ReferenceAdapter
from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.golden import GoldenRun
from crashmatrix.harness.history import End, TraceEntry
from crashmatrix.harness.oracle import Evidence
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan

TRACE = [TraceEntry("label", "node.launch", "turn-1", 1), TraceEntry("label", "model.call.before", "turn-1", 1),
         TraceEntry("label", "log.append.after", "turn-1", 1)]
GOLDEN = GoldenRun("conv1", "cm-run-g", list(TRACE), Evidence(Observation("cm-run-g", "completed"), {}, {}), 0.1)


def case(kind: str = "cancel") -> Case:
    return Case("checkout", "conv1", FaultPlan((Fault(kind, CrashPoint("label", "log.append.after", "turn-1", 1)),)))


def result(reached: set[str], outcome: str = "pass", took_effect: bool = True) -> CaseResult:
    r = CaseResult(case(), "reference", outcome, workers=[{"role": "start", "took_effect": took_effect}])
    r.reached = reached
    return r


def test_the_reference_runtime_declares_its_recovery_branches() -> None:
    branches = coverage.declared(ReferenceAdapter())
    assert {"probe.answer.applied", "probe.answer.not_applied", "probe.answer.cannot_tell", "effect.unknown.resolved",
            "drain.in_flight", "lease.taken_over"} <= set(branches)


def test_a_malformed_declaration_is_one_clear_error() -> None:
    class Bad:
        recovery_branches = ["probe.answer.applied"]

    with pytest.raises(InvalidArgument, match="Bad.recovery_branches must map labels"):
        coverage.declared(Bad())


def test_branches_are_counted_per_case_and_the_unreached_ones_named() -> None:
    class Subject:
        recovery_branches = {"a.b": "first", "c.d": "second", "e.f": "third"}

    cov = coverage.coverage_of(Subject(), [result({"a.b", "x.y"}), result({"a.b", "c.d"}), result(set())])
    assert cov.reached == {"a.b": 2, "c.d": 1} and cov.unreached == ["e.f"] and not cov.complete
    assert cov.lines() == ["coverage: 2/3 recovery branches reached (a.b 2, c.d 1); never reached: e.f (third)"]


def test_a_fault_that_changed_nothing_did_not_take_effect() -> None:
    same = End("completed", list(TRACE))
    assert not coverage.took_effect("cancel", GOLDEN, same, 0, TRACE[:2])
    drained = End("completed", TRACE[:2] + [TraceEntry("label", "drain.begin", "run", 1)] + TRACE[2:])
    assert coverage.took_effect("term", GOLDEN, drained, 0, TRACE[:2])
    assert coverage.took_effect("cancel", GOLDEN, End("interrupted", TRACE[:2]), 0, TRACE[:2])
    assert coverage.took_effect("cancel", GOLDEN, None, None, TRACE[:2])  # killed: it did
    assert coverage.took_effect("net", GOLDEN, same, 0, TRACE[:2])  # a toxic ridden out took effect
    # a pause whose run others took over and ended while it slept, however the zombie ended
    assert not coverage.took_effect("pause", GOLDEN, same, 0, TRACE[:2])
    assert coverage.took_effect("pause", GOLDEN, same, 0, TRACE[:2], taken_over=True)


def test_a_passing_case_whose_fault_did_not_take_effect_is_not_run() -> None:
    r = result(set(), took_effect=False)
    coverage.mark_not_run(r)
    assert r.outcome == coverage.NOT_RUN and "could not take effect" in (r.error or "")
    failing = result(set(), outcome="fail", took_effect=False)
    coverage.mark_not_run(failing)
    assert failing.outcome == "fail"  # a failure stays a failure
    cov = coverage.coverage_of(ReferenceAdapter(), [r])
    assert cov.not_run == [r.case.id] and not cov.complete
