"""Cost of the reference runtime's store on local PostgreSQL, on the ``long_run`` workload.

    python benchmarks/bench_runtime_store.py [--turns 1000] [--rounds 2] [--rehydrate 5000]
                                             [--vacuum-wait 75] [--dsn DSN] [--json PATH]
                                             [--rehydrate-only] [--repeat 15] [--baseline DIR]

1. **Turn append** (the executor's ``append``: encode + insert + commit, one fenced
   statement that also moves the node's effect) p50/p95 over turns 1-20 ("turn 10") and
   over the last 20 turns ("turn 1000") of one ``long_run`` run driven in process (its
   script as a local model, its progress mails on an in-memory provider), for the
   append-only log, delta-and-snapshot (a snapshot every 50 records, written in the turn
   that reaches it) and a naive store that upserts the whole state (every record so far)
   each turn, side by side: ``rounds`` rounds, the order of the strategies rotated. After
   each append (outside its timing) a one-row commit on the same connection, so each
   window's p50 is also given over the floor measured in that window
   (``turn10_over_floor_beside_p50``; the goal's ratio is to section 3's floor, measured
   before the runs: this one holds when the disk's speed drifts between the two).
2. **Operating costs** of each strategy's run: table, index and TOAST bytes it added (per
   1,000 turns), values stored out of line, dead tuples after the run (ledger and run-row
   updates; the naive store's rewrites) and what autovacuum did with them within
   ``--vacuum-wait`` seconds (``pg_stat_user_tables``, ``pg_relation_size``).
3. **Floor**: a ``SELECT 1`` round trip and a one-row INSERT with its own commit (fsync
   on), the least any turn append can cost on this server and disk; beside them a log
   row's plain INSERT and the store's fenced append statements alone (no encoding), so
   the append's distance from the floor splits into the statement's and the client's.
4. **Rehydrate** of ``--rehydrate`` records (a long_run log): the store's read (one round
   trip returning the records framed as one protobuf message, parsed in one call, with
   the facts the rebuild needs), the per-row path (three arrays, a parse per record), a
   plain row-by-row fetch, the framed fetch alone (as the read made it before schema
   version 6: the goal's denominator) and the store's query alone, the graph rebuild on
   top, the same log as rows without facts (an older build's), and with ``--baseline``
   another build's read and rebuild; round-robin, ``--repeat`` rounds.
5. With ``--baseline``: the append-only store's append of this build against the other
   build's, interleaved record by record on one connection.

Starts an embedded PostgreSQL (fsync on) unless --dsn (or $CRASHMATRIX_PG_DSN) is given.
Figures go to stdout as JSON; docs/benchmarks.md records runs. Wall-clock figures on a
shared machine are noisy: the load average is printed with them; the ratios within one
run and the client CPU times are the stable part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_support import (  # noqa: E402
    MemoryProvider, MemoryStore, Resources, TimedRuntime, Timings, local_agent, pct, postgres_dsn, print_figures,
)

from crashmatrix.reference_runtime import RunGraph, connect, migrate  # noqa: E402
from crashmatrix.reference_runtime.db import Db  # noqa: E402
from crashmatrix.reference_runtime.executor import Execution, Runtime  # noqa: E402
from crashmatrix.reference_runtime.leases import Lease, LeaseLost  # noqa: E402
from crashmatrix.reference_runtime import logstore  # noqa: E402
from crashmatrix.reference_runtime.logstore import (  # noqa: E402
    _APPEND_SQL, AppendOnlyLog, EffectOutcome, StoredRecord, decode_row, record_facts)
from crashmatrix.reference_runtime.records_pb2 import NodeRecord, Snapshot, SnapshotEntry  # noqa: E402
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore  # noqa: E402
from crashmatrix.scenarios import long_run  # noqa: E402

SNAPSHOT_EVERY = 50
_VARINT4_V5 = "substring(int8send(((({n} & 127) | 128)::bigint << 24) | (((({n} >> 7) & 127) | 128) << 16)" \
              " | (((({n} >> 14) & 127) | 128) << 8) | ({n} >> 21)) FROM 5)"
TABLES = ("cm_run_log", "cm_run_snapshots", "cm_effects", "cm_runs", "bench_full_state")

_FULL_SQL = """
WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $3 FOR SHARE)
, up AS (
    INSERT INTO bench_full_state (run_id, state) SELECT $1, $2 FROM fence
    ON CONFLICT (run_id) DO UPDATE SET state = EXCLUDED.state RETURNING 1)
, eff AS (
    UPDATE cm_effects SET status = $5, result = $6::jsonb, lease_epoch = $3, updated_at = now()
     WHERE run_id = $1 AND idem_key = $4 AND $4 IS NOT NULL AND EXISTS (SELECT 1 FROM up) RETURNING 1)
SELECT (SELECT count(*) FROM fence) AS fenced_ok, (SELECT count(*) FROM eff) AS effects
"""


class FullStateUpsert:
    """The naive strategy (what seed 000 warns against): every turn re-encodes and
    upserts the whole state, i.e. every record so far, into one row. Benchmarks only."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.entries: dict[str, list[SnapshotEntry]] = {}

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        entries = self.entries.setdefault(lease.run_id, [])
        entries.append(SnapshotEntry(seq=seq, record=record))
        state = Snapshot(format_version=1, upto_seq=seq, entries=entries).SerializeToString(deterministic=True)
        row = await self.db.fetchrow(
            _FULL_SQL, lease.run_id, state, lease.epoch, effect.idem_key if effect else None,
            effect.status if effect else None, json.dumps(effect.result, sort_keys=True) if effect else None)
        if row is None or not row["fenced_ok"]:
            raise LeaseLost(f"run {lease.run_id}: lease epoch {lease.epoch} is stale")
        return True

    async def read(self, run_id: str) -> list[StoredRecord]:
        data = await self.db.fetchval("SELECT state FROM bench_full_state WHERE run_id = $1", run_id)
        if data is None:
            return []
        return [StoredRecord(e.seq, e.record.node_id, e.record) for e in Snapshot.FromString(data).entries]


STRATEGIES = {
    "append_only": lambda db: AppendOnlyLog(db),
    f"delta_snapshot_every{SNAPSHOT_EVERY}": lambda db: DeltaSnapshotStore(db, every=SNAPSHOT_EVERY),
    "full_state_upsert": lambda db: FullStateUpsert(db),
}


def turn_of(node_id: str) -> int:
    """``turn-12`` and ``turn-12.tool-0`` -> 12."""
    return int(node_id.split(".", 1)[0].rsplit("-", 1)[1])


def long_run_agent(turns: int, provider: MemoryProvider) -> Any:
    conversation = f"t{turns}"
    return local_agent(long_run.WORKLOAD.build_agent(conversation, Resources(conversation)),
                       {"long_run": long_run.respond}, conversation, provider)


async def relation_sizes(db: Db) -> dict[str, dict[str, int]]:
    out = {}
    for table in TABLES:
        row = await db.fetchrow(
            "SELECT pg_relation_size(c.oid) AS heap, pg_indexes_size(c.oid) AS indexes, "
            "coalesce(pg_relation_size(nullif(c.reltoastrelid, 0)), 0) AS toast FROM pg_class c WHERE c.oid = $1::regclass",
            table)
        out[table] = {"heap": row["heap"], "indexes": row["indexes"], "toast": row["toast"]}
    return out


async def run_strategy(db: Db, name: str, turns: int, floor: Callable[[], Awaitable[float]] | None = None) -> dict[str, Any]:
    """One long_run of ``turns`` turns on strategy ``name``: append timings and what it
    added to each table; with ``floor``, that floor's figure after each append (outside
    its timing: ``besides``)."""
    before = await relation_sizes(db)
    timings = Timings(beside=floor)
    rt = TimedRuntime(db, long_run_agent(turns, MemoryProvider()), worker_id="bench", handle_sigterm=False,
                      store=STRATEGIES[name](db))
    rt.timings = timings
    run_id = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    await rt.create_run(run_id, "long_run", long_run.WORKLOAD.run_input(f"t{turns}"))
    t0 = time.perf_counter()
    status = await rt.run(run_id)
    seconds = time.perf_counter() - t0
    after = await relation_sizes(db)
    added = {t: {k: after[t][k] - before[t][k] for k in after[t]} for t in TABLES}
    return {"run_id": run_id, "status": status, "seconds": seconds, "appends": timings.appends, "added": added,
            "besides": timings.besides}


def window(appends: list[Any], first: int, last: int) -> list[float]:
    return [a.ms for a in appends if first <= turn_of(a.node_id) <= last]


def window_besides(besides: list[tuple[str, float]], first: int, last: int) -> list[float]:
    return [ms for node_id, ms in besides if first <= turn_of(node_id) <= last]


async def bench_append(db: Db, turns: int, rounds: int, floor: Callable[[], Awaitable[float]] | None = None,
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Section 1. With ``floor`` (:func:`floor_beside`), it runs after every append
    (outside the append's timing), and each window's append p50 is also given over the
    floor's p50 in the same window, measured where the appends are (the disk's commit
    time drifts several-fold within minutes on a shared machine, so a floor measured
    before the runs can be another disk's)."""
    names = list(STRATEGIES)
    samples: dict[str, dict[str, list[float]]] = {n: {"early": [], "late": [], "floor_early": [], "floor_late": []}
                                                  for n in names}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            out = await run_strategy(db, name, turns, floor)
            assert out["status"] == "completed", out["status"]
            samples[name]["early"] += window(out["appends"], 1, 20)
            samples[name]["late"] += window(out["appends"], turns - 19, turns)
            samples[name]["floor_early"] += window_besides(out["besides"], 1, 20)
            samples[name]["floor_late"] += window_besides(out["besides"], turns - 19, turns)
            runs[name].append(out)
    figures = {}
    for name in names:
        e, la = samples[name]["early"], samples[name]["late"]
        figures[name] = {
            "turn10_p50_ms": round(pct(e, .5), 3), "turn10_p95_ms": round(pct(e, .95), 3),
            f"turn{turns}_p50_ms": round(pct(la, .5), 3), f"turn{turns}_p95_ms": round(pct(la, .95), 3),
            f"turn{turns}_max_ms": round(max(la), 3),
            "late_over_early_p50": round(pct(la, .5) / pct(e, .5), 2),
            "appends_per_window": len(e),
            "run_seconds": [round(o["seconds"], 2) for o in runs[name]],
        }
        fe, fl = samples[name]["floor_early"], samples[name]["floor_late"]
        if fe and fl:
            figures[name] |= {
                "floor_beside_turn10_p50_ms": round(pct(fe, .5), 3), f"floor_beside_turn{turns}_p50_ms": round(pct(fl, .5), 3),
                "turn10_over_floor_beside_p50": round(pct(e, .5) / pct(fe, .5), 2),
                f"turn{turns}_over_floor_beside_p50": round(pct(la, .5) / pct(fl, .5), 2),
            }
    return figures, runs


@contextlib.asynccontextmanager
async def floor_beside(db: Db) -> AsyncIterator[Callable[[], Awaitable[float]]]:
    """The one-row commit floor of section 3, as a callable that commits one row on the
    run's own connection and returns its ms, for :func:`bench_append` to call between
    appends (through the ``Db``, as the appends go: its turn, ~8 us, is in the figure).
    A commit in the run's rhythm costs more than one in section 3's tight loop (the
    server's process wakes from a longer idle; 0.20-0.26 ms against 0.18-0.21 on a
    quiet machine, 2026-12-05): both ratios are given."""
    await db.execute("CREATE TABLE IF NOT EXISTS bench_floor_beside (id bigserial PRIMARY KEY, v int NOT NULL)")

    async def one() -> float:
        t0 = time.perf_counter()
        await db.fetch("INSERT INTO bench_floor_beside (v) VALUES (1)")
        return (time.perf_counter() - t0) * 1000

    try:
        yield one
    finally:
        await db.execute("DROP TABLE bench_floor_beside")


async def operating_costs(db: Db, runs: dict[str, list[dict[str, Any]]], turns: int, vacuum_wait: float) -> dict[str, Any]:
    """Bytes per 1,000 turns and TOAST per strategy (its first run); dead tuples and
    autovacuum over every table after all runs."""
    per_k = 1000 / turns
    costs: dict[str, Any] = {}
    for name, outs in runs.items():
        added = outs[0]["added"]
        used = {t: v for t, v in added.items() if any(v.values())}
        costs[name] = {
            "bytes_per_1000_turns": {t: {k: int(v * per_k) for k, v in sizes.items()} for t, sizes in used.items()},
            "total_bytes_per_1000_turns": int(sum(sum(s.values()) for s in used.values()) * per_k),
        }
    run_ids = [o["run_id"] for outs in runs.values() for o in outs]
    costs["out_of_line"] = {
        "cm_run_log": dict(await db.fetchrow(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE pg_column_compression(record) IS NOT NULL) AS compressed, "
            "count(*) FILTER (WHERE pg_column_toast_chunk_id(record) IS NOT NULL) AS external, "
            "max(octet_length(record)) AS longest FROM cm_run_log WHERE run_id = ANY($1::text[])", run_ids)),
        "cm_run_snapshots": dict(await db.fetchrow(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE pg_column_toast_chunk_id(snapshot) IS NOT NULL) AS external, "
            "max(octet_length(snapshot)) AS longest, sum(octet_length(snapshot)) AS bytes FROM cm_run_snapshots "
            "WHERE run_id = ANY($1::text[])", run_ids)),
        "bench_full_state": dict(await db.fetchrow(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE pg_column_toast_chunk_id(state) IS NOT NULL) AS external, "
            "max(octet_length(state)) AS longest FROM bench_full_state WHERE run_id = ANY($1::text[])", run_ids)),
    }
    await db.fetchval("SELECT pg_stat_force_next_flush()")
    await asyncio.sleep(1.5)
    stats_sql = """
        SELECT coalesce(o.relname || ' (toast)', c.relname) AS name, s.n_live_tup, s.n_dead_tup, s.n_tup_upd,
               s.n_tup_hot_upd, s.autovacuum_count, s.autoanalyze_count, s.last_autovacuum::text AS last_autovacuum
          FROM pg_stat_all_tables s JOIN pg_class c ON c.oid = s.relid
          LEFT JOIN pg_class o ON o.reltoastrelid = s.relid
         WHERE c.relname = ANY($1::text[]) OR o.relname = ANY($1::text[])
         ORDER BY 1
    """

    async def stats() -> dict[str, Any]:
        return {r["name"]: {k: r[k] for k in r.keys() if k != "name"} for r in await db.fetch(stats_sql, list(TABLES))}

    settings = {r["name"]: r["setting"] for r in await db.fetch(
        "SELECT name, setting FROM pg_settings WHERE name LIKE 'autovacuum%' AND name IN ('autovacuum', 'autovacuum_naptime', "
        "'autovacuum_vacuum_threshold', 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_insert_threshold', "
        "'autovacuum_vacuum_insert_scale_factor')")}
    after_run = await stats()
    t0 = time.monotonic()
    later = after_run
    while time.monotonic() - t0 < vacuum_wait:
        await asyncio.sleep(5)
        later = await stats()
    costs["autovacuum_settings"] = settings
    costs["tables_after_run"] = after_run
    costs[f"tables_after_{int(vacuum_wait)}s"] = later
    return costs


async def long_run_records(n: int) -> list[StoredRecord]:
    """``n`` records of a long_run log, made in memory (no database)."""
    turns = n // 2 + 1

    class NoLedger:
        async def get(self, run_id: str, key: str) -> None:
            return None

        async def mark_started(self, *args: Any) -> None:
            pass

    rt = Runtime(None, long_run_agent(turns, MemoryProvider()), worker_id="gen", handle_sigterm=False,  # type: ignore[arg-type]
                 store=MemoryStore(), ledger=NoLedger())  # type: ignore[arg-type]
    execution = Execution(rt, RunGraph.rehydrate("gen", {}, []), Lease("gen", "gen", 1))
    await execution.schedule()
    return rt.store.runs["gen"][:n]  # type: ignore[attr-defined]


# The framed fetch as the store's read made it before schema version 6 (records framed as
# a Snapshot's entries, node ids, the plain check; no facts): the denominator of issue
# 22's rehydrate goal, kept fixed so builds compare against the same fetch.
FRAMED_FETCH_V5_SQL = """
SELECT string_agg('\\x1a'::bytea || {v1} || '\\x12'::bytea || {v2} || record, ''::bytea ORDER BY seq) AS framed,
       array_agg(node_id ORDER BY seq) AS nodes, count(*) AS n, min(seq) AS first, max(seq) AS last,
       max(length(record)) AS longest,
       bool_and(octet_length(node_id) < 128 AND substring(record FROM 1 FOR 4 + octet_length(node_id))
                = '\\x0802'::bytea || '\\x12'::bytea || set_byte('\\x00'::bytea, 0, octet_length(node_id))
                  || convert_to(node_id, 'UTF8')) AS plain
  FROM cm_run_log WHERE run_id = $1
"""


def load_baseline(directory: str) -> Any:
    """Another build's ``reference_runtime`` package (``git archive REV reference_runtime``
    unpacked), imported beside this one as ``cm_baseline_rt`` with this build's generated
    protobuf module (a superset: one descriptor pool holds one ``records.proto``)."""
    import importlib.util

    from crashmatrix.reference_runtime import records_pb2

    root = Path(directory).resolve()
    sys.modules["cm_baseline_rt.records_pb2"] = records_pb2
    spec = importlib.util.spec_from_file_location("cm_baseline_rt", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["cm_baseline_rt"] = package
    spec.loader.exec_module(package)
    import cm_baseline_rt.graph  # type: ignore[import-not-found]  # noqa: F401
    import cm_baseline_rt.logstore  # type: ignore[import-not-found]  # noqa: F401
    return package


async def bench_rehydrate(db: Db, n: int, repeat: int = 15, baseline: Any = None) -> dict[str, Any]:
    """The read paths of one ``n``-record long_run log, measured round-robin (each
    repetition runs every path once, so a change of the machine's speed hits them alike),
    and the same log as rows of a build before schema version 6 (no facts beside the
    records: the graph walks them). ``baseline``: another build's package
    (:func:`load_baseline`), whose store's read and rebuild are measured in the same rounds."""
    from crashmatrix.reference_runtime.logstore import _READ_FRAMED_SQL, record_facts

    records = await long_run_records(n)
    run_id, old_id = f"bench-r-{uuid.uuid4().hex[:12]}", f"bench-r-{uuid.uuid4().hex[:12]}"
    for rid in (run_id, old_id):
        await db.execute("INSERT INTO cm_runs (run_id, workload, input, status) VALUES ($1, 'bench', '{}'::jsonb, 'pending')", rid)
    rows = [(run_id, s.seq, s.node_id, s.record.SerializeToString(deterministic=True), 1, *record_facts(s.record))
            for s in records]
    await db.conn.copy_records_to_table("cm_run_log", records=rows, columns=[
        "run_id", "seq", "node_id", "record", "lease_epoch", "kind", "tokens", "wall_ms", "spawned"])
    await db.conn.copy_records_to_table("cm_run_log", records=[(old_id, *r[1:5]) for r in rows],
                                        columns=["run_id", "seq", "node_id", "record", "lease_epoch"])
    await db.execute("VACUUM ANALYZE cm_run_log")
    log = AppendOnlyLog(db)
    fetch_v5 = FRAMED_FETCH_V5_SQL.format(v1=_VARINT4_V5.format(n="(length(record) + 5)"), v2=_VARINT4_V5.format(n="length(record)"))

    async def read() -> Any:
        return await log.read(run_id)

    async def read_rows() -> Any:
        return await log.read_rows(run_id)

    async def row_by_row() -> Any:
        rs = await db.fetch("SELECT seq, node_id, record FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
        return [decode_row(run_id, r["seq"], r["node_id"], bytes(r["record"])) for r in rs]

    async def fetch_only() -> Any:
        return await db.fetchrow(fetch_v5, run_id)

    async def fetch_store_query() -> Any:
        return await db.fetchrow(_READ_FRAMED_SQL, run_id)

    async def read_and_rebuild() -> Any:
        return RunGraph.rehydrate(run_id, {}, await log.read(run_id))

    async def read_and_rebuild_old_rows() -> Any:
        return RunGraph.rehydrate(old_id, {}, await log.read(old_id))

    fast, slow = await read_and_rebuild(), await read_and_rebuild_old_rows()
    assert [(s.seq, s.record) for s in await read()] == [(s.seq, s.record) for s in await read_rows()]
    assert (fast.records, list(fast.specs), fast._pending, fast.tokens_used, fast.wall_ms_used, fast.turns_used) == (
        slow.records, list(slow.specs), slow._pending, slow.tokens_used, slow.wall_ms_used, slow.turns_used)
    paths: list[tuple[str, Any]] = [
        ("fetch_only_framed", fetch_only), ("fetch_only_store_query", fetch_store_query),
        ("fetch_decode_framed (the store's read)", read),
        ("fetch_decode_per_row_arrays", read_rows), ("fetch_decode_row_by_row", row_by_row),
        ("fetch_decode_framed_plus_graph_rebuild", read_and_rebuild),
        ("rows_without_facts_read_plus_graph_rebuild", read_and_rebuild_old_rows),
    ]
    if baseline is not None:
        base_log = baseline.logstore.AppendOnlyLog(db)
        base_graph = baseline.graph.RunGraph

        async def baseline_read_and_rebuild() -> Any:
            return base_graph.rehydrate(run_id, {}, await base_log.read(run_id))

        assert (await baseline_read_and_rebuild()).records == fast.records
        paths.append(("baseline_read_plus_graph_rebuild", baseline_read_and_rebuild))
    out: dict[str, Any] = {"records": n, "bytes": sum(len(r[3]) for r in rows)}
    wall: dict[str, list[float]] = {name: [] for name, _ in paths}
    cpu: dict[str, list[float]] = {name: [] for name, _ in paths}
    for name, fn in paths:
        await fn()
    for _ in range(repeat):
        for name, fn in paths:
            t0, c0 = time.perf_counter(), time.process_time()
            result = await fn()  # held until the time is taken: freeing it is not the read's
            wall[name].append((time.perf_counter() - t0) * 1000)
            cpu[name].append((time.process_time() - c0) * 1000)
            del result
    for name, _ in paths:
        out[name] = {"median_ms": round(statistics.median(wall[name]), 2), "min_ms": round(min(wall[name]), 2),
                     "client_cpu_median_ms": round(statistics.median(cpu[name]), 2)}
    fetch = out["fetch_only_framed"]["median_ms"]
    out["ratios_to_fetch_only_framed"] = {name: round(out[name]["median_ms"] / fetch, 2) for name, _ in paths}
    return out


async def bench_append_against(db: Db, baseline: Any, n: int = 600) -> dict[str, Any]:
    """The append-only store's append of this build against ``baseline``'s, interleaved:
    the first ``n`` records of a long_run log appended one by one into two runs, record
    ``i`` by one build then the other (the order swapped every record), p50/p95 in ms.
    Both write to this build's schema (the baseline's statement leaves the facts NULL)."""
    records = await long_run_records(n)
    stores = {"this_build": AppendOnlyLog(db), "baseline": baseline.logstore.AppendOnlyLog(db)}
    leases = {}
    for name in stores:
        run_id = f"bench-a-{uuid.uuid4().hex[:12]}"
        await db.execute("INSERT INTO cm_runs (run_id, workload, input, status, lease_epoch) "
                         "VALUES ($1, 'bench', '{}'::jsonb, 'running', 1)", run_id)
        leases[name] = Lease(run_id, "bench", 1)
    times: dict[str, list[float]] = {name: [] for name in stores}
    names = list(stores)
    for i, item in enumerate(records):
        for name in names if i % 2 else names[::-1]:
            t0 = time.perf_counter()
            await stores[name].append(leases[name], item.seq, item.record, None)
            times[name].append((time.perf_counter() - t0) * 1000)
    out: dict[str, Any] = {name: {"p50_ms": round(pct(t, 0.5), 3), "p95_ms": round(pct(t, 0.95), 3)} for name, t in times.items()}
    out["this_over_baseline_p50"] = round(out["this_build"]["p50_ms"] / out["baseline"]["p50_ms"], 3)
    out["appends_each"] = n
    return out


async def bench_floor(db: Db, n: int = 400) -> dict[str, Any]:
    """What this server and disk cost before the store does anything: a ``SELECT 1``
    round trip, and a one-row INSERT committed on its own (the commit's WAL flush, fsync
    on), p50/p95 in ms over ``n`` each. A turn append is one such commit plus its work,
    so its p50 cannot go below the commit's. Between the floor and the executor's append,
    three steps of the same kind: a long_run model record (its real bytes and facts)
    inserted into ``cm_run_log`` by a plain INSERT, by the store's fenced statement for a
    record without an effect (``logstore._APPEND_ALONE_SQL``, what a model turn sends; a
    build without it gets no such row), and by its
    statement for a record with one (``_APPEND_SQL``, the fence, the insert and the
    effect's update as CTEs; here with no effect to update), each with the record already
    encoded, so what the fence costs and what the client's encoding costs read apart.
    Each statement runs in turn, ``n`` rounds, so drift on the disk touches all of them
    alike."""
    await db.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, v int NOT NULL)")
    item = (await long_run_records(2))[0]
    data = item.record.SerializeToString(deterministic=True)
    facts = record_facts(item.record)
    runs = []
    for _ in range(3):
        run_id = f"bench-floor-{uuid.uuid4().hex[:12]}"
        await db.execute("INSERT INTO cm_runs (run_id, workload, input, status, lease_epoch) "
                         "VALUES ($1, 'bench', '{}'::jsonb, 'running', 1)", run_id)
        runs.append(run_id)
    plain = ("INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned) "
             "VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8)")
    statements: dict[str, tuple[str, Any]] = {
        "select_1": ("SELECT 1", lambda i: ()),
        "insert_commit_1_row": ("INSERT INTO bench_floor (v) VALUES (1)", lambda i: ()),
        "log_row_plain_insert": (plain, lambda i: (runs[0], i, f"n{i}", data, *facts)),
        "append_statement_alone": (getattr(logstore, "_APPEND_ALONE_SQL", ""), lambda i: (runs[1], i, f"n{i}", data, 1, *facts)),
        "append_effect_statement": (_APPEND_SQL, lambda i: (runs[2], i, f"n{i}", data, 1, None, None, None, *facts)),
    }
    if not statements["append_statement_alone"][0]:
        del statements["append_statement_alone"]
    times: dict[str, list[float]] = {name: [] for name in statements}
    for i in range(1, n + 1):
        for name, (sql, args) in statements.items():
            values = args(i)
            t0 = time.perf_counter()
            await db.conn.fetch(sql, *values)
            times[name].append((time.perf_counter() - t0) * 1000)
    out: dict[str, Any] = {name: {"p50_ms": round(pct(t, 0.5), 3), "p95_ms": round(pct(t, 0.95), 3)}  # as the appends
                           for name, t in times.items()}
    commit = out["insert_commit_1_row"]["p50_ms"]
    out["ratios_to_insert_commit_1_row_p50"] = {name: round(out[name]["p50_ms"] / commit, 2) for name in statements}
    await db.execute("DROP TABLE bench_floor")
    await db.execute("DELETE FROM cm_run_log WHERE run_id = ANY($1::text[])", runs)
    await db.execute("DELETE FROM cm_runs WHERE run_id = ANY($1::text[])", runs)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    async with postgres_dsn(args.dsn) as dsn:
        db = await connect(dsn, application_name="crashmatrix-bench")
        try:
            await migrate(db.conn)
            await db.execute("CREATE TABLE IF NOT EXISTS bench_full_state (run_id text PRIMARY KEY, state bytea NOT NULL)")
            result: dict[str, Any] = {"load_average_start": os.getloadavg(), "turns": args.turns, "rounds": args.rounds,
                                      "server": await db.fetchval("SHOW server_version"), "fsync": await db.fetchval("SHOW fsync")}
            if not args.rehydrate_only:
                result["floor"] = await bench_floor(db)
                async with floor_beside(db) as floor:
                    result["append"], runs = await bench_append(db, args.turns, args.rounds, floor)
                result["operating_costs"] = await operating_costs(db, runs, args.turns, args.vacuum_wait)
            baseline = load_baseline(args.baseline) if args.baseline else None
            if baseline is not None:
                result["append_against_baseline"] = await bench_append_against(db, baseline)
            result["rehydrate"] = await bench_rehydrate(db, args.rehydrate, args.repeat, baseline)
            result["load_average_end"] = os.getloadavg()
            return result
        finally:
            await db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rehydrate", type=int, default=5000)
    ap.add_argument("--vacuum-wait", type=float, default=75.0, help="seconds to watch autovacuum after the runs")
    ap.add_argument("--rehydrate-only", action="store_true", help="measure only the rehydrate (section 4)")
    ap.add_argument("--repeat", type=int, default=15, help="rounds of the rehydrate's paths")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="another build's reference_runtime directory (e.g. `git archive main reference_runtime` "
                         "unpacked): its store's append (interleaved with this build's) and read + rebuild "
                         "(in the same rounds) measured beside this build's")
    ap.add_argument("--dsn", default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.turns < 40:
        ap.error(f"--turns={args.turns} must be at least 40 (two windows of 20 turns)")
    print_figures(asyncio.run(main_async(args)), args.json)


if __name__ == "__main__":
    main()
