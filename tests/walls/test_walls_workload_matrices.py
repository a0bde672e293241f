"""A representative slice of each non-checkout workload's matrix (research, long_run,
human_pause, report), under both store strategies, with real SIGKILL/SIGTERM/cancel
faults, forked workers and the providers in their own processes.

One session (PostgreSQL, the three providers, the zygote) serves every workload and
subject; each workload's golden run is made once on the append-only subject and is the
oracle's reference for the delta-and-snapshot subject too (both strategies must end in
the same normalised state), except where the slice has await points (the stores' own
awaits differ, so each subject gets its own golden). The full matrices are CLI runs (docs/runtime.md has their
commands and results)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from crashmatrix.harness.enumeration import validate_case
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.explorer import Explorer, Options
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan
from crashmatrix.harness.session import open_session

SUBJECTS = ("reference", "reference-delta")
CHILD = "turn-1.tool-40"  # research: the investigate sub-agent node (after 40 read_source calls)


def case(workload: str, conversation: str, kind: str, source: str, name: str, task: str, occurrence: int = 1) -> Case:
    return Case(workload, conversation, FaultPlan((Fault(kind, CrashPoint(source, name, task, occurrence)),)))


SLICES: dict[tuple[str, str], list[Case]] = {
    ("research", "fanout"): [
        case("research", "fanout", "kill", "label", "tool.request.after", "turn-1.tool-17"),  # one of the 40
        case("research", "fanout", "kill", "step", "step.after", f"{CHILD}:turn-1"),  # the child's first turn done
        case("research", "fanout", "cancel", "label", "tool.request.before", f"{CHILD}:turn-2.tool-0"),  # its effect
        case("research", "fanout", "term", "label", "model.call.after", f"{CHILD}:turn-2"),
        case("research", "fanout", "kill", "label", "log.append.before", CHILD),  # child done, parent not recorded
    ],
    ("long_run", "t200"): [
        case("long_run", "t200", "kill", "label", "log.append.after", "turn-150.tool-0"),
        case("long_run", "t200", "cancel", "label", "tool.request.before", "turn-175.tool-0"),  # a progress mail
    ],
    ("human_pause", "approve"): [
        case("human_pause", "approve", "kill", "label", "effect.unknown.after", "turn-2.tool-0"),  # about to wait
        case("human_pause", "approve", "cancel", "label", "effect.started.after", "turn-2.tool-0"),
        case("human_pause", "approve", "term", "step", "step.before", "turn-2.tool-0", 2),  # approved, resuming
        # while the run waits: inside a retention pass of the operator (an await point)
        case("human_pause", "approve", "kill", "await", "crashmatrix.reference_runtime.retention:delete_finished_runs@3", "run", 2),
    ],
    ("report", "publish"): [
        case("report", "publish", "kill", "label", "log.append.before", "turn-2.tool-0"),  # the file's blobs written
        case("report", "publish", "cancel", "label", "tool.request.before", "turn-3.tool-0"),
        case("report", "publish", "term", "step", "step.after", "turn-2.tool-0"),
        # SIGTERM outside the scheduler (found by the term matrix at await points; drain.py):
        # while connecting (the run not yet submitted), submitting, after the lease, as
        # the scheduler's task group closes, and while the final status is written (each
        # round trip as it waits for the Db's turn, before its statement is sent:
        # Db._take_turn@1)
        case("report", "publish", "term", "await", "crashmatrix.reference_runtime.db:_connect@1", "run"),
        case("report", "publish", "term", "await", "crashmatrix.reference_runtime.db:Db._take_turn@1", "run", 2),
        case("report", "publish", "term", "await", "crashmatrix.reference_runtime.db:Db._take_turn@1", "run", 4),
        case("report", "publish", "term", "await", "crashmatrix.reference_runtime.executor:Execution.schedule@6", "run"),  # the task group closing: @4 before a lone node ran inline, @5 before launch batches
        case("report", "publish", "term", "await", "crashmatrix.reference_runtime.db:Db._take_turn@1", "run", 6),
    ],
}


def explorer_for(base: Explorer, subject: str, workload: str, options: Options) -> Explorer:
    """Another subject or workload on the services of ``base`` (the zygote forks any)."""
    ex = Explorer(base.env, base.pool, subject, workload, base.workdir, base.http, options)
    ex.db = base.db
    return ex


async def run_slices() -> tuple[dict[str, Any], list[CaseResult], list[int]]:
    results: list[CaseResult] = []
    goldens: dict[str, Any] = {}
    limit = asyncio.Semaphore(4)
    async with open_session("reference", "human_pause") as base:
        extra: list[Explorer] = []

        async def one(ex: Explorer, c: Case, golden: Any) -> None:
            async with limit:
                results.append(await ex.run_case(c, golden))

        jobs = []
        for (workload, conversation), cases in SLICES.items():
            awaits = any(f.point.source == "await" for c in cases for f in c.plan.faults)
            options = dataclasses.replace(base.options, await_points=awaits)
            golden = goldens[workload] = await explorer_for(base, "reference", workload, options).golden(conversation)
            for subject in SUBJECTS:
                ex = explorer_for(base, subject, workload, options)
                extra.append(ex)
                if awaits and subject != "reference":  # the stores' own awaits differ: a golden of its own
                    golden = await ex.golden(conversation)
                for c in cases:
                    validate_case(c, {conversation: golden})
                jobs += [one(ex, c, golden) for c in cases]
        try:
            await asyncio.gather(*jobs)
        finally:
            for ex in extra:
                await ex.adapter.aclose()
        blobs = sorted(f.stat().st_size for f in (Path(base.env.workdir) / "blobs").rglob("*") if f.is_file())
    return goldens, results, blobs


def test_each_workload_slice_passes_under_both_store_strategies() -> None:
    goldens, results, blobs = asyncio.run(run_slices())
    bad = [(r.subject, r.case.id, r.outcome, r.error, [(v.check, v.details) for v in r.failed]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) == 2 * sum(len(c) for c in SLICES.values())
    by = {(r.subject, r.case.id): r for r in results}

    # research: 41 nodes ran concurrently in turn 1; the child is scoped under its node
    tasks = {e[2] for e in goldens["research"].trace}
    assert {f"turn-1.tool-{i}" for i in range(40)} | {CHILD, f"{CHILD}:turn-1", f"{CHILD}:turn-3"} <= tasks
    golden_log = [e.node_id for e in goldens["research"].evidence.observation.log]
    assert golden_log.index(CHILD) > golden_log.index(f"{CHILD}:turn-3")  # the parent waited on the child's record
    for subject in SUBJECTS:
        # killed after the child's completion record, before the parent's: the resume runs
        # nothing of the child again (no point of a child node in its trace)
        r = by[(subject, f"research/fanout/kill@log.append.before[{CHILD}]#1")]
        assert r.resume_trace and not [e for e in r.resume_trace if e[2].startswith(CHILD + ":")]
        assert any(e[2] == CHILD and e[1] == "log.append.after" for e in r.resume_trace)
    # the child's model calls were billed once each (the oracle checks it per scoped node)
    assert {n: c for n, c in goldens["research"].evidence.model_calls.items() if n.startswith(CHILD)} == {
        f"{CHILD}:turn-{i}": 1 for i in (1, 2, 3)}

    # long_run: hundreds of turns; the late kill resumed from turn 150, not from the start
    assert len([e for e in goldens["long_run"].trace if e[1] == "model.call.before"]) == 200
    for subject in SUBJECTS:
        late = by[(subject, "long_run/t200/kill@log.append.after[turn-150.tool-0]#1")]
        assert not [e for e in late.resume_trace if e[1] == "model.call.before" and e[2] in ("turn-1", "turn-150")]

    # human_pause: two invocations in the golden run (before and after the approval);
    # the run killed inside a retention pass while it waited was resumed, not deleted
    assert len(goldens["human_pause"].evidence.observation.invocations) == 2
    assert len(goldens["human_pause"].evidence.ledgers["mail"]) == 1
    assert len(goldens["human_pause"].evidence.ledgers["payment"]) == 1

    # report: the file went to the blob store (the record holds a pointer, not 300 KB)
    answer = goldens["report"].evidence.observation.state["answer"]
    assert answer.startswith("Published report.md: 300000 bytes")
    assert len([b for b in blobs if b > 300_000]) >= 2  # the output and the state document, content-addressed
