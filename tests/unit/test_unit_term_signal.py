"""term.drained judges launches from the SIGTERM's delivery (the worker's ``signalled``
report), not from the subject's ``drain.begin``: a handler that runs late (asyncio's
``loop.add_signal_handler``) cannot hide launches made before it ran, and a drain
recorded late that launched nothing passes."""

from __future__ import annotations

from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.faults.term import check_term_drained, launched_after_signal
from crashmatrix.harness.history import Signalled, WorkerReport, decode, encode
from crashmatrix.harness.oracle import CrashEvidence
from crashmatrix.harness.plan import CrashPoint, Fault

FAULT = Fault("term", CrashPoint("step", "step.after", "turn-3"))
AT_FAULT = [("label", "node.launch", "turn-3", 1), ("step", "step.before", "turn-3", 1),
            ("label", "log.append.after", "turn-3", 1), ("step", "step.after", "turn-3", 1)]


def ev(after: list, signalled_at: int | None = len(AT_FAULT)) -> CrashEvidence:
    full = AT_FAULT + after
    return CrashEvidence(FAULT, AT_FAULT, full, 0, None, False, Observation("r", "paused"), signalled_at=signalled_at)


LATE_HANDLER = [("label", "node.launch", "turn-4", 1), ("step", "step.before", "turn-4", 1),
                ("label", "node.launch", "turn-5", 1), ("label", "drain.begin", "run", 1)]


def test_launches_before_a_late_drain_begin_are_caught() -> None:
    v = check_term_drained(ev(LATE_HANDLER))
    assert v.valid is False and "2 node(s) launched after SIGTERM was delivered: turn-4, turn-5" in v.details


def test_without_the_report_the_fault_point_is_the_delivery() -> None:
    assert launched_after_signal(ev(LATE_HANDLER, signalled_at=None)) == ["turn-4", "turn-5"]


def test_a_drain_recorded_late_that_launched_nothing_passes() -> None:
    late = [("label", "model.call.before", "turn-3b", 1), ("label", "drain.begin", "run", 1)]
    v = check_term_drained(ev(late))
    assert v.valid is True, v.details


def test_a_launch_in_flight_at_the_delivery_is_not_counted() -> None:
    # the signal landed while node.launch[turn-4] was being recorded: that launch is the
    # one the signal interrupted (reported at index 5, after it), the next one is new
    after = [("label", "node.launch", "turn-4", 1), ("label", "drain.begin", "run", 1),
             ("label", "node.launch", "turn-5", 1)]
    assert launched_after_signal(ev(after, signalled_at=len(AT_FAULT) + 1)) == ["turn-5"]


def test_the_signalled_event_round_trips() -> None:
    import json

    event = Signalled("SIGTERM", 7, 1.5)
    assert decode(json.loads(encode(event))) == event
    assert WorkerReport([event]).signalled == event
    assert decode({"event": "signalled", "signal": "SIGTERM", "at": "x"}).event == "signalled"  # kept as Other
