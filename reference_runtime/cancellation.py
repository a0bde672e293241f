"""Operator cancel: stop a run from outside, and let an operator resume it later.

Wall (docs/runtime.md, "Operator cancel"): a cancel must stop the worker that runs the
run wherever it is, without a signal to that worker and without losing or repeating an
effect. :func:`cancel` does it with the fencing the runtime already has: in one
statement it moves the run to ``cancelled`` and bumps its lease epoch, so the worker's
next write (an effect's ``started`` row, a node's record, its final status) is refused
(:class:`~.leases.LeaseLost`) and the worker stops (``Runtime.run`` returns
``"cancelled"``). What the cancelled node did is then either recorded (its record
committed before the cancel, with its effect ``succeeded``) or not recorded, its effect
``started`` for the next attempt's probe to resolve; never recorded without its effect
(the record and the effect's final status commit in one statement: :mod:`.logstore`).

A cancelled run stays cancelled: no worker takes it (:func:`~.leases.acquire` refuses
it) until an operator calls :func:`resume`, which makes it ``paused`` for the next
worker. Sources: DBOS's ``cancel_workflow`` / ``resume_workflow`` pair (the same
contract: the workflow stops at its next step, a resume continues it from its recorded
steps); seed 000 ("a cancellation that lost the recovery write").
"""

from __future__ import annotations

from typing import Any

TERMINAL = ("completed", "failed", "limit_exceeded", "cannot_migrate")
"""Statuses a cancel leaves as they are: the run already ended."""


class CancelRefused(RuntimeError):
    """The run does not exist, already ended, or (for :func:`resume`) is not cancelled."""


async def cancel(conn: Any, run_id: str, *, by: str = "operator") -> int:
    """Cancel ``run_id``: status ``cancelled``, lease epoch bumped (the running worker is
    fenced off at its next write). Returns the new epoch. ``conn``: an asyncpg connection
    or pool, or a :class:`~.db.Db`. Raises :class:`CancelRefused` if the run does not
    exist or already ended."""
    epoch = await conn.fetchval(
        "UPDATE cm_runs SET status = 'cancelled', lease_epoch = lease_epoch + 1, lease_owner = NULL, "
        "lease_expires_at = NULL, detail = $2, updated_at = now() "
        "WHERE run_id = $1 AND status <> ALL($3::text[]) RETURNING lease_epoch",
        run_id, f"cancelled by {by}", list(TERMINAL))
    if epoch is None:
        raise CancelRefused(f"run {run_id!r} does not exist or already ended")
    return int(epoch)


async def resume(conn: Any, run_id: str, *, by: str = "operator") -> None:
    """Make a cancelled run resumable again (``paused``): the next worker continues it
    from its log. Raises :class:`CancelRefused` if it is not ``cancelled``."""
    done = await conn.fetchval(
        "UPDATE cm_runs SET status = 'paused', detail = $2, updated_at = now() "
        "WHERE run_id = $1 AND status = 'cancelled' RETURNING 1", run_id, f"resumed by {by} after a cancel")
    if done is None:
        raise CancelRefused(f"run {run_id!r} is not cancelled")
