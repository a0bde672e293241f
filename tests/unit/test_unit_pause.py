"""``pause.zombie_fenced`` on hand-built observations (harness/faults/pause.py): what it
says of a zombie that changed nothing, by how the zombie ended."""

from __future__ import annotations

from crashmatrix.harness.adapter import FENCED, Observation
from crashmatrix.harness.faults.pause import check_zombie_fenced
from crashmatrix.harness.history import End


def test_a_zombie_that_changed_nothing_is_described_by_how_it_ended() -> None:
    state = Observation("r", "completed")
    refused = check_zombie_fenced(state, state, End("error", [], error="LeaseLost: epoch 1 is stale"))
    assert refused.valid and refused.details == "the zombie's writes were refused (LeaseLost: epoch 1 is stale)"
    said_so = check_zombie_fenced(state, state, End(FENCED, []))
    assert said_so.valid and said_so.details == "the zombie's writes were refused (fenced)"
    quiet = check_zombie_fenced(state, state, End("completed", []))
    assert quiet.valid and quiet.details == ("nothing the zombie did changed the durable state "
                                             "(it ended 'completed' by itself)")
    moved = check_zombie_fenced(state, Observation("r", "running"), End("completed", []))
    assert not moved.valid and "run status changed from 'completed' to 'running'" in moved.details
