"""term.in_flight_recorded: the drain lets the nodes in flight at SIGTERM finish and
record (seed 002); the billing allowance is for kills, not for a drain that finished."""

from __future__ import annotations

from crashmatrix.harness import faults
from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.faults.term import check_in_flight_recorded, in_flight_at
from crashmatrix.harness.oracle import CrashEvidence
from crashmatrix.harness.plan import CrashPoint, Fault

FAULT = Fault("term", CrashPoint("label", "model.call.before", "turn-2"))
AT_FAULT = [("label", "node.launch", "turn-1", 1), ("label", "log.append.after", "turn-1", 1),
            ("label", "node.launch", "turn-2", 1), ("label", "model.call.before", "turn-2", 1)]


def ev(after: list, *, timed_out: bool = False, sig: int | None = None) -> CrashEvidence:
    full = AT_FAULT + [("label", "drain.begin", "run", 1)] + after
    return CrashEvidence(FAULT, AT_FAULT, full, 0 if sig is None else None, sig, timed_out, Observation("r", "paused"))


def test_in_flight_nodes_are_those_launched_and_not_recorded() -> None:
    assert in_flight_at(AT_FAULT) == ["turn-2"]


def test_a_drain_that_let_the_node_finish_passes() -> None:
    v = check_in_flight_recorded(ev([("label", "log.append.after", "turn-2", 1)]))
    assert v.valid is True and "1 node(s) in flight at SIGTERM, all recorded" in v.details


def test_a_drain_that_dropped_the_node_fails() -> None:
    v = check_in_flight_recorded(ev([]))
    assert v.valid is False and "turn-2" in v.details and "dropped" in v.details


def test_the_grace_period_ending_first_is_not_judged_here() -> None:
    assert check_in_flight_recorded(ev([], timed_out=True, sig=9)).valid is True


def test_no_allowance_for_a_drain_that_finished_but_for_one_that_was_killed() -> None:
    term = faults.kind("term")
    assert term.allowance(ev([])) == {}
    assert term.allowance(ev([], timed_out=True, sig=9)) == {"turn-2": 1}
    assert faults.kind("kill").allowance(ev([])) == {"turn-2": 1}


def test_a_node_that_handed_its_effect_to_a_person_is_not_dropped() -> None:
    """support_desk goodwill: the approval tool in flight at SIGTERM stops the run
    needs_human, its effect unknown for the person; that is the node's own end."""
    import dataclasses

    from crashmatrix.harness.adapter import EffectEntry

    waiting = EffectEntry("k", "turn-2", "await_approval", "unknown", None, 1)
    handed = dataclasses.replace(ev([]), observation=Observation("r", "needs_human", effects=[waiting]))
    assert check_in_flight_recorded(handed).valid is True
    # the same unknown effect on a run the drain left paused is dropped work
    paused = dataclasses.replace(ev([]), observation=Observation("r", "paused", effects=[waiting]))
    assert check_in_flight_recorded(paused).valid is False
