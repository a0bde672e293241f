"""Cost of the reference runtime's store on local PostgreSQL (issue 5, "Measure").

    python benchmarks/bench_runtime_store.py [--turns 1000] [--rehydrate 5000] [--dsn DSN]

1. Turn append (encode + insert + commit, the executor's one statement with the lease
   fence) p50/p95 at turns 1-20 and at turns N-19..N of one run, for the append-only log,
   for delta-and-snapshot (a snapshot every 50 records, its cost included in the turn
   that writes it) and, side by side, for a naive strategy that upserts the whole state
   (every output so far, JSON-encoded) each turn: the O(1) vs O(n) growth is visible.
2. Rehydrate of R small records (fetch + decode + graph rebuild): the store's one round
   trip returning arrays vs a plain row-by-row fetch.

Starts an embedded PostgreSQL unless --dsn (or $CRASHMATRIX_PG_DSN) is given. Figures
go to stdout; docs/runtime.md records a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from crashmatrix.harness.services.postgres import start_postgres
from crashmatrix.reference_runtime import RunGraph, codec, connect, migrate
from crashmatrix.reference_runtime.leases import acquire
from crashmatrix.reference_runtime.logstore import RECORD_FORMAT_VERSION, AppendOnlyLog, decode_row
from crashmatrix.reference_runtime.records_pb2 import Budget, NodeRecord, NodeSpec
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore


def turn_output(i: int) -> dict[str, Any]:
    """A model turn's output as the executor writes it (~250 bytes)."""
    return {"messages": [{"role": "assistant", "content": f"Step {i}: looking up the next item.",
                          "tool_calls": [{"id": f"call_{i:012x}", "name": "lookup", "arguments": {"sku": f"sku-{i}"}}]}]}


def record(i: int, epoch: int) -> NodeRecord:
    return NodeRecord(
        format_version=RECORD_FORMAT_VERSION, node_id=f"turn-{i}", parents=[f"turn-{i - 1}"] if i > 1 else [],
        kind="model", output=codec.encode(turn_output(i)),
        spawned=[NodeSpec(node_id=f"turn-{i + 1}", kind="model", parents=[f"turn-{i}"], input=codec.encode({}))],
        budget=Budget(tokens=11, model_calls=1, wall_ms=3), lease_epoch=epoch,
    )


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def bench_append(dsn: str, turns: int) -> dict[str, Any]:
    db = await connect(dsn)
    await db.execute("CREATE TABLE IF NOT EXISTS bench_full_state (run_id text PRIMARY KEY, state bytea NOT NULL)")
    log = AppendOnlyLog(db)
    delta = DeltaSnapshotStore(db, every=50)
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    run_d = run_id + "-d"
    for r in (run_id, run_d):
        await db.execute("INSERT INTO cm_runs (run_id, workload, input, status) VALUES ($1, 'bench', '{}'::jsonb, 'pending')", r)
    lease = await acquire(db, run_id, "bench")
    lease_d = await acquire(db, run_d, "bench")
    await delta.read(run_d)  # the store knows the (empty) prefix, as after a rehydrate
    append_ms: list[float] = []
    delta_ms: list[float] = []
    full_ms: list[float] = []
    state: list[Any] = []
    for i in range(1, turns + 1):
        t0 = time.perf_counter()
        rec = record(i, lease.epoch)  # encode
        await log.append(lease, i, rec, None)  # insert + commit (autocommit statement)
        append_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        await delta.append(lease_d, i, record(i, lease_d.epoch), None)
        delta_ms.append((time.perf_counter() - t0) * 1000)
        state.append(turn_output(i))
        t0 = time.perf_counter()
        blob = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
        await db.execute(
            "INSERT INTO bench_full_state (run_id, state) VALUES ($1, $2) ON CONFLICT (run_id) DO UPDATE SET state = $2",
            run_id, blob,
        )
        full_ms.append((time.perf_counter() - t0) * 1000)
    await db.close()
    early, late = slice(0, 20), slice(turns - 20, turns)
    return {
        "append_only": {"turn10_p50": pct(append_ms[early], .5), "turn10_p95": pct(append_ms[early], .95),
                        f"turn{turns}_p50": pct(append_ms[late], .5), f"turn{turns}_p95": pct(append_ms[late], .95)},
        "delta_snapshot_every50": {"turn10_p50": pct(delta_ms[early], .5), "turn10_p95": pct(delta_ms[early], .95),
                                   f"turn{turns}_p50": pct(delta_ms[late], .5), f"turn{turns}_p95": pct(delta_ms[late], .95),
                                   f"turn{turns}_max": max(delta_ms[late])},
        "full_state_upsert": {"turn10_p50": pct(full_ms[early], .5), "turn10_p95": pct(full_ms[early], .95),
                              f"turn{turns}_p50": pct(full_ms[late], .5), f"turn{turns}_p95": pct(full_ms[late], .95)},
    }


async def bench_rehydrate(dsn: str, n: int, repeat: int = 15) -> dict[str, float]:
    db = await connect(dsn)
    run_id = f"bench-r-{uuid.uuid4().hex[:12]}"
    await db.execute("INSERT INTO cm_runs (run_id, workload, input, status) VALUES ($1, 'bench', '{}'::jsonb, 'pending')", run_id)
    rows = [(run_id, i, f"turn-{i}", record(i, 1).SerializeToString(deterministic=True), 1) for i in range(1, n + 1)]
    await db.conn.copy_records_to_table("cm_run_log", records=rows, columns=["run_id", "seq", "node_id", "record", "lease_epoch"])
    await db.execute("ANALYZE cm_run_log")
    log = AppendOnlyLog(db)

    async def arrays() -> None:
        RunGraph.rehydrate(run_id, {}, await log.read(run_id))

    async def row_by_row() -> None:
        rs = await db.fetch("SELECT seq, node_id, record FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
        RunGraph.rehydrate(run_id, {}, [decode_row(run_id, r["seq"], r["node_id"], bytes(r["record"])) for r in rs])

    async def fetch_only() -> None:
        await db.fetchrow("SELECT array_agg(record ORDER BY seq) FROM cm_run_log WHERE run_id = $1", run_id)

    out = {}
    for name, fn in (("arrays_fetch_decode_rebuild", arrays), ("row_by_row_fetch_decode_rebuild", row_by_row), ("arrays_fetch_only", fetch_only)):
        await fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await fn()
            times.append((time.perf_counter() - t0) * 1000)
        out[name + "_median_ms"] = statistics.median(times)
    await db.close()
    return out


async def main_async(args: argparse.Namespace) -> None:
    service = None
    dsn = args.dsn
    if dsn is None:
        service = start_postgres(Path(tempfile.mkdtemp(prefix="cm-bench-")))
        dsn = service.dsn
    try:
        db = await connect(dsn)
        await migrate(db.conn)
        await db.close()
        appends = await bench_append(dsn, args.turns)
        rehydrate = await bench_rehydrate(dsn, args.rehydrate)
        print(json.dumps({"turns": args.turns, "append_ms": appends, "rehydrate_records": args.rehydrate,
                          "rehydrate": rehydrate}, indent=1))
    finally:
        if service is not None:
            service.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--rehydrate", type=int, default=5000)
    ap.add_argument("--dsn", default=None)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
