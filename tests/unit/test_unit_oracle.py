"""crashmatrix.harness.oracle: every check with hand-built observations."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from crashmatrix.harness import oracle
from crashmatrix.harness.adapter import EffectEntry, LogEntry, Observation
from crashmatrix.harness.faults.cancel import check_cancel_left_unknown
from crashmatrix.harness.history import TraceEntry
from crashmatrix.harness.faults.term import check_term_drained, untouched_by_worker
from crashmatrix.harness.oracle import CrashEvidence, Evidence, Verdict
from crashmatrix.harness.checks import CheckDeclarationError
from crashmatrix.harness.verdicts import crash_verdicts
from crashmatrix.harness.plan import CrashPoint, Fault

KEY1 = "11" * 32
KEY2 = "22" * 32


def log(*nodes: tuple[str, tuple[str, ...]], start: int = 1) -> list[LogEntry]:
    return [LogEntry(start + i, n, parents, "model" if "tool" not in n else "tool", 1) for i, (n, parents) in enumerate(nodes)]


GOOD_LOG = log(("turn-1", ()), ("turn-1.tool-0", ("turn-1",)), ("turn-2", ("turn-1.tool-0",)))


def obs(log_: list[LogEntry] | None = None, effects: list[EffectEntry] | None = None, status: str = "completed",
        state: dict[str, Any] | None = None, state_error: str | None = None) -> Observation:
    return Observation("cm-run-aaaaaaaa", status, log_, effects, state, state_error)


def eff(node: str, status: str, key: str = KEY1, result: Any = None, tool: str = "charge") -> EffectEntry:
    return EffectEntry(key, node, tool, status, result, 1)


# -- log.clean_prefix --------------------------------------------------------------------


def test_clean_prefix_valid() -> None:
    v = oracle.check_clean_prefix(obs(GOOD_LOG))
    assert v.valid is True and v.check == "log.clean_prefix" and v.phase == "crash"
    assert "3 records" in v.details


def test_clean_prefix_empty_log_valid() -> None:
    assert oracle.check_clean_prefix(obs([])).valid is True


def test_clean_prefix_not_applicable_without_log() -> None:
    v = oracle.check_clean_prefix(obs(None))
    assert v.valid is True and "not applicable" in v.details


def test_clean_prefix_gap() -> None:
    entries = [GOOD_LOG[0], LogEntry(3, "turn-1.tool-0", ("turn-1",), "tool", 1)]
    v = oracle.check_clean_prefix(obs(entries))
    assert v.valid is False
    assert "seq 3 at position 2" in v.details and "gap" in v.details


def test_clean_prefix_not_starting_at_one() -> None:
    v = oracle.check_clean_prefix(obs(log(("turn-1", ()), start=2)))
    assert v.valid is False and "seq 2 at position 1" in v.details


def test_clean_prefix_undecodable() -> None:
    entries = list(GOOD_LOG)
    entries[1] = LogEntry(2, "turn-1.tool-0", (), "", 1, error="record does not decode: DecodeError")
    v = oracle.check_clean_prefix(obs(entries))
    assert v.valid is False
    assert "seq 2 node turn-1.tool-0: record does not decode" in v.details


def test_clean_prefix_parent_missing_or_later() -> None:
    missing = log(("turn-1", ()), ("turn-2", ("turn-1.tool-0",)))
    v = oracle.check_clean_prefix(obs(missing))
    assert v.valid is False and "parent turn-1.tool-0 not recorded before it" in v.details
    later = log(("turn-1.tool-0", ("turn-1",)), ("turn-1", ()))
    v = oracle.check_clean_prefix(obs(later))
    assert v.valid is False and "parent turn-1 not recorded before it" in v.details


def test_clean_prefix_duplicate_node() -> None:
    v = oracle.check_clean_prefix(obs(log(("turn-1", ()), ("turn-1", ()))))
    assert v.valid is False and "node turn-1 recorded twice" in v.details
    assert v.details.startswith("1 problem(s)")


# -- effects.commit_with_record ----------------------------------------------------------


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_commit_with_record_valid(status: str) -> None:
    effects = [eff("turn-1.tool-0", status), eff("turn-3.tool-0", "started", KEY2)]
    v = oracle.check_commit_with_record(obs(GOOD_LOG, effects))
    assert v.valid is True, v.details


def test_commit_with_record_final_without_record() -> None:
    v = oracle.check_commit_with_record(obs(GOOD_LOG[:1], [eff("turn-1.tool-0", "succeeded")]))
    assert v.valid is False
    assert "effect charge of turn-1.tool-0 is succeeded but the node has no record" in v.details


@pytest.mark.parametrize("status", ["started", "unknown"])
def test_commit_with_record_record_without_final(status: str) -> None:
    v = oracle.check_commit_with_record(obs(GOOD_LOG, [eff("turn-1.tool-0", status)]))
    assert v.valid is False
    assert f"node turn-1.tool-0 is recorded but its effect charge is {status}" in v.details


def test_commit_with_record_not_applicable() -> None:
    assert oracle.check_commit_with_record(obs(GOOD_LOG, None)).valid is True
    assert oracle.check_commit_with_record(obs(None, [eff("x", "succeeded")])).valid is True


# -- cancel.left_unknown -----------------------------------------------------------------


def crash_ev(kind: str, point_name: str, task: str, effects: list[EffectEntry] | None = None,
             trace: list[tuple[str, str, str, int]] | None = None, rc: int | None = None,
             sig: int | None = None, timed_out: bool = False, status: str = "paused",
             state: dict[str, Any] | None = None, log_: list[LogEntry] | None = None) -> CrashEvidence:
    fault = Fault(kind, CrashPoint("label", point_name, task, 1))
    o = obs(log_ if log_ is not None else GOOD_LOG[:1], effects, status, state)
    return CrashEvidence(fault, trace or [], trace or [], rc, sig, timed_out, o)


def test_cancel_left_unknown_valid() -> None:
    ev = crash_ev("cancel", "tool.request.before", "turn-1.tool-0", [eff("turn-1.tool-0", "unknown")])
    assert check_cancel_left_unknown(ev).valid is True


def test_cancel_left_unknown_not_applicable_without_effects_ledger() -> None:
    v = check_cancel_left_unknown(crash_ev("cancel", "tool.request.before", "turn-1.tool-0", None))
    assert v.valid is True and v.details.startswith("not applicable")


def test_cancel_during_request_left_started_is_invalid() -> None:
    # the unknown write was cancelled by the cancellation it records (not shielded)
    ev = crash_ev("cancel", "tool.request.before", "turn-2.tool-0", [eff("turn-2.tool-0", "started")])
    v = check_cancel_left_unknown(ev)
    assert v.valid is False and "effect charge of turn-2.tool-0 left started" in v.details
    # no label tells whether the request was answered (an await point): started fails
    ev = crash_ev("cancel", "log.append.before", "turn-1.tool-0", [eff("turn-2.tool-0", "started")])
    assert check_cancel_left_unknown(ev).valid is False


def test_cancel_after_the_provider_answered_may_leave_started() -> None:
    # the outcome was being recorded when the cancel landed: the resume's probe resolves it
    answered = [TraceEntry("label", "tool.request.before", "turn-2.tool-0", 1),
                TraceEntry("label", "tool.request.after", "turn-2.tool-0", 1)]
    ev = crash_ev("cancel", "log.append.before", "turn-2.tool-0", [eff("turn-2.tool-0", "started")], trace=answered)
    v = check_cancel_left_unknown(ev)
    assert v.valid is True and "answered before the cancel" in v.details


def test_cancel_during_request_not_unknown_is_invalid() -> None:
    ev = crash_ev("cancel", "tool.request.before", "turn-1.tool-0", [eff("turn-1.tool-0", "succeeded")])
    v = check_cancel_left_unknown(ev)
    assert v.valid is False and "is succeeded, not unknown" in v.details


def test_cancel_elsewhere_succeeded_is_fine() -> None:
    ev = crash_ev("cancel", "model.call.before", "turn-2", [eff("turn-1.tool-0", "succeeded")])
    assert check_cancel_left_unknown(ev).valid is True


# -- log.acknowledged_durable ------------------------------------------------------------

ACKED = [
    ("step", "step.before", "turn-1", 1),
    ("label", "log.append.after", "turn-1", 1),
    ("label", "log.append.after", "turn-1.tool-0", 1),
    ("label", "log.append.after", "turn-1.tool-0", 2),  # a retried append: one node
]


def test_acknowledged_durable_valid() -> None:
    v = oracle.check_acknowledged_durable(crash_ev("kill", "model.call.before", "turn-2", trace=ACKED, log_=GOOD_LOG))
    assert v.valid is True and "2 acknowledged append(s)" in v.details


def test_acknowledged_append_missing_from_the_log_is_invalid() -> None:
    v = oracle.check_acknowledged_durable(crash_ev("kill", "model.call.before", "turn-2", trace=ACKED, log_=GOOD_LOG[:1]))
    assert v.valid is False and v.check == "log.acknowledged_durable"
    assert "1 of 2 acknowledged append(s) not in the log: turn-1.tool-0" in v.details


def test_acknowledged_durable_not_applicable_without_log() -> None:
    ev = crash_ev("kill", "model.call.before", "turn-2", trace=ACKED)
    ev.observation.log = None
    v = oracle.check_acknowledged_durable(ev)
    assert v.valid is True and "not applicable" in v.details


# -- term.drained ------------------------------------------------------------------------

DRAIN_TRACE = [
    ("label", "node.launch", "turn-1", 1),
    ("label", "drain.begin", "run", 1),
    ("label", "log.append.after", "turn-1", 1),
]


def test_term_drained_valid() -> None:
    v = check_term_drained(crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE, rc=0))
    assert v.valid is True and "paused" in v.details


def test_term_completed_without_pending_is_valid() -> None:
    ev = crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE, rc=0, status="completed", state={"pending": []})
    assert check_term_drained(ev).valid is True


def test_term_completed_with_pending_invalid() -> None:
    ev = crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE, rc=0, status="completed", state={"pending": ["turn-2"]})
    v = check_term_drained(ev)
    assert v.valid is False and "pending nodes" in v.details


def test_term_launch_after_drain() -> None:
    trace = DRAIN_TRACE + [("label", "node.launch", "turn-2", 1), ("label", "node.launch", "turn-3", 1)]
    v = check_term_drained(crash_ev("term", "node.launch", "turn-1", trace=trace, rc=0))
    assert v.valid is False
    assert "2 node(s) launched after SIGTERM was delivered: turn-2, turn-3" in v.details


def test_term_never_recorded() -> None:
    v = check_term_drained(crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE[:1], rc=0))
    assert v.valid is False and "no drain.begin" in v.details


@pytest.mark.parametrize(
    "rc, sig, timed_out, needle",
    [(1, None, False, "exited 1, not 0"), (None, 9, False, "died of signal 9"), (None, 9, True, "grace period")],
)
def test_term_bad_exit(rc: int | None, sig: int | None, timed_out: bool, needle: str) -> None:
    v = check_term_drained(crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE, rc=rc, sig=sig, timed_out=timed_out))
    assert v.valid is False and needle in v.details


EARLY = [("label", "db.reconnect", "db", 1), ("label", "drain.begin", "run", 1)]


@pytest.mark.parametrize("status", ["pending", "absent"])
def test_term_before_the_first_worker_took_the_run_leaves_it_submitted_at_most(status: str) -> None:
    """A SIGTERM while the first worker connected or submitted the run: nothing of it ran."""
    ev = crash_ev("term", "db.reconnect", "db", trace=EARLY, rc=0, status=status, log_=[])
    ev.observation.lease_epoch = None
    ev.before = Observation(ev.observation.run_id, "absent")
    v = check_term_drained(ev)
    assert v.valid is True, v.details


@pytest.mark.parametrize("status", ["running", "interrupted"])
def test_term_in_a_resume_before_it_took_the_run_leaves_the_earlier_state(status: str) -> None:
    """A double fault: the run as the first fault left it, and a resume drained before the lease."""
    ev = crash_ev("term", "db.reconnect", "db", trace=EARLY, rc=0, status=status)
    ev.before = dataclasses.replace(ev.observation)
    assert check_term_drained(ev).valid is True
    ev.before = dataclasses.replace(ev.observation, lease_epoch=(ev.observation.lease_epoch or 0) - 1)  # it took the lease
    v = check_term_drained(ev)
    assert v.valid is False and f"run status is {status!r}, not 'paused'" in v.details


def test_term_untouched_state_with_a_launch_is_invalid() -> None:
    ev = crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE, rc=0, status="running")
    ev.before = dataclasses.replace(ev.observation)
    v = check_term_drained(ev)
    assert v.valid is False and "as before the worker, yet it launched turn-1" in v.details


def test_a_pending_run_with_records_was_touched() -> None:
    after = obs(GOOD_LOG[:1], None, "pending", None)
    assert untouched_by_worker(Observation("r", "absent"), after) is False
    assert untouched_by_worker(Observation("r", "absent"), obs([], None, "pending", None)) is True


@pytest.mark.parametrize("status", ["running", "interrupted", "failed"])
def test_term_bad_status(status: str) -> None:
    v = check_term_drained(crash_ev("term", "node.launch", "turn-1", trace=DRAIN_TRACE, rc=0, status=status))
    assert v.valid is False and f"run status is {status!r}" in v.details


def test_crash_checks_select_by_kind() -> None:
    names = lambda kind: [v.check for v in crash_verdicts(crash_ev(kind, "node.launch", "turn-1", trace=DRAIN_TRACE, rc=0))]
    always = ["log.clean_prefix", "effects.commit_with_record", "log.acknowledged_durable", "run.acknowledged_durable"]
    assert names("kill") == always
    assert names("cancel") == names("cancel-edge") == always + ["cancel.left_unknown", "cancel.step_recorded"]
    assert names("cancel-api") == always + ["cancel.step_recorded"]
    assert names("term") == always + ["term.drained", "term.in_flight_recorded"]


def test_an_acknowledged_run_must_exist_after_the_crash() -> None:
    gone = CrashEvidence(Fault("kill", CrashPoint("await", "m:f@1", "run", 1)), [], [], None, 9, False,
                         Observation("r", "absent", state_error="run does not exist"), acknowledged=True)
    v = oracle.check_acknowledged_run(gone)
    assert v.valid is False and "an accepted request was lost" in v.details and "run does not exist" in v.details
    assert oracle.check_acknowledged_run(dataclasses.replace(gone, acknowledged=False)).valid is True
    there = dataclasses.replace(gone, observation=Observation("r", "pending"))
    assert oracle.check_acknowledged_run(there).details == "acknowledged, and there: status pending"


# -- unknown: a check that raises --------------------------------------------------------


def test_run_turns_exception_into_unknown() -> None:
    v = oracle.run_check("x.y", "crash", lambda: 1 // 0)
    assert v.valid is None and v.word == "unknown"
    assert "ZeroDivisionError" in v.details and v.check == "x.y"


def test_raising_check_is_unknown_never_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(_obs: Observation) -> Verdict:
        raise KeyError("seq")

    monkeypatch.setattr(oracle, "check_clean_prefix", boom)
    verdicts = crash_verdicts(crash_ev("kill", "node.launch", "turn-1"))
    first = verdicts[0]
    assert first.check == "log.clean_prefix" and first.valid is None
    assert "KeyError" in first.details
    assert oracle.merge(verdicts) is None


def test_end_check_on_garbage_is_unknown() -> None:
    g = evidence()
    c = evidence()
    c.model_calls = {"turn-1": "many"}  # type: ignore[dict-item]  # comparing str > int raises
    verdicts = {v.check: v for v in oracle.end_checks(g, c, {})}
    assert verdicts["model.calls_billed"].valid is None
    assert verdicts["run.status"].valid is True


# -- merge -------------------------------------------------------------------------------


def V(valid: bool | None) -> Verdict:
    return Verdict("c", "end", valid)


@pytest.mark.parametrize(
    "values, expected",
    [
        ([], True),
        ([True, True], True),
        ([True, None], None),
        ([None, True, False], False),
        ([False, None], False),
        ([None, None], None),
    ],
)
def test_merge(values: list[bool | None], expected: bool | None) -> None:
    assert oracle.merge([V(v) for v in values]) is expected


def test_verdict_to_dict() -> None:
    d = Verdict("run.status", "end", None, "why", ["-x", "+y"]).to_dict()
    assert d == {"check": "run.status", "phase": "end", "verdict": "unknown", "details": "why", "diff": ["-x", "+y"],
                 "property": "prefix continuation", "anomaly": "diverged status"}
    with pytest.raises(CheckDeclarationError):  # a check nobody declared has no property, not "other"
        Verdict("a", "end", None, "why").to_dict()


# -- end checks --------------------------------------------------------------------------


def evidence(run_suffix: str = "aa", status: str = "completed") -> Evidence:
    """A finished checkout-like run; ids differ per run_suffix, the shape does not."""
    call = f"call_{run_suffix * 4}"
    ch = f"ch_{run_suffix * 4}"
    key = run_suffix * 32
    transcript = [
        {"role": "user", "content": "buy a dock"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call, "name": "charge", "arguments": {"amount": 100}}]},
        {"role": "tool", "tool_call_id": call, "content": {"id": ch, "status": "succeeded"}},
        {"role": "assistant", "content": f"charged {ch}"},
    ]
    state = {"transcript": transcript, "answer": f"charged {ch}", "budget": {"tokens": 30, "model_calls": 2}, "pending": []}
    effects = [EffectEntry(key, "turn-1.tool-0", "charge", "succeeded", {"id": ch, "status": "succeeded"}, 1)]
    o = Observation(f"cm-run-{run_suffix * 8}", status, list(GOOD_LOG), effects, state)
    ledgers = {"payment": [{"id": ch, "key": key, "amount": 100, "seq": 1, "created_at": run_suffix}]}
    return Evidence(o, ledgers, {"turn-1": 1, "turn-2": 1})


def verdicts(golden: Evidence, case: Evidence, allowance: dict[str, int] | None = None) -> dict[str, Verdict]:
    """The end checks with the identifiers learned from two golden runs, as the explorer does."""
    model, differences = oracle.learn_identifiers(evidence("aa"), evidence("zz"))
    assert differences == []
    return {v.check: v for v in oracle.end_checks(golden, case, allowance or {}, model)}


def test_end_checks_equal_runs_with_different_ids_are_valid() -> None:
    vs = verdicts(evidence("aa"), evidence("bb"))
    assert set(vs) == {"run.status", "state.equal", "transcript.exact", "effects.ledger_equal",
                       "provider.payment.ledger_equal", "model.calls_billed"}
    assert all(v.valid is True for v in vs.values()), [v.to_dict() for v in vs.values() if v.valid is not True]
    assert all(v.phase == "end" for v in vs.values())


def test_end_status_differs() -> None:
    v = verdicts(evidence("aa"), evidence("bb", status="needs_human"))["run.status"]
    assert v.valid is False and "'needs_human'" in v.details and "'completed'" in v.details


def test_end_state_differs_and_unrebuildable() -> None:
    c = evidence("bb")
    c.observation.state["budget"] = {"tokens": 45, "model_calls": 3}  # type: ignore[index]
    v = verdicts(evidence("aa"), c)["state.equal"]
    assert v.valid is False and "budget" in v.details and v.diff
    c = evidence("bb")
    c.observation.state_error = "CorruptRecord: seq 2"
    v = verdicts(evidence("aa"), c)["state.equal"]
    assert v.valid is False and "CorruptRecord: seq 2" in v.details


def test_end_transcript_duplicate_message() -> None:
    c = evidence("bb")
    t = c.observation.state["transcript"]  # type: ignore[index]
    t.insert(3, copy.deepcopy(t[2]))
    v = verdicts(evidence("aa"), c)["transcript.exact"]
    assert v.valid is False and "1 duplicated/unexpected message(s)" in v.details
    assert "missing" not in v.details and v.diff


def test_end_transcript_missing_message() -> None:
    c = evidence("bb")
    del c.observation.state["transcript"][1:3]  # type: ignore[index]
    v = verdicts(evidence("aa"), c)["transcript.exact"]
    assert v.valid is False and "2 missing message(s)" in v.details


def test_end_transcript_reordered() -> None:
    c = evidence("bb")
    t = c.observation.state["transcript"]  # type: ignore[index]
    t[0], t[3] = t[3], t[0]
    v = verdicts(evidence("aa"), c)["transcript.exact"]
    assert v.valid is False and "reordered" in v.details


def test_end_effects_status_differs() -> None:
    c = evidence("bb")
    e = c.observation.effects[0]  # type: ignore[index]
    c.observation.effects = [EffectEntry(e.key, e.node_id, e.tool, "failed", e.result, 1)]
    v = verdicts(evidence("aa"), c)["effects.ledger_equal"]
    assert v.valid is False and any('"failed"' in line for line in v.diff)


def test_end_effects_extra_row() -> None:
    c = evidence("bb")
    c.observation.effects.append(EffectEntry("cc" * 32, "turn-2.tool-0", "charge", "succeeded", {"id": "ch_cccccccc"}, 1))  # type: ignore[union-attr]
    v = verdicts(evidence("aa"), c)["effects.ledger_equal"]
    assert v.valid is False and "2 rows, golden 1" in v.details


@pytest.mark.parametrize("status", ["started", "unknown"])
def test_end_effects_unresolved_row_invalid_even_if_golden_has_it(status: str) -> None:
    g, c = evidence("aa"), evidence("bb")
    for ev in (g, c):
        e = ev.observation.effects[0]  # type: ignore[index]
        ev.observation.effects = [EffectEntry(e.key, e.node_id, e.tool, status, None, 1)]
    v = verdicts(g, c)["effects.ledger_equal"]
    assert v.valid is False and f"left unresolved: turn-1.tool-0 {status}" in v.details


def test_end_provider_extra_row_is_applied_twice() -> None:
    c = evidence("bb")
    c.ledgers["payment"].append({"id": "ch_dddddddd", "key": "dd" * 32, "amount": 100, "seq": 2})
    v = verdicts(evidence("aa"), c)["provider.payment.ledger_equal"]
    assert v.valid is False and "1 more row(s) than golden (applied twice?)" in v.details


def test_end_provider_second_charge_not_masked() -> None:
    """Same row count, but the case charged a different card: normalised ids keep it visible."""
    g, c = evidence("aa"), evidence("bb")
    c.ledgers["payment"][0]["id"] = "ch_eeeeeeee"  # a charge the transcript never mentions
    v = verdicts(g, c)["provider.payment.ledger_equal"]
    assert v.valid is False and "rows differ" in v.details


def test_end_provider_lost_row_and_volatile_fields_ignored() -> None:
    c = evidence("bb")
    c.ledgers["payment"][0]["attempts"] = 3  # volatile: ignored
    c.ledgers["payment"][0]["seq"] = 99
    assert verdicts(evidence("aa"), c)["provider.payment.ledger_equal"].valid is True
    c.ledgers["payment"].clear()
    v = verdicts(evidence("aa"), c)["provider.payment.ledger_equal"]
    assert v.valid is False and "1 fewer row(s) than golden (lost?)" in v.details


def test_end_provider_only_in_case_is_checked() -> None:
    c = evidence("bb")
    c.ledgers["mail"] = [{"id": "msg_abcdef01"}]
    v = verdicts(evidence("aa"), c)["provider.mail.ledger_equal"]
    assert v.valid is False and "applied twice" in v.details


def test_end_model_calls_over_allowance() -> None:
    c = evidence("bb")
    c.model_calls = {"turn-1": 2, "turn-2": 1}
    v = verdicts(evidence("aa"), c)["model.calls_billed"]
    assert v.valid is False and "turn-1: billed 2, at most 1 allowed" in v.details
    assert "once per model.call.before label" in v.details and "retry loop inside one label" in v.details
    assert verdicts(evidence("aa"), c, {"turn-1": 1})["model.calls_billed"].valid is True
    c.model_calls = {"turn-1": 3, "turn-2": 1}
    assert verdicts(evidence("aa"), c, {"turn-1": 1})["model.calls_billed"].valid is False


def test_end_model_calls_new_node() -> None:
    c = evidence("bb")
    c.model_calls = {"turn-1": 1, "turn-2": 1, "turn-3": 1}
    v = verdicts(evidence("aa"), c)["model.calls_billed"]
    assert v.valid is False and "turn-3: billed 1, at most 0 allowed" in v.details


def test_end_fewer_model_calls_is_fine() -> None:
    c = evidence("bb")
    c.model_calls = {"turn-1": 1}
    assert verdicts(evidence("aa"), c)["model.calls_billed"].valid is True


# -- in_flight_model_calls ---------------------------------------------------------------


def test_in_flight_model_calls() -> None:
    trace = [
        ("label", "model.call.before", "turn-1", 1),
        ("label", "log.append.after", "turn-1", 1),
        ("label", "model.call.before", "turn-2", 1),
        ("label", "model.call.before", "turn-3", 1),
        ("label", "log.append.before", "turn-3", 1),
        ("label", "log.append.after", "turn-1.tool-0", 1),
    ]
    assert oracle.in_flight_model_calls(trace) == {"turn-2": 1, "turn-3": 1}
    assert oracle.in_flight_model_calls([]) == {}
    assert oracle.in_flight_model_calls(trace[:2]) == {}


def test_effects_diff_does_not_depend_on_random_keys_or_row_order() -> None:
    """A naive runtime's second attempt charges again under a fresh random key: whichever
    key sorts first and whichever row the store returns first, the case's normalised rows
    (and so the printed diff) are the same; sorting on the raw key once made replays of
    one case print different diffs."""
    diffs = set()
    for first_key, second_key in (("0" * 64, "f" * 64), ("f" * 64, "0" * 64)):
        for reverse in (False, True):
            case = evidence("bb")
            recorded = case.observation.effects[0]
            unrecorded = EffectEntry(second_key, recorded.node_id, "charge", "succeeded", {"id": "ch_cccccccc", "status": "succeeded"}, 1)
            rows = [EffectEntry(first_key, recorded.node_id, recorded.tool, recorded.status, recorded.result, 1), unrecorded]
            case.observation.effects = list(reversed(rows)) if reverse else rows
            v = verdicts(evidence("aa"), case)["effects.ledger_equal"]
            assert v.valid is False and "2 rows, golden 1" in v.details
            diffs.add("\n".join(v.diff))
    assert len(diffs) == 1, diffs


def test_a_changed_row_pairs_with_the_most_similar_as_every_pair_compared_would() -> None:
    """``_pairs`` skips candidates by difflib's cheap upper bounds; on rows within
    ``PAIR_CHARS`` it pairs exactly as comparing every pair's full ratio did."""
    import difflib
    import random

    from crashmatrix.harness.oracle import _pairs

    rng = random.Random(7)
    words = ["charge", "mail", "dock", "usb", "key", "ok", "failed", "started", "node", "turn"]
    for _ in range(200):
        a = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(rng.randint(1, 6))]
        b = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(rng.randint(1, 6))]
        olds, news = list(range(len(a))), list(range(len(b)))
        expected, left = [], list(news)
        for i in olds:  # the brute force the function replaced
            best = max(left, key=lambda j: difflib.SequenceMatcher(None, a[i], b[j], autojunk=False).ratio(), default=None)
            if best is not None and difflib.SequenceMatcher(None, a[i], b[best], autojunk=False).ratio() > 0.6:
                expected.append((i, best))
                left.remove(best)
        assert _pairs(a, b, olds, list(news)) == expected, (a, b)


def test_long_rows_that_differ_past_their_first_characters_still_pair() -> None:
    from crashmatrix.harness.oracle import PAIR_CHARS, _diff

    golden = [{"role": "assistant", "content": "x" * (2 * PAIR_CHARS) + f"-{n}"} for n in range(30)]
    case = [{"role": "assistant", "content": "x" * (2 * PAIR_CHARS) + f"+{n}"} for n in range(30)]
    lines = _diff(golden, case)
    assert lines[0].startswith("~ role assistant: content"), lines[:2]
    # 24 paired (the limit), the 6 rows past it shown as - and + and cut
    assert lines[-1] == "... (12 more changed lines)" and all(line.startswith("~ ") for line in lines[:-1])


# -- normalised documents made once per evidence object (golden and case) -------------


def _cache_model() -> oracle.IdentifierModel:
    model, differences = oracle.learn_identifiers(evidence("aa"), evidence("zz"))
    assert differences == []
    return model


def _counting(monkeypatch) -> list[int]:
    made: list[int] = []
    real = oracle._normalise

    def counting(ev, model):
        made.append(id(ev))
        return real(ev, model)

    monkeypatch.setattr(oracle, "_normalise", counting)
    return made


def test_a_shared_final_is_normalised_once_and_judged_the_same(monkeypatch) -> None:
    model, golden, final = _cache_model(), evidence("aa"), evidence("bb")
    made = _counting(monkeypatch)
    first = oracle.end_checks(golden, final, {}, model)
    second = oracle.end_checks(golden, final, {"turn-1": 1}, model)  # a sharer: its own allowance
    assert made == [id(golden), id(final)]
    compared = lambda vs: [(v.check, v.valid, v.details) for v in vs if v.check != "model.calls_billed"]  # noqa: E731
    assert compared(first) == compared(second)
    assert "in flight at faults 1" in second[-1].details  # the allowance is the sharer's own
    assert all(v.valid for v in first + second)


def test_another_model_or_another_object_is_normalised_again(monkeypatch) -> None:
    model, golden, final = _cache_model(), evidence("aa"), evidence("bb")
    made = _counting(monkeypatch)
    oracle.end_checks(golden, final, {}, model)
    oracle.end_checks(golden, final, {}, None)  # only the declared places: another model
    twin = evidence("bb")  # equal content, another object: never taken for the first
    twin.observation.status = "needs_human"
    verdicts = {v.check: v for v in oracle.end_checks(golden, twin, {}, model)}
    assert made.count(id(final)) == 2 and id(twin) in made
    assert verdicts["run.status"].valid is False


def test_the_case_cache_keeps_the_last_used_within_its_limit(monkeypatch) -> None:
    monkeypatch.setattr(oracle, "_CASE_DOCS_LIMIT", 3)
    oracle._CASE_DOCS.clear()
    model, golden = _cache_model(), evidence("aa")
    finals = [evidence(s) for s in ("bb", "cc", "dd", "ee")]
    for f in finals:
        oracle.end_checks(golden, f, {}, model)
    assert len(oracle._CASE_DOCS) == 3 and id(finals[0]) not in oracle._CASE_DOCS
    made = _counting(monkeypatch)
    oracle.end_checks(golden, finals[0], {}, model)
    assert made == [id(finals[0])]
