"""Absurd as a subject: PostgreSQL-based durable tasks (``absurd-sdk``) on the harness's
PostgreSQL.

Needs the optional extra ``crashmatrix[absurd]`` (``absurd-sdk``, and ``absurdctl`` for the
schema it bundles), imported only when a worker or ``prepare`` needs it. The workload is
:mod:`crashmatrix.scenarios.realworld.absurd_checkout` (``NAIVE`` or ``KEYED``), reached
through the workload object (``ctx.workload`` in a worker, :meth:`~.Adapter.workload_of`
in the controller): its ``queue_name``, ``task_name``, ``handler``, ``params``,
``answer`` and ``step_order``.

**prepare** installs Absurd's schema (``absurdctl``'s bundled ``absurd.sql`` of the same
release, executed once; a database that already has it is left as it is).

**A worker** (start or resume: the same code) connects with psycopg
(``application_name`` = the worker id, so the harness can wait for a killed worker's
sessions), creates the run's queue (one per run: the workload's ``queue_name``;
idempotent), spawns the task with the run id as its idempotency key (a second spawn
returns the same task), then works the queue (``work_batch``: claim one run with a lease
of :data:`CLAIM_TIMEOUT` s and execute it) until the task is ``completed``, ``failed`` or
``cancelled``. After a kill the dead worker's run keeps its claim until the lease
expires; the next claim sweeps it (``fail_run``: ``$ClaimTimeout``) and schedules the
next attempt, which the resume worker claims. So a resume waits up to
:data:`CLAIM_TIMEOUT` s, and the task gets at most :data:`MAX_ATTEMPTS` attempts.

**Faults**: ``kill``; ``term`` (Absurd installs no SIGTERM handler: the worker dies as
killed); ``cancel`` (``CancelledError`` is not an ``Exception``: it leaves
``_execute_task`` without failing the run, the run keeps its lease, the worker ends,
the next worker claims it when the lease expires); ``pause`` (a frozen worker's lease
expires, the resume worker steals the task; the woken zombie's writes meet Absurd's
fencing: a checkpoint of a run already failed raises ``AB002``); ``db-restart``;
``net`` on the ``db`` link and the providers'; ``cancel-api`` (:meth:`AbsurdAdapter.
cancel_run`: ``cancel_task``; a cancelled task cannot be resumed, so the adapter
declares its cancel final, ``cancel_is_final``, and the case ends cancelled).

**Crash points**: ``step.before/after`` around each step's function (logical task
``model-N`` / ``tool-N.i``, the checkpoint name), the workload's ``model.call.*`` /
``tool.request.*``, ``log.append.before/after`` around the checkpoint write. Await
points: frames in ``absurd_sdk``.

**observe** reads the queue's tables (``absurd.t_<queue>``, ``absurd.c_<queue>``) with
asyncpg: the task's state, its attempts (as the lease epoch), its checkpoints as the
log (in step order) and the transcript (the input plus the checkpointed messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import anyio

from ..adapter import Adapter, Environment, LogEntry, Observation, RunContext
from ._shared import point_under, worker_hooks

CLAIM_TIMEOUT = 2
"""Seconds of a run's lease (Absurd's default is 120): how long a resume waits for a dead
worker's claim to expire. Every checkpoint write extends it."""
MAX_ATTEMPTS = 12
"""Attempts of a task (Absurd's default is 5): the matrix kills a run up to four times."""
POLL_SECONDS = 0.05
STATUS_MAP = {"completed": "completed", "failed": "failed", "cancelled": "failed",
              "pending": "pending", "running": "pending", "sleeping": "pending"}
_POINT_LOCK = threading.Lock()
point = point_under(_POINT_LOCK)


class AbsurdAdapter(Adapter):
    """Absurd: a task whose model turns and tool calls are checkpointed steps, leases on
    PostgreSQL."""

    name = "absurd"
    #: a resume reads the run from the runtime's own store and needs the input only when
    #: nothing was stored (then the harness still hands it: the run was never acknowledged)
    expects_redelivery = False
    subject_packages = ("absurd_sdk",)
    requires = ("psycopg", "absurd_sdk", "absurdctl")
    extra = "absurd"
    #: task leases in the harness's PostgreSQL (pause, db-restart)
    harness_db_leases = True
    #: Absurd has no way back from a cancel: ``cancelled`` is final. Its one call that
    #: reschedules a task, ``retry_task`` (in place or ``spawn_new``), refuses a task that
    #: is not ``failed`` (``absurd.sql``: 'Task ... is not currently failed'), and a spawn
    #: with the run's idempotency key returns the cancelled task
    cancel_is_final = True

    async def prepare(self, env: Environment) -> None:
        import asyncpg
        from absurdctl import BUNDLED_SCHEMA_SQL

        conn = await asyncpg.connect(env.dsn, server_settings={"application_name": "crashmatrix-prepare"})
        try:
            installed = await conn.fetchval("SELECT to_regproc('absurd.get_schema_version') IS NOT NULL")
            if not installed:
                await conn.execute(BUNDLED_SCHEMA_SQL)
        finally:
            await conn.close()

    # -- worker side --------------------------------------------------------------

    async def start(self, ctx: RunContext) -> str:
        return await self._run(ctx)

    async def resume(self, ctx: RunContext) -> str:
        return await self._run(ctx)  # spawning is idempotent (the run id is the key)

    async def _run(self, ctx: RunContext) -> str:
        import aiohttp
        import psycopg
        from absurd_sdk import AsyncAbsurd

        workload = ctx.workload
        queue = workload.queue_name(ctx.run_id)
        conn = await psycopg.AsyncConnection.connect(ctx.env.dsn, autocommit=True, application_name=ctx.worker_id)
        try:
            async with aiohttp.ClientSession() as session:
                hooks = worker_hooks(ctx, session, point, _POINT_LOCK)
                app = AsyncAbsurd(conn, queue_name=queue, default_max_attempts=MAX_ATTEMPTS)
                app.register_task(workload.task_name)(workload.handler(hooks, ctx.run_id))
                await app.create_queue(queue)
                # a resume finds the task (and its params) in the queue and needs no input
                # (``--resume input-once``); otherwise spawn it, idempotently by run id
                row = await (await conn.execute(f'SELECT task_id FROM absurd."t_{queue}" LIMIT 1')).fetchone()
                if row is not None:
                    task_id = str(row[0])
                else:
                    spawned = await app.spawn(workload.task_name, workload.params(ctx.conversation),
                                              max_attempts=MAX_ATTEMPTS, idempotency_key=ctx.run_id)
                    task_id = str(spawned["task_id"])
                with _POINT_LOCK:
                    ctx.accepted()  # the task row is committed: a caller would be told "accepted"
                while True:
                    snapshot = await app.fetch_task_result(task_id)
                    state = snapshot.state if snapshot is not None else "pending"
                    if state in ("completed", "failed", "cancelled"):
                        return STATUS_MAP[state]
                    await app.work_batch(worker_id=ctx.worker_id, claim_timeout=CLAIM_TIMEOUT, batch_size=1)
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await conn.close()

    # -- controller side ----------------------------------------------------------

    async def cancel_run(self, env: Environment, run_id: str) -> None:
        """Absurd's own cancel, ``AsyncAbsurd.cancel_task`` on the run's task (found in
        its queue's task table; one task per run): the task and its active run become
        ``cancelled``, the run's claim is dropped, and the woken worker's next checkpoint
        write raises ``CancelledTask`` (SQLSTATE ``AB001``), so the step in flight is
        not recorded. Raises ``LookupError`` when the run has no task yet."""
        import psycopg
        from absurd_sdk import AsyncAbsurd

        queue = self.workload_of(env).queue_name(run_id)
        async with await psycopg.AsyncConnection.connect(env.dsn, autocommit=True,
                                                         application_name="crashmatrix-cancel") as conn:
            row = await (await conn.execute(f'SELECT task_id FROM absurd."t_{queue}" LIMIT 1')).fetchone()
            if row is None:
                raise LookupError(f"run {run_id}: no Absurd task in queue {queue!r} to cancel")
            await AsyncAbsurd(conn, queue_name=queue).cancel_task(str(row[0]))

    async def observe(self, env: Environment, run_id: str) -> Observation:
        import asyncpg

        workload = self.workload_of(env)
        queue = workload.queue_name(run_id)
        # a connection per observation (2-3 ms): ``db-restart`` cases read a second
        # server, started and stopped per case, while other cases read the first
        conn = await asyncpg.connect(env.dsn, server_settings={"application_name": "crashmatrix-oracle"})
        try:
            try:
                task = await conn.fetchrow(
                    f'SELECT task_id, state, attempts, params FROM absurd."t_{queue}" LIMIT 1')
                rows = [] if task is None else await conn.fetch(
                    f'SELECT checkpoint_name, state FROM absurd."c_{queue}" WHERE task_id = $1', task["task_id"])
            except asyncpg.UndefinedTableError:
                return Observation(run_id, "absent", log=[], state=None, state_error="no queue yet")
        finally:
            await conn.close()
        if task is None:
            return Observation(run_id, "absent", log=[], state=None, state_error="no task")
        status = STATUS_MAP.get(task["state"], task["state"])
        params = json.loads(task["params"])
        steps = sorted(((r["checkpoint_name"], json.loads(r["state"])) for r in rows), key=lambda r: workload.step_order(r[0]))
        messages = list(params["input"]["messages"]) + [out for _, out in steps]
        log = [LogEntry(seq, name, (), name.split("-")[0], 0) for seq, (name, _) in enumerate(steps, start=1)]
        return Observation(run_id, status, log=log, effects=None, lease_epoch=int(task["attempts"]), state={
            "transcript": messages, "answer": workload.answer(messages), "budget": None,
            "pending": [] if status in ("completed", "failed") else ["task"]})


__all__ = ["AbsurdAdapter", "CLAIM_TIMEOUT", "MAX_ATTEMPTS", "point"]
