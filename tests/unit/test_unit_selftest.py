"""crashmatrix.harness.selftest, pure logic: the catalogue's metadata, the --fast case
order, and the verdict (exit code) of a selftest from hand-built outcomes."""

from __future__ import annotations

import inspect
import sys

import pytest

from crashmatrix.harness import oracle, registry
from crashmatrix.harness.adapter import EffectEntry, Observation
from crashmatrix.harness.errors import InvalidArgument, RegistryError
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.golden import GoldenRun
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan
from crashmatrix.harness.selftest import (
    MutantSpec, SelftestReport, SubjectOutcome, _departures, _spread, catalogue, fast_order, mutant_spec,
)

# -- the catalogue ---------------------------------------------------------------------


def test_every_mutant_has_valid_metadata_and_a_docstring_naming_its_checks_and_source() -> None:
    specs = catalogue()
    assert len(specs) >= 14
    for spec in specs:
        adapter = registry.subject(spec.subject)
        module = sys.modules[type(adapter).__module__]
        docs = " ".join(inspect.getdoc(obj) or "" for obj in vars(module).values()
                        if inspect.isclass(obj) and obj.__module__ == module.__name__)
        for check in spec.caught_by:
            assert f"``{check}``" in docs, f"{spec.subject}: no docstring in {module.__name__} names {check}"
        assert "Class:" in docs and spec.defect and spec.source, spec.subject
        from crashmatrix.harness.builds import split

        # a clean subject, or for a mutant of a deploy a clean build pair
        assert all(b in registry.subject_names() for b in (split(spec.baseline) or (spec.baseline,))), spec.baseline
        assert (spec.crash_with is None) == (split(spec.baseline) is None), spec.subject


def test_mutant_spec_accepts_both_names_and_refuses_unknown_ones() -> None:
    assert mutant_spec("unkeyed-retry") == mutant_spec("defect:unkeyed-retry")
    assert mutant_spec("unkeyed-retry").name == "unkeyed-retry"
    with pytest.raises(RegistryError, match="mutant='nope' is not in the catalogue; known: .*unkeyed-retry"):
        mutant_spec("nope")


def test_missing_metadata_is_listed_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from crashmatrix.scenarios import defects

    monkeypatch.setitem(defects.MUTANTS, "bare", "crashmatrix.harness.adapters.reference:ReferenceAdapter")
    with pytest.raises(InvalidArgument) as info:
        mutant_spec("bare")
    message = str(info.value)
    for attr in ("defect", "source", "caught_by", "fault_kinds"):
        assert f"{attr} must be" in message
    assert message.startswith("mutant defect:bare (ReferenceAdapter): ")


# -- the --fast order ------------------------------------------------------------------


def test_spread_visits_the_whole_run_early() -> None:
    assert _spread(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert sorted(_spread(11)) == list(range(11)) and _spread(11)[:3] == [0, 8, 4]
    assert _spread(1) == [0] and _spread(0) == []


def test_departures_start_at_the_first_difference_per_task() -> None:
    clean = [("label", "a", "t1", 1), ("label", "b", "t1", 1), ("label", "a", "t2", 1)]
    mutant = [("label", "a", "t1", 1), ("label", "x", "t1", 1), ("label", "b", "t1", 1), ("label", "a", "t2", 1),
              ("label", "a", "t3", 1)]
    assert _departures(mutant, clean) == {("x", "t1", 1), ("b", "t1", 1), ("a", "t3", 1)}
    assert _departures(mutant, None) == set()


def _golden(trace: list[tuple[str, str, str, int]], effect_nodes: tuple[str, ...] = ()) -> GoldenRun:
    effects = [EffectEntry(f"k{i}", n, "charge", "succeeded", None, 1) for i, n in enumerate(effect_nodes)]
    return GoldenRun("conv1", "r", trace, oracle.Evidence(Observation("r", "completed", effects=effects), {}, {}), 0.1)


SPEC = MutantSpec("defect:x", "d", "s", ("c",), ("cancel",), ("step", "label"), ("conv1",), "checkout", "reference")


def test_fast_order_puts_kinds_departures_and_effect_tasks_first() -> None:
    trace = [("step", "step.before", "turn-1", 1), ("label", "log.append.after", "turn-1", 1),
             ("label", "tool.request.after", "turn-1.tool-0", 1), ("label", "mine.after", "turn-2", 1),
             ("step", "step.after", "turn-2", 1)]
    clean = [e for e in trace if e[1] != "mine.after"]
    cases = [Case("checkout", "conv1", FaultPlan((Fault(k, CrashPoint(s, n, t, o)),)))
             for s, n, t, o in trace for k in ("kill", "cancel")]
    order = fast_order(cases, SPEC, {"conv1": _golden(trace, ("turn-1.tool-0",))}, {"conv1": _golden(clean)})
    ids = [c.id for c in order]
    assert sorted(ids) == sorted(c.id for c in cases)
    kinds = [c.plan.faults[0].kind for c in order]
    assert kinds == ["cancel"] * 5 + ["kill"] * 5  # the mutant's kind first
    # where the mutant departs from its baseline (mine.after, then the rest of turn-2), then effect tasks
    assert ids[:3] == ["checkout/conv1/cancel@mine.after[turn-2]#1", "checkout/conv1/cancel@step.after[turn-2]#1",
                       "checkout/conv1/cancel@tool.request.after[turn-1.tool-0]#1"]
    assert order == fast_order(cases, SPEC, {"conv1": _golden(trace, ("turn-1.tool-0",))}, {"conv1": _golden(clean)})


# -- the verdict -----------------------------------------------------------------------


def _result(outcome: str, check: str | None = None) -> CaseResult:
    case = Case("checkout", "conv1", FaultPlan((Fault("kill", CrashPoint("label", "log.append.after", "turn-1")),)))
    verdicts = [oracle.Verdict(check, "end", False, "x")] if check else []
    return CaseResult(case, "defect:x", outcome, verdicts)


def _report(mutant: SubjectOutcome, baseline: SubjectOutcome) -> SelftestReport:
    return SelftestReport(True, [mutant], [baseline])


def test_exit_code_zero_when_caught_and_clean() -> None:
    caught = SubjectOutcome("defect:x", SPEC, [_result("fail", "c")], first_catch=_result("fail", "c"), first_catch_seconds=1.0)
    report = _report(caught, SubjectOutcome("reference", None, [_result("pass")]))
    assert report.exit_code == 0 and caught.catching_check == "c"
    assert report.to_dict()["mutants"][0]["check"] == "c"


def test_exit_code_one_when_a_mutant_is_missed_or_the_clean_runtime_fails() -> None:
    missed = SubjectOutcome("defect:x", SPEC, [_result("fail", "other"), _result("pass")])  # failed, not by its check
    clean = SubjectOutcome("reference", None, [_result("pass")])
    assert _report(missed, clean).exit_code == 1 and not missed.ok
    assert missed.to_dict()["failed_checks"] == {"other": 1}
    caught = SubjectOutcome("defect:x", SPEC, first_catch=_result("fail", "c"), first_catch_seconds=1.0)
    dirty = SubjectOutcome("reference", None, [_result("pass"), _result("fail", "run.status")])
    assert _report(caught, dirty).exit_code == 1


def test_exit_code_three_when_a_harness_error_leaves_something_unjudged() -> None:
    caught = SubjectOutcome("defect:x", SPEC, first_catch=_result("fail", "c"), first_catch_seconds=1.0)
    assert _report(caught, SubjectOutcome("reference", None, [_result("harness-error")])).exit_code == 3
    no_golden = SubjectOutcome("defect:x", SPEC, error="golden run of checkout/conv1 did not complete")
    assert _report(no_golden, SubjectOutcome("reference", None, [_result("pass")])).exit_code == 3
