"""Matrix throughput: cases per second for the checkout kill matrix on 2 cores.

    python benchmarks/bench_matrix.py [--jobs 1,2,4] [--conversations conv1,conv2,conv3,conv4]

Runs the step + labelled-point matrix x {kill, term, cancel} once per ``--jobs`` value
(services started once per run, excluded from the rate) and prints cases, seconds,
cases/s and the median case time; all in one process, so the ratios between job
counts are measured on the same machine state.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics

from crashmatrix.harness.matrix import run_matrix


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="2,4")
    ap.add_argument("--conversations", default="conv1,conv2,conv3,conv4")
    ap.add_argument("--subject", default="reference")
    args = ap.parse_args()
    convs = tuple(args.conversations.split(","))
    print(f"cores: {os.cpu_count()}; conversations: {', '.join(convs)}")
    for jobs in (int(j) for j in args.jobs.split(",")):
        report = asyncio.run(run_matrix("checkout", args.subject, kinds=("kill", "term", "cancel"),
                                        conversations=convs, jobs=jobs))
        med = statistics.median(r.seconds for r in report.results)
        c = report.counts
        print(f"jobs={jobs}: {len(report.results)} cases ({c['pass']} passed, {c['fail']} failed, "
              f"{c['harness-error']} harness errors) in {report.seconds:.1f} s = "
              f"{report.cases_per_second:.1f} cases/s; median case {med * 1000:.0f} ms; "
              f"setup + golden runs {report.setup_seconds:.1f} s")


if __name__ == "__main__":
    main()
