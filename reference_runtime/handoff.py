"""Hand-off to a human: the operator API for effects the runtime cannot decide.

Failure this wall prevents (docs/design.md, "Effects ledger": "or the run stops for a
human"): when a probe cannot tell whether an effect happened (or the tool has no
probe), guessing is wrong both ways: "not applied" may charge a card twice, "applied"
may lose a payment. The executor therefore stops the run in ``needs_human`` with the
effect named (:class:`~.executor.NeedsHuman`), leaving its ledger row ``started`` or
``unknown``. An operator who checked the provider by hand then calls :func:`resolve`:

- ``applied=True`` with the provider's result (and ``status``: ``succeeded`` or
  ``failed``): on resume the node takes that result as the call's outcome, without
  calling the provider again; the ledger row becomes ``succeeded``/``failed`` only when
  the node's record commits (the ledger's invariant holds);
- ``applied=False``: on resume the node makes the call again under the same
  idempotency key (the row goes back to ``started`` first, consuming the decision).

:func:`resolve` records the decision on the effect row and moves the run from
``needs_human`` to ``paused``, in one transaction, and only if the run is still in
``needs_human`` and the effect is still unresolved: a second operator, or a stale
screen, cannot overwrite a decision or wake a run that is not waiting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg


class HandoffError(RuntimeError):
    """The resolution was refused; the message says why (run not waiting, unknown key,
    effect already resolved)."""


@dataclass(frozen=True)
class PendingEffect:
    """An effect a run in ``needs_human`` waits on."""

    run_id: str
    idem_key: str
    node_id: str
    tool: str
    status: str
    request: Any


async def pending(conn: Any, run_id: str) -> list[PendingEffect]:
    """The undecided effects of ``run_id`` (``conn``: asyncpg connection or :class:`~.db.Db`)."""
    rows = await conn.fetch(
        "SELECT e.idem_key, e.node_id, e.tool, e.status, e.request FROM cm_effects e "
        "JOIN cm_runs r USING (run_id) WHERE e.run_id = $1 AND r.status = 'needs_human' "
        "AND e.status IN ('started', 'unknown') AND e.resolution IS NULL ORDER BY e.node_id",
        run_id,
    )
    return [PendingEffect(run_id, r["idem_key"], r["node_id"], r["tool"], r["status"], json.loads(r["request"])) for r in rows]


async def resolve(
    conn: asyncpg.Connection,
    run_id: str,
    idem_key: str,
    *,
    applied: bool,
    result: Any = None,
    status: Literal["succeeded", "failed"] = "succeeded",
    operator: str = "operator",
) -> None:
    """Record an operator's decision on one effect and make the run resumable.

    Raises :class:`HandoffError` when the run is not in ``needs_human``, the key is not
    an undecided effect of that run, or ``applied`` comes without a ``result``.
    """
    if applied and result is None:
        raise HandoffError("applied=True needs the provider's result (what the call returned)")
    if status not in ("succeeded", "failed"):
        raise HandoffError(f"status={status!r} is not 'succeeded' or 'failed'")
    decision = {"applied": bool(applied), "operator": operator}
    if applied:
        decision.update(status=status, result=result)
    async with conn.transaction():
        run = await conn.fetchrow("SELECT status FROM cm_runs WHERE run_id = $1 FOR UPDATE", run_id)
        if run is None:
            raise HandoffError(f"run {run_id!r} does not exist")
        if run["status"] != "needs_human":
            raise HandoffError(f"run {run_id!r} is {run['status']!r}, not waiting for a human")
        done = await conn.fetchval(
            "UPDATE cm_effects SET resolution = $3::jsonb, updated_at = now() "
            "WHERE run_id = $1 AND idem_key = $2 AND status IN ('started', 'unknown') AND resolution IS NULL "
            "RETURNING 1",
            run_id,
            idem_key,
            json.dumps(decision, sort_keys=True),
        )
        if done is None:
            raise HandoffError(f"run {run_id!r}: effect {idem_key[:12]} is not an undecided effect of this run")
        # resumable now; if another effect is still undecided, the resume asks its probe
        # and, failing that, stops in needs_human again naming that one
        await conn.execute(
            "UPDATE cm_runs SET status = 'paused', detail = $2, updated_at = now() WHERE run_id = $1",
            run_id,
            f"effect {idem_key[:12]} resolved by {operator} as {'applied' if applied else 'not applied'}",
        )
