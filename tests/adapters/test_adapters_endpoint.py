"""The endpoint adapter: the reference runtime served by a real uvicorn server in the
worker, a run driven as a streaming HTTP request, SIGTERM handled by uvicorn's handler.

Real processes, real signals, real PostgreSQL: the ``term`` fault sends SIGTERM to the
worker, uvicorn shuts down gracefully with the request open, and the term checks judge
what the endpoint did with the run in that request.
"""

from __future__ import annotations

from typing import Any

MODULE = "crashmatrix.harness.adapters.endpoint"
CASES = [
    "term@model.call.before[turn-1]#1",  # a model call in flight: it must finish and be recorded
    "term@node.launch[turn-2.tool-0]#1",  # a tool node just launched
    "term@log.append.after[turn-3]#1",  # between steps: the next must not be launched
    "kill@tool.request.after[turn-1.tool-0]#1",  # SIGKILL with the request open: resume as any
]


def test_the_endpoint_drains_through_uvicorns_handler(matrix_cases: Any) -> None:
    """SIGTERM mid-request: uvicorn's handler requests the runtime's drain, the step in
    flight finishes and records, the run is left ``paused``, uvicorn re-raises the
    SIGTERM into the adapter's own handler after its shutdown, and the worker exits 0."""
    s = matrix_cases("endpoint", "checkout", CASES)
    for case in s.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
    for case in s.cases[:3]:
        first = case.workers[0]
        assert first["returncode"] == 0 and first["signal"] is None, first
        verdicts = {v.check: v for v in case.result.verdicts}
        assert verdicts["term.drained"].valid is True, verdicts["term.drained"].details
        assert "status paused" in verdicts["term.drained"].details


def test_an_unwired_endpoint_launches_after_sigterm(matrix_cases: Any) -> None:
    """The app not hooked into uvicorn's shutdown: the open request runs the agent to its
    end after SIGTERM, launching steps: ``term.drained`` fails, naming the launches."""
    s = matrix_cases(f"{MODULE}:EndpointUnwiredAdapter", "checkout", CASES[:3])
    for case in s.cases:
        assert case.result.outcome == "fail", case.result.case.id
        assert "term.drained" in case.failed, case.why()
        drained = next(v for v in case.result.verdicts if v.check == "term.drained")
        assert "launched after SIGTERM" in drained.details


def test_an_endpoint_that_cancels_its_requests_drops_the_step_in_flight(matrix_cases: Any) -> None:
    """The app cancels its open requests at shutdown: the model call in flight is cut off
    unrecorded (``term.in_flight_recorded``) and the run is not left at rest
    (``term.drained``)."""
    s = matrix_cases(f"{MODULE}:EndpointCancelAdapter", "checkout", CASES[:1])
    (case,) = s.cases
    assert case.result.outcome == "fail"
    assert {"term.drained", "term.in_flight_recorded"} <= case.failed, case.why()


def test_the_module_starts_nothing_at_import(imports_start_nothing: Any) -> None:
    """Workers fork from a parent that imported it: uvicorn, Starlette and the adapter
    start no thread at import."""
    imports_start_nothing(MODULE)
