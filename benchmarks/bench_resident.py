"""What a job costs forked and in a long-lived worker, side by side in one session.

    python benchmarks/bench_resident.py [--jobs 40] [--conversation conv1] [--subject reference]

One session (as ``crashmatrix run`` opens it); ``--jobs`` runs of the conversation
started and completed, then each of them resumed twice, alternating: once in a worker
forked by the zygote (a worker of its own, as ``--fresh-workers`` runs every job), once in
a long-lived worker (:mod:`crashmatrix.harness.resident`; it never resumes a run it ran a
job of, so each run is resumed there once). A resume of a completed run reads the run and
returns: what it costs is what any worker pays before its first step (fork,
copy-on-write faults, connection, session, exit), so the ratio is the saving per job
that moves to a long-lived worker. Printed: median CPU ms (the forked worker's user +
system from the zygote's ``wait4``; the long-lived worker's ``getrusage`` delta around
the job) and median wall ms from the controller's request to the job's end, each way,
and their ratios; the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from crashmatrix.harness.history import WorkerReport
from crashmatrix.harness.plan import FaultPlan
from crashmatrix.harness.session import open_session


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--conversation", default="conv1")
    ap.add_argument("--subject", default="reference")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    async with open_session(args.subject, "checkout") as ex:
        residents = ex.pool.residents
        if residents is None:
            raise SystemExit(f"{args.subject}: its adapter does not declare long_lived_workers")
        runs = [f"cm-run-bench-{n}-{os.getpid()}" for n in range(args.jobs)]
        ex.pool.residents = None
        for run_id in runs:
            job, log = ex._job("start", args.conversation, run_id, FaultPlan(), ex.workdir)
            if (await ex.pool.run(job, log, timeout=60)).returncode != 0:
                raise SystemExit(f"{run_id} did not complete; its log: {log}")
        figures: dict[str, tuple[list[float], list[float]]] = {"forked": ([], []), "long-lived": ([], [])}
        for i in range(2 * args.jobs):
            way = "forked" if i % 2 == 0 else "long-lived"
            ex.pool.residents = None if way == "forked" else residents
            job, log = ex._job("resume", args.conversation, runs[i // 2], FaultPlan(), ex.workdir)
            t0 = time.monotonic()
            exit_ = await ex.pool.run(job, log, timeout=60)
            wall = (time.monotonic() - t0) * 1000
            end = WorkerReport.from_file(job.result_path).end
            if exit_.returncode != 0 or end is None or exit_.resident != (way == "long-lived"):
                raise SystemExit(f"job {i} ({way}) did not run as asked: {exit_}")
            cpu, walls = figures[way]
            cpu.append(exit_.cpu_ms or 0.0)
            walls.append(wall)
        ex.pool.residents = residents
    (fc, fw), (rc, rw) = figures["forked"], figures["long-lived"]
    print(f"{args.subject}, {args.jobs} completed {args.conversation} runs, each resumed once each way, alternating "
          f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f}, {residents.started} long-lived worker(s) started)")
    print(f"  forked      CPU {statistics.median(fc):6.2f} ms   wall {statistics.median(fw):6.2f} ms")
    print(f"  long-lived  CPU {statistics.median(rc):6.2f} ms   wall {statistics.median(rw):6.2f} ms")
    print(f"  long-lived / forked: CPU {statistics.median(rc) / statistics.median(fc):.3f}x, "
          f"wall {statistics.median(rw) / statistics.median(fw):.3f}x")


if __name__ == "__main__":
    asyncio.run(main())
