"""Mutants only a database outage reaches: defects in how a runtime lives through a
PostgreSQL that is away for a while."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg

from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime.db import DatabaseUnavailable, Db, _connect
from crashmatrix.reference_runtime.leases import Lease, set_status

from ._base import MutantAdapter

GIVE_UP_AFTER_S = 0.2
"""How long the mutant tries to reconnect before it calls the database gone."""
REPORT_WITHIN_S = 30.0
"""How long it then waits for the database to record the run as failed."""


class GivesUpOnOutageRuntime(Runtime):
    """Defect: a database that does not answer within a fraction of a second is taken for
    the run's failure. The runtime stops reconnecting after :data:`GIVE_UP_AFTER_S`, and
    instead of leaving the run as it was for a resume (the reference's
    ``DatabaseUnavailable``), it waits for the database to come back and records the run
    ``failed``: work that a brief outage interrupted is given up for good.

    Class: transient connection errors treated as the work's own failure, the outcome
    DBOS's recovery loop gave a PostgreSQL restart (dbos-transact-py #716: the workflows
    in recovery when the database went away stayed abandoned) and that DBOS's "handling
    database disconnections" change (block and retry until reconnected) exists to avoid.
    Caught by a ``db-outage`` fault anywhere the run still has database work to do
    (``checkout/conv1/db-outage(1000ms)@log.append.before[turn-4]#1``):
    ``db-outage.resumable`` (the run is ``failed`` after the worker) and ``run.status``.
    ``db-restart`` never reaches it: that worker sleeps through the restart and wakes to
    a server that is back, so its first reconnection succeeds.
    """

    def __init__(self, db: Db, *args: Any, **kwargs: Any) -> None:
        db.reconnect_deadline_s = GIVE_UP_AFTER_S
        super().__init__(db, *args, **kwargs)

    async def _run_attempt(self, run_id: str, lease: Lease, run_input: dict[str, Any]) -> str:
        try:
            return await super()._run_attempt(run_id, lease, run_input)
        except BaseException as exc:  # the defect: "the database is gone, so is the run"
            if not _unavailable(exc) or self.db.dsn is None:
                raise
            with anyio.move_on_after(REPORT_WITHIN_S, shield=True):
                self.db.conn = await _connect_when_back(self.db.dsn, self.db.application_name)
                await set_status(self.db, lease, "failed", f"database unavailable: {exc}")
            return "failed"


async def _connect_when_back(dsn: str, application_name: str | None) -> Any:
    """A new connection to ``dsn``, tried every 50 ms until the database answers."""
    while True:
        try:
            return await _connect(dsn, application_name, 1.0)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            await anyio.sleep(0.05)


def _unavailable(exc: BaseException) -> bool:
    """``exc`` is, or groups (a task group's), a :class:`DatabaseUnavailable`."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_unavailable(e) for e in exc.exceptions)
    return isinstance(exc, DatabaseUnavailable)


class GivesUpOnOutageAdapter(MutantAdapter):
    """A brief database outage fails the run (GivesUpOnOutageRuntime)."""

    name = "defect:gives-up-on-outage"
    defect = "a database unreachable for a fraction of a second fails the run instead of leaving it for a resume"
    source = ("transient connection errors taken for the work's failure: dbos-transact-py #716 (workflows in "
              "recovery abandoned when PostgreSQL restarted) and its fix's class, block and retry until reconnected")
    caught_by = ("db-outage.resumable", "run.status")
    fault_kinds = ("db-outage",)
    point_sources = ("label",)
    conversations = ("conv1",)

    runtime_class = GivesUpOnOutageRuntime
