"""The reference runtime's scheduler: the 40-call fan-out and the cost per node.

    python benchmarks/bench_fanout.py [--repeat 10] [--dsn DSN] [--json PATH]

1. **Fan-out** (goal: at most 60 ms end to end): the ``research`` workload, conversation
   ``slow`` (every ``read_source`` takes 50 ms), driven in process (its scripts as local
   models, its note on an in-memory provider) on a real PostgreSQL. The figure is the
   time from the moment turn 1's record is appended (its 40 tool calls and the sub-agent
   become ready) to the moment the last of the 40 ``read_source`` records is appended;
   ``tools_done_ms`` is when the first of them started its append (the tools' 50 ms), so
   the rest is the appends: with launch batches (the default: the 40 sibling calls'
   records in one statement once all have ended), with group commit (``group_commit=True``:
   records that finish together commit in one statement), with one commit per record
   (``launch_batches=False``), and with the no-I/O store (what the scheduler alone adds).
2. **Scheduler overhead per node** (goal: tens of microseconds): CPU time per node of
   the executor with a store and a ledger that do no I/O: the research fan-out with 0 ms
   tools, and a long_run chain (one model and one tool node per turn). The model here is
   the workload's script called in process, so the figure includes building each model
   node's transcript and the script's own work. Nothing inside the run is timed (timing
   each append would add ~10 us a node to the figure).
   In the same rounds, the chain's two floors (``_bench_support.drive_chain_floor``): the
   workload's own code alone, and that plus what the walls need (the codec's check, the
   state schema, the record, one suspension a node), and the chain over each.

Starts an embedded PostgreSQL unless --dsn (or $CRASHMATRIX_PG_DSN) is given. Figures go
to stdout as JSON; docs/benchmarks.md records runs (with the load average: the machine
these figures come from is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_support import (  # noqa: E402
    MemoryStore, NoLedger, TimedExecution, Timings, agent, drive_chain_floor, postgres_dsn, print_figures,
    untimed_execution,
)

from crashmatrix.reference_runtime import RunGraph, connect, migrate  # noqa: E402
from crashmatrix.reference_runtime.executor import Runtime  # noqa: E402
from crashmatrix.reference_runtime.leases import acquire, Lease  # noqa: E402
from crashmatrix.reference_runtime.logstore import AppendOnlyLog  # noqa: E402
from crashmatrix.scenarios import long_run, research  # noqa: E402

async def one_execution(rt: Runtime, run_id: str, run_input: dict[str, Any], lease: Lease) -> Timings:
    """Schedule one run to its end on ``rt`` (no lease, status or trace writes: the
    executor only) and return its append timings."""
    timings = Timings()

    class Timed(TimedExecution):
        pass

    Timed.timings = timings
    execution = Timed(rt, RunGraph.rehydrate(run_id, run_input, await rt.store.read(run_id), blobs=None), lease)
    status, _ = await execution.schedule()
    assert status == "completed", status
    return timings


def fanout_figure(timings: Timings) -> dict[str, float]:
    ends = {a.node_id: a for a in timings.appends}
    ready = ends["turn-1"].end
    sources = [a for n, a in ends.items() if n.startswith("turn-1.tool-") and ":" not in n and n != "turn-1.tool-40"]
    assert len(sources) == research.SOURCES, len(sources)
    last = max(a.end for a in sources)
    first_append = min(a.start for a in sources)
    return {"fanout_ms": (last - ready) * 1000, "tools_done_ms": (first_append - ready) * 1000}


async def bench_fanout(dsn: str, repeat: int) -> dict[str, Any]:
    db = await connect(dsn, application_name="crashmatrix-bench")
    out: dict[str, Any] = {}
    try:
        await migrate(db.conn)
        variants = (("postgres_launch_batches (the default)", lambda: AppendOnlyLog(db), {}),
                    ("postgres_group_commit (group_commit=True)", lambda: AppendOnlyLog(db), {"group_commit": True}),
                    ("postgres_one_commit_per_record (launch_batches=False)", lambda: AppendOnlyLog(db),
                     {"launch_batches": False}),
                    ("no_io_store", MemoryStore, {"group_commit": True}))
        for label, make_store, policy in variants:
            figures = []
            for _ in range(repeat):
                store = make_store()
                rt = Runtime(db, agent(research.WORKLOAD, "slow"), worker_id="bench", handle_sigterm=False, store=store,
                             **policy)
                run_id = f"bench-fan-{uuid.uuid4().hex[:8]}"
                run_input = research.WORKLOAD.run_input("slow")
                await rt.create_run(run_id, "research", run_input)
                lease = await acquire(db, run_id, "bench")
                figures.append(fanout_figure(await one_execution(rt, run_id, run_input, lease)))
            out[label] = {k: {"median": round(statistics.median(f[k] for f in figures), 2), "min": round(min(f[k] for f in figures), 2)}
                          for k in figures[0]}
    finally:
        await db.close()
    return out


async def bench_overhead(repeat: int) -> dict[str, Any]:
    """CPU microseconds a node of the executor with no I/O (nothing timed inside: the
    benchmark's own clock reads are not the executor's), and in the same rounds the chain's
    floors (``_bench_support.drive_chain_floor``): the workload's own code alone, and that
    plus what the walls need (codec check, state schema, the record, one suspension); the
    chain's figure over each floor is the ratio that holds between runs."""
    out: dict[str, Any] = {}
    shapes = (("research_fanout_41_nodes_plus_child", research.WORKLOAD, "fanout", "executor"),
              ("long_run_chain_200_turns", long_run.WORKLOAD, "t200", "executor"),
              ("long_run_chain_200_turns_floor_walls", long_run.WORKLOAD, "t200", "walls"),
              ("long_run_chain_200_turns_floor_workload_alone", long_run.WORKLOAD, "t200", "workload"),
              ("long_run_chain_1000_turns", long_run.WORKLOAD, "t1000", "executor"))
    per_node: dict[str, list[float]] = {label: [] for label, *_ in shapes}
    nodes: dict[str, int] = {}
    for round_ in range(repeat):  # round-robin, so a load change touches every shape alike
        for label, workload, conversation, driver in shapes:
            if conversation == "t1000" and round_ >= max(1, repeat // 5):
                continue
            if driver == "executor":
                rt = Runtime(None, agent(workload, conversation), worker_id="bench", handle_sigterm=False,  # type: ignore[arg-type]
                             store=MemoryStore(), ledger=NoLedger())  # type: ignore[arg-type]
                run_id = f"ov-{uuid.uuid4().hex[:8]}"
                c0 = time.process_time()
                n = await untimed_execution(rt, run_id, workload.run_input(conversation), Lease(run_id, "bench", 1))
            else:
                wl_agent = agent(workload, conversation)  # outside the figure, as the executor's is
                c0 = time.process_time()
                n = await drive_chain_floor(workload, conversation, walls=driver == "walls", wl_agent=wl_agent)
            per_node[label].append((time.process_time() - c0) / n * 1e6)
            nodes[label] = n
    for label, *_ in shapes:
        out[label] = {"nodes": nodes[label], "cpu_us_per_node_median": round(statistics.median(per_node[label]), 1),
                      "cpu_us_per_node_min": round(min(per_node[label]), 1)}
    chain = out["long_run_chain_200_turns"]["cpu_us_per_node_median"]
    out["long_run_chain_200_turns_over_floor_walls"] = round(chain / out["long_run_chain_200_turns_floor_walls"]["cpu_us_per_node_median"], 2)
    out["long_run_chain_200_turns_over_workload_alone"] = round(
        chain / out["long_run_chain_200_turns_floor_workload_alone"]["cpu_us_per_node_median"], 2)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    async with postgres_dsn(args.dsn) as dsn:
        result: dict[str, Any] = {"load_average_start": os.getloadavg()}
        result["fanout_40_calls_50ms_tools"] = await bench_fanout(dsn, args.repeat)
        result["scheduler_overhead_no_io"] = await bench_overhead(args.repeat)
        result["load_average_end"] = os.getloadavg()
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--dsn", default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat={args.repeat} must be at least 1")
    print_figures(asyncio.run(main_async(args)), args.json)


if __name__ == "__main__":
    main()
