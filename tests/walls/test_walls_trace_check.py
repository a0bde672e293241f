"""harness/trace_check.py: the ``trace.continues`` check on plain observations."""

from __future__ import annotations

from crashmatrix.harness.adapter import InvocationEntry, LogEntry, Observation
from crashmatrix.harness.trace_check import check_trace_continues


def tp(trace: int, span: int) -> str:
    return f"00-{trace:032x}-{span:016x}-01"


def obs(*invs: InvocationEntry, log: int = 1) -> Observation:
    entries = [LogEntry(i, f"turn-{i}", (), "model", 1) for i in range(1, log + 1)]
    return Observation("r", "completed", log=entries, invocations=list(invs))


def test_a_chain_of_links_is_valid() -> None:
    a, b, c = tp(1, 1), tp(2, 2), tp(3, 3)
    v = check_trace_continues(obs(InvocationEntry(1, "w1", a, None), InvocationEntry(2, "w2", b, a), InvocationEntry(4, "w3", c, b)))
    assert v.valid is True and v.check == "trace.continues" and "3 invocation(s)" in v.details


def test_single_invocation_and_not_applicable() -> None:
    assert check_trace_continues(obs(InvocationEntry(1, "w1", tp(1, 1), None))).valid is True
    na = check_trace_continues(Observation("r", "completed", log=[], invocations=None))
    assert na.valid is True and "not applicable" in na.details


def test_a_resume_without_a_link_is_invalid() -> None:
    v = check_trace_continues(obs(InvocationEntry(1, "w1", tp(1, 1), None), InvocationEntry(2, "w2", tp(2, 2), None)))
    assert v.valid is False and any("resume without a link" in d for d in v.diff)


def test_a_link_to_the_wrong_invocation_is_invalid() -> None:
    a, b = tp(1, 1), tp(2, 2)
    v = check_trace_continues(obs(InvocationEntry(1, "w1", a, None), InvocationEntry(2, "w2", b, a), InvocationEntry(3, "w3", tp(3, 3), a)))
    assert v.valid is False and any("epoch 3: links to" in d and "epoch 2" in d for d in v.diff)


def test_a_resume_that_adopts_the_stored_context_as_parent_is_invalid() -> None:
    a = tp(1, 1)
    v = check_trace_continues(obs(InvocationEntry(1, "w1", a, None), InvocationEntry(2, "w2", tp(1, 2), a)))
    assert v.valid is False and any("shares trace id" in d for d in v.diff)


def test_malformed_traceparents_and_a_first_invocation_with_a_link_are_invalid() -> None:
    v = check_trace_continues(obs(InvocationEntry(1, "w1", "00-zz-1-01", tp(9, 9))))
    assert v.valid is False
    assert any("not a valid W3C traceparent" in d for d in v.diff)
    assert any("the first invocation links" in d for d in v.diff)
    zero = check_trace_continues(obs(InvocationEntry(1, "w1", tp(0, 1), None)))
    assert zero.valid is False


def test_records_without_any_invocation_are_invalid_and_an_unstarted_run_is_valid() -> None:
    assert check_trace_continues(obs(log=2)).valid is False
    assert check_trace_continues(obs(log=0)).valid is True
