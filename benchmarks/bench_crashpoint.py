"""Cost of a labelled crash point: disarmed (no plan in this process) and armed with a
hook that only counts (the worker's recording hook does a little more).

    python benchmarks/bench_crashpoint.py

Prints nanoseconds per call, measured with timeit over 2,000,000 calls (best of 5).
"""

from __future__ import annotations

import timeit

from crashmatrix.harness import crashpoint as cp
from crashmatrix.harness.worker import Recorder
from crashmatrix.harness.plan import FaultPlan

N = 2_000_000


def best(stmt: str, setup: str = "pass") -> float:
    g = {"crashpoint": cp.crashpoint}
    return min(timeit.repeat(stmt, setup, number=N, repeat=5, globals=g)) / N * 1e9


def main() -> None:
    cp.disarm()
    empty = best("pass")
    disarmed = best('crashpoint("effect.started.after")')
    calls = [0]

    def hook(name: str, task: str) -> None:
        calls[0] += 1

    cp.arm(hook)
    armed = best('crashpoint("effect.started.after")')
    import os

    fd = os.open(os.devnull, os.O_WRONLY)
    rec = Recorder(FaultPlan(), fd)
    cp.arm(rec.label_hook)
    n_rec = 200_000
    recording = min(timeit.repeat('crashpoint("effect.started.after")', number=n_rec, repeat=3, globals={"crashpoint": cp.crashpoint})) / n_rec * 1e9
    cp.disarm()
    print(f"loop overhead (pass):         {empty:7.1f} ns")
    print(f"crashpoint() disarmed:        {disarmed:7.1f} ns per call")
    print(f"crashpoint() armed, counting: {armed:7.1f} ns per call")
    print(f"crashpoint() armed, worker's recording hook: {recording:7.1f} ns per call")


if __name__ == "__main__":
    main()
