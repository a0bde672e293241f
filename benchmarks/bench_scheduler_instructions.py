"""The scheduler's cost per node in CPU instructions, counted by valgrind.

    python benchmarks/bench_scheduler_instructions.py [--runs 2] [--shape long_run_200 --shape research_fanout]
                                                      [--json PATH]

``bench_fanout.py`` measures the same thing in CPU microseconds, which move up to 2x
between two runs a minute apart on a shared virtual machine. An instruction count does
not: the same code gives the same count to a fraction of a percent, so two builds can be
compared across sessions and a change of a few percent is visible. The figure is
``(Ir(1 + runs) - Ir(1)) / (runs * nodes)``: valgrind's instruction count of the whole
interpreter for 1 + ``runs`` executions of the shape, minus that of one (start-up,
imports, the first run's warm-up), per node. The executor runs as in ``bench_fanout``'s
scheduler figure: the workload's scripts as local models, a store and a ledger that do no
I/O, no lease or trace writes. Shape ``rehydrate_long_run_2500`` counts instead
``RunGraph.rehydrate`` of a 2,500-turn chain's records (made once, in memory), per record;
``rehydrate_read_long_run_2500`` the client's side of the default store's read and the
rebuild of the same records: the parse of the framed ``RecordLog`` bytes, the
``LogRead`` with the facts its server sums (summed once here) and ``RunGraph.rehydrate``
from them, per record.

The floors, in the same unit: ``floor_long_run_200`` is the
chain driven by a bare loop doing per node only what the walls need (the codec's check,
the state schema, the record, one suspension: ``_bench_support.drive_chain_floor``),
``workload_long_run_200`` the workload's own code alone (the model's script, the tools,
their awaits), ``anyio_task_40`` one anyio task started in a task group and passing one
checkpoint, per task (a fan-out's concurrent node pays it). ``long_run_200`` minus
``floor_long_run_200`` is the executor's bookkeeping.

Needs ``valgrind`` on PATH (Debian: ``apt install valgrind``); exits 2 naming it if not.
Each count takes ~10-30 s (valgrind runs Python ~40x slower). Figures go to stdout as
JSON; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fanout import one_execution  # noqa: E402
from _bench_support import MemoryStore, NoLedger, agent, drive_chain_floor, print_figures, untimed_execution  # noqa: E402

from crashmatrix.reference_runtime.executor import Runtime  # noqa: E402
from crashmatrix.reference_runtime.graph import RunGraph  # noqa: E402
from crashmatrix.reference_runtime.logstore import LogRead, facts_of  # noqa: E402
from crashmatrix.reference_runtime.records_pb2 import RecordLog  # noqa: E402
from crashmatrix.reference_runtime.leases import Lease  # noqa: E402
from crashmatrix.scenarios import long_run, research  # noqa: E402

SHAPES = {
    "long_run_200": (long_run.WORKLOAD, "t200"),  # a chain: one model and one tool node per turn, 399 nodes
    "research_fanout": (research.WORKLOAD, "fanout"),  # 40 concurrent tools and a sub-agent, 49 nodes
    # not a schedule: RunGraph.rehydrate of a 2,500-turn chain's 4,999 records, already in
    # memory (the store's fetch and parse are bench_runtime_store's); per record
    "rehydrate_long_run_2500": (long_run.WORKLOAD, "t2500"),
    # the same records as the default store's read hands them over: parsed from one framed
    # RecordLog value with the facts summed beside them (logstore.LogRead); per record
    "rehydrate_read_long_run_2500": (long_run.WORKLOAD, "t2500"),
    # not the executor: long_run_200's chain driven by a bare loop doing what any durable
    # executor of it must (_bench_support.drive_chain_floor); per node
    "floor_long_run_200": (long_run.WORKLOAD, "t200"),
    # the same loop without the walls: the workload's own code alone; per node
    "workload_long_run_200": (long_run.WORKLOAD, "t200"),
    # not a workload: 40 anyio tasks started in one task group, each passing one
    # checkpoint (what the fan-out's concurrent nodes pay to run concurrently); per task
    "anyio_task_40": (None, "40"),
}
ANYIO_TASKS = "anyio_task_40"
FLOORS = {"floor_long_run_200": True, "workload_long_run_200": False}
REHYDRATE = "rehydrate_long_run_2500"
REHYDRATE_READ = "rehydrate_read_long_run_2500"
_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


async def drive(shape: str, executions: int) -> int:
    """Schedule ``executions`` runs of ``shape`` in this process; the nodes of one."""
    workload, conversation = SHAPES[shape]
    nodes = 0
    if shape == ANYIO_TASKS:
        for _ in range(executions):
            async with anyio.create_task_group() as tg:
                for i in range(int(conversation)):
                    tg.start_soon(anyio.lowlevel.checkpoint, name=f"node-{i}")
        return int(conversation)
    if shape in FLOORS:
        for _ in range(executions):
            nodes = await drive_chain_floor(workload, conversation, walls=FLOORS[shape])
        return nodes
    if shape in (REHYDRATE, REHYDRATE_READ):  # the records are made once in either count, so they cancel out
        rt = Runtime(None, agent(workload, conversation), worker_id="bench", handle_sigterm=False,  # type: ignore[arg-type]
                     store=MemoryStore(), ledger=NoLedger())  # type: ignore[arg-type]
        run_id, run_input = "ir-rehydrate", workload.run_input(conversation)
        await one_execution(rt, run_id, run_input, Lease(run_id, "bench", 1))
        stored = await rt.store.read(run_id)
        if shape == REHYDRATE_READ:
            records = [s.record for s in stored]
            framed, nodes, facts = RecordLog(records=records).SerializeToString(), [s.node_id for s in stored], facts_of(records)
            for _ in range(executions):
                RunGraph.rehydrate(run_id, run_input, LogRead(nodes, RecordLog.FromString(framed).records, facts))
            return len(stored)
        for _ in range(executions):
            RunGraph.rehydrate(run_id, run_input, stored)
        return len(stored)
    for _ in range(executions):
        rt = Runtime(None, agent(workload, conversation), worker_id="bench", handle_sigterm=False,  # type: ignore[arg-type]
                     store=MemoryStore(), ledger=NoLedger())  # type: ignore[arg-type]
        run_id = f"ir-{uuid.uuid4().hex[:8]}"
        nodes = await untimed_execution(rt, run_id, workload.run_input(conversation), Lease(run_id, "bench", 1))
    return nodes


def count_instructions(valgrind: str, shape: str, executions: int) -> tuple[int, int]:
    """(instructions, nodes per execution) of one interpreter running ``executions`` runs.

    Raises RuntimeError with valgrind's stderr tail if the child fails or prints no count."""
    proc = subprocess.run(
        [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--drive", shape, str(executions)],
        capture_output=True, text=True, check=False,
    )
    found = _IREFS.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind run of {shape} x{executions} failed (exit {proc.returncode}): {proc.stderr[-800:]}")
    return int(found.group(1).replace(",", "")), int(proc.stdout.split()[-1])


def measure(valgrind: str, shape: str, runs: int) -> dict[str, Any]:
    base, nodes = count_instructions(valgrind, shape, 1)
    more, _ = count_instructions(valgrind, shape, 1 + runs)
    return {"nodes": nodes, "runs": runs, "instructions_per_node": round((more - base) / (runs * nodes))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="repeatable; default: all")
    ap.add_argument("--runs", type=int, default=2, help="executions counted beyond the first (default 2)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--drive", nargs=2, metavar=("SHAPE", "EXECUTIONS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.drive:  # the child valgrind runs
        print(asyncio.run(drive(args.drive[0], int(args.drive[1]))))
        return
    if args.runs < 1:
        ap.error(f"--runs={args.runs} must be at least 1")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("bench_scheduler_instructions: valgrind is not on PATH (Debian: apt install valgrind)", file=sys.stderr)
        raise SystemExit(2)
    print_figures({shape: measure(valgrind, shape, args.runs) for shape in (args.shape or sorted(SHAPES))}, args.json)


if __name__ == "__main__":
    main()
