"""crashmatrix.harness.pruning: the pure parts (grouping, the plan, state documents,
derived results). The grouping's soundness on real runs is tests/integration/test_pruning.py's."""

from __future__ import annotations

from crashmatrix.harness import pruning, runner
from crashmatrix.harness.adapter import EffectEntry, LogEntry, Observation
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.golden import GoldenRun
from crashmatrix.harness.iostate import GoldenIo, IoMark
from crashmatrix.harness.normalize import IdentifierModel
from crashmatrix.harness.oracle import Evidence
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan

TRACE = [
    ("label", "node.launch", "turn-1", 1),
    ("step", "step.before", "turn-1", 1),
    ("label", "model.call.before", "turn-1", 1),
    ("label", "model.call.after", "turn-1", 1),
    ("label", "log.append.before", "turn-1", 1),
    ("label", "log.append.after", "turn-1", 1),
    ("step", "step.after", "turn-1", 1),
]


def mark(sent: int, read: int = 0, opaque: int = 0) -> IoMark:
    return IoMark(0, 0, sent, read, 4, 0, opaque)


# the model call sends (3) and its answer is read (3); the append sends (5)
MARKS = [mark(0), mark(0), mark(0), mark(100, 50), mark(100, 50), mark(300, 60), mark(300, 60)]


def golden(marks: list[IoMark] | None = MARKS, twin_marks: list[IoMark] | None = None,
           twin_trace: list | None = None) -> GoldenRun:
    final = Observation("cm-run-g", "completed", log=[LogEntry(1, "turn-1", (), "model", 1)], effects=[])
    g = GoldenRun("conv1", "cm-run-g", list(TRACE), Evidence(final, {}, {"turn-1": 1}), 0.1)
    g.io = GoldenIo(marks, list(twin_trace or TRACE), list(twin_marks or marks) if marks else None)
    return g


def kill(i: int, kind: str = "kill") -> Case:
    _, name, task, occ = TRACE[i]
    return Case("checkout", "conv1", FaultPlan((Fault(kind, CrashPoint(TRACE[i][0], name, task, occ)),)))


def names(groups: list[pruning.PointGroup]) -> list[list[str]]:
    return [[e[1] for e in g.entries] for g in groups]


def test_points_with_nothing_sent_between_them_form_one_group() -> None:
    groups, why = pruning.crash_state_groups(golden())
    assert why is None
    assert names(groups) == [["node.launch", "step.before", "model.call.before"],
                             ["model.call.after", "log.append.before"], ["log.append.after", "step.after"]]


def test_a_boundary_only_the_twin_run_saw_splits_the_group() -> None:
    # the twin sent something between node.launch and step.before
    twin = MARKS[:1] + [m._replace(sent=m.sent + 7) for m in MARKS[1:]]
    groups, _ = pruning.crash_state_groups(golden(twin_marks=twin))
    assert names(groups)[:2] == [["node.launch"], ["step.before", "model.call.before"]]


def test_a_point_reached_at_another_place_of_the_other_tasks_stands_alone() -> None:
    trace = TRACE[:2] + [("label", "db.reconnect", "db", 1)] + TRACE[2:]
    marks = MARKS[:2] + [mark(0)] + MARKS[2:]
    twin_trace = [trace[0], trace[2], trace[1]] + trace[3:]  # the db task ran before step.before in the twin
    twin_marks = [marks[0], marks[2], marks[1]] + marks[3:]
    g = golden(marks, twin_marks, twin_trace)
    g.trace = trace
    groups, _ = pruning.crash_state_groups(g)
    assert names(groups)[:3] == [["node.launch"], ["step.before"], ["db.reconnect"]]


def test_an_opaque_socket_keeps_every_point_alone() -> None:
    marks = [mark(0, opaque=i + 1) for i in range(len(TRACE))]
    groups, _ = pruning.crash_state_groups(golden(marks))
    assert len(groups) == len(TRACE)


def test_without_marks_every_point_is_alone_and_the_reason_is_given() -> None:
    g = golden(None)
    g.io = GoldenIo(None, list(TRACE), None, "/proc/self/io is not readable")
    groups, why = pruning.crash_state_groups(g)
    assert len(groups) == len(TRACE) and why == "/proc/self/io is not readable"


def test_plan_groups_kill_cases_only_and_runs_the_first_of_each_in_the_given_order() -> None:
    cases = [kill(2), kill(0), kill(1), kill(5), kill(6), kill(0, "term"), kill(1, "term")]
    plan = pruning.plan_cases(cases, {"conv1": golden()}, pruning.PruneOptions(sample=0))
    assert [[c.id for c in g.cases] for g in plan.groups] == [[cases[0].id, cases[1].id, cases[2].id],
                                                              [cases[3].id, cases[4].id]]
    assert [c.id for c in cases if plan.runs(c)] == [cases[0].id, cases[3].id, cases[5].id, cases[6].id]
    assert plan.pruned == 3


def test_the_sample_is_seeded_and_a_share_of_the_members() -> None:
    cases = [kill(i) for i in range(len(TRACE))]
    goldens = {"conv1": golden()}
    a = pruning.plan_cases(cases, goldens, pruning.PruneOptions(sample=0.5, seed=3))
    b = pruning.plan_cases(cases, goldens, pruning.PruneOptions(sample=0.5, seed=3))
    members = sum(len(g.cases) - 1 for g in a.groups)
    assert a.sampled == b.sampled and len(a.sampled) == 2 == -(-members // 2)
    assert all(plan_member not in {g.representative.id for g in a.groups} for plan_member in a.sampled)


def evidence(run: str, key: str, status: str, calls: int = 1) -> Evidence:
    obs = Observation(run, "running", log=[LogEntry(1, "turn-1", (), "model", 1)],
                      effects=[EffectEntry(key, "turn-4.tool-0", "charge", status, {"charge": f"ch_{key[:8]}"}, 1)],
                      state={"transcript": [{"role": "assistant", "content": "hi"}], "answer": None,
                             "budget": {"tokens": 1}, "pending": ["turn-5"]}, lease_epoch=1)
    ledger = {"payment": [{"op": "charge", "key": key, "ref": f"ch_{key[:8]}", "status": "succeeded", "seq": 1}]}
    return Evidence(obs, ledger, {"turn-1": calls})


MODEL = IdentifierModel(places=frozenset({("effects", "*", "key"), ("ledgers", "*", "*", "key")}))


def test_state_documents_are_equal_up_to_a_renaming_of_identifiers() -> None:
    a = pruning.state_document(evidence("cm-run-a", "a" * 64, "succeeded"), MODEL)
    b = pruning.state_document(evidence("cm-run-b", "b" * 64, "succeeded"), MODEL)
    assert a == b and pruning.state_key(a) == pruning.state_key(b)


def test_state_differences_name_the_field() -> None:
    a = pruning.state_document(evidence("cm-run-a", "a" * 64, "succeeded"), MODEL)
    b = pruning.state_document(evidence("cm-run-b", "b" * 64, "started", calls=2), MODEL)
    diffs = pruning.state_differences(a, b)
    assert [d.split(":")[0] for d in diffs] == ["effects", "model_calls"], diffs


def record(crash_log: list[LogEntry], final_calls: int) -> pruning.Record:
    rep_case = kill(4)
    crash = Observation("cm-run-r", "running", log=crash_log, effects=[], lease_epoch=1)
    final = Observation("cm-run-r", "completed", log=[LogEntry(1, "turn-1", (), "model", 2)], effects=[])
    result = CaseResult(rep_case, "reference", "pass", run_id="cm-run-r",
                        workers=[{"role": "start", "signal": 9, "returncode": None}])
    return pruning.Record(Evidence(crash, {}, {}), Evidence(final, {}, {"turn-1": final_calls}), result)


def test_a_derived_case_is_judged_with_its_own_trace_on_its_representatives_state() -> None:
    # the representative was killed at log.append.before; the store acknowledged turn-1
    # without writing it (a lagging store): a member past log.append.after must fail
    lagging = record([], final_calls=1)
    after = pruning.derive(kill(5), lagging, golden())
    before = pruning.derive(kill(3), lagging, golden())
    assert after.outcome == "fail" and [v.check for v in after.failed] == ["log.acknowledged_durable"]
    assert before.outcome == "pass" and after.to_dict()["representative"] == kill(4).id
    assert after.workers == [] and after.run_id == "cm-run-r"


def test_a_derived_case_gets_its_own_allowance_of_model_calls_in_flight() -> None:
    billed_twice = record([], final_calls=2)  # the resume called the model again
    assert pruning.derive(kill(2), billed_twice, golden()).outcome == "pass"  # killed with the call in flight
    assert [v.check for v in pruning.derive(kill(1), billed_twice, golden()).failed] == ["model.calls_billed"]


def test_a_representative_that_took_another_interleaving_is_not_derived_from() -> None:
    """support_desk's parallel turns: a representative whose siblings finished in another
    order than the golden run's passed other points by its fault; its members run whole
    (followed_golden), and two resumes that committed siblings in either order are one
    final state for the sharing check (order_free)."""
    from crashmatrix.harness.pruning import followed_golden, order_free

    golden = [("label", "log.append.after", "turn-5.tool-0", 1), ("label", "log.append.after", "turn-5.tool-1", 1),
              ("step", "step.after", "turn-5.tool-1", 1)]
    from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan

    case = Case("support_desk", "goodwill", FaultPlan((Fault("kill", CrashPoint("label", "log.append.after", "turn-5.tool-1", 1)),)))
    assert followed_golden([list(e) for e in golden[:2]], golden, case)
    assert followed_golden([list(golden[1]), list(golden[0])], golden, case)  # the same points, another order
    assert not followed_golden([list(golden[1])], golden, case)  # tool-0 not yet acknowledged
    assert followed_golden(None, golden, case)
    a = {"log": [[1, "turn-5.tool-0", "tool", 1, True], [2, "turn-5.tool-1", "tool", 1, True]], "status": "completed"}
    b = {"log": [[1, "turn-5.tool-1", "tool", 1, True], [2, "turn-5.tool-0", "tool", 1, True]], "status": "completed"}
    assert a != b and order_free(a) == order_free(b)
    assert order_free(a) != order_free({**b, "log": b["log"][:1]})


def _share_run(hook: pruning.CrashStates, case: Case, outcome: str = "pass"):
    """A case run as the explorer drives the hook, up to its resume: (CaseRun, result)."""
    import types
    from pathlib import Path

    from crashmatrix.harness.case import CaseRun

    g = golden()
    result = CaseResult(case, "reference", outcome, run_id=f"cm-run-{case.id[-8:]}")
    cx = CaseRun(types.SimpleNamespace(subject="reference"), case, g, result.run_id, result, Path("."))
    cx.crash = g.evidence
    hook.docs[case.id] = {"state": "the same"}  # every case here leaves one crash state
    return cx, result


def test_a_resume_is_shared_only_once_its_owner_passed_and_a_replay_resumes_itself() -> None:
    """A flaky failure of an owner's resume must not be copied to the cases that share
    its crash state (the checkout matrix of a correct runtime once failed two term cases
    that way), and a replay of a failing case (same id) runs its own resume."""
    import asyncio

    async def scenario(owner_outcome: str) -> tuple[bool, bool, bool]:
        g = golden()
        hook = pruning.CrashStates(pruning.PruneOptions(sample=0.0), pruning.Plan(), {"conv1": g})
        (a, ra), (b, rb) = _share_run(hook, kill(0, "term")), _share_run(hook, kill(5, "term"))
        assert await hook.share_resume(a) is False  # the first of the state owns it
        waiting = asyncio.ensure_future(hook.share_resume(b))
        hook.finished(a, g.evidence)
        await asyncio.sleep(0)
        early = waiting.done()  # the sharer waits for the owner's verdict, not its final state
        replay, _ = _share_run(hook, kill(0, "term"))
        replay_shares = await hook.share_resume(replay)
        ra.outcome = owner_outcome
        hook.case_over(ra)
        return early, replay_shares, await waiting

    assert asyncio.run(scenario("pass")) == (False, False, True)
    assert asyncio.run(scenario("flaky")) == (False, False, False)
    assert asyncio.run(scenario("fail")) == (False, False, False)


def test_a_record_is_kept_while_its_group_or_a_recent_shareable_resume_may_read_it_and_no_longer() -> None:
    """The controller's memory stays bounded on a long matrix: a representative's record
    lives until its group is over; an owner's, while its resume is one of the ``keep``
    most recent of its conversation; an older state, forgotten, is owned anew by the next
    case that leaves it (it resumes itself: slower, never wrong)."""
    import asyncio

    async def scenario() -> tuple[str, set[str], set[str], bool, bool]:
        g = golden()
        cases = [kill(i) for i in range(len(TRACE))]
        plan = pruning.plan_cases(cases, {"conv1": g}, pruning.PruneOptions(sample=0))
        hook = pruning.CrashStates(pruning.PruneOptions(sample=0.0, keep=1), plan, {"conv1": g})
        rep = plan.groups[0].representative
        (r, rr), (a, ra), (b, rb) = _share_run(hook, rep), _share_run(hook, kill(3, "term")), _share_run(hook, kill(5, "term"))
        hook.docs[rep.id], hook.docs[b.case.id] = {"state": "the rep's"}, {"state": "another"}
        for cx, res in ((r, rr), (a, ra), (b, rb)):
            assert await hook.share_resume(cx) is False  # three crash states, three owners
            hook.finished(cx, g.evidence)
            hook.case_over(res)
        kept = set(hook.records)  # keep=1: b's resume is the most recent; the group still reads the rep's
        hook.group_over(rep.id)
        after = set(hook.records)
        c, _ = _share_run(hook, kill(6, "term"))  # a's crash state, forgotten: c owns it anew
        shares = await hook.share_resume(c)
        return rep.id, kept, after, shares, c.case.id in hook.owned

    rep, kept, after, shares, owns = asyncio.run(scenario())
    assert kept == {rep, kill(5, "term").id}
    assert after == {kill(5, "term").id}
    assert (shares, owns) == (False, True)


def test_cases_of_kinds_that_mostly_wait_run_in_lanes_beside_the_slots_and_one_at_a_time_kinds_never_overlap() -> None:
    """``CaseLanes``: the slots take the cases in the order given (the waiting kinds'
    too); the extra lanes take only ``net`` and ``db-restart`` cases, from the start;
    never two ``db-restart`` cases at once (they restart one server); ``--jobs 1`` has no
    extra lane."""
    plain = [kill(i) for i in range(4)]
    restart = [kill(i, "db-restart") for i in range(3)]
    lanes = runner.CaseLanes(plain + restart, jobs=2)
    assert (lanes.slots, lanes.waiting_lanes) == (2, 2)
    first = lanes.take(True)
    assert first is restart[0]
    assert lanes.take(True) is None  # only db-restart cases are left to a lane, one is in flight
    assert [lanes.take(False) for _ in range(4)] == plain
    assert lanes.take(False) is None  # the slots, too, wait for the one in flight
    lanes.done(first)
    assert lanes.take(False) is restart[1]
    lanes.done(restart[1])
    assert lanes.take(True) is restart[2]
    lanes.done(restart[2])
    assert lanes.take(True) is None and lanes.take(False) is None

    # an order that puts them first (selftest --fast's likely catchers): the slots take them first too
    lanes = runner.CaseLanes(restart[:1] + plain, jobs=4)
    assert lanes.take(False) is restart[0] and lanes.take(False) is plain[0] and lanes.take(True) is None

    assert (runner.CaseLanes(plain + restart, jobs=1).waiting_lanes) == 0
    assert (runner.CaseLanes(plain, jobs=4).waiting_lanes) == 0
    only_waits = runner.CaseLanes(restart, jobs=4)
    assert (only_waits.slots, only_waits.waiting_lanes) == (3, 2)


def test_spare_lanes_start_taking_cases_while_the_cores_idle_and_stop_once_they_are_busy(tmp_path, monkeypatch) -> None:
    """``CpuIdle`` reads the aggregate ``cpu`` line of ``/proc/stat``: the first reading is
    a baseline; a reading at least ``IDLE_SAMPLE_S`` later whose idle share (idle +
    iowait) is above ``idle`` grants one spare lane, once; one below ``busy`` retires one,
    once; between the two, neither; an unreadable file grants none.
    ``CaseLanes.pending`` says whether a case is left."""
    stat = tmp_path / "stat"
    now = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])

    def reading(user: int, idle: int, iowait: int = 0) -> None:  # user nice system idle iowait irq softirq steal
        stat.write_text(f"cpu  {user} 0 0 {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4\n")
        now[0] += runner.IDLE_SAMPLE_S

    reading(1000, 1000)
    gauge = runner.CpuIdle(0.15, 0.05, str(stat))
    assert gauge.grant() is False and gauge.retire() is False  # the baseline
    stat.write_text("cpu  1040 0 0 1050 0 0 0 0 0 0\n")  # idle, but too soon for a new reading
    assert gauge.grant() is False
    reading(1040, 1050)  # 50 of 90 ticks idle
    assert gauge.retire() is False and gauge.grant() is True and gauge.grant() is False  # one a reading
    reading(1140, 1050, 3)  # 3 of 103 idle (iowait): busy
    assert gauge.grant() is False and gauge.retire() is True and gauge.retire() is False
    reading(1190, 1055, 3)  # 5 of 55 idle: neither
    assert gauge.grant() is False and gauge.retire() is False
    assert runner.CpuIdle(0.15, 0.05, str(tmp_path / "absent")).grant() is False

    plain = [kill(i) for i in range(2)]
    lanes = runner.CaseLanes(plain, jobs=1)
    assert lanes.pending() and lanes.take(False) is plain[0] and lanes.pending()
    assert lanes.take(False) is plain[1] and not lanes.pending()
