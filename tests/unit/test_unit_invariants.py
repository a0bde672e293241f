"""crashmatrix.harness.invariants: checks that hold for a run on its own (no golden run)."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness import invariants, oracle
from crashmatrix.harness.adapter import EffectEntry, Observation
from crashmatrix.harness.oracle import CrashEvidence, Evidence
from crashmatrix.harness.plan import CrashPoint, Fault

KEY, KEY2 = "k" * 64, "j" * 64


def run(*, ledger: list[dict[str, Any]], effects: list[EffectEntry] | None = None, status: str = "completed",
        transcript: list[dict[str, Any]] | None = None, model_rows: list[dict[str, Any]] | None = None) -> Evidence:
    state = {"transcript": transcript if transcript is not None else [
        {"role": "tool", "tool_call_id": "call_1", "content": {"charge_id": "ch_aaaaaaaa"}}]}
    obs = Observation("cm-run-x", status, log=[], effects=effects, state=state)
    return Evidence(obs, {"payment": ledger}, {}, model_rows or [])


def charge(key: str, ref: str, status: str = "succeeded", **extra: Any) -> dict[str, Any]:
    return {"op": "charge", "key": key, "ref": ref, "status": status, "http_status": 200, **extra}


def test_one_charge_per_call_is_valid() -> None:
    ev = run(ledger=[charge(KEY, "ch_aaaaaaaa"), charge(KEY2, "ch_bbbbbbbb", status="declined")],
             effects=[EffectEntry(KEY, "turn-4.tool-0", "charge", "succeeded", {"charge_id": "ch_aaaaaaaa"}, 1)])
    assert invariants.check_applied_once(ev).valid is True


def test_two_charges_named_by_one_effect_row_are_one_call_applied_twice() -> None:
    ev = run(ledger=[charge(KEY, "ch_aaaaaaaa"), charge(KEY + ":retry", "ch_bbbbbbbb")],
             effects=[EffectEntry(KEY, "turn-4.tool-0", "charge", "succeeded", {"charge_id": "ch_bbbbbbbb"}, 1)])
    v = invariants.check_applied_once(ev)
    assert v.valid is False and "2 charge(s) applied for one tool call, turn-4.tool-0" in v.details


def test_a_charge_the_record_never_names_is_applied_but_not_recorded() -> None:
    """No effect ledger (a LangGraph-like subject): the transcript names one charge of two."""
    ev = run(ledger=[charge(KEY, "ch_aaaaaaaa"), charge(KEY2, "ch_zzzzzzzz")], effects=None)
    v = invariants.check_applied_once(ev)
    assert v.valid is False and "applied but not recorded: ch_zzzzzzzz" in v.details


def test_a_provider_the_record_never_names_is_not_judged() -> None:
    ev = run(ledger=[charge(KEY, "ch_qqqqqqqq"), charge(KEY2, "ch_zzzzzzzz")], effects=None, transcript=[])
    assert invariants.check_applied_once(ev).valid is True


def test_two_charges_by_one_logical_task_where_the_provider_recorded_it() -> None:
    ev = run(ledger=[charge(KEY, "ch_aaaaaaaa", task="tools"), charge(KEY2, "ch_bbbbbbbb", task="tools")],
             transcript=[{"content": "ch_aaaaaaaa ch_bbbbbbbb"}])
    v = invariants.check_applied_once(ev)
    assert v.valid is False and "applied 2 times by tool call tools" in v.details


def test_a_key_applied_twice() -> None:
    ev = run(ledger=[charge(KEY, "ch_aaaaaaaa"), charge(KEY, "ch_aaaaaaaa")])
    v = invariants.check_applied_once(ev)
    assert v.valid is False and f"charge with key {KEY} applied 2 times" in v.details


def test_unresolved_effect_in_an_ended_run() -> None:
    effects = [EffectEntry(KEY, "turn-4.tool-0", "charge", "unknown", None, 1)]
    v = invariants.check_resolved(run(ledger=[], effects=effects))
    assert v.valid is False and "charge of turn-4.tool-0 unknown" in v.details
    assert invariants.check_resolved(run(ledger=[], effects=effects, status="needs_human")).valid is True
    assert invariants.check_resolved(run(ledger=[], effects=None)).valid is True


def model_row(node: str, call_id: str | None, content: str = "") -> dict[str, Any]:
    calls = [{"id": call_id, "name": "charge", "arguments": {}}] if call_id else []
    return {"op": "completion", "node_id": node, "ref": f"cmpl_{node}", "result": {"content": content, "tool_calls": calls}}


def test_billed_answers_must_be_in_the_record() -> None:
    rows = [model_row("turn-1", "call_1"), model_row("turn-2", None, "Done, charged.")]
    transcript = [{"role": "tool", "tool_call_id": "call_1", "content": {}}, {"role": "assistant", "content": "Done, charged."}]
    assert invariants.check_answers_recorded(run(ledger=[], transcript=transcript, model_rows=rows), {}).valid is True
    lost = invariants.check_answers_recorded(run(ledger=[], transcript=transcript[:1], model_rows=rows), {})
    assert lost.valid is False and "turn-2: 1 billed answer(s) not in the record" in lost.details
    # unless the call was in flight when a fault landed
    assert invariants.check_answers_recorded(run(ledger=[], transcript=transcript[:1], model_rows=rows),
                                             {"turn-2": 1}).valid is True


def test_acknowledged_run_must_exist_after_a_crash() -> None:
    fault = Fault("kill", CrashPoint("label", "node.launch", "turn-1"))
    trace = [("label", "run.accepted", "run", 1), ("label", "node.launch", "turn-1", 1)]

    def crash(status: str, t: list[Any], acknowledged: bool = False) -> CrashEvidence:
        return CrashEvidence(fault, t, t, None, 9, False, Observation("r", status), acknowledged=acknowledged)

    assert oracle.check_acknowledged_run(crash("absent", trace)).valid is False
    assert oracle.check_acknowledged_run(crash("running", trace)).valid is True
    assert oracle.check_acknowledged_run(crash("absent", trace[1:])).valid is True  # never acknowledged
    # acknowledged by ctx.accepted() in this or an earlier worker of the case
    assert oracle.check_acknowledged_run(crash("absent", trace[1:], acknowledged=True)).valid is False


def test_end_invariants_never_raise() -> None:
    broken = Evidence(Observation("r", "completed", state={"transcript": 3}), {"payment": [{"op": "charge"}]}, {},
                      [{"result": 7}])
    for v in invariants.end_invariants(broken):
        assert v.valid in (True, False, None)  # a check that raises is unknown, never a pass


def test_an_answer_whose_tool_call_ids_the_runtime_replaced_is_found_by_name_and_arguments() -> None:
    """A runtime that mints its own tool-call ids (``tc.turn-1.0``) keeps the answer's
    calls by name and arguments: recorded. The same record without the call: lost."""
    row = {"op": "completion", "node_id": "turn-1", "ref": "cmpl_1", "result": {"content": "", "tool_calls": [
        {"id": "call_model_9f", "name": "charge", "arguments": '{"amount": 4200, "order": "ord_17"}'}]}}
    kept = [{"role": "assistant", "tool_calls": [{"id": "tc.turn-1.0", "name": "charge",
                                                   "arguments": {"amount": 4200, "order": "ord_17"}}]}]
    assert invariants.check_answers_recorded(run(ledger=[], transcript=kept, model_rows=[row]), {}).valid is True
    other = [{"role": "assistant", "tool_calls": [{"id": "tc.turn-1.0", "name": "charge",
                                                    "arguments": {"amount": 4200, "order": "ord_18"}}]}]
    lost = invariants.check_answers_recorded(run(ledger=[], transcript=other, model_rows=[row]), {})
    assert lost.valid is False and "turn-1: 1 billed answer(s) not in the record (cmpl_1)" in lost.details


def test_a_runtime_that_keeps_provider_ids_is_judged_by_them() -> None:
    """Two answers asking for the same call: the record keeps the first's id only. A
    runtime that keeps provider ids lost the second (paid again), even though a call of
    that name and arguments is in its record."""
    def row(node: str, call_id: str) -> dict[str, Any]:
        return {"op": "completion", "node_id": node, "ref": f"cmpl_{node}", "result": {"content": "", "tool_calls": [
            {"id": call_id, "name": "charge", "arguments": {"amount": 4200}}]}}

    kept = [{"role": "assistant", "tool_calls": [{"id": "call_first", "name": "charge", "arguments": {"amount": 4200}}]}]
    v = invariants.check_answers_recorded(run(ledger=[], transcript=kept,
                                              model_rows=[row("turn-1", "call_first"), row("turn-2", "call_second")]), {})
    assert v.valid is False and "turn-2: 1 billed answer(s) not in the record (cmpl_turn-2)" in v.details


def test_the_final_log_must_be_as_clean_as_every_crash_state() -> None:
    """``log.clean_final``: a hole the resume appended past (seq 4 never written) fails the
    end invariant, named once, not once per record after it; a clean log passes."""
    from crashmatrix.harness.adapter import LogEntry

    def ended(seqs: list[int]) -> Evidence:
        log = [LogEntry(s, f"n{s}", (f"n{seqs[i - 1]}",) if i else (), "model", 1) for i, s in enumerate(seqs)]
        return Evidence(Observation("r", "completed", log=log, state={"transcript": []}), {}, {}, [])

    def final(ev: Evidence) -> oracle.Verdict:
        return next(v for v in invariants.end_invariants(ev) if v.check == "log.clean_final")

    holed = final(ended([1, 2, 3, 5, 6, 7]))
    assert holed.valid is False and holed.phase == "end"
    assert holed.details == "1 problem(s): seq 5 at position 4 (expected 4: a gap)"
    assert final(ended([1, 2, 3, 4])).valid is True
    repeated = final(ended([1, 2, 2, 3]))
    assert repeated.valid is False and "seq 2 at position 3 (expected 3: a seq repeated or out of order)" in repeated.details
    assert oracle.check_clean_prefix(ended([2, 3]).observation).check == "log.clean_prefix"
