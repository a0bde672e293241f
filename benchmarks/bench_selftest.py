"""Time to first detection per mutant: ``crashmatrix selftest --fast``, repeated.

    python benchmarks/bench_selftest.py [--repeat 3] [--jobs 4] [--mutant NAME ...] [--full]

Runs the selftest ``--repeat`` times in this process and prints, per mutant: the median
(min-max) seconds from the start of its turn (golden runs included) to the end of the
first case that caught it, the cases run until then, and the check; then the whole
run's wall seconds, the CPU seconds of this process and its children (workers,
providers: everything but PostgreSQL) and the load average. ``--full`` runs the full
matrix instead (every case, all conversations: minutes, not seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from collections import defaultdict

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
    args = ap.parse_args()
    seconds: dict[str, list[float]] = defaultdict(list)
    cases: dict[str, list[int]] = defaultdict(list)
    checks: dict[str, set[str]] = defaultdict(set)
    for i in range(args.repeat):
        t0, c0, load = time.monotonic(), _cpu(), os.getloadavg()[0]
        report = asyncio.run(run_selftest(args.mutant, fast=not args.full, jobs=args.jobs))
        wall, cpu = time.monotonic() - t0, _cpu() - c0
        for m in report.mutants:
            name = m.spec.name if m.spec else m.subject
            if m.first_catch is None or m.first_catch_seconds is None:
                checks[name].add("MISSED" if m.error is None else "error")
                continue
            seconds[name].append(m.first_catch_seconds)
            cases[name].append(len(m.results) if not args.full else
                               sum(1 for r in m.results if r.outcome == "fail"))
            checks[name].add(m.catching_check or "?")
        clean = ", ".join(f"{b.subject} {b.counts['pass']}/{len(b.results)}" for b in report.baselines)
        print(f"run {i + 1}: exit {report.exit_code}, {wall:.1f} s wall, {cpu:.1f} s CPU (without PostgreSQL), "
              f"load {load:.1f}; baselines passed: {clean}")
    label = "failing cases" if args.full else "cases run"
    print(f"{'mutant':28} {'detection s median (min-max)':32} {label:>14}  check")
    for name in sorted(set(seconds) | set(checks)):
        s = seconds.get(name) or [float("nan")]
        print(f"{name:28} {statistics.median(s):6.2f} ({min(s):.2f}-{max(s):.2f}){'':14} "
              f"{statistics.median(cases.get(name) or [0]):>8.0f}  {', '.join(sorted(checks[name]))}")


if __name__ == "__main__":
    main()
