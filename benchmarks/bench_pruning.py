"""Pruned and unpruned matrices in one run: throughput and the same verdicts.

    python benchmarks/bench_pruning.py [--workload checkout] [--subject reference]
        [--conversations conv1,conv2] [--kinds kill,term,cancel] [--sources step,label]
        [--shard K/N | --slice A:B] [--jobs 4] [--sample 0.05] [--seed 0] [--mutants NAME,...|all]
        [--modes pruned,unpruned] [--report DIR]

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
on its metadata's conversations and on the default kinds and sources plus its own
(as ``crashmatrix selftest`` full mode does, on fewer conversations). Exit code 1 when
a comparison differs or a sampled member disagreed with its representative.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from crashmatrix.harness import pruning
from crashmatrix.harness.enumeration import enumerate_cases, shard
from crashmatrix.harness.explorer import CaseResult, Options
from crashmatrix.harness.plan import DEFAULT_KINDS, DEFAULT_SOURCES
from crashmatrix.harness.session import open_session


def verdict(r: CaseResult) -> tuple[str, tuple[str, ...]]:
    return r.outcome, tuple(sorted({v.check for v in r.failed}))


def failing_states(results: list[CaseResult], summary: pruning.PruneSummary | None) -> set[str]:
    """Failing cases named by their crash state: a grouped kill case by its group's
    representative, any other case by its own id."""
    rep = {c.id: g.representative.id for g in summary.plan.groups for c in g.cases} if summary else {}
    return {rep.get(r.case.id, r.case.id) for r in results if r.outcome == "fail"}


async def run_subject(subject: str, args: argparse.Namespace, kinds: tuple[str, ...], sources: tuple[str, ...],
                      conversations: tuple[str, ...] | None) -> bool:
    modes = args.modes.split(",")
    async with open_session(subject, args.workload, options=Options(await_points="await" in sources)) as ex:
        convs = conversations or ex.workload.conversations
        t0 = time.monotonic()
        goldens = {c: await ex.golden(c) for c in convs}
        cases = enumerate_cases(args.workload, {c: g for c, g in goldens.items() if not g.broken}, kinds, sources)
        if args.shard:
            cases = shard(cases, args.shard)
        if args.slice:
            a, _, b = args.slice.partition(":")
            cases = cases[int(a or 0):int(b) if b else None]
        print(f"{subject} on {args.workload} ({', '.join(convs)}): {len(cases)} cases, golden runs "
              f"{time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.1f}, cores {os.cpu_count()}", flush=True)
        runs: dict[str, tuple[list[CaseResult], pruning.PruneSummary, float]] = {}
        for mode in modes:
            opts = pruning.options_of(mode == "pruned", args.sample, args.seed)
            load0 = os.getloadavg()[0]
            t1 = time.monotonic()
            results, summary = await pruning.run_pruned(ex, cases, goldens, args.jobs, options=opts)
            seconds = time.monotonic() - t1
            runs[mode] = (results, summary, seconds)
            ran = pruning.executed(results)
            counts = {k: sum(r.outcome == k for r in results) for k in ("pass", "fail", "harness-error", "not-run")}
            print(f"  {mode}: {len(results)} cases {counts}, executed {ran}, workers {pruning.workers_forked(results)}, "
                  f"{seconds:.1f} s: {len(results) / seconds:.2f} cases/s, {ran / seconds:.2f} executed cases/s "
                  f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
            for line in summary.lines():
                print(f"    {line}")
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
        for k in differ[:20]:
            print(f"    {k}: pruned {va.get(k)}, unpruned {vb.get(k)}")
        ok = ok and not differ and fa == fb
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
    args = ap.parse_args()
    kinds, sources = tuple(args.kinds.split(",")), tuple(args.sources.split(","))
    convs = tuple(c for c in args.conversations.split(",") if c) or None
    ok = True
    if args.mutants:
        from crashmatrix.harness.selftest import catalogue

        names = None if args.mutants == "all" else args.mutants.split(",")
        for spec in catalogue(names):
            if spec.workload != args.workload:
                continue
            k = tuple(dict.fromkeys(kinds + spec.fault_kinds))
            s = tuple(dict.fromkeys(sources + spec.point_sources))
            ok = asyncio.run(run_subject(spec.subject, args, k, s, convs or spec.conversations)) and ok
    else:
        ok = asyncio.run(run_subject(args.subject, args, kinds, sources, convs))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
