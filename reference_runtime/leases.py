"""Run ownership: a lease with an epoch (a fencing token).

Wall (docs/design.md, "Run ownership"): a worker that was paused (SIGSTOP, a long GC, a VM
migration) may wake up after another worker took its run over. Every write the runtime
makes (log append, effect ledger, run status) carries the writer's epoch and is refused
when the run's current epoch differs, so the zombie cannot append or mark effects.

:func:`acquire` always takes the lease by bumping the epoch (the harness decides who
runs, so a resume steals rather than waiting for expiry); ``expires_at`` is what the
sweep (:mod:`.sweep`) reads to find abandoned runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .db import Db

LEASE_SECONDS = 30


class LeaseLost(RuntimeError):
    """This worker's lease epoch is stale: another worker owns the run now."""


FINISHED = ("completed", "failed", "limit_exceeded")
"""Statuses of a run that ended: :func:`acquire` never takes it again. (``needs_human``,
``paused``, ``interrupted`` and ``cannot_migrate`` wait for a person, a worker or a
newer build; ``cancelled`` for an operator's resume.)"""


class RunFinished(Exception):
    """The run ended (``status``, one of :data:`FINISHED`): a worker handed it again (a
    queue that redelivers a message whose acknowledgement was lost) answers with its
    status and writes nothing."""

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id}: already {status}; not taken again")
        self.status = status


class RunCancelled(LeaseLost):
    """The run was cancelled by an operator (:mod:`.cancellation`): no worker takes it
    until it is resumed, and the worker that ran it lost its lease."""


@dataclass(frozen=True)
class Lease:
    """The lease a worker holds on ``run_id``: ``epoch`` is the fencing token;
    ``previous_status``: the run's status when it was taken (``running``: another
    worker held it), None when not known; ``progress_epoch`` the epoch of the run's
    newest record when it was taken (0: none; :mod:`.attempts`)."""

    run_id: str
    owner: str
    epoch: int
    previous_status: str | None = None
    progress_epoch: int = 0


async def acquire(db: Db, run_id: str, owner: str) -> Lease:
    """Take the lease on ``run_id`` for ``owner`` (stealing it), set status ``running``;
    in the same statement, the epoch of the run's newest record (for :mod:`.attempts`).

    Raises ``LookupError`` if the run does not exist, :class:`RunCancelled` if an
    operator cancelled it (:mod:`.cancellation`: it waits for their resume) and
    :class:`RunFinished` if it ended (:data:`FINISHED`: taking it would set it
    ``running`` again, and a run redelivered often enough would then end ``failed`` by
    the attempt limit, :mod:`.attempts`, however it had ended). The lease says the
    status the run had (``running``: taken over from another worker), read in the same
    statement.
    """
    row = await db.fetchrow(
        """
        UPDATE cm_runs r
           SET lease_epoch = r.lease_epoch + 1, lease_owner = $2, status = 'running',
               lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
          FROM (SELECT status FROM cm_runs WHERE run_id = $1 FOR UPDATE) AS previous
         WHERE r.run_id = $1 AND previous.status <> ALL($4::text[])
        RETURNING r.lease_epoch, previous.status,
                  (SELECT max(l.lease_epoch) FROM cm_run_log l WHERE l.run_id = $1) AS progress
        """,
        run_id,
        owner,
        LEASE_SECONDS,
        ["cancelled", *FINISHED],
    )
    if row is None:
        status = await db.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id)
        if status == "cancelled":
            raise RunCancelled(f"run {run_id}: cancelled by an operator; not taken until it is resumed")
        if status in FINISHED:
            raise RunFinished(run_id, status)
        raise LookupError(f"run_id={run_id!r} does not exist")
    return Lease(run_id, owner, row[0], row[1], int(row["progress"] or 0))


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
