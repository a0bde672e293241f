"""Run ownership: a lease with an epoch (a fencing token).

Wall (DESIGN.md, "Run ownership"): a worker that was paused (SIGSTOP, a long GC, a VM
migration) may wake up after another worker took its run over. Every write the runtime
makes (log append, effect ledger, run status) carries the writer's epoch and is refused
when the run's current epoch differs, so the zombie cannot append or mark effects.

:func:`acquire` always takes the lease by bumping the epoch (the harness decides who
runs, so a resume steals rather than waiting for expiry); ``expires_at`` is recorded for
operators and for runtimes that poll for abandoned runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .db import Db

LEASE_SECONDS = 30


class LeaseLost(RuntimeError):
    """This worker's lease epoch is stale: another worker owns the run now."""


@dataclass(frozen=True)
class Lease:
    """The lease a worker holds on ``run_id``: ``epoch`` is the fencing token."""

    run_id: str
    owner: str
    epoch: int


async def acquire(db: Db, run_id: str, owner: str) -> Lease:
    """Take the lease on ``run_id`` for ``owner`` (stealing it), set status ``running``.

    Raises ``LookupError`` if the run does not exist.
    """
    epoch = await db.fetchval(
        """
        UPDATE cm_runs
           SET lease_epoch = lease_epoch + 1, lease_owner = $2, status = 'running',
               lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
         WHERE run_id = $1
        RETURNING lease_epoch
        """,
        run_id,
        owner,
        LEASE_SECONDS,
    )
    if epoch is None:
        raise LookupError(f"run_id={run_id!r} does not exist")
    return Lease(run_id, owner, epoch)


async def set_status(db: Db, lease: Lease, status: str, detail: str | None = None) -> None:
    """Write the run's status, fenced by ``lease``; raises :class:`LeaseLost` if stale."""
    done = await db.fetchval(
        """
        UPDATE cm_runs SET status = $3, detail = $4, updated_at = now()
         WHERE run_id = $1 AND lease_epoch = $2
        RETURNING 1
        """,
        lease.run_id,
        lease.epoch,
        status,
        detail,
    )
    if done is None:
        raise LeaseLost(f"run {lease.run_id}: lease epoch {lease.epoch} is stale")
