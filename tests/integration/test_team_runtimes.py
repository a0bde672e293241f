"""Correct runtimes written the ways other teams write them pass with no false alarm;
the defect planted in each is caught, and is the only failure.

``tests/subjects/teamruntimes``: keys made once and stored before the send (uuid4, uuid
hex, ULID, a PostgreSQL sequence, base64), a runtime with status names of its own and one
that mints its own tool-call ids. The
CI suite runs shard 1/11 of the default matrix per runtime (every conversation, kill, term
and cancel, steps and labels); the whole matrices are a run of ``crashmatrix run --subject
teamruntimes.keys:UuidKeyAdapter`` with ``PYTHONPATH=tests/subjects``.
"""

from __future__ import annotations

import asyncio

import pytest

from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case

CORRECT = ["keys:UuidKeyAdapter", "keys:UuidHexKeyAdapter", "keys:UlidKeyAdapter", "keys:SequenceKeyAdapter",
           "keys:Base64KeyAdapter", "statuses:OwnStatusAdapter", "callids:OwnCallIdAdapter"]
PLANTED = ["keys:FreshUuidKeyAdapter", "keys:FreshSequenceKeyAdapter", "keys:FreshUlidKeyAdapter",
           "statuses:FreshKeyOwnStatusAdapter"]
# what a key made afresh on every attempt does after the provider answered: charges again
DOUBLE_CHARGE = {"provider.payment.ledger_equal", "effects.ledger_equal", "effects.resolved"}


pytestmark = pytest.mark.usefixtures("subjects_on_path")


@pytest.mark.parametrize("subject", CORRECT)
def test_a_correct_team_runtime_passes_a_shard_of_the_default_matrix(subject: str) -> None:
    # the default's kinds at every point; 11 is prime to the 3 kinds: the shard holds kill,
    # term and cancel cases (a shard of 12 would hold kills only: cases come kill, term,
    # cancel per point)
    report = asyncio.run(run_matrix("checkout", f"teamruntimes.{subject}", kinds=("kill", "term", "cancel"),
                                    shard_spec="1/11"))
    failed = [(r.case.id, r.outcome, [(v.check, v.details[:300]) for v in r.failed], r.error,
               [w.get("shared") for w in r.workers if w.get("shared")]) for r in report.results if r.outcome != "pass"]
    assert failed == [] and report.golden_results == [], failed[:4]
    assert len(report.results) > 80 and {r.case.plan.faults[0].kind for r in report.results} == {"kill", "term", "cancel"}


def test_sequence_keys_survive_a_database_restart_on_the_second_server() -> None:
    """db-restart cases run on a second PostgreSQL while the providers keep every run's
    keys: a runtime whose keys come from a database sequence must not mint, there, keys
    the main server's runs used (the provider's 409 was a false alarm of the harness's;
    db_restart.carry_sequences)."""
    cases = [Case.parse(f"checkout/conv1/db-restart@{p}") for p in
             ("model.call.before[turn-2]#1", "tool.request.before[turn-4.tool-0]#1")]
    report = asyncio.run(run_matrix("checkout", "teamruntimes.keys:SequenceKeyAdapter", cases=cases))
    failed = [(r.case.id, [(v.check, v.details) for v in r.failed], r.error) for r in report.results if r.outcome != "pass"]
    assert failed == [] and len(report.results) == 2, failed


@pytest.mark.parametrize("subject", PLANTED)
def test_the_planted_defect_is_caught_and_is_the_only_failure(subject: str) -> None:
    cases = [Case.parse("checkout/conv3/kill@tool.request.after[turn-4.tool-0]#1"),   # after the charge answered
             Case.parse("checkout/conv3/kill@model.call.before[turn-4]#1"),            # before the charge exists
             Case.parse("checkout/conv3/kill@log.append.after[turn-6.tool-0]#1")]     # after the refund recorded
    report = asyncio.run(run_matrix("checkout", f"teamruntimes.{subject}", cases=cases, replay_failures=0))
    caught, before, after = report.results
    assert caught.outcome == "fail"
    assert {v.check for v in caught.failed} <= DOUBLE_CHARGE and "provider.payment.ledger_equal" in {v.check for v in caught.failed}
    assert "charge applied twice" in next(v.details for v in caught.failed if v.check == "provider.payment.ledger_equal")
    assert before.outcome == after.outcome == "pass", [v.to_dict() for v in before.failed + after.failed]


def test_a_golden_run_the_subject_cannot_finish_is_its_failure_not_a_harness_error() -> None:
    """conv2 raises in the subject with no fault: that golden run fails ``run.ends`` with
    what the subject raised (exit 1), its conversation runs no case, conv1 is judged."""
    report = asyncio.run(run_matrix("checkout", "teamruntimes.stuck:RejectsConv2Adapter",
                                    cases=[Case.parse("checkout/conv2/golden"), Case.parse("checkout/conv1/golden")]))
    by_id = {g.case.id: g for g in report.golden_results}
    assert by_id["checkout/conv1/golden"].outcome == "pass"
    broken = by_id["checkout/conv2/golden"]
    assert broken.outcome == "fail" and [v.check for v in broken.failed] == ["run.ends"]
    assert "did not complete: it raised" in broken.failed[0].details and "unsupported schema" in broken.failed[0].details
    assert report.exit_code == 1


def test_a_conversation_needing_a_person_the_adapter_does_not_answer_is_not_applicable() -> None:
    """support_desk/goodwill waits for the workload's operator (the reference runtime's
    handoff protocol); a subject that does not answer it gets a note naming why, no
    failure, and the other conversations are judged as usual."""
    report = asyncio.run(run_matrix("support_desk", "teamruntimes.stuck:NoOperatorAdapter", kinds=("kill",),
                                    conversations=("goodwill", "declined"), shard_spec="1/9"))
    assert report.golden_results == [] and report.exit_code == 0, [g.error for g in report.golden_results]
    assert {r.case.conversation for r in report.results} == {"declined"} and report.results
    [note] = [n for n in report.notes if n.startswith("not applicable")]
    assert "support_desk/goodwill" in note and "workload.operator" in note and "answers_operator" in note


def test_a_runtime_that_never_takes_a_run_from_a_live_owner_declares_it_and_pause_wakes_the_owner() -> None:
    """advisory:AdvisoryAdapter refuses a second worker while the first one's session
    holds the run's advisory lock (a frozen worker included). Declared
    (``takes_over_live_owner = False``), its ``pause`` cases wake the stopped worker as
    the owner, which finishes the run as the golden run did: the fault could not take
    effect, and the case is reported not run. Undeclared,
    the harness takes the refused takeover for a failed resume and the woken owner for a
    zombie (the false alarm the blind set of 2026-12-02 found)."""
    cases = [Case.parse("checkout/conv2/pause@tool.request.after[turn-2.tool-0]#1"),
             Case.parse("checkout/conv1/pause@step.after[turn-4.tool-0]#1")]
    declared = asyncio.run(run_matrix("checkout", "teamruntimes.advisory:AdvisoryAdapter", cases=cases, replay_failures=0))
    # with no takeover the woken owner ends the run as the golden run did: the pause could
    # not take effect, which the report says (not run), never a pass and never a failure
    outcomes = [(r.outcome, r.error or "") for r in declared.results]
    assert len(outcomes) == 2 and all(o == "not-run" and "could not take effect" in e for o, e in outcomes), outcomes
    assert declared.exit_code == 0
    undeclared = asyncio.run(run_matrix("checkout", "teamruntimes.advisory:UndeclaredAdvisoryAdapter", cases=cases,
                                        replay_failures=0))
    failed = {v.check for r in undeclared.results for v in r.failed}
    assert "pause.zombie_fenced" in failed and "resume.runs" in failed, failed


def test_a_golden_run_whose_worker_never_returns_is_the_subject_s_run_ends() -> None:
    """conv2's worker completes the run and never returns: killed at the worker deadline,
    its golden run fails ``run.ends`` (the subject's hang, not a harness error); conv1 is
    judged."""
    from crashmatrix.harness.explorer import Options

    report = asyncio.run(run_matrix("checkout", "teamruntimes.stuck:HangsOnConv2Adapter",
                                    cases=[Case.parse("checkout/conv2/golden"), Case.parse("checkout/conv1/golden")],
                                    options=Options(worker_timeout=6.0)))
    by_id = {g.case.id: g for g in report.golden_results}
    assert by_id["checkout/conv1/golden"].outcome == "pass"
    broken = by_id["checkout/conv2/golden"]
    assert broken.outcome == "fail" and [v.check for v in broken.failed] == ["run.ends"]
    assert "did not return within the worker deadline" in broken.failed[0].details, broken.failed[0].details
    assert report.exit_code == 1
