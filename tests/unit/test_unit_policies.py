"""crashmatrix.harness.policies and plan.Resume: the resume policies' pure parts (ids,
who gets the input, the checks on worker reports and ledgers); the policies run for
real in tests/integration/test_resume_policies.py and the selftest."""

from __future__ import annotations

import pytest

from crashmatrix.harness.adapter import Adapter
from crashmatrix.harness.errors import PlanError
from crashmatrix.harness.history import End, TraceEntry, WorkerReport
from crashmatrix.harness.plan import RESUME_POLICIES, Case, Resume
from crashmatrix.harness.policies import POLICIES, Concurrent, check_effects_once, hands_input, policy_of
from crashmatrix.harness.pool import WorkerExit
from crashmatrix.reference_runtime.attempts import attempts_without_progress
from crashmatrix.reference_runtime.leases import Lease

BASE = "checkout/conv1/kill@log.append.before[turn-4]#1"


def test_a_policy_is_the_case_id_s_last_component_and_round_trips() -> None:
    assert Case.parse(BASE).resume == Resume() and Case.parse(BASE).id == BASE
    for label, resume in (("concurrent", Resume("concurrent")), ("concurrent=3", Resume("concurrent", 3)),
                          ("recurring", Resume("recurring")), ("discovery", Resume("discovery")),
                          ("input-once", Resume("input-once")), ("redelivery", Resume("redelivery"))):
        case = Case.parse(f"{BASE}/{label}")
        assert case.resume == resume and case.id == f"{BASE}/{label}" and Resume.parse(label) == resume
    assert set(POLICIES) == set(RESUME_POLICIES)
    assert type(policy_of(Resume("concurrent"))) is Concurrent


@pytest.mark.parametrize(("text", "message"), [
    (f"{BASE}/sideways", "resume='sideways' must be one of default, concurrent"),
    (f"{BASE}/default", "the default resume policy is written as no component"),
    (f"{BASE}/concurrent=1", "resume workers=1 must be an integer from 2 to 16"),
    (f"{BASE}/recurring=2", "only 'concurrent' takes a number of workers"),
])
def test_a_bad_policy_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        Case.parse(text)


class _Declares(Adapter):
    async def prepare(self, env): ...  # type: ignore[no-untyped-def]
    async def start(self, ctx): ...  # type: ignore[no-untyped-def]
    async def resume(self, ctx): ...  # type: ignore[no-untyped-def]
    async def observe(self, env, run_id): ...  # type: ignore[no-untyped-def]


def test_who_is_handed_the_input() -> None:
    redelivered, stored = _Declares(), _Declares()
    stored.expects_redelivery = False
    for adapter in (redelivered, stored):
        assert hands_input(adapter, Resume(), 0, True)  # the first worker always
        assert hands_input(adapter, Resume("input-once"), 1, False)  # not acknowledged: the caller retries
        assert not hands_input(adapter, Resume("input-once"), 1, True)
        assert hands_input(adapter, Resume("redelivery"), 1, True)
    assert hands_input(redelivered, Resume(), 2, True) and not hands_input(stored, Resume(), 2, True)
    assert not hands_input(stored, Resume("concurrent"), 1, True)


def _report(status: str, steps: bool, error: str | None = None, waits: bool = False) -> WorkerReport:
    trace = [TraceEntry("step", "step.before", "turn-5", 1)] if steps else []
    trace += [TraceEntry("label", "human.wait", "human-turn-5-1", 1)] if waits else []
    return WorkerReport([End(status, trace, error)])


def _exit(rc: int) -> WorkerExit:
    return WorkerExit(1, rc, None, 0.1)


def test_a_fenced_loser_and_two_owners() -> None:
    terminal = ("completed", "failed")
    fenced = Concurrent._loser_fenced([_report("completed", True), _report("error", True, "LeaseLost: stale")],
                                      [_exit(0), _exit(1)], terminal)
    assert fenced.valid is True and "refused: LeaseLost" in fenced.details
    # a runtime that says it was refused by returning "fenced" instead of raising
    said = Concurrent._loser_fenced([_report("completed", True), _report("fenced", True)], [_exit(0), _exit(0)], terminal)
    assert said.valid is True and "refused: fenced" in said.details
    late = Concurrent._loser_fenced([_report("completed", True), _report("completed", False)], [_exit(0), _exit(0)], terminal)
    assert late.valid is True  # the second found the run done and ran nothing
    both = Concurrent._loser_fenced([_report("completed", True), _report("completed", True)], [_exit(0), _exit(0)], terminal)
    assert both.valid is False and "no loser fenced" in both.details
    # each owner's steps are named, so two owners of different steps read as what they are
    ran_apart = WorkerReport([End("completed", [TraceEntry("step", "step.before", "plan", 1)], None)]), \
        WorkerReport([End("completed", [TraceEntry("step", "step.before", t, 1) for t in ("charge", "mail")], None)])
    apart = Concurrent._loser_fenced(list(ran_apart), [_exit(0), _exit(0)], terminal)
    assert apart.valid is False and "resumer 1 ran plan; resumer 2 ran charge, mail" in apart.details
    # a second owner that ran steps and left the run unfinished is an owner too
    half = Concurrent._loser_fenced([_report("completed", True), _report("interrupted", True)], [_exit(0), _exit(0)], terminal)
    assert half.valid is False and "they ended completed, interrupted" in half.details
    # each stopped at the run's wait for a person and took it back after the answer: a
    # hand-over; one that ran on without waiting is still a second owner
    handed = Concurrent._loser_fenced([_report("completed", True, waits=True), _report("needs_human", True, waits=True)],
                                      [_exit(0), _exit(0)], terminal)
    assert handed.valid is True and "handing the run over" in handed.details
    one_ran_on = Concurrent._loser_fenced([_report("completed", True, waits=True), _report("completed", True)],
                                          [_exit(0), _exit(0)], terminal)
    assert one_ran_on.valid is False
    split = Concurrent._one_status([_report("completed", True), _report("failed", True)], "completed", terminal)
    assert split.valid is False and "completed, failed" in split.details
    assert Concurrent._one_status([_report("completed", True)], "running", terminal).valid is False


def test_effects_once_counts_rows_per_operation_against_the_golden_run() -> None:
    golden = {"payment": [{"op": "charge", "key": "a"}], "mail": [{"op": "message", "key": "m"}]}
    assert check_effects_once("x", golden, golden).valid is True
    twice = check_effects_once("x", golden, {"payment": [{"op": "charge", "key": "a"}, {"op": "charge", "key": "b"}]})
    assert twice.valid is False and "payment charge: 2 row(s), golden 1" in twice.details


def test_attempts_without_progress_counts_epochs_after_the_newest_record() -> None:
    assert attempts_without_progress(Lease("r", "w", 1, progress_epoch=0)) == 0  # the first attempt
    assert attempts_without_progress(Lease("r", "w", 3, progress_epoch=2)) == 0  # the last attempt appended
    assert attempts_without_progress(Lease("r", "w", 7, progress_epoch=1)) == 5  # five in a row appended nothing


def test_the_start_gate_holds_each_resumer_until_all_have_arrived(tmp_path) -> None:
    import threading
    import time

    from crashmatrix.harness.worker import Job, wait_at_gate

    gate = tmp_path / "gate"
    gate.mkdir()
    left: dict[str, float] = {}

    def party(worker_id: str, delay: float) -> None:
        time.sleep(delay)
        assert wait_at_gate(str(gate), 2, worker_id, limit_s=5)
        left[worker_id] = time.monotonic()

    t0 = time.monotonic()
    threads = [threading.Thread(target=party, args=("cmw-1", 0.0)), threading.Thread(target=party, args=("cmw-2", 0.2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert min(left.values()) - t0 >= 0.2  # the first waited for the second
    # a party that never comes does not hold the one that did for longer than the limit
    alone = tmp_path / "alone"
    alone.mkdir()
    assert wait_at_gate(str(alone), 2, "cmw-3", limit_s=0.05) is False
    from crashmatrix.harness.adapter import Environment
    from crashmatrix.harness.plan import FaultPlan

    job = Job("resume", "s", "w", "c", "r", "cmw-4", Environment("dsn", {}, "dir"), FaultPlan(), "x",
              start_gate=str(gate), gate_parties=3, hold_at=("tool.request.before", "turn-4.tool-0"), lead=True)
    assert Job.from_dict(job.to_dict()) == job


def test_a_held_lead_waits_for_the_others_to_end_and_they_wait_for_it_to_hold(tmp_path) -> None:
    """worker.Lead: the followers start once the lead is at its hold point; the lead goes
    on once they ended; either side waits no longer than its limit for a party that
    never comes."""
    import threading
    import time

    from crashmatrix.harness.worker import Lead

    gate = tmp_path / "gate"
    gate.mkdir()
    events: list[str] = []

    def lead() -> None:
        held = Lead(str(gate), ("tool.request.before", "turn-4.tool-0"), parties=2)
        assert held.reached("step.before", "turn-4.tool-0") is False  # not the hold point
        time.sleep(0.1)
        events.append("lead at hold")
        assert held.reached("tool.request.before", "turn-4.tool-0", limit_s=5) is True
        events.append("lead goes on")
        assert held.reached("tool.request.before", "turn-4.tool-0") is False  # holds once

    def follower() -> None:
        assert Lead.follow(str(gate), limit_s=5)
        events.append("follower starts")
        time.sleep(0.1)
        events.append("follower ends")
        Lead.followed(str(gate), "cmw-2")

    threads = [threading.Thread(target=follower), threading.Thread(target=lead)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert events == ["lead at hold", "follower starts", "follower ends", "lead goes on"]
    alone = tmp_path / "alone"
    alone.mkdir()
    assert Lead(str(alone), ("x", "t"), parties=2).reached("x", "t", limit_s=0.05) is False  # nobody follows
    assert Lead.follow(str(tmp_path / "nobody"), limit_s=0.05) is False  # no lead ever holds
    ended = tmp_path / "ended"
    ended.mkdir()
    Lead(str(ended), ("x", "t"), parties=2).ended()  # a lead that ended before its hold point
    assert Lead.follow(str(ended), limit_s=0.05) is True


def test_the_hold_point_is_one_of_the_points_after_the_fault_chosen_by_the_case_id() -> None:
    from crashmatrix.harness.history import TraceEntry
    from crashmatrix.harness.policies import HOLD_CHOICES, hold_point

    trace = [TraceEntry("label", name, task, 1) for name, task in [
        ("step.before", "turn-1"), ("effect.started.after", "turn-1.tool-0"), ("tool.request.before", "turn-1.tool-0"),
        ("tool.request.after", "turn-1.tool-0"), ("log.append.before", "turn-1.tool-0"),
        ("log.append.after", "turn-1.tool-0"), ("step.before", "turn-2"), ("step.after", "turn-2"),
        ("log.append.before", "turn-2"), ("log.append.after", "turn-2")]]
    fault = ("effect.started.after", "turn-1.tool-0", 1)
    after = [(e.name, e.task) for e in trace[2:2 + HOLD_CHOICES]]
    chosen = {hold_point(f"checkout/conv1/kill@x#{i}/concurrent", trace, fault) for i in range(200)}
    assert chosen == {None, *after}  # all start together, or the lead holds at one of the next points
    case = "checkout/conv1/kill@effect.started.after[turn-1.tool-0]#1/concurrent"
    assert hold_point(case, trace, fault) == hold_point(case, trace, fault)  # a replay holds at the same place
    assert hold_point(case, trace, ("nowhere", "t", 1)) is None  # a point the golden run did not pass
    assert hold_point(case, trace[:2], fault) is None  # nothing after the fault's point


def test_a_point_gate_holds_each_party_at_its_point_until_all_are_there(tmp_path) -> None:
    """worker.PointGate: a party waits at its first passage of the point (not before, not
    at a second passage) until every party has passed it or ended; Job.gate_at round-trips."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from crashmatrix.harness.adapter import Environment
    from crashmatrix.harness.plan import FaultPlan
    from crashmatrix.harness.worker import Job, PointGate

    gate = tmp_path / "gate"
    gate.mkdir()
    at = ("recovery.listed", "recovery")
    left: dict[str, float] = {}

    def party(worker_id: str, delay: float) -> None:
        g = PointGate(str(gate), at, 2, worker_id)
        g.reached("step.before", "model-1")  # another point: no wait
        time.sleep(delay)
        g.reached(*at)
        left[worker_id] = time.monotonic()
        g.reached(*at)  # a second passage: no wait
        g.ended()

    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(party, ("cmw-1", "cmw-2"), (0.0, 0.3)))
    assert min(left.values()) - t0 >= 0.3  # the first waited at the point for the second
    # a party that ends without reaching the point releases the one waiting there
    early = tmp_path / "early"
    early.mkdir()
    PointGate(str(early), at, 2, "cmw-3").ended()
    t1 = time.monotonic()
    PointGate(str(early), at, 2, "cmw-4").reached(*at)
    assert time.monotonic() - t1 < 1.0
    job = Job("resume", "s", "w", "c", "r", "cmw-4", Environment("dsn", {}, "dir"), FaultPlan(), "x",
              start_gate=str(gate), gate_parties=2, gate_at=at)
    assert Job.from_dict(job.to_dict()) == job


def test_other_executor_is_not_applicable_without_the_declaration() -> None:
    from crashmatrix.harness.explorer import Options

    policy = policy_of(Resume("other-executor"))
    from types import SimpleNamespace

    assert Adapter.recovers_other_executor is False
    why = policy.not_applicable(SimpleNamespace(name="no-other"), Options())  # type: ignore[arg-type]
    assert why is not None and "recovers_other_executor" in why and "no-other" in why
    declared = SimpleNamespace(name="other", recovers_other_executor=True)
    assert policy.not_applicable(declared, Options()) is None  # type: ignore[arg-type]
