"""The executor: schedules a run's nodes, records each one, survives faults.

Entry points: :meth:`Runtime.create_run` and :meth:`Runtime.run` (which both starts and
resumes: it always rehydrates from the log first). One runtime object serves one worker
process with one database connection.

Walls, and the failure each prevents (docs/design.md, "reference_runtime"):

- **Record after the node, not before**: a node's record is appended only once its
  work is done, so a crash mid-node re-runs the node instead of skipping it.
- **Effects ledger + probes** (:mod:`.effects`): a tool call that changes another system
  is keyed, marked ``started`` first, and its ``succeeded`` row commits with the node's
  record; on resume an unresolved key goes to the tool's probe, so a crash between the
  provider's answer and the commit neither repeats nor loses the effect.
- **Shielded cancellation write**: cancellation (a deadline, a closed tab) is level
  triggered: ``CancelledError`` arrives at every await until a shielded scope. The
  ``unknown`` row and the ``interrupted`` status are written inside
  ``CancelScope(shield=True)`` bounded by :data:`SHIELD_SECONDS`, and the cancellation
  is always re-raised.
- **SIGTERM drain** (:mod:`.drain`): on SIGTERM no new node is launched; in-flight
  nodes finish and append; the run is left ``paused`` for another worker; the process
  exits 0. The handler covers all of :meth:`Runtime.run` (the lease, the trace link,
  the final status), and a worker that installs a :class:`~.drain.WorkerDrain` first
  thing is covered while it connects too; a SIGTERM before the run was taken leaves it
  untouched.
- **Fencing**: every write carries the lease epoch (:mod:`.leases`).
- **Launch batches** (:class:`_LaunchBatch`): the records of sibling nodes launched
  together (one kind, the same parents: a model turn's tool calls) commit in one
  statement once each has its record or has ended without one; the commit runs in the
  scheduler's task on a logical task of its own, so how many commits there are and
  whose awaits they are follow from the graph, not from timing.
- **Attempt limit** (:mod:`.attempts`): a run whose last attempts in a row appended
  nothing (a crash at the same point in every worker) gives up ``failed``, "crash loop".
- **The sweep** (:mod:`.sweep`): :meth:`Runtime.recover` finds the runs of a queue whose
  lease expired (their worker died) and takes them over; nobody needs their id.
- **Blob pointers** (:mod:`.blobs`): outputs over ``blob_threshold`` bytes go to the blob
  store; the record keeps the pointer.
- **State codec** (:mod:`.state_codec`): the state fields a tool sets are encoded by the
  agent's schema at write time (an undeclared field fails there, named); transient fields
  are rebuilt by their factories on every load.
- **Trace links** (:mod:`.tracing`): each invocation is a span; a resume links to the
  invocation it continues.
- **Budgets and limits** (:mod:`.budgets`): each record carries its tokens and wall
  ms; a limit stops the run before a launch (never mid-turn), status ``limit_exceeded``.
- **Operator hand-off** (:mod:`.handoff`): an effect an operator resolved is taken as
  applied (with the operator's result) or not applied (the call is made again).
- **Sub-agents** (:mod:`.subagents`): a sub-agent's nodes are nodes of this run, scoped
  by the parent node's id; the sub-agent node waits for the child's completion record,
  so a crash inside the child re-runs only the child node that was in flight.
- **Broken links** (a connection reset, a lost or cut answer, a timeout): the database
  connection reconnects (:mod:`.db`; a lost COMMIT acknowledgement of the append is
  resolved by re-reading the log, :mod:`.logstore`); a model call that failed
  transiently (:class:`~.agent.TransientFailure`) is made again, up to
  :data:`MODEL_ATTEMPTS`; a charge whose answer was lost goes to the probe, and a probe
  that cannot reach the provider (``cannot_tell_yet``) is asked again, up to
  :data:`PROBE_ATTEMPTS`. What stays unreachable stops the run ``interrupted``
  (:class:`RunInterrupted`): resumable, never charged twice, never handed to a human.

Crash points (labels; :mod:`crashmatrix.harness.crashpoint`): ``node.launch``,
``model.call.before/after``, ``effect.started.before/after``, ``tool.request.before/after``,
``probe.before/after``, ``effect.unknown.before/after``, ``log.append.before/after``,
``drain.begin`` when the SIGTERM handler runs, and ``db.reconnect`` (logical task ``db``)
before each reconnection attempt. A repeated model call or probe reaches its points again
(occurrence 2, 3...). Step boundaries (``before``/``after`` each
node) are reported through the ``on_step`` callback for the adapter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from crashmatrix.harness.crashpoint import (
    EFFECT_STARTED_BEFORE, EFFECT_UNKNOWN_BEFORE, LOG_APPEND_AFTER, LOG_APPEND_BEFORE, MODEL_CALL_AFTER,
    MODEL_CALL_BEFORE, NODE_LAUNCH, PROBE_BEFORE, TOOL_REQUEST_AFTER, TOOL_REQUEST_BEFORE, crashpoint,
    crashpoint_for, reset_logical_task, set_logical_task,
)

from opentelemetry.trace import SpanKind, TracerProvider

from . import attempts, budgets, codec, restore, subagents, sweep, tracing
from .agent import Agent, ModelReply, OutcomeUnknown, ProbeOutcome, ToolContext, ToolOutcome, TransientFailure
from .blobs import DEFAULT_THRESHOLD, BlobStore
from .db import DatabaseUnavailable, Db
from .drain import WorkerDrain
from .effects import EffectLedger, idempotency_key
from .graph import RunGraph
from .leases import Lease, LeaseLost, RunFinished, acquire, set_status
from .logstore import AppendOnlyLog, EffectOutcome, RunStore
from .logstore import RECORD_FORMAT_VERSION
from .records_pb2 import Budget, NodeRecord, NodeSpec
from .state_codec import TrackedState, UnknownStateField
from .turns import Turns

CANNOT_MIGRATE = "cannot_migrate"
"""The status of a run whose records this build cannot read (its ``detail`` says why):
resumable by a build that can, never resumed by this one (``cm_runs.detail``)."""

SHIELD_SECONDS = 10.0
"""Upper bound of a shielded cleanup write (anyio: ``move_on_after(..., shield=True)``)."""

MAX_PROBE_ROUNDS = 3

MODEL_ATTEMPTS = 3
"""Calls of one model turn in one attempt of the run before it stops ``interrupted``."""
PROBE_ATTEMPTS = 3
"""Probes of one effect answering ``cannot_tell_yet`` before the run stops ``interrupted``."""
RETRY_BACKOFF_S = 0.1
"""First pause between two model calls or two probes; doubled after each."""

StepHook = Callable[[str, str], None]
"""``on_step(phase, node_id)`` with phase ``"before"`` or ``"after"``."""

try:  # anyio's backend, looked up once per schedule instead of once per loop turn
    from anyio._core._eventloop import get_async_backend as _get_async_backend
except ImportError:  # pragma: no cover - another anyio layout: the public function
    _get_async_backend = None


def _backend_calls() -> tuple[Callable[[], Awaitable[None]], Callable[[], anyio.Event]]:
    """``anyio.lowlevel.checkpoint_if_cancelled`` and ``anyio.Event``, without their lookup
    of the running backend on every call (sniffio's thread-local and context variable:
    ~7,000 instructions, about half of what either costs): the running backend's own
    methods, the very ones the public names call. The scheduler loop makes one of each a
    turn."""
    if _get_async_backend is None:  # pragma: no cover
        return anyio.lowlevel.checkpoint_if_cancelled, anyio.Event
    backend = _get_async_backend()
    return backend.checkpoint_if_cancelled, backend.create_event


def _describe(exc: BaseException) -> str:
    """One line naming an error; for an exception group, its leaf exceptions."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


class NeedsHuman(Exception):
    """An effect's outcome cannot be decided (the probe cannot tell, or there is no
    probe): the run stops in ``needs_human`` with the effect named."""


class RunInterrupted(Exception):
    """A provider stayed unreachable (the model, or the probe of an unresolved effect):
    the run stops ``interrupted`` with the reason as its detail, for another worker to
    resume. Nothing is decided, so nothing is lost or repeated."""


class Runtime:
    """Runs agents durably on one connection.

    ``store`` and ``ledger`` default to :class:`AppendOnlyLog` and
    :class:`EffectLedger`; other strategies (and the mutant catalogue) pass their own.
    ``launch_batches`` (the default): the records of sibling nodes launched together
    commit in one statement (:class:`_LaunchBatch`); False: every record in a statement
    of its own. ``group_commit=True``: records of nodes that finish together commit in
    one statement, whichever they are (:meth:`Execution.commit`; off by default, see
    there; it replaces the launch batches). ``drain``: the worker's
    :class:`~.drain.WorkerDrain`; without one, ``handle_sigterm=True`` uses the drain
    installed on the running loop, or installs one of its own for the length of each
    :meth:`run`.
    """

    def __init__(
        self,
        db: Db,
        agent: Agent,
        *,
        worker_id: str,
        store: RunStore | None = None,
        ledger: EffectLedger | None = None,
        on_step: StepHook | None = None,
        handle_sigterm: bool = True,
        blobs: BlobStore | None = None,
        blob_threshold: int = DEFAULT_THRESHOLD,
        tracer_provider: TracerProvider | None = None,
        group_commit: bool = False,
        launch_batches: bool = True,
        drain: WorkerDrain | None = None,
    ) -> None:
        self.db = db
        self.group_commit = group_commit
        self.launch_batches = launch_batches and not group_commit
        self.agent = agent
        self.worker_id = worker_id
        self.store = store if store is not None else AppendOnlyLog(db)
        self.ledger = ledger if ledger is not None else EffectLedger(db)
        self.on_step = on_step
        self.handle_sigterm = handle_sigterm
        self.blobs = blobs
        self.blob_threshold = blob_threshold
        self.tracer = tracing.get_tracer(tracer_provider)
        self.drain = drain
        self.draining = False
        self._active_drain: WorkerDrain | None = None
        self._changed: anyio.Event | None = None
        self._execution: Execution | None = None  # the attempt scheduling now

    #: the class that rehydrates a run from its records (a store strategy with its own
    #: payload encoding, or a mutant, passes a subclass)
    graph_class: type[RunGraph] = RunGraph
    #: attempts in a row without progress after which a run gives up (:mod:`.attempts`);
    #: None: never
    max_attempts_without_progress: int | None = attempts.MAX_ATTEMPTS_WITHOUT_PROGRESS
    #: a model node that an operator's restore took out of the log is answered again from
    #: its record, not by a new model call (:mod:`.restore`: the tool calls it asks for keep
    #: their ids, so their effects keep their idempotency keys); False: the mutant that
    #: forgets it
    replay_restored: bool = True

    @property
    def execution_class(self) -> type[Execution]:
        return Execution

    # -- run lifecycle -----------------------------------------------------------------

    async def create_run(self, run_id: str, workload: str, run_input: dict[str, Any], queue: str | None = None) -> bool:
        """Insert the run (status ``pending``) unless it exists; True if inserted.
        ``queue``: the queue the sweep finds it in if its worker dies (:mod:`.sweep`;
        None: resumed by id only).

        Idempotent on purpose: a caller that crashed before learning whether its
        INSERT committed submits the same run id again (the run's input is the durable
        request; nothing before it is). Once this returned, the run is stored: a caller
        may be told it was accepted, and a resume needs no input (it reads it here)."""
        inserted = await self.db.fetchval(
            "INSERT INTO cm_runs (run_id, workload, input, status, queue) VALUES ($1, $2, $3::jsonb, 'pending', $4) "
            "ON CONFLICT (run_id) DO NOTHING RETURNING true",
            run_id,
            workload,
            json.dumps(run_input, sort_keys=True),
            queue,
        )
        return bool(inserted)

    async def recover(self, queue: str, clock_offset_s: float = 0.0) -> dict[str, str]:
        """The sweep (:mod:`.sweep`): take over and run every abandoned run of ``queue``
        (lease expired by ``now() + clock_offset_s``, or never taken); run id -> the
        status each ended with (``"lease lost"`` when another worker took it first)."""
        out: dict[str, str] = {}
        for run_id in await sweep.abandoned_runs(self.db, queue, clock_offset_s):
            try:
                out[run_id] = await self.run(run_id)
            except LeaseLost:
                out[run_id] = "lease lost"
        return out

    async def run(self, run_id: str) -> str:
        """Take the lease, rehydrate, run until the graph is done, drained or stopped.

        Returns the terminal status written (``completed``, ``paused``,
        ``needs_human``, ``cannot_migrate``), ``"drained"`` when a SIGTERM came before
        the run was taken (nothing is written: the run stays as it was), or
        ``"cancelled"`` when an operator cancelled it (:mod:`.cancellation`; before or
        while this worker ran it); a run that had ended (:data:`.leases.FINISHED`) is not
        taken again: its status is returned and nothing written. Re-raises cancellation after writing ``interrupted``
        (shielded); raises :class:`LeaseLost` if another worker took the run over.
        """
        drain = self.drain or (WorkerDrain.on_running_loop() if self.handle_sigterm else None)
        own = None
        if drain is None and self.handle_sigterm:
            own = drain = WorkerDrain().install()
        self._active_drain = drain
        if drain is not None:
            drain.subscribe(self.begin_drain)
        try:
            if self.drain_requested():
                return "drained"
            try:
                return await self._run_leased(run_id)
            except LeaseLost:
                # fenced off: by another worker (re-raised), or by an operator's cancel,
                # which this worker obeys (cancellation.py)
                if await self.db.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id) == "cancelled":
                    return "cancelled"
                raise
        finally:
            if drain is not None:
                drain.unsubscribe(self.begin_drain)
            if own is not None:
                own.remove()
            self._active_drain = None

    async def _run_leased(self, run_id: str) -> str:
        try:
            lease = await self.acquire_lease(run_id)
        except RunFinished as finished:  # handed a run that ended: its status, nothing written
            return finished.status
        limit = self.max_attempts_without_progress
        if limit is not None and attempts.attempts_without_progress(lease) >= limit:
            await set_status(self.db, lease, "failed", attempts.crash_loop_detail(attempts.attempts_without_progress(lease), lease))
            return "failed"
        row = await self.db.fetchrow("SELECT input, traceparent FROM cm_runs WHERE run_id = $1", run_id)
        previous = row["traceparent"]
        with self.tracer.start_as_current_span(
            f"run {self.agent.name}",
            kind=SpanKind.INTERNAL,
            links=tracing.links_to(previous),
            attributes={"crashmatrix.run_id": run_id, "crashmatrix.lease_epoch": lease.epoch,
                        "crashmatrix.worker": self.worker_id, "crashmatrix.resumed": previous is not None},
        ) as span:  # an exception (failure, cancellation, lost lease) marks the span ERROR
            await tracing.record_invocation(self.db, lease, tracing.traceparent_of(span), previous)
            status = await self._run_attempt(run_id, lease, json.loads(row["input"]))
            span.set_attribute("crashmatrix.status", status)
            return status

    async def _run_attempt(self, run_id: str, lease: Lease, run_input: dict[str, Any]) -> str:
        try:
            graph = self.graph_class.rehydrate(run_id, run_input, await self.store.read(run_id), blobs=self.blobs)
            execution = self._execution = self.execution_class(self, graph, lease)
            if self.replay_restored:  # a restored run answers its model nodes again from their records
                execution.replies = await restore.recorded_replies(self.db, run_id, self.blobs)
            status, detail = await execution.schedule()
        except codec.UnreadablePayload as exc:
            # a record this build cannot read (written by another build: a newer format,
            # a missing upgrader, a state field it dropped): the run is parked with the
            # reason, never failed, never half-read (docs/runtime.md, "Codec versions")
            await set_status(self.db, lease, CANNOT_MIGRATE, f"cannot migrate: {exc}")
            return CANNOT_MIGRATE
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(SHIELD_SECONDS, shield=True):
                await set_status(self.db, lease, "interrupted")
            raise
        except LeaseLost:
            raise
        except RunInterrupted as exc:
            await set_status(self.db, lease, "interrupted", str(exc))
            return "interrupted"
        except DatabaseUnavailable:
            raise  # no status can be written: the run stays as it was, for a resume
        except BaseException as exc:
            with anyio.move_on_after(SHIELD_SECONDS, shield=True):
                await set_status(self.db, lease, "failed", _describe(exc))
            raise
        await set_status(self.db, lease, status, detail)
        return status

    async def acquire_lease(self, run_id: str) -> Lease:
        """Take the run over (bumping the fencing epoch): :func:`.leases.acquire`; label
        ``lease.taken_over`` when another worker held it (``running``: it died, or it is
        a zombie), a recovery branch (``ReferenceAdapter.recovery_branches``)."""
        lease = await acquire(self.db, run_id, self.worker_id)
        if lease.previous_status == "running":
            crashpoint("lease.taken_over")
        return lease

    def drain_requested(self) -> bool:
        """True once a SIGTERM came (read before every launch: the drain's flag is set by
        the signal handler itself, before the loop runs :meth:`begin_drain`), during a
        :meth:`run` or, with a worker's ``drain``, between two."""
        drain = self._active_drain or self.drain
        return self.draining or (drain is not None and drain.requested)

    def begin_drain(self) -> None:
        """Stop launching nodes; in-flight ones finish; the run ends ``paused`` (called
        by the :class:`~.drain.WorkerDrain` at SIGTERM, which records ``drain.begin``);
        label ``drain.in_flight`` when a node is running (it finishes and appends), a
        recovery branch (``ReferenceAdapter.recovery_branches``)."""
        self.draining = True
        if self._execution is not None and self._execution.running:
            crashpoint("drain.in_flight")
        if self._changed is not None:
            self._changed.set()


@dataclass
class _Pending:
    """A record waiting for its commit (:meth:`Execution.commit`)."""

    record: NodeRecord
    effect: EffectOutcome | None
    state_updates: dict[str, Any]
    #: the output as the codec reads it back (the graph keeps it: no decode for the transcript)
    output: Any = None
    #: set once the record's commit ended; only a record that waits behind another
    #: commit has one (an event per record would cost every append ~10 us)
    done: anyio.Event | None = None
    error: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.finish()

    def finish(self) -> None:
        if self.done is not None:
            self.done.set()


class _LaunchBatch:
    """The records of sibling nodes one scheduler step launched together (the same kind
    and the same parents: the tool calls of one model turn), committed in one statement
    by the scheduler (:meth:`Execution.commit_batch`) once every member has handed in
    its record (:meth:`Execution.hand_in`) or ended without one (interrupted, failed,
    cancelled). Which nodes form a batch follows from the graph: siblings become ready
    when their parent's record commits, so they are launched in the same step in every
    run, and the batch's commit happens once, whatever order the members finish in
    (unlike group commit, which batches by timing, so its batches vary from run to run:
    docs/runtime.md, "Launch batches"). The cost: a fast sibling's record waits for the slowest."""

    __slots__ = ("members", "waiting", "items", "task", "started")

    def __init__(self, members: list[str]) -> None:
        self.members = members
        #: members that have neither handed in a record nor ended
        self.waiting = set(members)
        self.items: dict[str, _Pending] = {}
        #: the logical task of the batch's commit (its await points, the same in every run)
        self.task = f"{members[0]}.batch"
        self.started = False


class Execution:
    """One attempt at one run: the scheduler loop and the node bodies.

    A :class:`Runtime` builds one per :meth:`Runtime.run` from ``Runtime.execution_class``;
    the mutant catalogue subclasses it to plant one defect per mutant.
    """

    def __init__(self, runtime: Runtime, graph: RunGraph, lease: Lease) -> None:
        self.rt = runtime
        self.graph = graph
        self.lease = lease
        self.running: set[str] = set()
        self.seq = graph.last_seq
        # the append turn: one appender at a time, in FIFO order; taking it suspends
        # exactly once, free or not (turns.py), so await points do not depend on timing
        self._append_turn = Turns()
        self._queue: list[_Pending] = []
        self._committing = False
        #: launch batches whose commit has not started, and each member's batch
        self._batches: list[_LaunchBatch] = []
        self._batch_of: dict[str, _LaunchBatch] = {}
        self.error: BaseException | None = None
        self.stop: tuple[str, str] | None = None
        #: ``anyio.Event`` without its lookup of the backend (set by :meth:`schedule`)
        self._new_event: Callable[[], anyio.Event] = anyio.Event
        self.started_at: dict[str, float] = {}
        #: model replies recorded before an operator's restore, by node id (:mod:`.restore`)
        self.replies: dict[str, ModelReply] = {}
        #: the input of every spawned model node (``{}``), encoded once per attempt, as the
        #: fields the record's constructor builds its spec's payload from (a Payload object
        #: would be copied into every record that spawns one)
        empty = codec.encode_trusted({})
        self._empty_input = {"codec": empty.codec, "format_version": empty.format_version, "inline": empty.inline}
        schema = runtime.agent.state_schema
        # the durable fields (from the log), then the transient ones, rebuilt on each load
        self.state: dict[str, Any] = graph.state(schema)
        if schema is not None:
            self.state.update(schema.rebuild(runtime.agent.resources))

    def may_launch(self) -> bool:
        return not self.rt.drain_requested() and self.stop is None and self.error is None

    async def schedule(self) -> tuple[str, str | None]:
        checkpoint_if_cancelled, new_event = _backend_calls()
        self._new_event = new_event  # hand_in and commit make one a waiting record
        async with anyio.create_task_group() as tg:
            while True:
                # A node that ended (e.g. by the cancellation) sets the event the loop waits
                # on, so the loop can wake before the cancellation reaches it: never launch
                # in a cancelled scope (the new node would run to its first await and send
                # a billed model call). Raises only if cancelled; does not yield otherwise.
                await checkpoint_if_cancelled()
                if self.may_launch():
                    ready = self.graph.ready(exclude=self.running)
                    limit = budgets.exceeded(self.rt.agent, self.graph, ready) if ready else None
                    if limit is not None:  # a node boundary: running nodes finish, none starts
                        self.stop = (budgets.LIMIT_STATUS, limit)
                    elif len(ready) == 1 and not self.running:
                        # a lone ready node with nothing else running (a chain's next
                        # turn): run it in this task, not a task of its own (~175,000
                        # instructions a spawn); the loop has nothing to do meanwhile
                        spec = ready[0]
                        self.mark_launched(spec)
                        await self.run_node(spec)
                        continue
                    else:
                        launched = []
                        for spec in ready:
                            if not self.may_launch():  # a SIGTERM during one launch stops the rest
                                break
                            self.launch(tg, spec)
                            launched.append(spec)
                        if self.rt.launch_batches and len(launched) > 1:
                            self._form_batches(launched)  # before any of them runs (start_soon)
                if not self.running:
                    break
                # made here, not at the top: nothing ran since the ready scan (no await),
                # so no node can have ended unseen
                self.rt._changed = new_event()
                await self.rt._changed.wait()
                # a launch batch is due only once its members ran, so only after this wait;
                # every due one is committed before the next scan (its records make the
                # next nodes ready), and none can fall due unseen between the last check
                # and the next wait (no await there). Written after the wait so the
                # await points before it keep their names (ordinals: awaitpoints.py).
                while self._batches and (due := self._due_batch()) is not None:
                    await self.commit_batch(due)
        if self.error is not None:
            raise self.error
        if self.stop is not None:
            return self.stop
        if self.graph.done():
            return "completed", None
        return "paused", "drained after SIGTERM" if self.rt.drain_requested() else None

    def launch(self, tg: anyio.abc.TaskGroup, spec: NodeSpec) -> None:
        """Start ``spec`` in a task of its own (:meth:`mark_launched` first)."""
        self.mark_launched(spec)
        tg.start_soon(self.run_node, spec, name=spec.node_id)

    def _form_batches(self, launched: list[NodeSpec]) -> None:
        """Group nodes launched in one step into :class:`_LaunchBatch` es: siblings (one
        kind, the same parents), two or more; a node alone appends alone."""
        groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for spec in launched:
            groups.setdefault((spec.kind, tuple(spec.parents[:])), []).append(spec.node_id)
        for members in groups.values():
            if len(members) > 1:
                batch = _LaunchBatch(members)
                self._batches.append(batch)
                for node_id in members:
                    self._batch_of[node_id] = batch

    def _due_batch(self) -> _LaunchBatch | None:
        """The first launch batch every member of which has handed in or ended; a batch
        left with no record (every member ended without one) is dropped."""
        for batch in self._batches:
            if not batch.waiting:
                if batch.items:
                    return batch
                self._batches.remove(batch)
                return self._due_batch()
        return None

    def _wake(self) -> None:
        if self.rt._changed is not None:
            self.rt._changed.set()

    async def hand_in(self, batch: _LaunchBatch, pending: _Pending) -> None:
        """Give ``pending`` (a member's record) to its launch batch and wait until the
        scheduler has committed it: one suspension (an event the commit sets; never set
        before, since the scheduler commits only after this member has handed in).
        Raises the commit's error; a cancellation while waiting takes the record back
        if its commit has not started."""
        node_id = pending.record.node_id
        pending.done = self._new_event()
        batch.items[node_id] = pending
        batch.waiting.discard(node_id)
        if not batch.waiting:
            self._wake()
        try:
            await pending.done.wait()
        except BaseException:
            if not batch.started:
                batch.items.pop(node_id, None)
            raise
        if pending.error is not None:
            raise pending.error

    def _left(self, node_id: str) -> None:
        """``node_id`` ended; if it was waiting in a launch batch without a record, the
        batch no longer waits for it."""
        batch = self._batch_of.pop(node_id, None)
        if batch is not None and node_id in batch.waiting:
            batch.waiting.discard(node_id)

    async def commit_batch(self, batch: _LaunchBatch) -> None:
        """Commit a due launch batch's records in one statement (``_write``), in the
        members' launch order, from the scheduler's task, under the batch's logical task,
        after taking the append turn (a lone append may be in flight). An error fails
        every record of the batch (each member raises it, and the first is the run's);
        a cancellation propagates."""
        self._batches.remove(batch)
        batch.started = True
        items = [batch.items[m] for m in batch.members if m in batch.items]
        token = set_logical_task(batch.task)
        try:
            turn = self._append_turn.take()
            try:
                await turn  # suspends exactly once, as an append's turn does
            except BaseException as exc:
                self._append_turn.leave(turn)
                for item in items:
                    item.fail(exc)
                raise
            try:
                await self._write(items)  # fails every item on an error
            except Exception:
                pass  # each member raises it from hand_in: the run's error is theirs
            finally:
                self._append_turn.end()
        finally:
            reset_logical_task(token)

    def mark_launched(self, spec: NodeSpec) -> None:
        """Label ``node.launch`` on the node's logical task; the node is running."""
        node_id = spec.node_id
        crashpoint_for(node_id, NODE_LAUNCH)
        self.running.add(node_id)

    async def run_node(self, spec: NodeSpec) -> None:
        """Run one launched node to its record, in its own task or in the scheduler's
        (its logical task is set for the length of the call and then reset). A
        :class:`NeedsHuman` sets :attr:`stop`, another error :attr:`error`; a
        cancellation propagates."""
        node_id, kind = spec.node_id, spec.kind  # read once: each read of a upb field makes a new str
        token = set_logical_task(node_id)
        self.started_at[node_id] = time.monotonic()
        try:
            self.step("before", node_id)
            if kind == "model":
                await self.run_model(spec)
            elif kind == subagents.SUBAGENT_KIND:
                await self.run_subagent(spec)
            else:
                await self.run_tool(spec)
            self.step("after", node_id)
        except NeedsHuman as exc:
            self.stop = ("needs_human", str(exc))
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # reported by schedule(), after in-flight nodes end
            if self.error is None:
                self.error = exc
        finally:
            self.running.discard(node_id)
            if self._batch_of:
                self._left(node_id)
            reset_logical_task(token)
            if self.rt._changed is not None:
                self.rt._changed.set()

    def step(self, phase: str, node_id: str) -> None:
        if self.rt.on_step is not None:
            self.rt.on_step(phase, node_id)

    # -- node bodies -------------------------------------------------------------------

    def agent_for(self, node_id: str) -> Agent:
        """The agent whose model and tools serve ``node_id`` (a sub-agent's inside its
        scope: :func:`.subagents.agent_for`)."""
        if subagents.SCOPE_SEPARATOR not in node_id:
            return self.rt.agent
        return subagents.agent_for(self.rt.agent, self.graph.specs, node_id)

    async def run_model(self, spec: NodeSpec) -> None:
        node_id = spec.node_id
        agent = self.agent_for(node_id)
        messages = self.graph.transcript(upto=node_id)
        reply = self.replies.pop(node_id, None) or await self.call_model(node_id, messages)
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            assistant["tool_calls"] = calls
        output: dict[str, Any] = {"messages": [assistant]}
        # the spawned specs as the fields of NodeSpec messages: the record's constructor
        # builds them in place (a NodeSpec object would be built, then copied into it)
        spawned: list[Any] = []
        if calls:
            turn = int(node_id.rsplit("-", 1)[1])  # max_turns is enforced before launch (budgets.py)
            children: list[Any] = []
            empty = self._empty_input
            for i, call in enumerate(calls):
                tool = agent.tools.get(call["name"])
                if tool is None:
                    raise RuntimeError(f"{node_id}: model called unknown tool {call['name']!r}")
                tool_node = f"{node_id}.tool-{i}"
                # the call is part of this node's output, whose encoding (in append, before
                # anything is recorded) checks it: the spec's copy needs no check of its own
                kind = "tool"
                if isinstance(tool, subagents.SubAgent):  # the child's root starts at once (subagents.py)
                    kind = subagents.SUBAGENT_KIND
                    subagents.child_messages(call)  # a call without a task fails here, before anything is recorded
                    children.append({"node_id": subagents.child_root(tool_node), "kind": "model", "parents": [node_id],
                                     "input": empty})
                spawned.append({"node_id": tool_node, "kind": kind, "parents": [node_id],
                                "input": codec.encode_trusted({"call": call})})
            next_turn = subagents.scoped(subagents.scope_of(node_id), f"turn-{turn + 1}")
            spawned.append({"node_id": next_turn, "kind": "model", "parents": [s["node_id"] for s in spawned],
                            "input": empty})
            spawned.extend(children)
        else:
            output["final"] = reply.content
        await self.append(spec, output, spawned, Budget(tokens=reply.tokens, model_calls=1), None)

    async def run_subagent(self, spec: NodeSpec) -> None:
        """A sub-agent node runs once its child has completed (the scheduler launches it
        only then: :meth:`.graph.RunGraph.ready`): it records the child's final answer as
        its tool result. Nothing of the child runs again here."""
        call = codec.decode(spec.input)["call"]
        answer = self.graph.final_answer(scope=spec.node_id)
        if answer is None:
            raise RuntimeError(f"{spec.node_id}: sub-agent node launched before its child completed")
        outcome = ToolOutcome("succeeded", {"answer": answer})
        await self.append(spec, self.tool_output(call, outcome), [], Budget(), None)

    async def call_model(self, node_id: str, messages: list[dict[str, Any]]) -> Any:
        """One model turn's reply; a transient failure is called again (each attempt
        reaches ``model.call.before``) up to :data:`MODEL_ATTEMPTS`, then
        :class:`RunInterrupted`."""
        delay = RETRY_BACKOFF_S
        for attempt in range(1, MODEL_ATTEMPTS + 1):
            crashpoint(MODEL_CALL_BEFORE)
            try:
                reply = await self.agent_for(node_id).model.complete(self.graph.run_id, node_id, messages)
            except TransientFailure as exc:
                if attempt == MODEL_ATTEMPTS:
                    raise RunInterrupted(f"{node_id}: the model failed {attempt} times, last: {exc}") from exc
                await anyio.sleep(delay)
                delay *= 2
                continue
            crashpoint(MODEL_CALL_AFTER)
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_tool(self, spec: NodeSpec) -> None:
        call = codec.decode(spec.input)["call"]
        tool = self.agent_for(spec.node_id).tools[call["name"]]
        ctx = ToolContext(self.graph.run_id, spec.node_id, None, self.rt.agent.resources, TrackedState(self.state))
        if not tool.effect:
            crashpoint(TOOL_REQUEST_BEFORE)
            outcome = await tool.fn(ctx, call["arguments"])
            crashpoint(TOOL_REQUEST_AFTER)
            await self.append(spec, self.tool_output(call, outcome), [], Budget(tool_calls=1), None,
                              state_updates=ctx.state.updates())
            return
        key = ctx.idem_key = self.effect_key(call)
        try:
            outcome = await self.run_effect(tool, ctx, call)
            # the key the effect was made under is the context's (the call's own, here)
            effect = EffectOutcome(ctx.idem_key or key, outcome.status, outcome.result)
            await self.append(spec, self.tool_output(call, outcome), [], Budget(tool_calls=1), effect,
                              state_updates=ctx.state.updates())
        except anyio.get_cancelled_exc_class():
            # Anywhere between `started` and the commit of the node's record, the
            # provider may have applied the effect: leave it `unknown`, never `started`
            # (a no-op when no row was written or the record already committed).
            await self.mark_unknown(key)
            raise

    def effect_key(self, call: dict[str, Any]) -> str:
        """The idempotency key of a tool call: stable across attempts, because the call
        id comes from the model node's record."""
        return idempotency_key(self.graph.run_id, call["id"])

    @staticmethod
    def tool_output(call: dict[str, Any], outcome: ToolOutcome) -> dict[str, Any]:
        return {"messages": [{
            "role": "tool",
            "tool_call_id": call["id"],
            "name": call["name"],
            "status": outcome.status,
            "content": outcome.result,
        }]}

    async def run_effect(self, tool: Any, ctx: ToolContext, call: dict[str, Any]) -> ToolOutcome:
        """Carry out one effect exactly once, whatever happened to earlier attempts."""
        ledger, key = self.rt.ledger, ctx.idem_key
        assert key is not None
        row = await ledger.get(self.graph.run_id, key)
        if row is not None and row.status in ("succeeded", "failed"):
            return ToolOutcome(row.status, row.result)  # type: ignore[arg-type]
        if row is not None and row.resolution is not None:  # an operator decided (handoff.py)
            if row.resolution.get("applied"):
                return ToolOutcome(row.resolution["status"], row.resolution["result"])
            # not applied: this attempt makes the call again, from `started`
            crashpoint(EFFECT_STARTED_BEFORE)
            await ledger.restart(self.lease, key)
            crashpoint("effect.started.after")
        elif row is None:
            crashpoint(EFFECT_STARTED_BEFORE)
            await ledger.mark_started(self.lease, key, ctx.node_id, tool.name, call["arguments"])
            crashpoint("effect.started.after")
        else:  # started or unknown: an earlier attempt may have reached the provider
            resolved = await self.resolve(tool, ctx)
            if row.status == "unknown":  # a recovery branch (ReferenceAdapter.recovery_branches)
                crashpoint("effect.unknown.resolved")
            if resolved is not None:
                return resolved
        for _ in range(MAX_PROBE_ROUNDS):
            try:
                crashpoint(TOOL_REQUEST_BEFORE)
                outcome = await tool.fn(ctx, call["arguments"])
                crashpoint(TOOL_REQUEST_AFTER)
                return outcome
            except OutcomeUnknown:
                await self.mark_unknown(key)
                resolved = await self.resolve(tool, ctx)
                if resolved is not None:
                    return resolved
        raise NeedsHuman(f"effect {tool.name} {key[:12]} of {ctx.node_id}: outcome still unknown after {MAX_PROBE_ROUNDS} attempts")

    async def mark_unknown(self, key: str) -> None:
        """Record ``unknown`` inside a shielded, bounded scope (see module docstring)."""
        with anyio.move_on_after(SHIELD_SECONDS, shield=True):
            crashpoint(EFFECT_UNKNOWN_BEFORE)
            await self.rt.ledger.mark_unknown(self.lease, key)
            crashpoint("effect.unknown.after")

    async def resolve(self, tool: Any, ctx: ToolContext) -> ToolOutcome | None:
        """Ask the probe about an earlier attempt: its outcome if applied, None if not."""
        if tool.probe is None:
            raise NeedsHuman(f"effect {tool.name} {ctx.idem_key[:12]} of {ctx.node_id}: no probe")
        answer = await self.probe(tool, ctx)
        if answer.outcome == "applied":
            if answer.tool_outcome is None:
                raise NeedsHuman(f"probe of {tool.name} said applied without the result")
            return answer.tool_outcome
        if answer.outcome == "not_applied":
            return None
        raise NeedsHuman(f"effect {tool.name} {ctx.idem_key[:12]} of {ctx.node_id}: probe cannot tell")

    async def probe(self, tool: Any, ctx: ToolContext) -> ProbeOutcome:
        """The probe's answer; ``cannot_tell_yet`` (the provider could not be reached)
        is asked again up to :data:`PROBE_ATTEMPTS`, then :class:`RunInterrupted`."""
        delay = RETRY_BACKOFF_S
        for attempt in range(1, PROBE_ATTEMPTS + 1):
            crashpoint(PROBE_BEFORE)
            answer: ProbeOutcome = await tool.probe(ctx)
            crashpoint("probe.after")
            if answer.outcome != "cannot_tell_yet":
                # the recovery branch taken (ReferenceAdapter.recovery_branches)
                if answer.outcome == "applied":
                    crashpoint("probe.answer.applied")
                elif answer.outcome == "not_applied":
                    crashpoint("probe.answer.not_applied")
                else:
                    crashpoint("probe.answer.cannot_tell")
                return answer
            if attempt < PROBE_ATTEMPTS:
                await anyio.sleep(delay)
                delay *= 2
        raise RunInterrupted(f"effect {tool.name} {ctx.idem_key[:12]} of {ctx.node_id}: the provider could not be "
                             f"asked ({PROBE_ATTEMPTS} probes could not tell yet); the effect stays unknown")

    async def append(
        self, spec: NodeSpec, output: Any, spawned: list[NodeSpec], budget: Budget, effect: EffectOutcome | None,
        *, state_updates: dict[str, Any] | None = None,
    ) -> None:
        """Encode (blobs over the threshold, state through the schema: an undeclared
        field raises here, naming it) and append the node's record."""
        state_payload = None
        if state_updates:
            schema = self.rt.agent.state_schema
            if schema is None:
                name = sorted(state_updates)[0]
                raise UnknownStateField(
                    f"{spec.node_id} set state field {name!r} (a {type(state_updates[name]).__qualname__}) but agent "
                    f"{self.rt.agent.name!r} declares no state schema"
                )
            state_payload = schema.encode(state_updates, blobs=self.rt.blobs, threshold=self.rt.blob_threshold)
        node_id = spec.node_id
        started = self.started_at.get(node_id)
        if started is not None:
            budget.wall_ms = int((time.monotonic() - started) * 1000)
        payload, read = codec.encode_read(output, blobs=self.rt.blobs, threshold=self.rt.blob_threshold)
        record = NodeRecord(
            format_version=RECORD_FORMAT_VERSION,
            node_id=node_id,
            parents=spec.parents[:],  # a list made in C (see RunGraph.add)
            kind=spec.kind,
            output=payload,
            spawned=spawned,
            budget=budget,
            lease_epoch=self.lease.epoch,
        )
        if state_payload is not None:
            record.state.CopyFrom(state_payload)
        pending = _Pending(record, effect, state_updates or {}, read)
        batch = self._batch_of.get(node_id) if self._batch_of else None
        if batch is not None:  # a sibling launched with others: one statement for them all
            crashpoint(LOG_APPEND_BEFORE)
            await self.hand_in(batch, pending)
            crashpoint(LOG_APPEND_AFTER)
            return
        if not self.rt.group_commit:  # one appender at a time, one record per statement
            turn = self._append_turn.take()
            try:
                await turn  # suspends exactly once, free or not (turns.py); a cancellation point
            except BaseException:
                self._append_turn.leave(turn)
                raise
            try:
                crashpoint(LOG_APPEND_BEFORE)
                await self._write([pending])
                crashpoint(LOG_APPEND_AFTER)
            finally:
                self._append_turn.end()
            return
        crashpoint(LOG_APPEND_BEFORE)
        await self.commit(pending)
        crashpoint(LOG_APPEND_AFTER)

    async def commit(self, pending: _Pending) -> None:
        """Group commit (:attr:`Runtime.group_commit`): append one node's record, together
        with every record that arrives while a commit is in flight (a fan-out's tools
        finishing together): those wait and go in the next commit, one statement and one
        fsync for all of them, each with its effect; a lone record goes alone
        (``store.append``). ``seq`` is assigned in commit order; the graph and the state
        take each record in that order before any node can see it. A failed or cancelled
        commit fails every record it carried (and those queued behind it): none of them
        is known to be appended, exactly as when one record's append fails.

        Off by default: which node's task performs a batch depends on timing, so the
        awaits of the commit path are not the same in every run (await points stop
        being deterministic per logical task; labels and steps still are)."""
        if self._committing:
            pending.done = self._new_event()
            self._queue.append(pending)
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return
        self._queue.append(pending)
        self._committing = True
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._write(batch)
        except BaseException as exc:
            for waiting in self._queue:
                waiting.fail(exc)
            self._queue = []
            raise
        finally:
            self._committing = False

    async def _write(self, batch: list[_Pending]) -> None:
        store = self.rt.store
        try:
            if len(batch) == 1 or not hasattr(store, "append_many"):
                written = []
                for item in batch:
                    written.append(await store.append(self.lease, self.seq + 1 + len(written), item.record, item.effect))
            else:
                written = await store.append_many(self.lease, self.seq + 1, [(i.record, i.effect) for i in batch])
        except BaseException as exc:
            for item in batch:
                item.fail(exc)
            raise
        for item, ok in zip(batch, written):
            if ok:
                self.seq += 1
            self.graph.add(item.record, output=item.output)  # seq order: the state folds in it
            if item.state_updates:
                self.state.update(item.state_updates)
            item.finish()
