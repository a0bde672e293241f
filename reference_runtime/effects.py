"""The effects ledger: what the runtime knows about each call that changes another system.

Each effect has an idempotency key ``sha256(run_id:tool_call_id)`` (the tool call id is
recorded in the model node's output, so a resumed tool node reuses it) and a status, the
same three outcomes as Jepsen's ok / fail / info plus the in-between:

- ``started``: written before the request leaves;
- ``succeeded``: written with the node's log record, in the same statement
  (:mod:`.logstore`), never on its own;
- ``failed``: a definite error (a declined card), also with the node's record;
- ``unknown``: the call was cancelled or its outcome was lost. Written inside a
  shielded scope by the executor, so the cancellation cannot cancel the write itself.

On resume, a ``started`` or ``unknown`` key is resolved by the tool's probe, or by an
operator's ``resolution`` (:mod:`.handoff`) when the probe could not decide.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .db import Db
from .leases import Lease, LeaseLost


def idempotency_key(run_id: str, tool_call_id: str) -> str:
    """``sha256(run_id:tool_call_id)`` as 64 hex characters."""
    return hashlib.sha256(f"{run_id}:{tool_call_id}".encode()).hexdigest()


@dataclass(frozen=True)
class EffectRow:
    idem_key: str
    node_id: str
    tool: str
    status: str
    request: Any
    result: Any
    resolution: Any = None


class EffectLedger:
    """Reads and fenced writes of ``cm_effects`` for one run."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def get(self, run_id: str, idem_key: str) -> EffectRow | None:
        row = await self.db.fetchrow(
            "SELECT idem_key, node_id, tool, status, request, result, resolution FROM cm_effects "
            "WHERE run_id = $1 AND idem_key = $2",
            run_id,
            idem_key,
        )
        return _row(row) if row else None

    async def mark_started(self, lease: Lease, idem_key: str, node_id: str, tool: str, request: Any) -> None:
        """Insert the ``started`` row (no-op if the key exists). Raises LeaseLost."""
        ok = await self.db.fetchval(
            """
            WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $6 FOR SHARE)
            , ins AS (
                INSERT INTO cm_effects (run_id, idem_key, node_id, tool, status, request, lease_epoch)
                SELECT $1, $2, $3, $4, 'started', $5::jsonb, $6 FROM fence
                ON CONFLICT DO NOTHING RETURNING 1)
            SELECT count(*) FROM fence
            """,
            lease.run_id,
            idem_key,
            node_id,
            tool,
            json.dumps(request, sort_keys=True),
            lease.epoch,
        )
        if not ok:
            raise LeaseLost(f"run {lease.run_id}: effect {idem_key[:12]} refused, lease epoch {lease.epoch} is stale")

    async def mark_unknown(self, lease: Lease, idem_key: str) -> None:
        """Move a ``started`` row to ``unknown``. Call it inside a shielded scope."""
        ok = await self.db.fetchval(
            """
            WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $3 FOR SHARE)
            , upd AS (
                UPDATE cm_effects SET status = 'unknown', lease_epoch = $3, updated_at = now()
                 WHERE run_id = $1 AND idem_key = $2 AND status = 'started'
                   AND EXISTS (SELECT 1 FROM fence) RETURNING 1)
            SELECT count(*) FROM fence
            """,
            lease.run_id,
            idem_key,
            lease.epoch,
        )
        if not ok:
            raise LeaseLost(f"run {lease.run_id}: effect {idem_key[:12]} refused, lease epoch {lease.epoch} is stale")

    async def restart(self, lease: Lease, idem_key: str) -> None:
        """An operator said the effect was not applied: back to ``started`` (a new
        attempt is about to call the provider), the resolution consumed. Fenced."""
        ok = await self.db.fetchval(
            """
            WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $3 FOR SHARE)
            , upd AS (
                UPDATE cm_effects SET status = 'started', resolution = NULL, lease_epoch = $3, updated_at = now()
                 WHERE run_id = $1 AND idem_key = $2 AND status IN ('started', 'unknown')
                   AND EXISTS (SELECT 1 FROM fence) RETURNING 1)
            SELECT count(*) FROM fence
            """,
            lease.run_id,
            idem_key,
            lease.epoch,
        )
        if not ok:
            raise LeaseLost(f"run {lease.run_id}: effect {idem_key[:12]} refused, lease epoch {lease.epoch} is stale")

    async def rows(self, run_id: str) -> list[EffectRow]:
        rows = await self.db.fetch(
            "SELECT idem_key, node_id, tool, status, request, result, resolution FROM cm_effects "
            "WHERE run_id = $1 ORDER BY node_id, idem_key",
            run_id,
        )
        return [_row(r) for r in rows]


def _row(r: Any) -> EffectRow:
    return EffectRow(
        r["idem_key"],
        r["node_id"],
        r["tool"],
        r["status"],
        json.loads(r["request"]) if r["request"] is not None else None,
        json.loads(r["result"]) if r["result"] is not None else None,
        json.loads(r["resolution"]) if "resolution" in r.keys() and r["resolution"] is not None else None,
    )
