"""crashmatrix beside the loop a team writes by hand (docs/design.md, "Sources": seed
000's eleven-kill loop), on the same services, in one run.

    python benchmarks/bench_handrolled.py [--subject reference] [--mutant replays-model-call[,NAME...]]
        [--conversation conv1] [--jobs 4]  # --mutant '': the clean subject only

The hand-rolled loop, as seed 000's team ran it: one uninterrupted run in a fresh
interpreter (the reference), then for each step k of the run: a fresh interpreter
starts a new run and SIGKILLs itself right after step k; another fresh interpreter
resumes it; its final state is compared with the uninterrupted run's (the oracle's end
checks and invariants, so the comparison is as strict as crashmatrix's: what differs is
how the cases are produced and run). One case at a time, as a shell loop runs them.

crashmatrix, in the same session: its golden runs, then (a) the same cases (a kill at
each step's end: ``kill@step.after``) and (b) the conversation's whole default matrix
(step and labelled points x kill, term, cancel), pruned, ``--jobs`` at a time.

Printed for each: cases, seconds, cases per second, and for the subject ``--mutant``
(a mutant of the catalogue) the seconds from the start of the method (its reference or
golden runs included) to its first failing case. Ratios measured in one run are the
figures to quote; wall times move with the machine's load (printed).

The oracle is equally strict on both sides: the hand-rolled loop has only the end
state to compare (no trace of where the kill landed, so none of crashmatrix's crash
checks, and no allowance for model calls in flight at the kill), so a crashmatrix case
counts as failed here only when it fails one of the checks the loop applied (the end
checks and invariants, by name); a case that fails only a crash check counts as a pass.
crashmatrix's same kills also run one at a time (``--jobs 1``), which separates the
cost of a case from running ``--jobs`` of them at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from crashmatrix.harness import invariants, oracle, pruning, runner
from crashmatrix.harness.enumeration import enumerate_cases
from crashmatrix.harness.explorer import Explorer
from crashmatrix.harness.plan import DEFAULT_KINDS, DEFAULT_SOURCES
from crashmatrix.harness.session import open_session

# -- the child: one fresh interpreter, one start or resume -------------------------------


def child(args: argparse.Namespace) -> int:
    """``--child start|resume``: run the subject on ``--env`` (JSON), SIGKILL after the
    ``--kill-after``-th step's end (0: never)."""
    import anyio

    from crashmatrix.harness import registry
    from crashmatrix.harness.adapter import Environment, RunContext

    env = Environment.from_dict(json.loads(args.env))
    adapter, workload = registry.subject(args.subject), registry.workload(args.workload)
    ended = 0

    def on_step(phase: str, task: str) -> None:
        nonlocal ended
        if phase == "after":
            ended += 1
            if ended == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

    ctx = RunContext(env, args.run_id, workload, args.conversation, f"hand-{uuid.uuid4().hex[:8]}", on_step)
    run = adapter.start if args.child == "start" else adapter.resume
    print(anyio.run(run, ctx))
    return 0


def spawn(args: argparse.Namespace, role: str, run_id: str, env: dict[str, Any], kill_after: int = 0) -> int:
    """A fresh interpreter for one worker; its return code (-9: killed)."""
    cmd = [sys.executable, "-P", __file__, "--child", role, "--run-id", run_id, "--env", json.dumps(env),
           "--kill-after", str(kill_after), "--subject", args.subject_now, "--workload", "checkout",
           "--conversation", args.conversation]
    return subprocess.run(cmd, env=dict(os.environ, PYTHONHASHSEED="0"), capture_output=True, timeout=120).returncode


# -- the two methods ---------------------------------------------------------------------


async def hand_rolled(ex: Explorer, args: argparse.Namespace, steps: int, golden: Any) -> dict[str, Any]:
    """The loop; ``golden``: crashmatrix's golden run, whose pair's identifiers the
    comparison renames by (nothing of it is timed here)."""
    env = ex.env.to_dict()
    t0 = time.monotonic()
    ref_id = f"cm-run-{uuid.uuid4().hex[:16]}"
    await asyncio.to_thread(spawn, args, "start", ref_id, env)
    reference = await ex.evidence(ref_id)
    model, _ = oracle.learn_identifiers(reference, golden.evidence, ex.identifier_fields())
    first_failure = None
    failed = 0
    checks: set[str] = set()
    for k in range(1, steps + 1):
        run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
        killed = await asyncio.to_thread(spawn, args, "start", run_id, env, k)
        if killed != -signal.SIGKILL:
            raise SystemExit(f"hand-rolled loop: the start worker of step {k} exited {killed}, not killed after the step")
        await asyncio.to_thread(spawn, args, "resume", run_id, env)
        final = await ex.evidence(run_id)
        verdicts = oracle.end_checks(reference, final, {}, model) + invariants.end_invariants(final)
        checks |= {v.check for v in verdicts}
        if oracle.merge(verdicts) is not True:
            failed += 1
            if first_failure is None:
                first_failure = time.monotonic() - t0
    seconds = time.monotonic() - t0
    return {"cases": steps, "seconds": seconds, "failed": failed, "first_failure": first_failure, "checks": checks}


def judged_by(r: dict[str, Any], checks: set[str]) -> dict[str, Any]:
    """crashmatrix's figures with a case counted failed only when it failed one of
    ``checks`` (the hand-rolled loop's)."""
    fails = [(t, c) for t, c in r["fails"] if c & checks]
    return {**r, "failed": len(fails), "first_failure": min((t for t, _ in fails), default=None),
            "failed_any": len(r["fails"])}


async def crashmatrix(ex: Explorer, args: argparse.Namespace, matrix: str, jobs: int | None = None) -> dict[str, Any]:
    """``matrix``: "steps" (a kill at each step's end) or "matrix" (the default matrix);
    ``fails``: each failing case's (seconds since the start, failed checks)."""
    t0 = time.monotonic()
    goldens = {args.conversation: await ex.golden(args.conversation)}
    if matrix == "steps":
        cases = [c for c in enumerate_cases("checkout", goldens, ("kill",), ("step",))
                 if c.plan.faults[0].point.name == "step.after"]
    else:
        cases = enumerate_cases("checkout", goldens, DEFAULT_KINDS, DEFAULT_SOURCES)
    fails: list[tuple[float, set[str]]] = []

    def on_result(r: Any) -> None:
        if r.outcome == "fail":
            fails.append((time.monotonic() - t0, {v.check for v in r.failed}))

    t1 = time.monotonic()
    results, summary = await runner.run_loop(ex, cases, goldens, jobs or args.jobs, on_result)
    seconds = time.monotonic() - t1
    return {"cases": len(results), "seconds": seconds, "with_golden": time.monotonic() - t0,
            "executed": pruning.executed(results), "fails": fails,
            "pruning": summary.lines(), "golden": goldens[args.conversation]}


def show(name: str, r: dict[str, Any]) -> None:
    ff = f"{r['first_failure']:.1f} s" if r.get("first_failure") is not None else "none"
    extra = f", executed {r['executed']}" if "executed" in r else ""
    also = f" ({r['failed_any']} failing any check)" if "failed_any" in r else ""
    print(f"  {name}: {r['cases']} cases{extra} in {r['seconds']:.1f} s = {r['cases'] / r['seconds']:.2f} cases/s; "
          f"{r['failed']} failed{also}; first failure after {ff}", flush=True)


async def main(args: argparse.Namespace) -> None:
    subjects = [("clean", args.subject)] + [("mutant", "defect:" + m) for m in args.mutant.split(",") if m]
    for label, subject in subjects:
        args.subject_now = subject
        load0 = os.getloadavg()[0]
        async with open_session(subject, "checkout") as ex:
            steps_cm = await crashmatrix(ex, args, "steps")
            steps = steps_cm["cases"]
            hand = await hand_rolled(ex, args, steps, steps_cm["golden"])
            one = await crashmatrix(ex, args, "steps", jobs=1)
            whole = await crashmatrix(ex, args, "matrix")
        steps_cm, one, whole = (judged_by(r, hand["checks"]) for r in (steps_cm, one, whole))
        print(f"{label} {subject}, {args.conversation}, load {load0:.1f} -> {os.getloadavg()[0]:.1f}, cores {os.cpu_count()}:")
        show("hand-rolled loop (fresh interpreters, one at a time)", hand)
        show(f"crashmatrix, the same {steps} kills, --jobs {args.jobs}", steps_cm)
        show(f"crashmatrix, the same {steps} kills, --jobs 1", one)
        show(f"crashmatrix, the default matrix, pruned, --jobs {args.jobs}", whole)
        if whole["pruning"]:
            print("    " + "; ".join(whole["pruning"]))
        rate = hand["cases"] / hand["seconds"]
        print(f"  cases/s crashmatrix / hand-rolled: same kills {steps_cm['cases'] / steps_cm['seconds'] / rate:.1f}x "
              f"(--jobs 1: {one['cases'] / one['seconds'] / rate:.1f}x), "
              f"default matrix {whole['cases'] / whole['seconds'] / rate:.1f}x "
              f"(executed cases only: {whole['executed'] / whole['seconds'] / rate:.1f}x)")
        if label == "mutant" and hand["first_failure"] and whole["first_failure"] and steps_cm["first_failure"]:
            print(f"  time to first failure hand-rolled / crashmatrix (reference or golden runs included): "
                  f"{hand['first_failure'] / whole['first_failure']:.1f}x (default matrix), "
                  f"{hand['first_failure'] / steps_cm['first_failure']:.1f}x (same kills), "
                  f"{hand['first_failure'] / one['first_failure']:.1f}x (same kills, --jobs 1)")
        elif label == "mutant":
            print("  time to first failure: a method found no failure (see above); no ratio")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--subject", default="reference")
    ap.add_argument("--mutant", default="replays-model-call")
    ap.add_argument("--conversation", default="conv1")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--child", choices=("start", "resume"))
    ap.add_argument("--run-id")
    ap.add_argument("--env")
    ap.add_argument("--kill-after", type=int, default=0)
    ap.add_argument("--workload", default="checkout")
    a = ap.parse_args()
    if a.child:
        raise SystemExit(child(a))
    asyncio.run(main(a))
