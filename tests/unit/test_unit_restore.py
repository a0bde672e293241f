"""The ``restore`` fault kind's pure parts (harness/faults/restore.py): where the
restore point falls in a trace, and each check on hand-built evidence. The kind runs for
real in tests/integration/test_restore.py and tests/adapters/test_adapters_*_restore.py."""

from __future__ import annotations

from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.faults.restore import (
    check_approvals, check_effects, check_fork_original, check_model_rebilled, check_state_possible, rebillable,
    rebill_allowance,
)
from crashmatrix.harness.human import record
from crashmatrix.harness.oracle import Evidence

TRACE = [("label", "model.call.before", "turn-1", 1), ("label", "log.append.after", "turn-1", 1),
         ("label", "tool.request.before", "turn-1.tool-0", 1), ("label", "log.append.after", "turn-1.tool-0", 1),
         ("label", "model.call.before", "turn-2", 1), ("label", "log.append.after", "turn-2", 1),
         ("label", "model.call.before", "turn-3", 1)]


def _row(key: str, attempts: int = 1, op: str = "charge") -> dict:
    return {"op": op, "key": key, "attempts": attempts, "http_status": 200, "status": "succeeded"}


def _obs(transcript: list | None, status: str = "completed") -> Observation:
    return Observation("r", status, state=None if transcript is None else {"transcript": transcript, "answer": None})


def test_the_model_calls_after_the_point_s_checkpoint_may_be_billed_again() -> None:
    assert rebillable(TRACE, 3) == {"turn-2": 1, "turn-3": 1}  # point after turn-1's append: its answer kept
    assert rebillable(TRACE, 0) == {"turn-1": 1, "turn-2": 1, "turn-3": 1}  # before any checkpoint
    assert rebillable(TRACE, 5, label="checkpoint.put.after") == {"turn-1": 1, "turn-2": 1, "turn-3": 1}


def test_nodes_named_anew_share_what_is_left_of_the_allowance() -> None:
    again = {"agent-3": 1, "agent-5": 1}
    assert rebill_allowance({"agent-1": 1, "agent-3": 1, "agent-5": 1}, {"agent-1": 1, "agent-3": 1, "agent-5": 1,
                                                                          "agent-4": 1, "agent-6": 1}, again) == \
        {"agent-3": 1, "agent-5": 1, "agent-4": 1, "agent-6": 1}
    assert rebill_allowance({}, {"agent-4": 3}, again)["agent-4"] == 2  # never more than the whole of again


def test_replays_recorded_allows_no_request_again_and_a_fresh_attempt_one_more_each() -> None:
    before = {"payment": [_row("k1")], "mail": [_row("m1", op="message")]}
    same = check_effects("replays recorded", before, before, False, {"payment": 1, "mail": 1})
    assert same.valid is True and "none sent again" in same.details
    resent = check_effects("replays recorded", before, {**before, "payment": [_row("k1", attempts=2)]}, False,
                           {"payment": 1})
    assert resent.valid is False and "1 sent again" in resent.details
    new_key = check_effects("replays recorded", before, {**before, "payment": [_row("k1"), _row("k2")]}, False,
                            {"payment": 1})
    assert new_key.valid is False and "1 effect(s) were applied again" in new_key.details
    fresh = check_effects("fresh attempt", before, {**before, "payment": [_row("k1"), _row("k2")]}, False,
                          {"payment": 1})
    assert fresh.valid is True and "1 effect(s) applied anew" in fresh.details
    twice = check_effects("fresh attempt", before, {**before, "payment": [_row("k1"), _row("k2"), _row("k3")]},
                          False, {"payment": 1})
    assert twice.valid is False and "payment: 2 new effect(s), the whole golden run made 1" in twice.details
    fork = check_effects("fresh attempt", before, {"payment": [_row("f1")]}, True, {"payment": 1})
    assert fork.valid is True  # a fork's rows are all its own


def test_model_answers_recorded_at_the_point_are_not_billed_again() -> None:
    again = {"turn-2": 1}
    assert check_model_rebilled({"turn-1": 1, "turn-2": 1}, {"turn-1": 1, "turn-2": 2}, again).valid is True
    bad = check_model_rebilled({"turn-1": 1, "turn-2": 1}, {"turn-1": 2, "turn-2": 2}, again)
    assert bad.valid is False and "turn-1: billed 1 more, 0 after the restore point" in bad.details


def test_two_resumers_after_a_restore_may_each_send_an_effect_and_a_refused_one_leave_a_call() -> None:
    """Under ``concurrent`` two workers resume the restored run: each may send an effect
    once more (the refused one before its refusal), and the model call a resumer refused
    mid-node left unrecorded is allowed, as ``model.calls_billed`` allows it; no more."""
    before = {"payment": [_row("k1")]}
    both = check_effects("fresh attempt", before, {"payment": [_row("k1", attempts=3)]}, False, {"payment": 1}, 2)
    assert both.valid is True, both.details
    alone = check_effects("fresh attempt", before, {"payment": [_row("k1", attempts=3)]}, False, {"payment": 1})
    assert alone.valid is False and "payment k1 sent 2 more time(s)" in alone.details
    thrice = check_effects("fresh attempt", before, {"payment": [_row("k1", attempts=4)]}, False, {"payment": 1}, 2)
    assert thrice.valid is False and "by each of 2 resumers" in thrice.details
    again = {"turn-2": 1}
    assert check_model_rebilled({"turn-2": 1}, {"turn-2": 3}, again, {"turn-2": 1}).valid is True
    over = check_model_rebilled({"turn-2": 1}, {"turn-2": 3}, again)
    assert over.valid is False and "turn-2: billed 2 more, 1 after the restore point" in over.details
    assert check_model_rebilled({"turn-1": 1}, {"turn-1": 2}, again, {"turn-2": 1}).valid is False  # not its node


def test_the_restored_transcript_must_be_a_prefix_of_the_run_s() -> None:
    had = [{"role": "user", "content": "buy"}, {"role": "assistant", "content": "ok"}, {"role": "tool", "content": "ch"}]
    assert check_state_possible(_obs(had), _obs(had[:2], "paused"), "2").valid is True
    odd = check_state_possible(_obs(had), _obs([had[0], had[2]], "paused"), "2")
    assert odd.valid is False and "message 1 differs" in odd.details
    assert "not applicable" in check_state_possible(_obs(None), _obs(None), "2").details


def test_an_answer_given_after_the_point_must_be_asked_again() -> None:
    answered = [{"role": "human", **record("review", 1, "yes")}]
    asked = [("label", "human.answer.before", "human-review-1", 1)]
    assert check_approvals(_obs([]), _obs(answered), asked).valid is True
    assert check_approvals(_obs(answered), _obs(answered), []).valid is True  # held at the point already
    spent = check_approvals(_obs([]), _obs(answered), [])
    assert spent.valid is False and "review#1: consumed 1 time(s) after the restore, asked 0" in spent.details


def test_a_fork_must_leave_the_original_as_it_was() -> None:
    ev = Evidence(_obs([{"role": "user"}]), {"payment": [_row("k1")]}, {"turn-1": 1})
    assert check_fork_original(ev, ev, "r~fork-2").valid is True
    moved = Evidence(_obs([{"role": "user"}], "paused"), {"payment": [_row("k1")]}, {"turn-1": 1})
    changed = check_fork_original(ev, moved, "r~fork-2")
    assert changed.valid is False and "changed the original run: status" in changed.details
