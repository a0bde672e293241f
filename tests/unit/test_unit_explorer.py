"""crashmatrix.harness.explorer: pure parts (trace divergence, enumeration, validation)."""

from __future__ import annotations

import os

import pytest

from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.enumeration import enumerate_cases, validate_case
from crashmatrix.harness.errors import PlanError
from crashmatrix.harness.case import replay_command
from crashmatrix.harness.golden import GoldenRun, trace_divergence
from crashmatrix.harness.oracle import Evidence
from crashmatrix.harness.plan import DEFAULT_KINDS, Case, CrashPoint, Fault, FaultPlan

TRACE = [
    ("label", "node.launch", "turn-1", 1),
    ("step", "step.before", "turn-1", 1),
    ("label", "model.call.before", "turn-1", 1),
    ("label", "log.append.before", "turn-1", 1),
    ("label", "log.append.after", "turn-1", 1),
    ("step", "step.after", "turn-1", 1),
    ("label", "node.launch", "turn-1.tool-0", 1),
    ("label", "node.launch", "turn-1.tool-1", 1),
    ("await", "pkg.mod:f@1", "turn-1.tool-0", 1),
    ("label", "tool.request.before", "turn-1.tool-1", 1),
    ("label", "tool.request.before", "turn-1.tool-0", 1),
    ("await", "pkg.mod:f@1", "turn-1.tool-0", 2),
    ("label", "log.append.before", "turn-1.tool-1", 1),
    ("label", "log.append.before", "turn-1.tool-0", 1),
]


def golden(conv: str, trace: list | None = None) -> GoldenRun:
    ev = Evidence(Observation("cm-run-x", "completed"), {}, {})
    return GoldenRun(conv, f"cm-run-{conv}", list(TRACE if trace is None else trace), ev, 0.1)


# -- trace_divergence --------------------------------------------------------------------


def test_prefix_is_no_divergence() -> None:
    for n in (0, 1, 5, len(TRACE)):
        assert trace_divergence(TRACE, TRACE[:n]) is None


def test_interleaving_between_tasks_tolerated() -> None:
    # tool-1 and tool-0 swapped relative order, each task's own order intact
    faulted = TRACE[:6] + [
        ("label", "node.launch", "turn-1.tool-1", 1),
        ("label", "tool.request.before", "turn-1.tool-1", 1),
        ("label", "node.launch", "turn-1.tool-0", 1),
        ("await", "pkg.mod:f@1", "turn-1.tool-0", 1),
        ("label", "log.append.before", "turn-1.tool-1", 1),
    ]
    assert trace_divergence(TRACE, faulted) is None


def test_a_label_fired_on_a_thread_may_pass_an_await_of_its_task_but_each_streams_order_holds() -> None:
    """DBOS records a step's output on a thread and fires its commit label there while the
    workflow's coroutine awaits it: the label and the await of one task race."""
    from crashmatrix.harness.golden import trace_difference

    one = [("label", "step.after", "tool-2", 1), ("await", "dbos._outcome:Pending._wrap@4", "tool-2", 1),
           ("label", "log.append.after", "tool-2", 1), ("await", "dbos._outcome:Pending._wrap@5", "tool-2", 1)]
    other = [one[0], one[2], one[1], one[3]]
    assert trace_difference(one, other) is None and trace_divergence(one, other[:2]) is None
    swapped_awaits = [one[0], one[3], one[2], one[1]]
    msg = trace_difference(one, swapped_awaits)
    assert msg is not None and "task tool-2 (awaits): point 1 is dbos._outcome:Pending._wrap@4#1" in msg
    swapped_labels = [one[2], one[1], one[0], one[3]]
    msg = trace_difference(one, swapped_labels)
    assert msg is not None and msg.startswith("task tool-2: point 1 is step.after#1")


def test_real_divergence_reported_with_task_and_position() -> None:
    faulted = TRACE[:2] + [("label", "tool.request.before", "turn-1", 1)]
    msg = trace_divergence(TRACE, faulted)
    assert msg is not None
    assert "task turn-1" in msg
    assert "point 3 is tool.request.before#1" in msg
    assert "golden has model.call.before#1" in msg


def test_divergence_in_order_within_a_task() -> None:
    faulted = [TRACE[0], TRACE[2]]  # skipped step.before of turn-1
    msg = trace_divergence(TRACE, faulted)
    assert msg is not None and "task turn-1: point 2 is model.call.before#1" in msg


def test_divergence_occurrence_differs() -> None:
    faulted = [("label", "node.launch", "turn-1", 2)]
    assert "node.launch#2" in (trace_divergence(TRACE, faulted) or "")


def test_divergence_unknown_task_and_overlong_task() -> None:
    msg = trace_divergence(TRACE, [("label", "node.launch", "turn-9", 1)])
    assert msg is not None and "task turn-9" in msg and "golden has nothing" in msg
    longer = [e for e in TRACE if e[2] == "turn-1"] + [("label", "node.launch", "turn-1", 2)]
    msg = trace_divergence(TRACE, longer)
    assert msg is not None and "golden has nothing" in msg


# -- enumerate_cases ---------------------------------------------------------------------


def test_enumerate_counts_points_times_kinds() -> None:
    goldens = {"conv1": golden("conv1"), "conv2": golden("conv2", TRACE[:4])}
    points = sum(1 for e in TRACE if e[0] in ("step", "label")) + sum(1 for e in TRACE[:4] if e[0] in ("step", "label"))
    cases = enumerate_cases("checkout", goldens)
    assert len(cases) == points * len(DEFAULT_KINDS)
    assert len({c.id for c in cases}) == len(cases)  # ids unique
    one = enumerate_cases("checkout", goldens, kinds=("kill",))
    assert len(one) == points


def test_enumerate_source_filter() -> None:
    goldens = {"conv1": golden("conv1")}
    awaits = enumerate_cases("w", goldens, kinds=("kill",), sources=("await",))
    assert [c.plan.faults[0].point for c in awaits] == [
        CrashPoint("await", "pkg.mod:f@1", "turn-1.tool-0", 1),
        CrashPoint("await", "pkg.mod:f@1", "turn-1.tool-0", 2),
    ]
    steps = enumerate_cases("w", goldens, kinds=("kill", "term"), sources=("step",))
    assert len(steps) == 4
    assert {c.plan.faults[0].point.source for c in steps} == {"step"}
    assert enumerate_cases("w", goldens, sources=()) == []
    # default sources exclude await points
    assert all(c.plan.faults[0].point.source != "await" for c in enumerate_cases("w", goldens))


def test_enumerate_deterministic_order() -> None:
    goldens = {"conv2": golden("conv2", TRACE[:3]), "conv1": golden("conv1", TRACE[:2])}
    cases = enumerate_cases("w", goldens, kinds=("term", "kill"))
    assert [c.id for c in cases] == [
        "w/conv1/term@node.launch[turn-1]#1",
        "w/conv1/kill@node.launch[turn-1]#1",
        "w/conv1/term@step.before[turn-1]#1",
        "w/conv1/kill@step.before[turn-1]#1",
        "w/conv2/term@node.launch[turn-1]#1",
        "w/conv2/kill@node.launch[turn-1]#1",
        "w/conv2/term@step.before[turn-1]#1",
        "w/conv2/kill@step.before[turn-1]#1",
        "w/conv2/term@model.call.before[turn-1]#1",
        "w/conv2/kill@model.call.before[turn-1]#1",
    ]
    reversed_goldens = dict(reversed(list(goldens.items())))
    assert enumerate_cases("w", reversed_goldens, kinds=("term", "kill")) == cases


def test_enumerated_cases_validate_and_round_trip() -> None:
    goldens = {"conv1": golden("conv1")}
    for case in enumerate_cases("w", goldens, sources=("step", "label", "await")):
        validate_case(case, goldens)
        assert Case.parse(case.id) == case


# -- validate_case -----------------------------------------------------------------------


def case_at(conv: str, name: str, task: str, occ: int = 1, kind: str = "kill") -> Case:
    from crashmatrix.harness.plan import source_of

    return Case("w", conv, FaultPlan((Fault(kind, CrashPoint(source_of(name), name, task, occ)),)))


def test_validate_unknown_conversation() -> None:
    goldens = {"conv1": golden("conv1"), "conv2": golden("conv2")}
    with pytest.raises(PlanError, match=r"conversation='conv9' is not one of conv1, conv2"):
        validate_case(case_at("conv9", "node.launch", "turn-1"), goldens)


def test_validate_point_not_in_trace() -> None:
    goldens = {"conv1": golden("conv1")}
    with pytest.raises(PlanError) as info:
        validate_case(case_at("conv1", "probe.before", "turn-1"), goldens)
    msg = str(info.value)
    assert "plan.faults[0].point probe.before[turn-1] is not in the golden trace of conv1" in msg
    assert "node.launch" in msg  # lists what the task does reach
    with pytest.raises(PlanError, match=r"point node.launch\[turn-7\] is not in the golden trace"):
        validate_case(case_at("conv1", "node.launch", "turn-7"), goldens)


def test_validate_occurrence_out_of_range() -> None:
    goldens = {"conv1": golden("conv1")}
    validate_case(case_at("conv1", "pkg.mod:f@1", "turn-1.tool-0", 2), goldens)
    with pytest.raises(PlanError, match=r"occurrence=3 is out of range: .*occurs 2 time\(s\)"):
        validate_case(case_at("conv1", "pkg.mod:f@1", "turn-1.tool-0", 3), goldens)


def test_validate_checks_the_first_fault_against_the_golden_trace_only() -> None:
    # fault i lands in the i-th worker: only the first runs the golden path; later ones
    # land in resumes, whose traces the golden run does not contain
    goldens = {"conv1": golden("conv1")}
    ok = Fault("kill", CrashPoint("label", "node.launch", "turn-1", 1))
    in_resume = Fault("kill", CrashPoint("label", "nowhere", "turn-1", 1))
    validate_case(Case("w", "conv1", FaultPlan((ok, in_resume))), goldens)
    with pytest.raises(PlanError, match=r"plan\.faults\[0\]"):
        validate_case(Case("w", "conv1", FaultPlan((in_resume, ok))), goldens)


def test_replay_command() -> None:
    case = case_at("conv1", "node.launch", "turn-1")
    assert replay_command(case, "reference") == "crashmatrix replay 'w/conv1/kill@node.launch[turn-1]#1'"
    assert replay_command(case, "mutant-x").endswith("--subject mutant-x")


def test_replay_command_carries_the_path_a_team_module_was_found_on(monkeypatch) -> None:
    case = Case.parse("crashmatrix_workload:WORKLOAD/conv1/kill@node.launch[turn-1]#1")
    monkeypatch.setenv("PYTHONPATH", ".")
    line = replay_command(case, "crashmatrix_adapter:SubjectAdapter")
    assert line.startswith(f"PYTHONPATH={os.path.abspath('.')} crashmatrix replay "), line
    monkeypatch.delenv("PYTHONPATH")
    assert replay_command(case, "crashmatrix_adapter:SubjectAdapter").startswith("crashmatrix replay ")
    monkeypatch.setenv("PYTHONPATH", ".")
    assert replay_command(Case.parse("checkout/conv1/kill@node.launch[turn-1]#1"), "reference").startswith(
        "crashmatrix replay ")  # nothing imported from the path
