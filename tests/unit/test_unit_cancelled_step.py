"""``cancel.step_recorded``: a cancelled step is recorded with the effect it made, or
not recorded and its effect left to resolve; never recorded without it."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.adapter import LogEntry, Observation
from crashmatrix.harness.faults._cancelled import check_step_recorded
from crashmatrix.harness.history import TraceEntry
from crashmatrix.harness.oracle import CrashEvidence
from crashmatrix.harness.plan import CrashPoint, Fault

CHARGE = {"op": "charge", "ref": "ch_1", "status": "succeeded", "request": {"amount": 1}}
TRACE = [TraceEntry("label", "tool.request.before", "tool-3", 1), TraceEntry("label", "tool.request.after", "tool-3", 1)]


def _ev(log: list[str] | None, transcript: list[dict[str, Any]], ledgers: dict[str, Any] | None) -> CrashEvidence:
    obs = Observation("r", "interrupted", log=None if log is None else [
        LogEntry(i, node, (), "tool", 0) for i, node in enumerate(log, 1)], state={"transcript": transcript})
    fault = Fault("cancel", CrashPoint("label", "tool.request.after", "tool-3", 1))
    return CrashEvidence(fault, TRACE, TRACE, 0, None, False, obs, ledgers=ledgers)


def test_recorded_without_the_effect_it_made_is_invalid() -> None:
    # Burr's cancelled action: saved as done, with the state from before it
    v = check_step_recorded(_ev(["model-2", "tool-3"], [{"role": "user"}], {"payment": [CHARGE]}))
    assert v.valid is False and "payment charge ch_1" in v.details and "tool-3" in v.details


def test_recorded_with_its_result_or_not_recorded_are_valid() -> None:
    held = [{"role": "tool", "content": {"charge_id": "ch_1"}}]
    assert check_step_recorded(_ev(["model-2", "tool-3"], held, {"payment": [CHARGE]})).valid
    left = check_step_recorded(_ev(["model-2"], [], {"payment": [CHARGE]}))
    assert left.valid and "not recorded: tool-3" in left.details
    declined = dict(CHARGE, status="declined")
    assert check_step_recorded(_ev(["model-2", "tool-3"], [], {"payment": [declined]})).valid
    assert "not applicable" in check_step_recorded(_ev(None, [], {"payment": [CHARGE]})).details
