"""Armed overhead of await-point tracing, per suspension.

    python benchmarks/bench_awaitpoints.py

Runs a task that suspends 50,000 times (``await asyncio.sleep(0)`` inside a function of
the "subject") three ways in one process: plain asyncio; with the tracing task factory
and a hook that does nothing; with the worker's recording hook (counts occurrences per
logical task, keeps the trace). Prints microseconds per suspension and the difference,
best of 5 runs each.
"""

from __future__ import annotations

import asyncio
import os
import time

from crashmatrix.harness import awaitpoints
from crashmatrix.harness.plan import FaultPlan
from crashmatrix.harness.worker import Recorder

N = 50_000


async def subject_step() -> None:
    await asyncio.sleep(0)


async def subject_loop() -> None:
    for _ in range(N):
        await subject_step()


def run(mode: str) -> float:
    async def main() -> float:
        if mode == "noop-hook":
            awaitpoints.install(lambda name, task: None, ("__main__",))
        elif mode == "recording-hook":
            rec = Recorder(FaultPlan(), os.open(os.devnull, os.O_WRONLY))
            awaitpoints.install(rec.await_hook, ("__main__",))
        t = time.perf_counter()
        await asyncio.get_running_loop().create_task(subject_loop())
        return time.perf_counter() - t

    return min(asyncio.run(main()) for _ in range(5)) / N * 1e6


def main() -> None:
    plain = run("plain")
    noop = run("noop-hook")
    recording = run("recording-hook")
    print(f"plain asyncio:             {plain:6.2f} us per suspension")
    print(f"traced, no-op hook:        {noop:6.2f} us per suspension (+{noop - plain:.2f} us)")
    print(f"traced, recording hook:    {recording:6.2f} us per suspension (+{recording - plain:.2f} us)")


if __name__ == "__main__":
    main()
