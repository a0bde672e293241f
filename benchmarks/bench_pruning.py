"""Pruned and unpruned matrices in one run: throughput and the same verdicts.

    python benchmarks/bench_pruning.py [--workload checkout] [--subject reference]
        [--conversations conv1,conv2] [--kinds kill,term,cancel] [--sources step,label]
        [--shard K/N | --slice A:B] [--jobs 4] [--sample 0.05] [--seed 0] [--mutants NAME,...|all]
        [--modes pruned,unpruned] [--report DIR] [--fresh-workers]

One session per subject (the golden runs once, so both matrices are cut from the same
golden marks): the matrix pruned (:mod:`crashmatrix.harness.pruning`: kill cases by
crash state, shared resumes), then unpruned (``--modes`` picks the order or only one).
For each: cases, cases executed (not derived from a representative), workers forked,
seconds, cases per second and executed cases per second, what pruning said, the load
average. Then the verdicts compared case id by case id (outcome and failed checks), and
the failing cases in each as crash states (a pruned failing case counts under its
representative): the sets must be equal.

``--slice A:B`` keeps cases A to B of the matrix (a stretch of the run, so its groups
stay whole, unlike ``--shard``); ``--sample 1`` runs every member whole and compares
each with its representative (the soundness check at its strongest).

``--mutants`` runs the same for mutants of the catalogue instead of ``--subject``, each
as ``crashmatrix selftest`` full mode builds its matrix, on fewer conversations: its
metadata's conversations (``--conversations`` overrides), the default kinds and
sources plus its own, under each of its resume policies, in its own session (a
mutant of a deploy: its build pair, the cases labelled with it). For a mutant each
mode also prints whether it was caught (a failing case fails a check its metadata
names) and the seconds from the start of the mode to the first such case (cases in
matrix order, ``--jobs`` at a time); with both modes, one line per mutant ``MUTANT
name: caught pruned/unpruned, first catch s, failing crash states equal`` and a table
at the end. Exit code 1 when a comparison differs, a sampled member disagreed with its
representative, or a mutant was caught in one mode only.

``--fresh-workers``: every job forks a worker of its own (default: long-lived workers,
:mod:`crashmatrix.harness.resident`); two ``--report`` directories, one run each way,
compared file by file with ``compare_verdicts.py``, are the long-lived workers' acceptance
test (the same verdicts on every mutant, pruned and unpruned).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from crashmatrix.harness import pruning, runner
from crashmatrix.harness.enumeration import enumerate_cases, shard
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.explorer import Options
from crashmatrix.harness.plan import DEFAULT_KINDS, DEFAULT_SOURCES, Resume
from crashmatrix.harness.session import open_session


def verdict(r: CaseResult) -> tuple[str, tuple[str, ...]]:
    return r.outcome, tuple(sorted({v.check for v in r.failed}))


def failing_states(results: list[CaseResult], summary: pruning.PruneSummary | None) -> set[str]:
    """Failing cases named by their crash state: a grouped kill case by its group's
    representative, any other case by its own id."""
    rep = {c.id: g.representative.id for g in summary.plan.groups for c in g.cases} if summary else {}
    return {rep.get(r.case.id, r.case.id) for r in results if r.outcome == "fail"}


def produced(r: CaseResult) -> str:
    """How a pruned run produced ``r``: derived from its representative (no worker ran),
    a sampled member whose crash state differed from its representative's (a harness
    error: the grouping was unsound), with a shared resume (its faulted worker ran, the
    resume was another case's), or run whole."""
    if not r.workers:
        return "derived"
    if r.outcome == "harness-error" and "crash-state grouping unsound" in (r.error or ""):
        return "sampled member: its crash state differed from its representative's"
    return "shared resume" if any("shared" in w for w in r.workers) else "ran whole"


async def run_subject(subject: str, args: argparse.Namespace, kinds: tuple[str, ...], sources: tuple[str, ...],
                      conversations: tuple[str, ...] | None, spec: Any = None,
                      rows: list[dict[str, Any]] | None = None) -> bool:
    """One subject's matrix in each mode; ``spec``: the catalogue entry of a mutant
    (its session subject, resume policies and build pair; caught and first catch are
    reported, and appended to ``rows``)."""
    from crashmatrix.harness.builds import label_cases

    modes = args.modes.split(",")
    session_subject = spec.session_subject if spec is not None else subject
    policies = spec.resume_policies if spec is not None else ("default",)
    async with open_session(session_subject, args.workload, options=Options(await_points="await" in sources,
                                                                                long_lived=not args.fresh_workers)) as ex:
        convs = conversations or ex.workload.conversations
        t0 = time.monotonic()
        goldens = {c: await ex.golden(c) for c in convs}
        usable = {c: g for c, g in goldens.items() if not g.broken}
        cases = label_cases([c for policy in policies
                             for c in enumerate_cases(args.workload, usable, kinds, sources, Resume(policy))],
                            ex.upgrade)
        if args.shard:
            cases = shard(cases, args.shard)
        if args.slice:
            a, _, b = args.slice.partition(":")
            cases = cases[int(a or 0):int(b) if b else None]
        print(f"{subject} on {args.workload} ({', '.join(convs)}): {len(cases)} cases, golden runs "
              f"{time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.1f}, cores {os.cpu_count()}", flush=True)
        broken = {c: sorted(v.check for v in g.broken) for c, g in goldens.items() if g.broken}
        for c, checks in broken.items():
            print(f"  the golden run of {c} is broken ({', '.join(checks)}): no matrix on it (every case would be "
                  f"refused for it)", flush=True)
        if spec is not None and broken and not cases:
            hit = sorted({c for checks in broken.values() for c in checks} & set(spec.caught_by))
            print(f"  MUTANT {spec.name}: caught by its golden run ({', '.join(hit) or 'a check it does not name'}), "
                  f"before any case: nothing to prune", flush=True)
            if rows is not None:
                rows.append({"mutant": spec.name, "golden": ", ".join(hit) or "?"})
            return bool(hit)
        runs: dict[str, tuple[list[CaseResult], pruning.PruneSummary, float]] = {}
        catch: dict[str, float | None] = {}
        for mode in modes:
            opts = pruning.options_of(mode == "pruned", args.sample, args.seed)
            load0 = os.getloadavg()[0]
            t1 = time.monotonic()
            catch[mode] = None

            def on_result(r: CaseResult, mode: str = mode, t1: float = t1) -> None:
                if (spec is not None and catch[mode] is None and r.outcome == "fail"
                        and any(v.check in spec.caught_by for v in r.failed)):
                    catch[mode] = time.monotonic() - t1

            results, summary = await runner.run_loop(ex, cases, goldens, args.jobs, on_result, options=opts)
            seconds = time.monotonic() - t1
            runs[mode] = (results, summary, seconds)
            ran = pruning.executed(results)
            counts = {k: sum(r.outcome == k for r in results) for k in ("pass", "fail", "harness-error", "not-run")}
            print(f"  {mode}: {len(results)} cases {counts}, executed {ran}, workers {pruning.workers_run(results)} ({pruning.workers_forked(results)} forked), "
                  f"{seconds:.1f} s: {len(results) / seconds:.2f} cases/s, {ran / seconds:.2f} executed cases/s "
                  f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
            for line in summary.lines():
                print(f"    {line}")
            if spec is not None:
                first = f"first catch after {catch[mode]:.2f} s" if catch[mode] is not None else "NOT CAUGHT"
                print(f"    mutant {spec.name} ({', '.join(spec.caught_by)}): {first}", flush=True)
            for r in results:
                if r.outcome == "harness-error":
                    print(f"    harness error {r.case.id}: {(r.error or '').splitlines()[0][:300]}")
            if args.report:
                Path(args.report).mkdir(parents=True, exist_ok=True)
                name = f"{subject.replace(':', '_')}-{mode}.json"
                data: dict[str, Any] = {"subject": subject, "mode": mode, "seconds": seconds,
                                        "cases": [r.to_dict() for r in results], "pruning": summary.to_dict()}
                (Path(args.report) / name).write_text(json.dumps(data, indent=1, default=str))
    ok = all(not r.outcome == "harness-error" or "unsound" not in (r.error or "") for m in runs.values() for r in m[0])
    if len(runs) == 2:
        (a, sa, ta), (b, _, tb) = runs["pruned"], runs["unpruned"]
        va, vb = {r.case.id: verdict(r) for r in a}, {r.case.id: verdict(r) for r in b}
        differ = sorted(k for k in va.keys() | vb.keys() if va.get(k) != vb.get(k))
        fa, fb = failing_states(a, sa), failing_states(b, sa)
        print(f"  same verdicts: {len(differ) == 0} ({len(va)} vs {len(vb)} cases, {len(differ)} differ); "
              f"failing crash states pruned {len(fa)}, unpruned {len(fb)}, equal: {fa == fb}; "
              f"wall ratio unpruned/pruned {tb / ta:.2f}")
        how = {r.case.id: produced(r) for r in a}
        for k in differ[:20]:
            print(f"    {k}: pruned {va.get(k)} ({how.get(k)}), unpruned {vb.get(k)}")
        whole = [k for k in differ if how.get(k) == "ran whole"]
        if whole:
            print(f"    {len(whole)} of the {len(differ)} differing case(s) ran whole in both modes (nothing derived or "
                  f"shared): the subject's own nondeterminism, not pruning; replay them to see")
        ok = ok and not differ and fa == fb
        if spec is not None:
            ca, cb = catch["pruned"], catch["unpruned"]
            ok = ok and (ca is None) == (cb is None)
            row = {"mutant": spec.name, "cases": len(a), "executed": pruning.executed(a),
                   "caught": f"{'yes' if ca is not None else 'NO'}/{'yes' if cb is not None else 'NO'}",
                   "first_pruned": ca, "first_unpruned": cb, "states": (len(fa), len(fb)), "equal": fa == fb,
                   "same_verdicts": not differ, "sample": [ln for ln in sa.lines() if "sample" in ln],
                   "differ_pruning": sum(1 for k in differ if how.get(k) != "ran whole"),
                   "ratio": tb / ta}
            if rows is not None:
                rows.append(row)
            fmt = lambda x: f"{x:.2f}" if x is not None else "-"  # noqa: E731
            print(f"  MUTANT {spec.name}: caught {row['caught']} (pruned/unpruned), first catch {fmt(ca)} / {fmt(cb)} s, "
                  f"failing crash states {len(fa)} / {len(fb)} equal {fa == fb}, same verdicts {not differ}", flush=True)
    elif spec is not None and rows is not None:
        rows.append({"mutant": spec.name, "mode": modes[0], "first": catch[modes[0]]})
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="checkout")
    ap.add_argument("--subject", default="reference")
    ap.add_argument("--conversations", default="")
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS))
    ap.add_argument("--sources", default=",".join(DEFAULT_SOURCES))
    ap.add_argument("--shard", default="")
    ap.add_argument("--slice", default="")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--sample", type=float, default=pruning.DEFAULT_SAMPLE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutants", default="")
    ap.add_argument("--modes", default="pruned,unpruned")
    ap.add_argument("--report", default="")
    ap.add_argument("--fresh-workers", action="store_true")
    args = ap.parse_args()
    kinds, sources = tuple(args.kinds.split(",")), tuple(args.sources.split(","))
    convs = tuple(c for c in args.conversations.split(",") if c) or None
    ok = True
    if args.mutants:
        from crashmatrix.harness.selftest import catalogue

        names = None if args.mutants == "all" else args.mutants.split(",")
        rows: list[dict[str, Any]] = []
        for spec in catalogue(names):
            if spec.workload != args.workload:
                continue
            k = tuple(dict.fromkeys(spec.fault_kinds + kinds))
            s = tuple(dict.fromkeys(spec.point_sources + sources))
            ok = asyncio.run(run_subject(spec.subject, args, k, s, convs or spec.conversations, spec, rows)) and ok
        fmt = lambda x: f"{x:.2f}" if x is not None else "-"  # noqa: E731
        print("\n| mutant | cases (executed pruned) | caught pruned/unpruned | first catch s pruned / unpruned "
              "| failing crash states pruned / unpruned | equal | same verdicts (differing derived or shared) "
              "| wall unpruned/pruned |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            if "golden" in r:
                print(f"| {r['mutant']} | 0 (its golden run breaks {r['golden']}) | golden/golden | - | - | - | - | - |")
            if "caught" in r:
                print(f"| {r['mutant']} | {r['cases']} ({r['executed']}) | {r['caught']} | {fmt(r['first_pruned'])} / "
                      f"{fmt(r['first_unpruned'])} | {r['states'][0]} / {r['states'][1]} | {r['equal']} | "
                      f"{r['same_verdicts']} ({r['differ_pruning']}) | {r['ratio']:.2f} |")
    else:
        ok = asyncio.run(run_subject(args.subject, args, kinds, sources, convs))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
