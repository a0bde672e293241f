"""What the ``Db``'s serialisation costs a round trip, with no I/O.

    python benchmarks/bench_db_turn.py [--baseline DIR] [--n 20000] [--blocks 15] [--json PATH]

Every statement the reference runtime sends goes through ``reference_runtime.db.Db``,
which lets one round trip at a time use the connection (a ``turns.Turns`` turn and a
cancellation checkpoint; older builds, which ``--baseline`` can measure, used an ``anyio.Lock``).
Here a ``Db`` wraps a stand-in connection whose ``fetchrow`` suspends once (as a real
answer's wait does) and returns: what is left is the serialisation, the method calls
and one pass of the loop for the answer. ``n`` round trips a block, in a task of an
anyio task group (the cancel scopes a node's task has), ``--blocks`` blocks; thread CPU
time (``time.thread_time``: what a loaded machine does not inflate much) and wall time
per round trip, medians over the blocks. A third figure, ``sleep0``, is the loop pass
alone (``await asyncio.sleep(0)`` in the same loop): what any suspension costs.

With ``--baseline DIR`` (another build's ``reference_runtime`` directory, e.g. ``git
archive main reference_runtime`` unpacked, or another worktree's), its ``db.Db`` is
measured in the same blocks, alternating, and the figures say ``this_build`` and
``baseline``. Figures go to stdout as JSON; docs/benchmarks.md records runs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_support import print_figures  # noqa: E402

from crashmatrix.reference_runtime.db import Db  # noqa: E402


class StubConnection:
    """What ``Db`` needs of an asyncpg connection, answering at once after one
    suspension of the caller (the wait for the server's answer)."""

    async def fetchrow(self, query: str, *args: Any) -> None:
        await asyncio.sleep(0)

    fetchval = fetch = execute = fetchrow

    def is_closed(self) -> bool:
        return False


def baseline_db_class(directory: str) -> type:
    """``Db`` of another build's ``reference_runtime`` (its ``db.py``, loaded beside this
    build's as ``cm_baseline_db``; it imports only the harness's crash points)."""
    path = Path(directory).resolve() / "db.py"
    spec = importlib.util.spec_from_file_location("cm_baseline_rt_db", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cm_baseline_rt_db"] = module
    spec.loader.exec_module(module)
    return module.Db


async def block(kind: str, db: Any, n: int) -> tuple[float, float]:
    """CPU and wall seconds of ``n`` round trips (or loop passes) of ``kind``."""
    c0, t0 = time.thread_time(), time.perf_counter()
    if kind == "sleep0":
        for _ in range(n):
            await asyncio.sleep(0)
    elif kind.endswith("_once"):
        for _ in range(n):
            await db.fetchrow_once("SELECT 1")
    else:
        for _ in range(n):
            await db.fetchrow("SELECT 1")
    return time.thread_time() - c0, time.perf_counter() - t0


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    dbs: dict[str, Any] = {"this_build": Db(StubConnection())}  # type: ignore[arg-type]
    if args.baseline:
        dbs["baseline"] = baseline_db_class(args.baseline)(StubConnection())
    kinds = ["sleep0"] + [f"{name}{suffix}" for name in dbs for suffix in ("", "_once")]
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    out: dict[str, Any] = {"load_average_start": os.getloadavg(), "n": args.n, "blocks": args.blocks}

    async def measure() -> None:
        for b in range(args.blocks + 1):  # the first block of each warms up and is dropped
            order = kinds if b % 2 else kinds[::-1]
            for kind in order:
                c, w = await block(kind, dbs.get(kind.removesuffix("_once")), args.n)
                if b:
                    cpu[kind].append(c / args.n * 1e6)
                    wall[kind].append(w / args.n * 1e6)

    async with anyio.create_task_group() as tg:  # a node's task: inside a task group's scopes
        tg.start_soon(measure)
    for kind in kinds:
        out[kind] = {"cpu_us_median": round(statistics.median(cpu[kind]), 2),
                     "cpu_us_min": round(min(cpu[kind]), 2),
                     "wall_us_median": round(statistics.median(wall[kind]), 2)}
    if args.baseline:
        out["this_minus_baseline_cpu_us"] = {
            suffix or "fetchrow": round(out[f"this_build{suffix}"]["cpu_us_median"] - out[f"baseline{suffix}"]["cpu_us_median"], 2)
            for suffix in ("", "_once")}
    out["load_average_end"] = os.getloadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="another build's reference_runtime directory: its Db measured beside this build's")
    ap.add_argument("--n", type=int, default=20000, help="round trips a block")
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    print_figures(anyio.run(main_async, args), args.json)


if __name__ == "__main__":
    main()
