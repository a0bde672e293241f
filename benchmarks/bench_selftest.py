"""Time to first detection per mutant: ``crashmatrix selftest --fast``, repeated.

    python benchmarks/bench_selftest.py [--repeat 3] [--jobs 4] [--mutant NAME ...] [--full]
                                        [--modes pruned,unpruned]

Runs the selftest ``--repeat`` times in this process and prints, per mutant: the median
(min-max) seconds from the start of its turn (golden runs included) to the end of the
first case that caught it, the cases run until then, and the check; then the whole
run's wall seconds, the CPU seconds of this process and its children (workers,
providers: everything but PostgreSQL) and the load average. ``--full`` runs the full
matrix instead (every case, all conversations: minutes, not seconds). ``--modes``: each
repeat runs the selftest pruned (the default: kill cases by crash state,
shared resumes) and/or unpruned (``--no-prune``), one after the other, so the detection
times of both are measured under the same load; the table has a column per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from collections import defaultdict

from crashmatrix.harness.explorer import Options
from crashmatrix.harness.pruning import options_of
from crashmatrix.harness.selftest import run_selftest


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--mutant", action="append")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--modes", default="pruned")
    args = ap.parse_args()
    modes = args.modes.split(",")
    seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
    cases: dict[tuple[str, str], list[int]] = defaultdict(list)
    checks: dict[str, set[str]] = defaultdict(set)
    for i, mode in ((i, m) for i in range(args.repeat) for m in modes):
        t0, c0, load = time.monotonic(), _cpu(), os.getloadavg()[0]
        options = Options(prune=options_of(mode == "pruned"))
        report = asyncio.run(run_selftest(args.mutant, fast=not args.full, jobs=args.jobs, options=options))
        wall, cpu = time.monotonic() - t0, _cpu() - c0
        for m in report.mutants:
            name = m.spec.name if m.spec else m.subject
            if m.first_catch is None or m.first_catch_seconds is None:
                checks[name].add("MISSED" if m.error is None else "error")
                continue
            seconds[name, mode].append(m.first_catch_seconds)
            cases[name, mode].append(len(m.results) if not args.full else
                                     sum(1 for r in m.results if r.outcome == "fail"))
            checks[name].add(m.catching_check or "?")
        clean = ", ".join(f"{b.subject} {b.counts['pass']}/{len(b.results)}" for b in report.baselines)
        print(f"run {i + 1} {mode}: exit {report.exit_code}, {wall:.1f} s wall, {cpu:.1f} s CPU (without PostgreSQL), "
              f"load {load:.1f}; baselines passed: {clean}")
    label = "failing cases" if args.full else "cases run"
    print(f"{'mutant':28} " + " ".join(f"{mode + ': detection s median (min-max), ' + label:52}" for mode in modes)
          + "  check")
    for name in sorted(checks):
        cells = []
        for mode in modes:
            s = seconds.get((name, mode)) or [float("nan")]
            cells.append(f"{statistics.median(s):6.2f} ({min(s):.2f}-{max(s):.2f}), "
                         f"{statistics.median(cases.get((name, mode)) or [0]):.0f}")
        print(f"{name:28} " + " ".join(f"{c:52}" for c in cells) + f"  {', '.join(sorted(checks[name]))}")


if __name__ == "__main__":
    main()
