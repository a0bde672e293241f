"""Where a case's CPU goes: per-process CPU per case for a matrix slice.

    python benchmarks/bench_case_cpu.py [--workload checkout] [--conversations conv1] [--kinds kill,term,cancel]
                                        [--jobs 4] [--subject reference] [--prune]
                                        [--kinds default]
                                        [--fsync on|off] [--fresh-workers] [--statements N]
                                        [--clean-runs N]

Starts one session (as ``crashmatrix run`` does), runs the golden runs, then the step +
labelled-point matrix of the given conversations and kinds; reads CPU times (user +
system, from ``/proc`` through psutil) of every process of the session before and after
the cases, and prints CPU milliseconds per case by process kind: workers (the zygote's
children, those reaped and those still running: the long-lived ones), the zygote
itself, each provider, PostgreSQL (the postmaster and its backends, exited or still
open: the pools' and the long-lived workers' connections), the controller (this
process). A process's CPU counts from its own times while it runs and from its
parent's children times once reaped, so every process is counted whole. The sum over kinds is the CPU a case
costs; on N cores the matrix can run at most ``N * 1000 / sum`` cases per second. Wall
figures depend on the machine's load (printed); the CPU split does much less.

``--kinds default``: the default matrix of ``crashmatrix run`` (:func:`.defaults.default_matrix`:
the every-point kinds, then the sampled kinds and resume policies) instead of the named
kinds at every point.

``--prune``: the cases run pruned (:mod:`crashmatrix.harness.pruning`: kill cases by
crash state, shared resumes); the split is then printed per matrix case and per case
executed. ``--fsync``: the embedded PostgreSQL's ``fsync`` (default ``off``, as every
matrix session runs; ``on`` is PostgreSQL's default). ``--fresh-workers``:
every job forks a worker of its own (default: resumes and cancelled workers run in
long-lived workers, :mod:`crashmatrix.harness.resident`, whose CPU is counted with the
workers'; their count is printed). ``--statements N``: the server runs with
``pg_stat_statements`` (planning tracked too), and the cases' total planning and
execution time and their N costliest statements are printed.

``--clean-runs N``: after the matrix, N runs of the first conversation without a fault,
one after the other, each read by the adapter's ``observe`` as a case's end is, measured
the same way: once in a long-lived worker (the cheapest a run gets: a warm process and a
kept connection) and once in a forked worker (what a case's crash worker pays: a fork, a
fresh backend). A case executes the workload from its input to its crash point, then the
rest in its resume, so one clean run is the floor of what a case executed costs while
cases do not share their prefix; the ratio of the two is printed. Then the cost of a
store snapshot by the one store-agnostic means PostgreSQL has, a copy of the session's
database (``CREATE DATABASE ... TEMPLATE``), the cheapest way a case could start at its
crash point instead of running to it: wall ms and PostgreSQL's CPU ms a copy. For the
forked runs it also prints a forked worker's minor page faults and system CPU (its
reaped children's counts in ``/proc/ZYGOTE/stat``): a fork's cost is mostly the pages its
run touches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid

import asyncpg
import psutil

from crashmatrix.harness import pool as worker_pool
from crashmatrix.harness import pruning, runner
from crashmatrix.harness.defaults import default_matrix
from crashmatrix.harness.enumeration import enumerate_cases
from crashmatrix.harness.explorer import Options
from crashmatrix.harness.plan import FaultPlan
from crashmatrix.harness.session import open_session


def _cpu(p: psutil.Process, children: bool) -> float:
    t = p.cpu_times()
    total = t.user + t.system
    if children:
        total += t.children_user + t.children_system
    return total * 1000


def _processes(workdir: str) -> dict[str, psutil.Process]:
    """The session's processes by kind, found by their command lines."""
    me = psutil.Process()
    out: dict[str, psutil.Process] = {"controller": me}
    for child in me.children(recursive=False):
        cmd = " ".join(child.cmdline())
        if "harness.zygote" in cmd:
            out["zygote"] = child
        elif "providers.server" in cmd:
            kind = cmd.split("--kind", 1)[1].split()[0]
            out[f"provider:{kind}"] = child
        elif "watchdog" in cmd:
            out["watchdog"] = child
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if cmd.startswith(("postgres", "/")) and "-D" in cmd and workdir in cmd and "postgres" in cmd:
            out["postgres"] = p
    return out


def _living(children: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``children`` still running (a zombie's times are its parent's to reap)."""
    out = []
    for c in children:
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                c.cpu_times()  # raises for a child gone since the listing
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def _snapshot(procs: dict[str, psutil.Process]) -> dict[str, float]:
    snap = {}
    for kind, p in procs.items():
        if kind == "zygote":
            t = p.cpu_times()
            snap["zygote"] = (t.user + t.system) * 1000
            # workers: the reaped ones (the zygote's children times) and the living ones,
            # long-lived workers above all (a worker reaped between two snapshots moves
            # from the second sum to the first, counted whole in both)
            snap["workers:exited"] = (t.children_user + t.children_system) * 1000
            snap["workers"] = snap["workers:exited"] + sum(
                _cpu(c, children=True) for c in _living(p.children(recursive=False)))
        elif kind == "controller":
            snap[kind] = _cpu(p, children=False)
        elif kind == "postgres":  # the backends that exited, and those still open (pools, kept connections)
            snap["postgres:exited"] = _cpu(p, children=True)
            snap[kind] = snap["postgres:exited"] + sum(_cpu(c, children=True) for c in _living(p.children()))
        else:
            snap[kind] = _cpu(p, children=True)
    return snap


async def _db_stats(explorer) -> dict[str, int]:
    row = await explorer.db.fetchrow(
        "SELECT sessions, xact_commit, xact_rollback, tup_returned, tup_inserted, tup_updated"
        " FROM pg_stat_database WHERE datname = current_database()")
    return dict(row)


STATEMENTS_SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all",
                       "pg_stat_statements.track_planning": "on"}
"""The embedded server's settings for ``--statements``."""


async def _statements(explorer, top: int) -> list[dict[str, object]]:
    """The totals (first row: ``plan``, ``exec`` in ms) and the ``top`` statements by
    planning + execution time, from ``pg_stat_statements``."""
    total = await explorer.db.fetchrow(
        "SELECT coalesce(sum(total_plan_time), 0) AS plan, coalesce(sum(total_exec_time), 0) AS exec"
        " FROM pg_stat_statements")
    rows = await explorer.db.fetch(
        "SELECT calls, total_plan_time AS plan, total_exec_time AS exec,"
        " left(regexp_replace(query, '\\s+', ' ', 'g'), 80) AS query FROM pg_stat_statements"
        " ORDER BY total_plan_time + total_exec_time DESC LIMIT $1", top)
    return [dict(total), *(dict(r) for r in rows)]


def _reaped_faults(pid: int) -> tuple[int, float]:
    """Minor page faults and system CPU ms of ``pid``'s reaped children (/proc/PID/stat:
    ``cminflt``, ``cstime``)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[8]), int(fields[14]) * 1000 / os.sysconf("SC_CLK_TCK")


async def _clean_runs(explorer, procs: dict[str, psutil.Process], conversation: str, n: int,
                      forked: bool) -> tuple[dict[str, float], float]:
    """CPU ms per process kind per clean run of ``conversation`` (``n`` runs, each read
    by ``observe``), and wall ms a run; for forked runs also the minor page faults and
    system CPU ms of a forked worker (keys ``faults``, ``worker system``: not CPU kinds)."""
    faults0 = _reaped_faults(procs["zygote"].pid)
    before = _snapshot(procs)
    t0 = time.monotonic()
    with worker_pool.fork_only() if forked else contextlib.nullcontext():
        for _ in range(n):
            run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
            job, log = explorer.job("start", conversation, run_id, FaultPlan(), explorer.workdir)
            exit_, report = await explorer.run_worker(job, log)
            if report.end is None or report.end.status != "completed":
                raise SystemExit(f"a clean run of {conversation} did not complete ({exit_.describe()})")
            await explorer.evidence(run_id)
    wall = (time.monotonic() - t0) * 1000 / n
    after = _snapshot(procs)
    split = {k: (after[k] - before.get(k, 0)) / n for k in after if not k.endswith(":exited")}
    if forked:
        faults1 = _reaped_faults(procs["zygote"].pid)
        split["faults"], split["worker system"] = ((b - a) / n for a, b in zip(faults0, faults1))
    return split, wall


async def _template_copy(explorer, procs: dict[str, psutil.Process], n: int) -> tuple[float, float]:
    """Wall ms and PostgreSQL CPU ms of one ``CREATE DATABASE ... TEMPLATE`` copy of the
    session's database (its connections other than the copier's are none while it runs:
    the pool's are closed first), each copy dropped again."""
    name = await explorer.db.fetchval("SELECT current_database()")
    admin = await asyncpg.connect(explorer.env.dsn.replace(f"/{name}", "/postgres", 1))
    try:
        await explorer.db.expire_connections()
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = $1 AND pid <> pg_backend_pid()", name)
        before = _snapshot(procs)["postgres"]
        t0 = time.monotonic()
        for i in range(n):
            await admin.execute(f'CREATE DATABASE "cm_copy_{i}" TEMPLATE "{name}"')
        wall = (time.monotonic() - t0) * 1000 / n
        cpu = (_snapshot(procs)["postgres"] - before) / n
        for i in range(n):
            await admin.execute(f'DROP DATABASE "cm_copy_{i}"')
    finally:
        await admin.close()
    return wall, cpu


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="checkout")
    ap.add_argument("--conversations", default="conv1")
    ap.add_argument("--kinds", default="kill,term,cancel")
    ap.add_argument("--sources", default="step,label")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--subject", default="reference")
    ap.add_argument("--prune", action="store_true")
    ap.add_argument("--fsync", choices=("on", "off"), default="off")
    ap.add_argument("--fresh-workers", action="store_true")
    ap.add_argument("--statements", type=int, default=0, metavar="N",
                    help="also print the N statements of most planning + execution time (pg_stat_statements)")
    ap.add_argument("--clean-runs", type=int, default=0, metavar="N",
                    help="then measure N clean runs (long-lived and forked workers) and a database copy")
    args = ap.parse_args()
    convs = args.conversations.split(",")
    options = Options(long_lived=not args.fresh_workers)
    pg_settings = {"fsync": args.fsync, **(STATEMENTS_SETTINGS if args.statements else {})}
    async with open_session(args.subject, args.workload, pg_settings=pg_settings, options=options) as explorer:
        goldens = {c: await explorer.golden(c) for c in convs}
        if args.statements:
            await explorer.db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await explorer.db.execute("SELECT pg_stat_statements_reset()")
        sources = tuple(args.sources.split(","))
        if args.kinds == "default":  # the default matrix: every-point kinds, then the sampled kinds and policies
            cases, _ = default_matrix().cases(args.workload, goldens, sources)
        else:
            cases = enumerate_cases(args.workload, goldens, tuple(args.kinds.split(",")), sources)
        procs = _processes(str(explorer.workdir.parent))
        db0 = await _db_stats(explorer)
        before = _snapshot(procs)
        t0 = time.monotonic()
        results, _ = await runner.run_loop(explorer, cases, goldens, args.jobs,
                                              options=pruning.options_of(args.prune))
        seconds = time.monotonic() - t0
        after = _snapshot(procs)
        await asyncio.sleep(1.0)  # backends flush their statistics at exit, at most 1 s late
        db1 = await _db_stats(explorer)
        statements = await _statements(explorer, args.statements) if args.statements else []
        clean = []
        if args.clean_runs:
            clean = [await _clean_runs(explorer, procs, convs[0], args.clean_runs, forked) for forked in (False, True)]
            copy = await _template_copy(explorer, procs, min(args.clean_runs, 5))
    n = len(results)
    ran, forked = pruning.executed(results), pruning.workers_run(results)
    resident = forked - pruning.workers_forked(results)
    bad = sum(r.outcome != "pass" for r in results)
    print(f"{n} cases ({bad} not passed) in {seconds:.1f} s = {n / seconds:.1f} cases/s, jobs={args.jobs}, "
          f"load {os.getloadavg()[0]:.1f}, cores {os.cpu_count()}, fsync {args.fsync}, "
          f"{'pruned' if args.prune else 'unpruned'}: {ran} executed, {forked} workers ({resident} in long-lived ones)")
    exited = {k: after.pop(f"{k}:exited", 0.0) - before.pop(f"{k}:exited", 0.0) for k in ("workers", "postgres")}
    total = 0.0
    for kind in sorted(after, key=lambda k: -(after[k] - before.get(k, 0))):
        per_case = (after[kind] - before.get(kind, 0)) / n
        total += per_case
        print(f"  {kind:18s} {per_case:7.1f} ms CPU per case")
    print(f"  (of which in processes that exited during the cases: workers {exited['workers'] / n:.1f}, "
          f"postgres {exited['postgres'] / n:.1f}; the rest in long-lived workers and open backends)")
    print("  PostgreSQL per case: " + ", ".join(f"{k} {(db1[k] - db0[k]) / n:.1f}" for k in db0))
    print(f"  {'sum':18s} {total:7.1f} ms CPU per case -> ceiling {os.cpu_count() * 1000 / total:.1f} cases/s")
    if ran < n:
        print(f"  per case executed: {total * n / ran:.1f} ms CPU; per worker: "
              f"{(after['workers'] - before['workers']) / forked:.1f} ms")
    if statements:
        plan, execute = sum(r["plan"] for r in statements[1:]), sum(r["exec"] for r in statements[1:])
        print(f"  statements (main server, the cases only): planning {statements[0]['plan']:.0f} ms, "
              f"execution {statements[0]['exec']:.0f} ms in all; the top {len(statements) - 1} "
              f"({plan:.0f} + {execute:.0f} ms):")
        for r in statements[1:]:
            print(f"    {r['calls']:6d} calls  plan {r['plan']:7.1f} ms  exec {r['exec']:7.1f} ms  {r['query']}")

    for (split, wall), where in zip(clean, ("long-lived", "forked")):
        faults, system = split.pop("faults", None), split.pop("worker system", None)
        cpu = sum(split.values())
        top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(split.items(), key=lambda kv: -kv[1]) if v >= 0.5)
        print(f"  a clean run of {convs[0]} in a {where} worker: {cpu:.1f} ms CPU ({top}), {wall:.0f} ms wall;"
              f" a case executed costs {total * n / ran / cpu:.2f} of it, a matrix case {total / cpu:.2f}")
        if faults is not None:
            print(f"    the forked worker: {faults:.0f} minor page faults, {system:.1f} ms of its CPU in the kernel")
    if clean:
        print(f"  a copy of the session's database (CREATE DATABASE ... TEMPLATE): {copy[0]:.0f} ms wall, "
              f"{copy[1]:.1f} ms PostgreSQL CPU")


if __name__ == "__main__":
    asyncio.run(main())
