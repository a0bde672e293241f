"""crashmatrix.harness.history: the worker's events as typed data, one reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crashmatrix.harness.history import (
    Accepted, End, FaultError, Fired, Healed, HealError, Other, Passed, TraceEntry, WorkerReport, as_trace, encode, has_fired,
)

TRACE = [TraceEntry("label", "log.append.before", "turn-1", 1), TraceEntry("step", "step.after", "turn-1", 1)]


def _write(path: Path, *lines: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for line in lines:
            os.write(fd, line)
    finally:
        os.close(fd)


def test_events_round_trip_through_the_file_and_a_torn_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    fault = {"kind": "net", "point": {"source": "label", "name": "log.append.before", "task": "turn-1", "occurrence": 1}}
    events = [Accepted(0.5), Fired(fault, TRACE[:1], 1.5), Healed(TRACE[1], 2.0), HealError("no proxy"), Healed("worker-end"),
              FaultError("refused"), End("completed", TRACE)]
    _write(path, *(encode(e) for e in events), b'{"event": "end", "status": "comp')  # a kill mid-write
    report = WorkerReport.from_file(str(path))
    assert report.events == events
    assert report.names() == ["accepted", "fired", "healed", "heal-error", "healed", "fault-error", "end"]
    assert report.fired == events[1] and report.end == events[-1] and report.accepted
    assert [h.where() for h in report.healed] == ["step.after[turn-1]#1", "worker-end"]
    assert report.trace() == TRACE and isinstance(report.trace()[0], TraceEntry)
    assert [e.error for e in report.fault_errors] == ["refused"] and [e.error for e in report.heal_errors] == ["no proxy"]


def test_the_trace_of_a_killed_worker_is_the_one_up_to_its_fault(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    _write(path, encode(Fired({"kind": "kill"}, TRACE[:1])))
    report = WorkerReport.from_file(str(path))
    assert report.end is None and report.trace() == TRACE[:1]
    assert WorkerReport.from_file(str(tmp_path / "missing.jsonl")).events == []


def test_entries_unpack_and_compare_as_tuples() -> None:
    source, name, task, occ = TRACE[0]
    assert (source, name, task, occ) == ("label", "log.append.before", "turn-1", 1) == TRACE[0]
    assert TRACE[0].key == ("log.append.before", "turn-1", 1) and TRACE[0].label() == "log.append.before[turn-1]#1"
    assert as_trace([["step", "step.after", "turn-1", 1]]) == [TRACE[1]]
    assert json.loads(encode(End("completed", TRACE)))["trace"][0] == ["label", "log.append.before", "turn-1", 1]


def test_equal_entries_of_two_workers_traces_are_one_object(tmp_path: Path) -> None:
    """A matrix's traces pass the same points over and over: the controller keeps one
    object per entry, not one per trace (long_run's controller grew to 6.9 GB)."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, encode(End("completed", TRACE)))
    _write(b, encode(Fired({"kind": "kill"}, TRACE[:1])))
    first, second = WorkerReport.from_file(str(a)).trace(), WorkerReport.from_file(str(b)).trace()
    assert first == TRACE and second == TRACE[:1]
    assert first[0] is second[0] and type(first[0]) is TraceEntry
    with pytest.raises(TypeError):
        as_trace([["step", "step.after", "turn-1"]])


def test_unknown_or_malformed_events_are_kept_as_other(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    _write(path, b'{"event": "new-kind", "x": 1}\n', b'{"event": "fired"}\n')
    report = WorkerReport.from_file(str(path))
    assert [type(e) for e in report.events] == [Other, Other] and report.fired is None
    assert report.events[0].event == "new-kind"


def test_has_fired_reads_a_complete_fired_line(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    assert not has_fired(str(path))
    line = encode(Fired({"kind": "term"}, TRACE))
    _write(path, line[:-5])
    assert not has_fired(str(path))  # half written
    _write(path, line[-5:])
    assert has_fired(str(path))
    other = tmp_path / "o.jsonl"
    _write(other, encode(End("completed", [TraceEntry("label", "fired", "t", 1)])))
    assert not has_fired(str(other))  # "fired" as a point name is not the event
    acked = tmp_path / "a.jsonl"
    _write(acked, encode(Accepted(1.0)))
    assert not has_fired(str(acked))
    _write(acked, line)
    assert has_fired(str(acked))  # the subject acknowledged the run before the fault


def test_a_worker_dead_after_its_fault_has_the_points_it_passed_in_its_trace() -> None:
    fault_point = TraceEntry("label", "model.call.before", "turn-1", 1)
    drain = TraceEntry("label", "drain.begin", "run", 1)
    record = TraceEntry("label", "log.append.after", "turn-1", 1)
    report = WorkerReport([Fired({"kind": "term"}, [fault_point]), Passed(drain), Passed(record)])
    assert report.end is None
    assert report.trace() == [fault_point, drain, record]  # not only the trace up to the fault
    assert WorkerReport([Passed(drain)]).trace() == []  # nothing fired: no trace to speak of
