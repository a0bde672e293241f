"""Migrations, the append-only log, leases and the effects ledger against real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
import pytest

from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.effects import EffectLedger, idempotency_key
from crashmatrix.reference_runtime.leases import Lease, LeaseLost, acquire, set_status
from crashmatrix.reference_runtime.graph import RunGraph
from crashmatrix.reference_runtime.logstore import (
    AppendOnlyLog, CorruptRecord, EffectOutcome, LogConflict, LogRead, facts_of, record_facts,
)
from crashmatrix.reference_runtime.migrations import SCHEMA_VERSION, _ADVISORY_KEY, migrate
from crashmatrix.reference_runtime.records_pb2 import Budget, NodeRecord, NodeSpec

pytestmark = pytest.mark.anyio

TABLES = {"cm_schema_version", "cm_runs", "cm_run_log", "cm_effects"}


async def tables(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {r["tablename"] for r in rows} & TABLES


# -- migrations --------------------------------------------------------------------------


async def test_migrate_twice_is_harmless(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        assert await tables(conn) == set()
        assert await migrate(conn) == SCHEMA_VERSION
        await conn.execute("INSERT INTO cm_runs (run_id, workload, input, status) VALUES ('keep', 'w', '{}', 'paused')")
        assert await migrate(conn) == SCHEMA_VERSION
        assert await tables(conn) == TABLES
        assert await conn.fetchval("SELECT count(*) FROM cm_schema_version") == 1
        assert await conn.fetchval("SELECT status FROM cm_runs WHERE run_id = 'keep'") == "paused"
    finally:
        await conn.close()


async def test_concurrent_migrate_from_four_connections(fresh_database: str) -> None:
    conns = [await asyncpg.connect(fresh_database) for _ in range(4)]
    try:
        results: list[int] = []

        async def one(c: asyncpg.Connection) -> None:
            results.append(await migrate(c))

        async with anyio.create_task_group() as tg:
            for c in conns:
                tg.start_soon(one, c)
        assert results == [SCHEMA_VERSION] * 4
        assert await tables(conns[0]) == TABLES
        assert await conns[0].fetchval("SELECT count(*) FROM cm_schema_version") == 1
        # every connection released the advisory lock
        assert await conns[0].fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        for c in conns:
            await c.close()


async def test_newer_schema_is_refused_and_lock_released(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    other = await asyncpg.connect(fresh_database)
    try:
        await migrate(conn)
        await conn.execute("INSERT INTO cm_schema_version (version) VALUES ($1)", SCHEMA_VERSION + 1)
        with pytest.raises(RuntimeError) as info:
            await migrate(conn)
        msg = str(info.value)
        assert f"database schema version {SCHEMA_VERSION + 1} is newer than this build's {SCHEMA_VERSION}" in msg
        assert "upgrade crashmatrix" in msg
        # the failed migrate did not keep the advisory lock
        assert await other.fetchval("SELECT pg_try_advisory_lock($1)", _ADVISORY_KEY) is True
        await other.execute("SELECT pg_advisory_unlock($1)", _ADVISORY_KEY)
    finally:
        await conn.close()
        await other.close()


# -- helpers -----------------------------------------------------------------------------


async def make_run(db: Db, run_id: str) -> None:
    await db.execute(
        "INSERT INTO cm_runs (run_id, workload, input, status) VALUES ($1, 'w', '{}'::jsonb, 'pending')", run_id
    )


def rec(node_id: str, parents: tuple[str, ...] = (), output: Any = None, epoch: int = 1, kind: str = "tool") -> NodeRecord:
    return NodeRecord(
        format_version=1, node_id=node_id, parents=list(parents), kind=kind,
        output=codec.encode(output if output is not None else {"messages": []}),
        budget=Budget(tool_calls=1), lease_epoch=epoch,
    )


async def log_rows(raw: asyncpg.Connection, run_id: str) -> list[tuple[int, str, int]]:
    rows = await raw.fetch("SELECT seq, node_id, lease_epoch FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
    return [(r["seq"], r["node_id"], r["lease_epoch"]) for r in rows]


async def effect_row(raw: asyncpg.Connection, run_id: str, key: str) -> dict[str, Any] | None:
    r = await raw.fetchrow("SELECT status, result, request, lease_epoch, node_id FROM cm_effects WHERE run_id = $1 AND idem_key = $2", run_id, key)
    if r is None:
        return None
    return {"status": r["status"], "result": json.loads(r["result"]) if r["result"] else None,
            "request": json.loads(r["request"]), "epoch": r["lease_epoch"], "node": r["node_id"]}


@pytest.fixture
async def run(db: Db, new_run_id: Callable[[], str]) -> tuple[str, Lease]:
    run_id = new_run_id()
    await make_run(db, run_id)
    return run_id, await acquire(db, run_id, "worker-a")


# -- Db ----------------------------------------------------------------------------------


async def test_concurrent_round_trips_take_turns_in_order(db: Db) -> None:
    # asyncpg refuses a second operation in flight on one connection: the turn queues them
    answered: list[int] = []

    async def ask(i: int) -> None:
        answered.append(await db.fetchval("SELECT $1::int FROM pg_sleep(0.002)", i))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(ask, i)
    assert answered == list(range(6))


async def test_a_write_in_a_cancelled_scope_never_reaches_the_server(db: Db, raw: asyncpg.Connection,
                                                                      new_run_id: Callable[[], str]) -> None:
    run_id = new_run_id()
    await make_run(db, run_id)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await db.execute("UPDATE cm_runs SET status = 'paused' WHERE run_id = $1", run_id)
    assert scope.cancelled_caught
    assert await raw.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id) == "pending"
    with anyio.CancelScope(shield=True):  # a shielded write in a cancelled scope does land
        with anyio.CancelScope() as outer:
            outer.cancel()
            with anyio.CancelScope(shield=True):
                await db.execute("UPDATE cm_runs SET status = 'running' WHERE run_id = $1", run_id)
    assert await raw.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id) == "running"
    # and the connection is free again
    assert await db.fetchval("SELECT 1") == 1


# -- leases ------------------------------------------------------------------------------


async def test_acquire_bumps_epoch_and_sets_running(db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    run_id = new_run_id()
    await make_run(db, run_id)
    a = await acquire(db, run_id, "a")
    b = await acquire(db, run_id, "b")
    assert (a.epoch, b.epoch) == (1, 2) and b.owner == "b"
    row = await raw.fetchrow("SELECT status, lease_owner, lease_epoch FROM cm_runs WHERE run_id = $1", run_id)
    assert dict(row) == {"status": "running", "lease_owner": "b", "lease_epoch": 2}
    with pytest.raises(LeaseLost):
        await set_status(db, a, "completed")
    await set_status(db, b, "paused", "drained")
    assert await raw.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id) == "paused"
    with pytest.raises(LookupError, match="does not exist"):
        await acquire(db, "cm-run-nope", "a")


# -- AppendOnlyLog -----------------------------------------------------------------------


async def test_append_assigns_seq_and_retry_is_noop(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    log = AppendOnlyLog(db)
    assert await log.append(lease, 1, rec("turn-1", kind="model"), None) is True
    assert await log.append(lease, 2, rec("turn-1.tool-0", ("turn-1",)), None) is True
    assert await log_rows(raw, run_id) == [(1, "turn-1", 1), (2, "turn-1.tool-0", 1)]
    # the same bytes again (a retried append whose commit we did not see): no-op
    assert await log.append(lease, 2, rec("turn-1.tool-0", ("turn-1",)), None) is False
    assert await log.append(lease, 3, rec("turn-1.tool-0", ("turn-1",)), None) is False
    assert await log_rows(raw, run_id) == [(1, "turn-1", 1), (2, "turn-1.tool-0", 1)]


async def test_append_conflicting_record_raises(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    log = AppendOnlyLog(db)
    await log.append(lease, 1, rec("turn-1", output={"messages": [{"content": "a"}]}), None)
    with pytest.raises(LogConflict, match=r"node 'turn-1' at seq 2 conflicts.*at seq 1"):
        await log.append(lease, 2, rec("turn-1", output={"messages": [{"content": "b"}]}), None)
    with pytest.raises(LogConflict, match=r"seq taken"):
        await log.append(lease, 1, rec("turn-2"), None)
    assert await log_rows(raw, run_id) == [(1, "turn-1", 1)]


async def test_append_with_stale_epoch_writes_nothing(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, zombie = run
    log = AppendOnlyLog(db)
    await log.append(zombie, 1, rec("turn-1"), None)
    thief = await acquire(db, run_id, "worker-b")
    with pytest.raises(LeaseLost, match=f"lease epoch {zombie.epoch} is stale"):
        await log.append(zombie, 2, rec("turn-1.tool-0", ("turn-1",)), None)
    assert await log_rows(raw, run_id) == [(1, "turn-1", 1)]
    assert await log.append(thief, 2, rec("turn-1.tool-0", ("turn-1",), epoch=thief.epoch), None) is True
    assert await log_rows(raw, run_id) == [(1, "turn-1", 1), (2, "turn-1.tool-0", 2)]


@pytest.mark.parametrize("with_effect", [False, True], ids=["fenced-insert-alone", "with-effect-cte"])
@pytest.mark.parametrize("takeover_commits", [True, False], ids=["takeover-commits", "takeover-rolls-back"])
async def test_an_append_waits_for_a_takeover_in_flight_and_sees_its_outcome(
        db: Db, raw: asyncpg.Connection, run: tuple[str, Lease], with_effect: bool, takeover_commits: bool) -> None:
    # the fence's FOR SHARE waits for the takeover's row lock, then re-reads the run row:
    # the append's snapshot, taken before the takeover committed, must not let it through
    run_id, lease = run
    effect = None
    if with_effect:
        key = idempotency_key(run_id, "call_1")
        await EffectLedger(db).mark_started(lease, key, "turn-1.tool-0", "charge", {})
        effect = EffectOutcome(key, "succeeded", {"id": "ch_1"})
    tx = raw.transaction()
    await tx.start()
    await raw.execute("UPDATE cm_runs SET lease_epoch = lease_epoch + 1 WHERE run_id = $1", run_id)
    outcome: list[Any] = []

    async def append() -> None:
        try:
            outcome.append(await AppendOnlyLog(db).append(lease, 1, rec("turn-1.tool-0"), effect))
        except LeaseLost as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(append)
        with anyio.fail_after(10):
            while not await raw.fetchval("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted",
                                         db.conn.get_server_pid()):
                await anyio.sleep(0.01)  # the append waits on the takeover's transaction
        assert outcome == []
        await (tx.commit() if takeover_commits else tx.rollback())
    if takeover_commits:
        assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost)
        assert await log_rows(raw, run_id) == []
    else:
        assert outcome == [True]
        assert await log_rows(raw, run_id) == [(1, "turn-1.tool-0", 1)]


async def test_effect_succeeded_commits_with_the_record(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    log, ledger = AppendOnlyLog(db), EffectLedger(db)
    key = idempotency_key(run_id, "call_1")
    await ledger.mark_started(lease, key, "turn-1.tool-0", "charge", {"amount": 100})
    assert (await effect_row(raw, run_id, key))["status"] == "started"  # type: ignore[index]
    result = {"id": "ch_1", "amount": 100}
    assert await log.append(lease, 1, rec("turn-1.tool-0"), EffectOutcome(key, "succeeded", result)) is True
    row = await effect_row(raw, run_id, key)
    assert row is not None and row["status"] == "succeeded" and row["result"] == result
    assert row["request"] == {"amount": 100}
    # a failed effect lands the same way
    key2 = idempotency_key(run_id, "call_2")
    await ledger.mark_started(lease, key2, "turn-1.tool-1", "charge", {"amount": 1})
    await log.append(lease, 2, rec("turn-1.tool-1"), EffectOutcome(key2, "failed", {"status": "declined"}))
    assert (await effect_row(raw, run_id, key2))["status"] == "failed"  # type: ignore[index]


async def test_effect_with_stale_epoch_neither_lands(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, zombie = run
    log, ledger = AppendOnlyLog(db), EffectLedger(db)
    key = idempotency_key(run_id, "call_1")
    await ledger.mark_started(zombie, key, "turn-1.tool-0", "charge", {"amount": 100})
    await acquire(db, run_id, "worker-b")
    with pytest.raises(LeaseLost):
        await log.append(zombie, 1, rec("turn-1.tool-0"), EffectOutcome(key, "succeeded", {"id": "ch_1"}))
    assert await log_rows(raw, run_id) == []
    row = await effect_row(raw, run_id, key)
    assert row is not None and row["status"] == "started" and row["result"] is None and row["epoch"] == 1


async def test_retried_append_does_not_rewrite_effect(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    log, ledger = AppendOnlyLog(db), EffectLedger(db)
    key = idempotency_key(run_id, "call_1")
    await ledger.mark_started(lease, key, "turn-1.tool-0", "charge", {})
    record = rec("turn-1.tool-0")
    await log.append(lease, 1, record, EffectOutcome(key, "succeeded", {"id": "ch_1"}))
    assert await log.append(lease, 1, record, EffectOutcome(key, "succeeded", {"id": "ch_OTHER"})) is False
    assert (await effect_row(raw, run_id, key))["result"] == {"id": "ch_1"}  # type: ignore[index]


async def test_read_returns_seq_order(db: Db, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    log = AppendOnlyLog(db)
    # written out of order: seq 3, 1, 2
    await log.append(lease, 3, rec("c"), None)
    await log.append(lease, 1, rec("a"), None)
    await log.append(lease, 2, rec("b"), None)
    stored = await log.read(run_id)
    assert [(s.seq, s.node_id, s.record.node_id) for s in stored] == [(1, "a", "a"), (2, "b", "b"), (3, "c", "c")]
    assert codec.decode(stored[0].record.output) == {"messages": []}
    assert await log.read("cm-run-none") == []


def current(node_id: str, spawned: tuple[str, ...] = (), tokens: int = 0, wall_ms: int = 0, kind: str = "model") -> NodeRecord:
    """A record as this build writes it (format 2), spawning ``spawned``."""
    return NodeRecord(
        format_version=2, node_id=node_id, kind=kind, output=codec.encode({"messages": []}),
        spawned=[NodeSpec(node_id=s, kind="tool", parents=[node_id], input=codec.encode({})) for s in spawned],
        budget=Budget(tokens=tokens, wall_ms=wall_ms, model_calls=int(kind == "model")), lease_epoch=1,
    )


async def append_a_turn(log: AppendOnlyLog, lease: Lease) -> list[NodeRecord]:
    """turn-1 (spawning two tools and turn-2) by an append, its two tools by a group commit."""
    one = current("turn-1", ("turn-1.tool-0", "turn-1.tool-1", "turn-2"), tokens=7, wall_ms=30)
    await log.append(lease, 1, one, None)
    tools = [current(f"turn-1.tool-{i}", kind="tool", wall_ms=5 + i) for i in range(2)]
    assert await log.append_many(lease, 2, [(t, None) for t in tools]) == [True, True]
    return [one, *tools]


async def test_each_append_writes_the_record_facts_beside_it(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    """An append and a group commit write, in the statement that appends each record, what
    the graph's rebuild needs of it (schema version 6): what the record itself says."""
    run_id, lease = run
    log = AppendOnlyLog(db)
    one, *tools = await append_a_turn(log, lease)
    rows = await raw.fetch("SELECT kind, tokens, wall_ms, spawned FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
    assert [tuple(r) for r in rows] == [record_facts(r) for r in (one, *tools)]
    assert [tuple(r) for r in rows] == [("model", 7, 30, ["turn-1.tool-0", "turn-1.tool-1", "turn-2"]),
                                        ("tool", 0, 5, []), ("tool", 0, 6, [])]


async def test_read_carries_the_facts_each_append_wrote_beside_its_record(db: Db, run: tuple[str, Lease]) -> None:
    """The columns an append (and a group commit) writes beside each record, summed by the
    read's one statement, are what the records themselves say; the graph rebuilt from them
    is the one rebuilt by walking the records."""
    run_id, lease = run
    log = AppendOnlyLog(db)
    one, *tools = await append_a_turn(log, lease)
    await log.append(lease, 4, current("turn-2", ("turn-2.tool-0", "turn-3"), tokens=11), None)
    stored = await log.read(run_id)
    assert isinstance(stored, LogRead) and stored.facts == facts_of([one, *tools, stored[-1].record])
    assert stored.facts == (2, 18, 41, (3, 0, 0, 2), ["turn-1.tool-0", "turn-1.tool-1", "turn-2", "turn-2.tool-0", "turn-3"])
    fast, walked = RunGraph.rehydrate(run_id, {}, stored), RunGraph.rehydrate(run_id, {}, await log.read_rows(run_id))
    assert (dict(fast.records), dict(fast.specs), fast.pending(), fast.tokens_used, fast.wall_ms_used, fast.last_seq) == \
        (dict(walked.records), dict(walked.specs), walked.pending(), walked.tokens_used, walked.wall_ms_used, walked.last_seq)
    assert fast.pending() == ["turn-2.tool-0", "turn-3"]


async def test_read_of_a_row_without_facts_or_an_id_the_join_cannot_split(
        db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    """A row written before schema version 6 (no facts) or a spawned id holding the read's
    separator (0x1f): no facts, and the graph walks the records."""
    run_id, lease = run
    log = AppendOnlyLog(db)
    await log.append(lease, 1, current("turn-1", ("a\x1fb",)), None)
    stored = await log.read(run_id)
    assert isinstance(stored, LogRead) and stored.facts is None
    assert RunGraph.rehydrate(run_id, {}, stored).pending() == ["a\x1fb"]
    await raw.execute("INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch) VALUES ($1, 2, 'a\x1fb', $2, 1)",
                      run_id, current("a\x1fb").SerializeToString())
    stored = await log.read(run_id)
    assert isinstance(stored, LogRead) and stored.facts is None and [s.node_id for s in stored] == ["turn-1", "a\x1fb"]
    assert RunGraph.rehydrate(run_id, {}, stored).done()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xff\xff\xff\xffjunk", id="junk-bytes"),
        pytest.param(NodeRecord(format_version=1, node_id="someone-else").SerializeToString(), id="wrong-node"),
        pytest.param(NodeRecord(format_version=9, node_id="turn-9").SerializeToString(), id="newer-format"),
    ],
)
async def test_corrupt_record_names_run_seq_and_node(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease], data: bytes) -> None:
    run_id, lease = run
    log = AppendOnlyLog(db)
    await log.append(lease, 1, rec("turn-1"), None)
    await raw.execute(
        "INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch) VALUES ($1, 2, 'turn-9', $2, 1)", run_id, data
    )
    with pytest.raises(CorruptRecord) as info:
        await log.read(run_id)
    msg = str(info.value)
    assert run_id in msg and "seq 2" in msg and "turn-9" in msg, msg


# -- EffectLedger ------------------------------------------------------------------------


async def test_mark_started_is_idempotent(db: Db, raw: asyncpg.Connection, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    ledger = EffectLedger(db)
    key = idempotency_key(run_id, "call_1")
    await ledger.mark_started(lease, key, "turn-1.tool-0", "charge", {"amount": 100})
    await ledger.mark_started(lease, key, "turn-1.tool-0", "charge", {"amount": 999})
    assert await raw.fetchval("SELECT count(*) FROM cm_effects WHERE run_id = $1", run_id) == 1
    row = await ledger.get(run_id, key)
    assert row is not None and row.status == "started" and row.request == {"amount": 100} and row.result is None
    assert [r.idem_key for r in await ledger.rows(run_id)] == [key]
    assert await ledger.get(run_id, "0" * 64) is None


async def test_mark_unknown_moves_only_started_rows(db: Db, run: tuple[str, Lease]) -> None:
    run_id, lease = run
    ledger, log = EffectLedger(db), AppendOnlyLog(db)
    started, done, failed = (idempotency_key(run_id, c) for c in ("c1", "c2", "c3"))
    for i, key in enumerate((started, done, failed)):
        await ledger.mark_started(lease, key, f"turn-1.tool-{i}", "charge", {})
    await log.append(lease, 1, rec("turn-1.tool-1"), EffectOutcome(done, "succeeded", {"id": "ch"}))
    await log.append(lease, 2, rec("turn-1.tool-2"), EffectOutcome(failed, "failed", {"status": "declined"}))
    for key in (started, done, failed, "f" * 64):  # the last one does not exist: no error
        await ledger.mark_unknown(lease, key)
    statuses = {r.idem_key: r.status for r in await ledger.rows(run_id)}
    assert statuses == {started: "unknown", done: "succeeded", failed: "failed"}
    # unknown stays unknown (idempotent)
    await ledger.mark_unknown(lease, started)
    assert (await ledger.get(run_id, started)).status == "unknown"  # type: ignore[union-attr]


async def test_ledger_fencing_refuses_stale_epoch(db: Db, run: tuple[str, Lease]) -> None:
    run_id, zombie = run
    ledger = EffectLedger(db)
    k1, k2 = idempotency_key(run_id, "c1"), idempotency_key(run_id, "c2")
    await ledger.mark_started(zombie, k1, "turn-1.tool-0", "charge", {})
    thief = await acquire(db, run_id, "worker-b")
    with pytest.raises(LeaseLost, match="stale"):
        await ledger.mark_started(zombie, k2, "turn-1.tool-1", "charge", {})
    with pytest.raises(LeaseLost, match="stale"):
        await ledger.mark_unknown(zombie, k1)
    assert await ledger.get(run_id, k2) is None
    assert (await ledger.get(run_id, k1)).status == "started"  # type: ignore[union-attr]
    await ledger.mark_unknown(thief, k1)
    assert (await ledger.get(run_id, k1)).status == "unknown"  # type: ignore[union-attr]


def test_idempotency_key() -> None:
    import hashlib

    assert idempotency_key("r", "call_1") == hashlib.sha256(b"r:call_1").hexdigest()
    assert idempotency_key("r", "call_1") != idempotency_key("r2", "call_1")
