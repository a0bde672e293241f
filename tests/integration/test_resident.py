"""Long-lived workers (``crashmatrix.harness.resident``): real processes forked by the
zygote, a real PostgreSQL, jobs handed over the controller's socket.

The subjects that leave something behind live in ``tests/subjects/leaky``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import pytest


from crashmatrix.harness.explorer import Explorer, Options
from crashmatrix.harness.plan import CrashPoint, Fault, FaultPlan
from crashmatrix.harness.pool import WorkerExit
from crashmatrix.harness.history import WorkerReport
from crashmatrix.harness.session import open_session

LEAKY = ("leaky.adapter:LeavesDescriptor", "leaky.adapter:LeavesThread", "leaky.adapter:KeepsConnection",
         "leaky.adapter:LeavesTimer", "leaky.adapter:ExitsInResume", "leaky.adapter:HangsInResume")


async def _resume(ex: Explorer, run_id: str, plan: FaultPlan = FaultPlan()) -> tuple[WorkerExit, WorkerReport]:
    job, log = ex.job("resume", "conv1", run_id, plan, ex.workdir)
    exit_ = await ex.pool.run(job, log, timeout=ex.options.worker_timeout)
    return exit_, WorkerReport.from_file(job.result_path)


def test_resumes_and_cancelled_workers_run_in_one_long_lived_worker_and_kills_fork(subjects_on_path) -> None:
    async def main() -> None:
        async with open_session("reference", "checkout") as ex:
            golden = await ex.golden("conv1")  # golden runs fork: their I/O is measured per process
            # three runs (a resume handed a run that does not exist yet starts it from its input)
            exits = [(await _resume(ex, f"cm-run-{n}-{os.getpid()}")) for n in range(3)]
            assert [e.resident for e, _ in exits] == [True, True, True]
            assert len({e.pid for e, _ in exits}) == 1, [e.pid for e, _ in exits]  # one process ran all three
            assert all(e.returncode == 0 and r.end is not None and r.end.status == "completed" for e, r in exits)
            assert all(e.cpu_ms is not None and e.cpu_ms > 0 for e, _ in exits)
            # a cancel fault: the worker outlives it, so it may run there too; a kill never does
            point = next(p for p in golden.trace if p[1] == "step.before")
            at = CrashPoint(point[0], point[1], point[2], point[3])
            ran = {}
            for kind in ("cancel", "kill"):
                job, log = ex.job("start", "conv1", f"cm-run-{kind}-{os.getpid()}", FaultPlan((Fault(kind, at),)), ex.workdir)
                ran[kind] = (await ex.pool.run(job, log, timeout=30), WorkerReport.from_file(job.result_path))
            (cancelled, report), (killed, _) = ran["cancel"], ran["kill"]
            assert report.fired is not None and report.end is not None and cancelled.returncode == 0
            assert cancelled.resident and cancelled.pid == exits[0][0].pid
            assert not killed.resident and killed.signal == 9 and killed.pid != exits[0][0].pid
            # the cancelled run's resume is another machine: never the process that ran it
            resumed, report = await _resume(ex, f"cm-run-cancel-{os.getpid()}")
            assert resumed.resident and resumed.pid != cancelled.pid and report.end is not None
            assert ex.pool.residents is not None and ex.pool.residents.started == 2

    asyncio.run(main())


def test_fresh_workers_fork_every_job() -> None:
    async def main() -> None:
        async with open_session("reference", "checkout", options=Options(long_lived=False)) as ex:
            golden = await ex.golden("conv1")
            exits = [(await _resume(ex, golden.run_id))[0] for _ in range(2)]
            assert ex.pool.residents is None
            assert not any(e.resident for e in exits) and exits[0].pid != exits[1].pid

    asyncio.run(main())


def test_what_a_production_process_keeps_stays_and_an_idle_pooled_connection_is_not_waited_for(subjects_on_path) -> None:
    """A descriptor, a thread or an idle pooled connection a job keeps stays in the
    process (a production worker keeps its pools), and the next job runs there; the
    controller's wait for a job's sessions counts only those not idle."""
    from crashmatrix.harness.errors import HarnessError

    async def main() -> None:
        async with open_session("reference", "checkout", preload=LEAKY,
                                options=Options(quiesce_timeout=1.0)) as ex:
            for subject in ("leaky.adapter:LeavesDescriptor", "leaky.adapter:LeavesThread",
                            "leaky.adapter:KeepsConnection"):
                async with ex.for_subject(subject) as other:
                    golden = await other.golden("conv1")
                    job, log = other.job("resume", "conv1", golden.run_id, FaultPlan(), other.workdir)
                    first = await other.pool.run(job, log, timeout=30)
                    second, _ = await _resume(other, f"cm-run-{subject[-6:]}-{os.getpid()}")  # another run
                    assert first.resident and first.live and second.pid == first.pid, (subject, first, second)
                    t0 = time.monotonic()
                    await other.quiesce(job.worker_id, live=True)
                    assert time.monotonic() - t0 < 0.5
                    if subject.endswith("KeepsConnection"):  # its session is there, idle: only a dead worker's waits
                        with pytest.raises(HarnessError, match="did not go away"):
                            await other.quiesce(job.worker_id)

    asyncio.run(main())


def test_tasks_and_timers_a_job_left_are_ended_as_a_forked_workers_exit_would_and_named(subjects_on_path) -> None:
    async def main() -> None:
        async with open_session("leaky.adapter:LeavesTask", "checkout", preload=LEAKY) as ex:
            golden = await ex.golden("conv1")
            job, log = ex.job("resume", "conv1", golden.run_id, FaultPlan(), ex.workdir)
            first = await ex.pool.run(job, log, timeout=30)
            second, _ = await _resume(ex, f"cm-run-next-{os.getpid()}")  # another run: the same worker may take it
            async with ex.for_subject("leaky.adapter:LeavesTimer") as other:
                timed = other.job("resume", "conv1", golden.run_id, FaultPlan(), other.workdir)
                timer = await other.pool.run(*timed, timeout=30)
                await asyncio.sleep(1.5)  # past the task's and the timer's second, had they gone on
            workdir = Path(ex.env.workdir)
            assert (workdir / f"cancelled-{job.worker_id}").exists()
            assert not (workdir / f"late-{job.worker_id}").exists()
            assert not (workdir / f"timer-{timed[0].worker_id}").exists()
            assert first.left == ["task leaky.adapter:LeavesTask.resume.<locals>.late"], first.left
            assert timer.left == ["timer pathlib:Path.touch"], timer.left
            assert first.resident and second.pid == first.pid and second.left == first.left  # each job its own

    asyncio.run(main())


def test_a_worker_that_dies_or_hangs_in_a_job_is_reported_as_a_forked_one_and_replaced(subjects_on_path) -> None:
    async def main() -> None:
        async with open_session("reference", "checkout", preload=LEAKY) as ex:
            async with ex.for_subject("leaky.adapter:ExitsInResume") as other:
                golden = await other.golden("conv1")
                died, report = await _resume(other, golden.run_id)
                assert died.resident and died.returncode == 3 and died.signal is None and report.end is None
                again, _ = await _resume(other, golden.run_id)
                assert again.returncode == 3 and again.pid != died.pid
            async with ex.for_subject("leaky.adapter:HangsInResume") as other:
                golden = await other.golden("conv1")
                job, log = other.job("resume", "conv1", golden.run_id, FaultPlan(), other.workdir)
                t0 = time.monotonic()
                hung = await other.pool.run(job, log, timeout=1.0)
                assert hung.resident and hung.timed_out and hung.signal == 9, hung
                assert time.monotonic() - t0 < 10
            healthy, _ = await _resume(ex, golden.run_id)  # the reference's own resident still serves
            assert healthy.resident and healthy.returncode == 0

    asyncio.run(main())


def _verdicts(report) -> dict[str, tuple[str, set[str]]]:
    return {r.case.id: (r.outcome, {v.check for v in r.failed}) for r in report.results}


def test_warm_worker_resumes_in_a_process_that_ran_the_conversation_and_finds_state_it_left(subjects_on_path) -> None:
    """A runtime that memoises effect outcomes per process by node id is right in fresh
    workers and wrong in a warm one: the policy runs its first resume where the memo is
    full, and the end checks see outcomes of another run in this one."""
    from crashmatrix.harness.matrix import run_matrix
    from crashmatrix.harness.plan import Resume

    warm = Resume("warm-worker")
    memo = "leaky.adapter:MemoizesEffectsByNode"
    caught = asyncio.run(run_matrix("checkout", memo, kinds=("kill",), conversations=("conv1",), resume=warm,
                                    replay_failures=0))
    failed = {case: checks for case, (outcome, checks) in _verdicts(caught).items() if outcome == "fail"}
    # an effect's outcome taken from another run: the effects ledger holds it, and a charge
    # or mail of this run made before the fault is all the provider saw
    assert failed and all("effects.ledger_equal" in checks for checks in failed.values()), failed
    assert any("provider.payment.ledger_equal" in checks for checks in failed.values()), failed
    assert caught.counts["harness-error"] == 0
    ran_warm = [r for r in caught.results if any(v.check == "warm.worker" and v.details.startswith("the resume ran in")
                                                 for v in r.verdicts)]
    assert ran_warm and all(any(w.get("role") == "warm-up" for w in r.workers) for r in ran_warm)
    # the same cases in fresh workers: nothing to find, and the policy says it did not apply
    fresh = asyncio.run(run_matrix("checkout", memo, kinds=("kill",), conversations=("conv1",), resume=warm,
                                   options=Options(long_lived=False), replay_failures=0))
    assert fresh.counts["fail"] == 0 and fresh.counts["harness-error"] == 0, [
        (r.case.id, [(v.check, v.details) for v in r.failed]) for r in fresh.results if r.outcome != "pass"][:3]
    assert all(any(v.check == "warm.worker" and v.details.startswith("not applicable") for v in r.verdicts)
               for r in fresh.results if r.workers)
    # and the reference runtime keeps nothing between runs
    clean = asyncio.run(run_matrix("checkout", "reference", kinds=("kill",), conversations=("conv1",), resume=warm,
                                   replay_failures=0))
    assert clean.counts["fail"] == 0 and clean.counts["harness-error"] == 0, [
        (r.case.id, [(v.check, v.details) for v in r.failed]) for r in clean.results if r.outcome != "pass"][:3]


def test_a_failure_replays_in_forked_workers_unless_its_policy_resumes_in_a_warm_one(subjects_on_path) -> None:
    """The memoising runtime fails the default matrix only where a long-lived worker
    ran another run first; its failures replay in workers forked for the replay, pass
    there (flaky), and the report names the long-lived worker. A warm-worker case
    replays in a long-lived worker again: that is what it tests."""
    from crashmatrix.harness.matrix import run_matrix
    from crashmatrix.harness.plan import Resume
    from crashmatrix.harness.report import warm_process_note

    memo = "leaky.adapter:MemoizesEffectsByNode"
    report = asyncio.run(run_matrix("checkout", memo, kinds=("kill",), conversations=("conv1",), replay_failures=1))
    replayed = [r for r in report.results if r.replays]
    assert replayed, _verdicts(report)
    assert all(not w.get("resident") for r in replayed for rep in r.replays for w in rep.workers), [
        (r.case.id, [rep.workers for rep in r.replays]) for r in replayed][:2]
    assert all(r.outcome == "flaky" and r.replays[-1].outcome == "pass" for r in replayed), _verdicts(report)
    assert all("ran in a long-lived worker after" in (warm_process_note(r) or "") for r in replayed)
    case = replayed[0].case
    warm = asyncio.run(run_matrix("checkout", memo, cases=[dataclasses.replace(case, resume=Resume("warm-worker"))],
                                  replay_failures=1))
    (result,) = warm.results
    assert result.outcome == "fail" and result.replays, _verdicts(warm)
    assert any(w.get("resident") for rep in result.replays for w in rep.workers), [rep.workers for rep in result.replays]


def test_a_start_that_leaves_the_golden_path_in_a_warm_worker_is_the_subjects_failure(subjects_on_path) -> None:
    """Cancelled workers start their runs in long-lived workers; a runtime whose process
    state changes the run's path (its memo answers an effect, so the call's labels are
    never reached) fails ``worker.warm_path``, never a harness error; forked, it passes."""
    from crashmatrix.harness.matrix import run_matrix

    memo = "leaky.adapter:MemoizesEffectsByNode"
    warm = asyncio.run(run_matrix("checkout", memo, kinds=("cancel",), conversations=("conv1",), replay_failures=0))
    paths = [r for r in warm.results if any(v.check == "worker.warm_path" for v in r.failed)]
    assert paths and warm.counts["harness-error"] == 0, warm.counts
    assert all(r.workers[0].get("resident") and r.workers[0].get("jobs_before") for r in paths)
    fresh = asyncio.run(run_matrix("checkout", memo, kinds=("cancel",), conversations=("conv1",), replay_failures=0,
                                   options=Options(long_lived=False)))
    assert fresh.counts["fail"] == 0 and fresh.counts["harness-error"] == 0, fresh.counts


def test_same_worker_resumes_a_cancelled_run_in_the_process_its_cancellation_struck(subjects_on_path) -> None:
    """A runtime that keeps a cancelled run's graph in memory and resumes from it is right
    when another process resumes (the default), wrong in the one the cancellation struck:
    ``same-worker`` resumes there, once the cancelled job has ended. A kill leaves no
    process to resume in ("not applicable"); the reference runtime passes."""
    from crashmatrix.harness.matrix import run_matrix
    from crashmatrix.harness.plan import Case, Resume

    kept = "leaky.adapter:KeepsGraphAfterCancel"
    points = ["step.after[turn-1]#1", "log.append.after[turn-4.tool-0]#1", "model.call.before[turn-5]#1"]
    cases = [Case.parse(f"checkout/conv1/cancel@{p}/same-worker") for p in points]
    caught = asyncio.run(run_matrix("checkout", kept, cases=cases, replay_failures=0))
    assert caught.counts["fail"] == len(cases) and caught.counts["harness-error"] == 0, caught.counts
    for r in caught.results:
        start, resume = r.workers[0], r.workers[1]
        assert start["resident"] and resume["same"] and resume["pid"] == start["pid"], r.workers
        assert resume["jobs_before"] == 1  # its own start, nothing else
        assert "run.status" in {v.check for v in r.failed}, [(v.check, v.details) for v in r.failed]
        assert any(v.check == "same.worker" and v.details.startswith(f"the resume ran in worker {start['pid']}")
                   for v in r.verdicts)
    # resumed in another process, as by default, the kept graph is never read
    elsewhere = [dataclasses.replace(c, resume=Resume()) for c in cases]
    fine = asyncio.run(run_matrix("checkout", kept, cases=elsewhere, replay_failures=0))
    assert fine.counts["pass"] == len(cases), _verdicts(fine)
    # a kill ends the process: nothing to resume in, said so, resumed as usual
    kill = Case.parse(f"checkout/conv1/kill@{points[1]}/same-worker")
    clean = asyncio.run(run_matrix("checkout", "reference", cases=[*cases, kill], replay_failures=0))
    assert clean.counts["pass"] == len(cases) + 1, _verdicts(clean)
    by_id = {r.case.id: r for r in clean.results}
    assert [v.details for v in by_id[kill.id].verdicts if v.check == "same.worker"] == [
        "not applicable: a kill fault ends its worker's process; the resume ran in a fresh worker"]
    assert all(w.get("same") for r in clean.results if r.case.id != kill.id for w in r.workers[1:2])


def test_same_worker_after_a_stopping_fault_resumes_where_the_worker_woke_unless_its_run_was_taken_over() -> None:
    """cancel-api and restore stop the worker, act on its run, wake it: its job ends in
    its own process, and ``same-worker`` resumes there. A pause's run is taken over by
    other workers while its worker sleeps, so there is no resume after its job in that
    process: not applicable, said so, and no harness error (the takeover once ran in
    the sleeping resident, whose reply it was still waiting for)."""
    from crashmatrix.harness.matrix import run_matrix
    from crashmatrix.harness.plan import Case

    point = "log.append.after[turn-5.tool-0]#1"
    cases = [Case.parse(f"checkout/conv1/{kind}@{point}/same-worker") for kind in ("pause", "cancel-api", "restore")]
    report = asyncio.run(run_matrix("checkout", "reference", cases=cases, replay_failures=0))
    assert report.counts["pass"] == len(cases), _verdicts(report)
    by_kind = {r.case.plan.faults[0].kind: r for r in report.results}
    said = {k: [v.details for v in r.verdicts if v.check == "same.worker"] for k, r in by_kind.items()}
    assert said["pause"] == ["not applicable: a pause fault's run is resumed by other workers while the faulted one "
                             "sleeps, before its job ends in that process; the resume ran in a fresh worker"], said
    for kind in ("cancel-api", "restore"):
        start = by_kind[kind].workers[0]
        assert start["resident"] and said[kind] == [f"the resume ran in worker {start['pid']}, the process the "
                                                    f"{kind} fault struck, after its job had ended"], (kind, said)


def test_a_context_variable_a_job_set_does_not_reach_the_next_job(subjects_on_path) -> None:
    """A runtime that sets the logical task and never resets it (a context variable of
    its job) passes cancel cases run in long-lived workers: each job runs in a fresh
    copy of the worker's context. With one context shared by every job, the next job
    started inside the leftover task and left the golden path (``worker.warm_path``)."""
    from crashmatrix.harness.matrix import run_matrix

    report = asyncio.run(run_matrix("checkout", "leaky.adapter:LeavesLogicalTask", kinds=("cancel",),
                                    conversations=("conv1",), replay_failures=0))
    resident = [w for r in report.results for w in r.workers if w.get("resident")]
    failed = [(r.case.id, r.error) for r in report.results if r.outcome not in ("pass", "not-run")]
    assert len(resident) > 20 and failed == [], failed[:3]
