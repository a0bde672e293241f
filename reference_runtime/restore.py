"""Operator restore: move a run back to an earlier point of its own log (or fork a new
run from it: :func:`fork`).

Wall (docs/runtime.md, "Operator restore"): a run moved back to an earlier record must
resume into a state the world can agree with. The world kept what the run did after
that point: the payments it made, the mail it sent. :func:`restore` therefore moves
only the run's own log back and keeps the effects ledger whole: a tool call the
resumed run makes again has the same idempotency key (``sha256(run_id:tool_call_id)``,
the call id from the model node's record) and finds its row ``succeeded``, so the
recorded result answers it and no request reaches the provider. The model is not
called again for the nodes after the point either (a new answer would ask for tool
calls with new ids, hence new keys: a second charge): the executor answers a model node the restore took out of the
log from its record (:func:`recorded_replies`), so the tool calls it asks for keep their
ids and their effects their keys. A run restored without a change in between ends
where it had ended, having sent nothing again (the runtime's promise:
``"replays recorded"``); the records the restore took out stay readable
(:func:`discarded_nodes`).

In one transaction :func:`restore` moves the log rows after ``upto_seq`` to
``cm_run_restored`` (schema.sql; kept, for the record), deletes the snapshots past it (the
delta-and-snapshot store), sets the run ``paused`` and bumps its lease epoch: a worker
that still runs it is fenced off at its next write, as by a cancel
(:mod:`.cancellation`). Budgets are the log's: the run's spend is rebuilt from the
records it keeps, and the executor enforces the limits on the nodes it runs again.
Sources: LangGraph's time travel (invoking from an earlier ``checkpoint_id``), DBOS's
``fork_workflow`` from a step, Temporal's reset.
"""

from __future__ import annotations

from typing import Any

from . import codec
from .agent import ModelReply, ToolCall
from .logstore import decode_row


class RestoreRefused(RuntimeError):
    """The run does not exist, or its log never reached ``upto_seq``."""


async def current_point(conn: Any, run_id: str) -> int:
    """The seq of the run's newest record (0: none yet). Raises :class:`RestoreRefused`
    if the run does not exist."""
    row = await conn.fetchrow(
        "SELECT (SELECT coalesce(max(seq), 0) FROM cm_run_log WHERE run_id = $1) AS seq, "
        "EXISTS (SELECT 1 FROM cm_runs WHERE run_id = $1) AS known", run_id)
    if not row["known"]:
        raise RestoreRefused(f"run {run_id!r} does not exist")
    return int(row["seq"])


async def restore(conn: Any, run_id: str, upto_seq: int, *, by: str = "operator", keep_ledger: bool = True) -> int:
    """Move ``run_id`` back to the end of its record ``upto_seq`` (0: before its first
    record): the later log rows to ``cm_run_restored``, later snapshots deleted, status
    ``paused``, lease epoch bumped. The effects ledger stays as it is (``keep_ledger``
    False drops the rows of the nodes the restore discards: the mutant that forgets
    it). Returns the new epoch. ``conn``: an asyncpg connection or pool. Raises
    :class:`RestoreRefused` if the run does not exist or its log never reached
    ``upto_seq``."""
    if upto_seq < 0:
        raise RestoreRefused(f"run {run_id!r}: restore point {upto_seq} is negative")
    acquire = getattr(conn, "acquire", None)
    if acquire is not None:  # a pool: one connection for the transaction
        async with acquire() as c:
            return await restore(c, run_id, upto_seq, by=by, keep_ledger=keep_ledger)
    async with conn.transaction():
        last = await conn.fetchval("SELECT coalesce(max(seq), 0) FROM cm_run_log WHERE run_id = $1", run_id)
        epoch = await conn.fetchval(
            "UPDATE cm_runs SET status = 'paused', lease_epoch = lease_epoch + 1, lease_owner = NULL, "
            "lease_expires_at = NULL, detail = $2, updated_at = now() WHERE run_id = $1 RETURNING lease_epoch",
            run_id, f"restored by {by} to record {upto_seq}")
        if epoch is None:
            raise RestoreRefused(f"run {run_id!r} does not exist")
        if upto_seq > last:
            raise RestoreRefused(f"run {run_id!r}: its log ends at record {last}, it never reached {upto_seq}")
        dropped = await conn.fetch(
            "DELETE FROM cm_run_log WHERE run_id = $1 AND seq > $2 RETURNING seq, node_id, record, lease_epoch",
            run_id, upto_seq)
        await conn.executemany(
            "INSERT INTO cm_run_restored (run_id, restore_epoch, seq, node_id, record, lease_epoch) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            [(run_id, epoch, r["seq"], r["node_id"], r["record"], r["lease_epoch"]) for r in dropped])
        await conn.execute("DELETE FROM cm_run_snapshots WHERE run_id = $1 AND upto_seq > $2", run_id, upto_seq)
        if not keep_ledger:
            await conn.execute(
                "DELETE FROM cm_effects WHERE run_id = $1 AND node_id <> ALL("
                "SELECT node_id FROM cm_run_log WHERE run_id = $1)", run_id)
    return int(epoch)


async def fork(conn: Any, run_id: str, upto_seq: int, fork_id: str, *, by: str = "operator") -> str:
    """A new run ``fork_id`` from ``run_id``'s record ``upto_seq``: the run's row (its
    input and workload, status ``paused``), its log up to that record and the effects
    ledger's rows of the nodes in it are copied; ``run_id`` is left as it is. The fork
    runs the nodes after the point again under its own run id, so its effects get keys
    of their own (``sha256(fork_id:tool_call_id)``): a fresh attempt, sent once more.
    Returns ``fork_id``. Raises :class:`RestoreRefused` if the run does not exist, its
    log never reached ``upto_seq``, or ``fork_id`` is taken."""
    acquire = getattr(conn, "acquire", None)
    if acquire is not None:
        async with acquire() as c:
            return await fork(c, run_id, upto_seq, fork_id, by=by)
    async with conn.transaction():
        last = await conn.fetchval("SELECT coalesce(max(seq), 0) FROM cm_run_log WHERE run_id = $1", run_id)
        made = await conn.fetchval(
            "INSERT INTO cm_runs (run_id, workload, input, status, detail, queue) "
            "SELECT $2, workload, input, 'paused', $3, queue FROM cm_runs WHERE run_id = $1 "
            "ON CONFLICT (run_id) DO NOTHING RETURNING 1",
            run_id, fork_id, f"forked by {by} from {run_id} at record {upto_seq}")
        if made is None:
            raise RestoreRefused(f"run {run_id!r} does not exist, or a run {fork_id!r} does")
        if not 0 <= upto_seq <= last:
            raise RestoreRefused(f"run {run_id!r}: its log ends at record {last}, it never reached {upto_seq}")
        await conn.execute(
            "INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned) "
            "SELECT $2, seq, node_id, record, 0, kind, tokens, wall_ms, spawned FROM cm_run_log "
            "WHERE run_id = $1 AND seq <= $3", run_id, fork_id, upto_seq)
        await conn.execute(
            "INSERT INTO cm_effects (run_id, idem_key, node_id, tool, status, request, result, lease_epoch, resolution) "
            "SELECT $2, idem_key, node_id, tool, status, request, result, 0, resolution FROM cm_effects "
            "WHERE run_id = $1 AND node_id IN (SELECT node_id FROM cm_run_log WHERE run_id = $2)", run_id, fork_id)
    return fork_id


async def discarded_nodes(conn: Any, run_id: str) -> list[str]:
    """The node ids every restore of ``run_id`` took out of its log, oldest first:
    their work (a model's answer) is done again by the resumed run."""
    rows = await conn.fetch("SELECT node_id FROM cm_run_restored WHERE run_id = $1 ORDER BY restore_epoch, seq",
                            run_id)
    return [r["node_id"] for r in rows]


async def recorded_replies(conn: Any, run_id: str, blobs: Any = None) -> dict[str, ModelReply]:
    """Per model node an operator's restore took out of ``run_id``'s log (the newest
    restore's record of it), the reply it had recorded: content, tool calls (their ids
    as recorded) and tokens. Empty for a run never restored. ``blobs``: the store a
    large output was written to."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (node_id) seq, node_id, record FROM cm_run_restored WHERE run_id = $1 "
        "ORDER BY node_id, restore_epoch DESC", run_id)
    out: dict[str, ModelReply] = {}
    for r in rows:
        record = decode_row(run_id, r["seq"], r["node_id"], bytes(r["record"])).record
        if record.kind != "model":
            continue
        output = codec.decode(record.output, blobs=blobs)
        message = output["messages"][0]
        calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in message.get("tool_calls", [])]
        out[r["node_id"]] = ModelReply(message.get("content") or "", calls, int(record.budget.tokens))
    return out
