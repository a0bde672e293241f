"""DBOS Transact as a subject: an async workflow with steps, SQLite or PostgreSQL system
database, recovery by relaunching with a pinned executor id and application version.

Needs the optional extra ``crashmatrix[dbos]`` (imported only inside the methods). The
workload is :mod:`crashmatrix.scenarios.realworld.dbos_checkout` (``NAIVE`` or ``KEYED``),
reached through the workload object: ``worker``, ``workflow``, ``workflow_args`` in a
worker; ``model_step``, ``transcript`` and ``answer`` in ``observe``
(:meth:`~.Adapter.workload_of`).

**Start** (a forked worker): ``DBOS(config)`` with ``executor_id = "cm-<run id>"`` and
``application_version = "<APP_VERSION>-<build>.<run id>"`` (``<build>``: DBOS's own hash
of the workflow code, :func:`build_version`), ``DBOS.launch()``, then the workflow with
``SetWorkflowID(run_id)`` on the worker's event loop (or, for a workload with a
``queue``, ``queue.enqueue_async``: the ``queued`` checkout), acknowledge the run
(``ctx.accepted()``: the call returned, so the workflow row and its input are committed;
a resume that finds the row acknowledges it at once and needs no input), and wait for
its result.

**Versions and crash loops.** The application version follows the build: a resume under
``--resume-with`` a build whose workflow code differs finds the run ``PENDING`` under the
old version and leaves it (DBOS recovers a workflow only in a process of its version),
so the pair shows the run stranded. A workflow recovered more than its
``max_recovery_attempts`` (the checkout declares 5; DBOS's default, read from the
installed package, is 100) is dead-lettered, ``MAX_RECOVERY_ATTEMPTS_EXCEEDED``: the
declared ``crash_loop_status`` (``needs_human``: it waits for ``resume_workflow``).
Runs on dbos 2.x and 3.x (:func:`migrate`).

**Resume** (a new worker, "another machine"): the same config, ``DBOS.launch()``. On
launch DBOS recovers the workflows left ``PENDING`` by *this executor id and this
application version* (its background recovery thread runs them on DBOS's own event
loop); the adapter then waits on the workflow's handle. Two facts make the pins
necessary (both pinned by tests/adapters/test_adapters_dbos.py):

- launch-time recovery selects ``executor_id`` and ``application_version``; a worker
  with a fresh executor id (DBOS's default is ``"local"``, or ``DBOS__VMID``) recovers
  nothing, and the default application version is a hash of the workflow source;
- starting the workflow again with the same id from a process with another executor id
  does not resume it: DBOS attaches to the existing ``PENDING`` workflow and waits for
  an outcome that nobody is producing.

One executor id and one application version per run (not per worker) keep parallel
cases on one PostgreSQL apart (the version, not the application name: DBOS refuses a
version name already registered by another application name). Both are needed: launch-time recovery selects by executor
id, but it does not run the workflow, it re-enqueues it on DBOS's internal queue, and
the queue is served by every process attached to the same system database with the
same application name and version. Measured before the name was made per run: in the
PostgreSQL matrix (two cases at a time) a resume hung for its whole 60 s deadline
because the worker of another case dequeued the recovered workflow, ran it, and left
(``DBOS.destroy``) with it half done: ``PENDING`` under that worker's executor id, which
nobody would launch again (the mechanism as read in DBOS's source: the dequeue filters
on application name and version, not on executor id, and sets the row's executor id). In a deployment the same happens when an executor that took
over a recovered workflow is scaled in without draining.

Recovery does not run the workflow at once: DBOS re-enqueues it on its internal queue,
whose poller picks it up within its polling interval (1 s by default; measured: a
resume worker takes ~1.2 s, most of it that wait).

A run with no workflow row yet (killed before ``init_workflow`` committed) is started
again from its input.

**Recover** (resume policy ``discovery``: a worker given no run id): DBOS's own
recovery is by executor, not by workflow id: a process that launches with an executor
id recovers that executor's ``PENDING`` workflows. In a discovery case every worker
runs under the case's scope (``ctx.scope``) as its executor id and application version
(and, on SQLite, its file), so the recovering worker launches as "the same executor,
restarted" and waits until the executor has no workflow left ``PENDING``. DBOS has no
lease (``lease_seconds`` None): recovery takes them at launch.

Crash points: ``step.before`` / ``step.after`` inside each step (logical task
``model-<step id>`` / ``tool-<step id>``), the workload's ``model.call.*`` and
``tool.request.*`` labels, and ``log.append.after`` when DBOS has committed a step's
output (DBOS's own ``DEBUG_TRIGGER_STEP_COMMIT`` trigger point, from
``dbos._debug_trigger``: a private module, pinned by the tests). ``step.after`` is the
last point before DBOS writes the step output: a kill there is "effect done, output not
saved". Crash points go through one process-wide lock (see :func:`point`).

**Inside recovery**: DBOS's recovery sweep passes :data:`RECOVERY_LISTED` once it has
read the executor's pending workflows and before it re-enqueues or runs any
(``recovery_point``): ``concurrent`` recoverers meet there, and a ``db-outage`` placed
there begins between the list and the re-enqueue. The adapter's own calls (registering
the queue, reading the status) ride a refused connection (:func:`_riding_outage`), as a
server's startup code that retries does, so what such a case shows is DBOS's recovery.

``observe`` reads the system database with ``DBOSClient``: the workflow status, the
recorded steps (as the run log: one entry per step, ``seq`` = DBOS step id) and the
transcript rebuilt from the run input and the recorded step outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

from crashmatrix.harness.crashpoint import LOG_APPEND_AFTER, crashpoint, reset_logical_task, set_logical_task

from ..adapter import Adapter, Environment, LogEntry, Observation, RunContext

APP_NAME = "crashmatrix-checkout"
APP_VERSION = "crashmatrix-checkout-1"
BACKENDS = ("sqlite", "postgres")

STATUS_MAP = {
    "SUCCESS": "completed",
    "ERROR": "failed",
    "PENDING": "pending",
    "ENQUEUED": "pending",
    "DELAYED": "pending",
    # both wait for an operator (DBOS.resume_workflow): a hand-off to a human;
    # MAX_RECOVERY_ATTEMPTS_EXCEEDED is DBOS's dead letter, where a crash loop ends
    # (DBOSAdapter.crash_loop_status)
    "CANCELLED": "needs_human",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "needs_human",
}
DEAD_LETTER = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"
"""DBOS's status of a workflow recovered more than its ``max_recovery_attempts``
(dbos 2.x and 3.x: ``WorkflowStatusString.MAX_RECOVERY_ATTEMPTS_EXCEEDED``)."""

OPERATOR_POLL_SECONDS = 0.02
"""How often the scripted operator looks at what a workflow waits for."""

POLL_SECONDS = 0.02
"""How often a handle polls the system database for a recovered workflow's outcome
(DBOS's default is 1 s)."""

CANCELLED_WAIT_SECONDS = 30.0
"""After a ``cancel`` fault, how long the worker stays up for the shielded workflow to
end by itself before it leaves (and the loop's shutdown cancels the workflow task)."""

QUEUE_POLL_SECONDS = 0.05
"""How often a worker polls DBOS's internal queue, where launch-time recovery puts the
workflow (DBOS's default is 1 s, most of a resume worker's time). Set through a private
attribute (``Queue._polling_interval_sec`` of the registry's internal queue); if DBOS
renames it, resumes only get slower (:func:`_fast_internal_queue`)."""


def _fast_internal_queue() -> bool:
    """Make this process poll DBOS's internal queue every :data:`QUEUE_POLL_SECONDS`;
    False when DBOS's private names changed (then the default 1 s applies)."""
    try:
        from dbos._dbos import _get_or_create_dbos_registry

        queue = _get_or_create_dbos_registry().get_internal_queue()
        if not hasattr(queue, "_polling_interval_sec"):
            return False
        queue._polling_interval_sec = QUEUE_POLL_SECONDS
        return True
    except (ImportError, AttributeError):
        return False

OUTAGE_RIDE_SECONDS = 30.0
"""How long the adapter's own calls to DBOS (registering the workload's queue, reading a
workflow's status) retry a refused database connection before the error stands (a
``db-outage``: the worker rides the outage out as a server's startup code does, so what
DBOS's own recovery does during the outage is what the case shows)."""
OUTAGE_RETRY_SECONDS = 0.2


def _connection_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the database being unreachable (SQLAlchemy's
    ``OperationalError``, which wraps the driver's connection failures), not a bug."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:
        return False
    return isinstance(exc, OperationalError)


async def _riding_outage(call: Any) -> Any:
    """``await call()``, retried every :data:`OUTAGE_RETRY_SECONDS` for up to
    :data:`OUTAGE_RIDE_SECONDS` while the database refuses connections
    (:func:`_connection_refused`); any other error, or the last one, is raised."""
    deadline = asyncio.get_running_loop().time() + OUTAGE_RIDE_SECONDS
    while True:
        try:
            return await call()
        except Exception as exc:
            if not _connection_refused(exc) or asyncio.get_running_loop().time() >= deadline:
                raise
        await asyncio.sleep(OUTAGE_RETRY_SECONDS)


OTHER_EXECUTOR_SUFFIX = "-other"
"""Appended to the run's executor id for the executor that recovers it (``recover_other``)."""
RECOVER_OTHER_WAIT_SECONDS = 30.0
"""How long the recovering executor waits for the run it took over to end (within the
worker's deadline): a run its recovery stranded is reported as it stands."""

_POINT_LOCK = threading.Lock()

RECOVERY_LISTED = "recovery.listed"
"""Crash point (logical task :data:`RECOVERY_TASK`) that DBOS's recovery sweep passes
once it has read the executor's ``PENDING`` workflows, when there are any (``get_pending_workflows``, at
``DBOS.launch`` and in ``_recover_pending_workflows``) and before it acts on any of them
(``clear_queue_assignment`` for a queued workflow, else ``execute_workflow_by_id``):
:attr:`DBOSAdapter.recovery_point`."""
RECOVERY_TASK = "recovery"


def _mark_recovery_listed() -> bool:
    """Make this process pass :data:`RECOVERY_LISTED` each time DBOS's system database
    returns its pending-workflow list (a wrapper on ``SystemDatabase.get_pending_workflows``,
    installed once; it sits outside DBOS's own retry, so the point follows a list that was
    read). False when DBOS's private names changed (then the point is never passed and a
    fault placed there does not fire)."""
    try:
        from dbos._sys_db import SystemDatabase
    except ImportError:
        return False
    listed = getattr(SystemDatabase, "get_pending_workflows", None)
    if listed is None:
        return False
    if getattr(listed, "_crashmatrix_point", False):
        return True

    def get_pending_workflows(self: Any, *args: Any, **kwargs: Any) -> Any:
        rows = listed(self, *args, **kwargs)
        if not rows:  # nothing to recover: no sweep to be inside of (a fresh start passes no point)
            return rows
        token = set_logical_task(RECOVERY_TASK)
        try:
            point(RECOVERY_LISTED)
        finally:
            reset_logical_task(token)
        return rows

    get_pending_workflows._crashmatrix_point = True  # type: ignore[attr-defined]
    SystemDatabase.get_pending_workflows = get_pending_workflows  # type: ignore[method-assign]
    return True


def point(name: str) -> None:
    """``crashpoint(name)`` under one process-wide lock: DBOS records outputs on
    ``asyncio.to_thread`` threads and recovers on its own event-loop thread; a thread
    that reaches a crash point while another fires a kill waits there until the
    process dies, so nothing past a crash point happens unrecorded."""
    with _POINT_LOCK:
        crashpoint(name)


FORK_SEPARATOR = "~fork-"
"""A fork's workflow id is its original's, this, and the step it starts at: the adapter
files it with its original (:meth:`DBOSAdapter.restore_run`)."""


def executor_id(run_id: str) -> str:
    return f"cm-{run_id}"


def build_version() -> str:
    """This process's code as DBOS versions it, by DBOS's own rule
    (``compute_app_version``: an MD5 of the registered workflows' source, sorted, then
    the dbos release and the application name), over the application's workflows only:
    dbos 2.x registers internal workflows when ``DBOS(config)`` is made, so its own
    ``compute_app_version`` differs before and after, and the version goes into that
    config. The first 12 hex digits. Two builds with the same workflows and dbos release
    agree; a build whose workflow code changed gets another version, as a DBOS
    deployment left at its default does."""
    import hashlib
    import inspect

    from dbos._dbos import _get_or_create_dbos_registry
    from dbos._utils import GlobalParams

    workflows = _get_or_create_dbos_registry().workflow_info_map.values()
    sources = sorted(inspect.getsource(wf) for wf in workflows
                     if not str(getattr(wf, "__module__", "")).startswith("dbos"))
    hasher = hashlib.md5()
    for source in [*sources, GlobalParams.dbos_version, APP_NAME]:
        hasher.update(source.encode("utf-8"))
    return hasher.hexdigest()[:12]


def application_version(run_id: str) -> str:
    """The application version a run is started and recovered with:
    ``<APP_VERSION>-<build_version()>.<run id or scope>``. It follows the build (so a
    resume under a build with other workflow code does not recover a run left
    ``PENDING`` by the old one: DBOS's documented rule, shown by ``--resume-with``), and
    is one per run, because recovery re-enqueues a workflow on DBOS's internal queue,
    and *any* process on the same system database with the same application name and
    version may dequeue it (see module docstring)."""
    return f"{APP_VERSION}-{build_version()}.{run_id}"


def default_max_recovery_attempts() -> int:
    """DBOS's default ``max_recovery_attempts`` of a workflow (the installed release's
    ``DEFAULT_MAX_RECOVERY_ATTEMPTS``: 100 in dbos 2.x and 3.x)."""
    from dbos._registrations import DEFAULT_MAX_RECOVERY_ATTEMPTS

    return int(DEFAULT_MAX_RECOVERY_ATTEMPTS)


def max_recovery_attempts(workflow: Any) -> int | None:
    """The ``max_recovery_attempts`` a registered workflow function was declared with
    (``@DBOS.workflow(max_recovery_attempts=N)``; None: unbounded)."""
    from dbos._registrations import get_func_info

    info = get_func_info(workflow)
    return None if info is None else info.max_recovery_attempts


def migrate(system_database_url: str) -> None:
    """Create or migrate DBOS's system database: ``DBOS.migrate`` (dbos 3.x), else
    what the ``dbos migrate`` command runs (dbos 2.x:
    ``dbos.cli.migration.migrate_dbos_databases``; raises ``RuntimeError`` when it
    fails, e.g. a PostgreSQL without the ``uuid-ossp`` extension its schema needs)."""
    from dbos import DBOS

    if hasattr(DBOS, "migrate"):
        DBOS.migrate(system_database_url)
        return
    from dbos.cli.migration import migrate_dbos_databases

    try:
        migrate_dbos_databases(system_database_url, None, "dbos")
    except Exception as exc:  # the CLI's Exit (click's from 2.29, typer's before): it printed why
        if type(exc).__name__ != "Exit":
            raise
        raise RuntimeError("DBOS's `dbos migrate` of the system database failed (its reason is printed above; "
                           "dbos 2.x on PostgreSQL needs the uuid-ossp extension)") from None


class DBOSAdapter(Adapter):
    """DBOS Transact workflow with steps, SQLite system database."""

    name = "dbos-sqlite"
    subject_packages = ("dbos",)
    #: a resume reads the run from the runtime's own store and needs the input only when
    #: nothing was stored (then the harness still hands it: the run was never acknowledged)
    expects_redelivery = False
    #: a ``recv`` wait is answered from ``workload.operator_script`` with ``DBOS.send``
    answers_operator = ("operator_script",)
    backend = "sqlite"
    requires: tuple[str, ...] = ("dbos", "dbos._debug_trigger")
    extra = "dbos"
    #: a workflow recovered more than its ``max_recovery_attempts`` (the workload's
    #: ``@DBOS.workflow(max_recovery_attempts=N)``, DBOS's default
    #: :func:`default_max_recovery_attempts`) is dead-lettered,
    #: ``MAX_RECOVERY_ATTEMPTS_EXCEEDED``, which waits for an operator's
    #: ``resume_workflow``: reported ``needs_human``
    crash_loop_status = "needs_human"

    #: DBOS dead-letters a workflow whose recoveries exceeded its limit:
    #: ``MAX_RECOVERY_ATTEMPTS_EXCEEDED``, mapped to ``needs_human`` (STATUS_MAP)
    crash_loop_status = STATUS_MAP["MAX_RECOVERY_ATTEMPTS_EXCEEDED"]
    #: DBOS's recovery sweep has read the executor's pending workflows and acts on none
    #: yet (:data:`RECOVERY_LISTED`)
    recovery_point = (RECOVERY_LISTED, RECOVERY_TASK)
    #: a live DBOS process recovers another executor's pending workflows
    #: (``_recover_pending_workflows``): :meth:`recover_other`
    recovers_other_executor = True

    #: launch and destroy DBOS on the event loop's own thread, as an application does
    #: from async code (a web framework's lifespan): DBOS adopts the running loop as its
    #: main loop; False: in a worker thread (``asyncio.to_thread``)
    launch_on_loop = False

    def __init__(self) -> None:
        super().__init__()
        self._client: Any = None
        self._client_url: str | None = None
        self._workflow_limit: int | None = None

    @property
    def recovery_attempts_limit(self) -> int | None:  # type: ignore[override]
        """DBOS's own limit on a workflow's recoveries, as DBOS keeps it: the
        ``max_recovery_attempts`` the workload's workflow was registered with (read at
        ``prepare``, :func:`max_recovery_attempts`), else the installed package's default
        (:func:`default_max_recovery_attempts`); read, never assumed."""
        if self._workflow_limit is not None:
            return self._workflow_limit
        return default_max_recovery_attempts()

    # -- storage ------------------------------------------------------------------

    @staticmethod
    def _scope(env: Environment, run_id: str) -> str:
        """What the run is filed under: the case's recovery scope (a discovery case,
        ``Environment.options["recovery_scope"]``), else the run id (a fork's, its
        original's: :data:`FORK_SEPARATOR`)."""
        return str(env.options.get("recovery_scope") or run_id.split(FORK_SEPARATOR, 1)[0])

    def system_database_url(self, env: Environment, run_id: str, application_name: str | None = None) -> str:
        """SQLite: one file per run (``workdir/dbos/<run id or scope>.sqlite``).
        PostgreSQL: the harness's database (DBOS's tables live in its ``dbos`` schema),
        with ``application_name`` so the harness can wait for a killed worker's sessions."""
        if self.backend == "sqlite":
            return f"sqlite:///{Path(env.workdir) / 'dbos' / f'{self._scope(env, run_id)}.sqlite'}"
        url = env.dsn
        if application_name:
            parts = urllib.parse.urlsplit(url)
            query = urllib.parse.parse_qsl(parts.query)
            query = [(k, v) for k, v in query if k != "application_name"] + [("application_name", application_name)]
            url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
        return url

    def config(self, env: Environment, run_id: str, worker_id: str) -> dict[str, Any]:
        return {
            "name": APP_NAME,
            "system_database_url": self.system_database_url(env, run_id, worker_id),
            "executor_id": executor_id(self._scope(env, run_id)),
            "application_version": application_version(self._scope(env, run_id)),
            "sys_db_pool_size": 4,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
        }

    async def prepare(self, env: Environment) -> None:
        workflow = getattr(self.workload_of(env), "workflow", None) if env.workload else None
        if workflow is not None:  # else (a workload without its own workflow): DBOS's default
            self._workflow_limit = max_recovery_attempts(workflow)
        if self.backend == "postgres":
            await asyncio.to_thread(migrate, self.system_database_url(env, "", "crashmatrix-prepare"))
        else:
            (Path(env.workdir) / "dbos").mkdir(parents=True, exist_ok=True)

    # -- worker side --------------------------------------------------------------

    @staticmethod
    def _step_hook(on_step: Any) -> Any:
        from dbos import DBOS

        @contextlib.contextmanager
        def step(kind: str, step_id: object = None) -> Iterator[str]:
            # step_id: the workload's own id for work DBOS does not record as a step
            logical = f"{kind}-{DBOS.step_id if step_id is None else step_id}"
            # Not reset on exit: DBOS records the output from a thread that copies this
            # context, and its commit trigger reads the logical task from it.
            set_logical_task(logical)
            with _POINT_LOCK:
                on_step("before", logical)
            yield logical
            with _POINT_LOCK:
                on_step("after", logical)

        return step

    async def _launching(self, ctx: RunContext, executor: str | None = None) -> None:
        """:meth:`_launch` in a worker thread (it runs migrations and starts DBOS's
        threads, blocking), or with :attr:`launch_on_loop` on the event loop's own thread,
        where DBOS adopts the loop as its main loop."""
        if self.launch_on_loop:
            self._launch(ctx, executor)
        else:
            await asyncio.to_thread(self._launch, ctx, executor)

    async def _destroying(self) -> None:
        """``DBOS.destroy`` (no wait for workflows) where :meth:`_launching` launched it."""
        from dbos import DBOS

        if self.launch_on_loop:
            DBOS.destroy(workflow_completion_timeout_sec=0)
        else:
            await asyncio.to_thread(DBOS.destroy, workflow_completion_timeout_sec=0)

    def _launch(self, ctx: RunContext, executor: str | None = None) -> None:
        """Launch DBOS in this worker as the run's executor (``executor``: as another)."""
        from dbos import DBOS
        from dbos._debug_trigger import DebugAction, DebugTriggers

        worker = ctx.workload.worker  # the workload module's per-process state
        worker.urls = dict(ctx.env.providers)
        worker.worker_id = ctx.worker_id
        worker.step = self._step_hook(ctx.on_step)
        worker.point = point
        DebugTriggers.set_debug_trigger(
            DebugTriggers.DEBUG_TRIGGER_STEP_COMMIT, DebugAction(callback=lambda: point(LOG_APPEND_AFTER)))
        _mark_recovery_listed()
        config = self.config(ctx.env, ctx.run_id, ctx.worker_id)
        if executor is not None:
            config["executor_id"] = executor
        DBOS(config=config)  # type: ignore[arg-type]
        _fast_internal_queue()
        DBOS.launch()

    async def start(self, ctx: RunContext) -> str:
        return await self._run(ctx, "start")

    @staticmethod
    async def _until_ended(handle: Any) -> None:
        """Wait until the workflow ends: ``get_result``, whose cancelled and dead-lettered
        errors end the wait (the stored status says which). A dbos release without the
        dead-letter error (2.8.0) has a handle that waits on a dead-lettered workflow
        for ever: there the stored status is polled every :data:`POLL_SECONDS` instead
        (its awaits then depend on timing; the await matrices are measured on 3.x)."""
        from dbos import _error

        dead = getattr(_error, "DBOSAwaitedWorkflowMaxRecoveryAttemptsExceeded", None)
        if dead is None:
            while (await handle.get_status()).status not in ("SUCCESS", "ERROR", "CANCELLED", DEAD_LETTER):
                await asyncio.sleep(POLL_SECONDS)
            return
        try:
            await handle.get_result(polling_interval_sec=POLL_SECONDS)
        except (_error.DBOSAwaitedWorkflowCancelledError, dead):
            pass  # cancelled (a cancel-api fault) or dead-lettered: the status says which

    @staticmethod
    async def _queue(workload: Any) -> Any:
        """The workload's DBOS queue (``workload.queue_name``), registered in this
        launched process (``DBOS.register_queue_async``: DBOS keeps queues in its system
        database; registering again returns it; a ``Queue`` object on releases without
        it), polled every :data:`QUEUE_POLL_SECONDS`; None for a workload that starts its
        workflow directly."""
        name = getattr(workload, "queue_name", None)
        if name is None:
            return None
        from dbos import DBOS

        if hasattr(DBOS, "register_queue_async"):
            return await DBOS.register_queue_async(name, polling_interval_sec=QUEUE_POLL_SECONDS)
        from dbos import Queue  # dbos releases before register_queue: a queue is an object

        return Queue(name, polling_interval_sec=QUEUE_POLL_SECONDS)

    def _version(self, ctx: RunContext) -> str:
        return application_version(self._scope(ctx.env, ctx.run_id))

    async def resume(self, ctx: RunContext) -> str:
        return await self._run(ctx, "resume")

    async def recover(self, ctx: RunContext) -> str:
        """DBOS's own recovery: launch as the case's executor (``ctx.scope``), which
        re-enqueues the executor's ``PENDING`` workflows, and wait until none is left
        (bounded by the worker's deadline). Without a scope: recovery by id only."""
        from ..adapter import RecoveryByIdOnly

        if ctx.scope is None:
            raise RecoveryByIdOnly("DBOS recovers by executor id: this worker was given none")
        from dbos import DBOS

        await self._launching(ctx)
        try:
            await _riding_outage(lambda: self._queue(ctx.workload))  # a queued run is recovered onto its queue
            pending: list[str] = []
            for _ in range(int(CANCELLED_WAIT_SECONDS / POLL_SECONDS)):
                rows = await asyncio.to_thread(lambda: DBOS.list_workflows(
                    status=["PENDING", "ENQUEUED"], app_version=application_version(ctx.scope or ""),
                    load_input=False, load_output=False))
                pending = [r.workflow_id for r in rows]
                if not pending:
                    break
                await asyncio.sleep(POLL_SECONDS)
            return f"recovered by executor {executor_id(ctx.scope)}; still pending: {', '.join(pending) or 'none'}"
        finally:
            with anyio.CancelScope(shield=True):
                await self._destroying()

    async def recover_other(self, ctx: RunContext) -> str:
        """Recovery by another executor (resume policy ``other-executor``): launch as
        executor ``<the run's executor id>`` + :data:`OTHER_EXECUTOR_SUFFIX` (the same
        application version: DBOS recovers a workflow only in a process of its version),
        run ``DBOS._recover_pending_workflows([the run's executor id])`` (what DBOS's admin
        server runs for ``POST /dbos-workflow-recovery``, which a control plane calls when
        an executor is gone), and wait up to :data:`RECOVER_OTHER_WAIT_SECONDS` for the
        run to end; its status (``absent`` when no workflow row exists)."""
        from dbos import DBOS

        dead = executor_id(self._scope(ctx.env, ctx.run_id))
        await self._launching(ctx, dead + OTHER_EXECUTOR_SUFFIX)
        try:
            await _riding_outage(lambda: self._queue(ctx.workload))  # a queued run is handed back to its queue
            await asyncio.to_thread(DBOS._recover_pending_workflows, [dead])
            found = await _riding_outage(lambda: DBOS.get_workflow_status_async(ctx.run_id))
            if found is None:
                return "absent"
            with _POINT_LOCK:
                ctx.accepted()  # the system database holds the workflow and its input
            handle = await _riding_outage(lambda: DBOS.retrieve_workflow_async(ctx.run_id))
            with anyio.move_on_after(RECOVER_OTHER_WAIT_SECONDS):
                await self._until_ended(handle)
            final = await handle.get_status()
            return STATUS_MAP.get(final.status, final.status.lower())
        finally:
            with anyio.CancelScope(shield=True):
                await self._destroying()

    async def _run(self, ctx: RunContext, role: str) -> str:
        from dbos import DBOS, SetWorkflowID, SetWorkflowTimeout

        # launch in a thread: it runs migrations and starts DBOS's threads (blocking)
        await self._launching(ctx)
        try:
            workload = ctx.workload
            queue = await _riding_outage(lambda: self._queue(workload))  # served from here on: a recovered queued run is dequeued
            status = None
            if role == "resume":
                found = await _riding_outage(lambda: DBOS.get_workflow_status_async(ctx.run_id))
                status = found.status if found is not None else None
            if status is None:
                # start, or resume of a run killed before its workflow row committed; a
                # workload with a ``queue`` enqueues it there (a worker of this version
                # dequeues it: this one, or the next after a crash)
                timeout = getattr(workload, "workflow_timeout_s", None)  # a workload's deadline for its workflow
                deadline = SetWorkflowTimeout(timeout) if timeout is not None else contextlib.nullcontext()
                with SetWorkflowID(ctx.run_id), deadline:
                    if queue is not None:
                        handle = await queue.enqueue_async(workload.workflow, *workload.workflow_args(ctx.conversation))
                    else:
                        handle = await DBOS.start_workflow_async(workload.workflow,
                                                                 *workload.workflow_args(ctx.conversation))
                with _POINT_LOCK:
                    ctx.accepted()  # the workflow row is committed when start/enqueue returns
            else:
                with _POINT_LOCK:
                    ctx.accepted()  # the system database holds the workflow and its input
                if status not in ("PENDING", "ENQUEUED"):
                    return STATUS_MAP.get(status, status.lower())
                if found.app_version not in (None, "", self._version(ctx)):
                    # left by a build with other workflow code: DBOS recovers a workflow
                    # only in a process of its application version, so this build leaves it be
                    return "pending"
                # DBOS.launch() recovered it (same executor id and version); wait for it
                handle = await _riding_outage(lambda: DBOS.retrieve_workflow_async(ctx.run_id))
            script = getattr(workload, "operator_script", None)  # a person in the loop (harness/human.py)
            operator = asyncio.ensure_future(self._operate(ctx.run_id, script)) if script is not None else None
            try:
                await self._until_ended(handle)
            except anyio.get_cancelled_exc_class():
                # a cancel fault: DBOS shields the workflow task from its caller
                # (asyncio.shield in start_workflow_async), so only this wait ends. The
                # worker stays up, as a server does when one request is cancelled, until
                # the workflow ends on its own (bounded); then the cancellation goes on
                with anyio.move_on_after(CANCELLED_WAIT_SECONDS, shield=True):
                    with contextlib.suppress(Exception):
                        await self._until_ended(handle)
                raise
            finally:
                if operator is not None:
                    operator.cancel()
                    with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                        await operator
            final = await handle.get_status()
            return STATUS_MAP.get(final.status, final.status.lower())
        finally:
            # shielded: a cancelled worker still shuts DBOS down (pools, threads)
            with anyio.CancelScope(shield=True):
                await self._destroying()

    @staticmethod
    async def _operate(run_id: str, script: Any) -> None:
        """The workload's scripted operator, beside the workflow (DBOS's own mechanism:
        the workflow publishes what it waits for with ``set_event("waiting", ...)``, the
        person answers with ``send``, which the workflow gets with ``recv``). Each answer is sent
        once per worker under an idempotency key per interrupt, so a resumed worker that
        sends it again adds no second message; the operator's turn is labelled as in
        :mod:`crashmatrix.harness.human`. Runs until cancelled (the workflow ended)."""
        from dbos import DBOS

        from crashmatrix.harness.crashpoint import reset_logical_task, set_logical_task
        from crashmatrix.harness.human import ANSWER_AFTER, ANSWER_BEFORE, WAIT, record

        answered: set[str] = set()
        while True:
            waiting = await DBOS.get_event_async(run_id, "waiting", timeout_seconds=OPERATOR_POLL_SECONDS)
            answer = script.find(waiting["node"], waiting["ordinal"]) if isinstance(waiting, dict) else None
            if answer is not None and answer.label not in answered:
                token = set_logical_task(answer.task)
                try:
                    point(WAIT)
                    point(ANSWER_BEFORE)
                    await DBOS.send_async(run_id, record(answer.node, answer.ordinal, script.delivered(answer)),
                                          topic=answer.label, idempotency_key=f"{run_id}:{answer.label}")
                    point(ANSWER_AFTER)
                finally:
                    reset_logical_task(token)
                answered.add(answer.label)
            await asyncio.sleep(OPERATOR_POLL_SECONDS)

    # -- controller side ----------------------------------------------------------

    def _client_for(self, env: Environment, run_id: str) -> tuple[Any, bool]:
        """``(client, owned)``: SQLite: a client on the run's own file (owned: the caller
        destroys it); PostgreSQL: one cached client."""
        from dbos import DBOSClient

        url = self.system_database_url(env, run_id, "crashmatrix-oracle")
        if self.backend == "sqlite":
            return DBOSClient(system_database_url=url), True
        if self._client is None or self._client_url != url:
            if self._client is not None:
                self._client.destroy()
            self._client, self._client_url = DBOSClient(system_database_url=url), url
        return self._client, False

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.destroy)

    @staticmethod
    def step_kind(workload: Any, function_name: str) -> str:
        """The kind of a recorded step (``model``, ``tool``), from the name DBOS recorded
        it under (the workload's ``model_step`` is a model turn: an integration built on
        DBOS names its own): the log's ``node_id`` is ``<kind>-<step id>``, the logical
        task the step's points counted under."""
        return "model" if function_name == workload.model_step else function_name

    async def _with_client(self, env: Environment, run_id: str, call: Any) -> Any:
        def go() -> Any:
            client, owned = self._client_for(env, run_id)
            try:
                return call(client)
            finally:
                if owned:
                    client.destroy()

        return await asyncio.to_thread(go)

    async def cancel_run(self, env: Environment, run_id: str) -> None:
        """DBOS's own cancel, ``DBOSClient.cancel_workflow``: the workflow is
        ``CANCELLED`` and stops at its next step (the step in flight runs to its end)."""
        await self._with_client(env, run_id, lambda client: client.cancel_workflow(run_id))

    async def resume_cancelled(self, env: Environment, run_id: str) -> None:
        """DBOS's own resume, ``DBOSClient.resume_workflow``: ``ENQUEUED`` on the internal
        queue, whose next poll by a worker of this run's application version continues it
        from its recorded steps."""
        await self._with_client(env, run_id, lambda client: client.resume_workflow(run_id))

    #: ``DBOS.fork_workflow`` makes a new workflow with its own id, copies the inputs and
    #: the steps before its start step, and runs the rest again (DBOS's docs, "Workflow
    #: Management": forking)
    restore_effects = "fresh attempt"

    async def restore_point(self, env: Environment, run_id: str) -> str | None:
        """The step a fork from here starts at: one past the newest step DBOS recorded
        (``list_workflow_steps``), None when the workflow has no row yet."""
        def read(client: Any) -> str | None:
            if not client.list_workflows(workflow_ids=[run_id], load_input=False, load_output=False):
                return None
            return str(1 + max((s["function_id"] for s in client.list_workflow_steps(run_id)), default=0))

        if self.backend == "sqlite" and not (Path(env.workdir) / "dbos" / f"{self._scope(env, run_id)}.sqlite").exists():
            return None
        return await self._with_client(env, run_id, read)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        """DBOS's fork, ``DBOSClient.fork_workflow(run_id, start_step)`` under the id
        ``<run id>~fork-<start step>`` (``SetWorkflowID``; filed with its original:
        same file, executor id and application version, so a resume worker of the fork
        dequeues it). Returns the fork's id."""
        from dbos import SetWorkflowID

        fork_id = f"{run_id}{FORK_SEPARATOR}{point}"

        def fork(client: Any) -> str:
            with SetWorkflowID(fork_id):
                return str(client.fork_workflow(run_id, int(point)).workflow_id)

        return str(await self._with_client(env, run_id, fork))

    async def observe(self, env: Environment, run_id: str) -> Observation:
        # the workload reads its recorded steps: ``model_step``, ``transcript(run_input,
        # steps)`` (an integration's response objects), ``answer(messages)``
        workload = self.workload_of(env)
        if self.backend == "sqlite" and not (Path(env.workdir) / "dbos" / f"{self._scope(env, run_id)}.sqlite").exists():
            return Observation(run_id, "absent", log=[], state=None, state_error="no system database file")

        def read() -> Observation:
            client, owned = self._client_for(env, run_id)
            try:
                rows = client.list_workflows(workflow_ids=[run_id], load_input=True, load_output=False)
                if not rows:
                    return Observation(run_id, "absent", log=[], state=None, state_error="no workflow row")
                wf = rows[0]
                steps = client.list_workflow_steps(run_id)
                # child workflows the run started (DBOS ids them <parent id>-<the start's
                # function id>): their steps are the run's too
                children = {str(c.workflow_id).rsplit("-", 1)[-1]: client.list_workflow_steps(c.workflow_id)
                            for c in client.list_workflows(parent_workflow_id=run_id, load_input=False,
                                                           load_output=False)}
            finally:
                if owned:
                    client.destroy()
            status = STATUS_MAP.get(wf.status, wf.status.lower())
            # seq is the step's position: DBOS's function ids are its own numbering, and a
            # workflow recovered inside ``recv`` may leave one unused (a kill at
            # human.wait: ids 1-5, then 7); the node id keeps DBOS's id
            # (a child's steps follow its start, their node ids ``<kind>-<start id>.<step id>``,
            # the logical task its steps ran under)
            ordered: list[tuple[str, dict[str, Any]]] = []
            for s in sorted(steps, key=lambda s: s["function_id"]):
                ordered.append((str(s["function_id"]), s))
                ordered += [(f"{s['function_id']}.{c['function_id']}", c) for c in
                            sorted(children.get(str(s["function_id"]), ()), key=lambda c: c["function_id"])]
            log = [LogEntry(i, f"{self.step_kind(workload, s['function_name'])}-{fid}", (),
                            self.step_kind(workload, s["function_name"]), 0,
                            None if s.get("error") is None else f"step raised {s['error']!r}")
                   for i, (fid, s) in enumerate(ordered, 1)]
            args = tuple((wf.input or {}).get("args") or ())
            run_input = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
            messages = workload.transcript(run_input, [dict(s) for s in steps])
            state = {"transcript": messages, "answer": workload.answer(messages), "budget": None,
                     "pending": [] if status in ("completed", "failed") else ["workflow"]}
            return Observation(run_id, status, log=log, effects=None, state=state)

        return await asyncio.to_thread(read)


class DBOSSqliteAdapter(DBOSAdapter):
    """DBOS Transact workflow with steps, SQLite system database."""

    name = "dbos-sqlite"
    backend = "sqlite"


class DBOSPostgresAdapter(DBOSAdapter):
    """DBOS Transact workflow with steps, PostgreSQL system database."""

    name = "dbos-postgres"
    backend = "postgres"


class DBOSSqliteLoopAdapter(DBOSSqliteAdapter):
    """DBOS on SQLite, launched and destroyed on the worker's event loop thread (an
    application that calls ``DBOS.launch()`` and ``DBOS.destroy()`` from async code)."""

    name = "dbos-sqlite-loop"
    launch_on_loop = True


VARIANTS: dict[str, type[DBOSAdapter]] = {c.name: c for c in (DBOSSqliteAdapter, DBOSPostgresAdapter,
                                                               DBOSSqliteLoopAdapter)}
"""Registry name -> adapter class (proposed entries for ``harness/registry.py``)."""

__all__ = ["DBOSAdapter", "DBOSSqliteAdapter", "DBOSPostgresAdapter", "DBOSSqliteLoopAdapter", "VARIANTS", "APP_VERSION", "application_version",
           "executor_id", "point"]
