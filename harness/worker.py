"""The worker side of a case: arm the fault plan, run the subject, report.

A worker is forked from the preloaded parent (:mod:`.zygote`) and runs one *job*: start
or resume one run of one workload conversation on one subject. It records every crash
point it passes (the trace) and fires the plan's fault when the trace reaches the
fault's point. Reports go to a per-job result file as JSON lines, written with
``os.write`` on an ``O_APPEND`` descriptor, so a report written just before a SIGKILL
survives it (the page cache outlives the process). The lines are the events of
:mod:`.history` (``fired``, written *before* the fault acts: "a fault that
did not fire is a harness error, never a pass"; ``end`` when the adapter returned or
raised; ``healed``, ``heal-error`` and ``fault-error`` for a lasting fault), read back
by :meth:`.history.WorkerReport.from_file`. Trace entries are
:class:`.history.TraceEntry`.

What a fault does in the worker is its kind's (:meth:`.faults.FaultKind.act`; docs/design.md,
"Fault kinds, precisely"): ``kill`` sends SIGKILL to the worker itself, under the
recorder's lock; ``term`` sends SIGTERM and carries on (the subject must drain);
``cancel`` cancels the anyio ``CancelScope`` the worker runs the subject in, so
``CancelledError`` arrives at the next await and every later one until a shield;
``cancel-edge`` calls ``task.cancel()`` on the task that runs the subject, once;
``cancel-api`` stops the worker while the controller cancels the run through the
runtime's own API;
``pause`` and ``db-restart`` send SIGSTOP to the worker itself (the controller acts
while it sleeps, then sends SIGCONT); ``net`` adds the plan's toxic to the case's proxy
for that link before the subject goes on, and removes it at its heal point or when the
worker ends (:attr:`Recorder.lasting`, :mod:`.netfaults`).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from . import crashpoint as crashpoint_module
from . import fault_registry, registry
from .adapter import Environment, RunContext
from .history import Accepted, End, Fired, Passed, TraceEntry, WorkerEvent, encode
from .plan import Fault, FaultPlan


@dataclass(frozen=True)
class Job:
    """One worker's job; crosses the process boundary as JSON.

    ``role``: ``"start"`` (create and run), ``"resume"``, ``"recover"`` (no run id:
    the runtime's own recovery, :meth:`.adapter.Adapter.recover`), ``"recover-other"``
    (a worker of another identity recovers the dead one's runs,
    :meth:`.adapter.Adapter.recover_other`), or one of
    :data:`.builds.SERVICE_ROLES` (an adapter call of the controller's, made in a worker
    of a build); ``plan``: faults to arm (empty for the golden run and fault-free
    resumes); ``result_path``: the JSON-lines report; ``record_io``: measure the worker's
    I/O at every crash point (:mod:`.iostate`; golden runs only, the ground of
    crash-state pruning); ``input_given``, ``scope``, ``clock_offset_s``: as
    :class:`.adapter.RunContext`'s; ``build``: the label of the build whose zygote forks
    it (:mod:`.builds`; empty: the session has one build); ``start_gate``: a directory
    the worker waits at, before the subject runs, until ``gate_parties`` workers have
    arrived (:func:`wait_at_gate`; the ``concurrent`` resume policy's resumers start
    together; empty: no gate); ``hold_at``: with a start gate, the others wait on past
    it until the *lead* (the worker with ``lead``) has reached this crash point
    (``[name, task]``, its first occurrence) or ended, and the lead holds there until
    they ended (:class:`Lead`; empty: all start together); ``gate_at``: with a start
    gate, the worker waits at it not before the subject runs but at this crash point
    (``[name, task]``, its first occurrence: a point inside the runtime's own recovery
    sweep, :attr:`.adapter.Adapter.recovery_point`), so every party is past the same
    step of its recovery before any goes on; a worker that ends without reaching it
    counts as arrived (:class:`PointGate`).
    """

    role: str
    subject: str
    workload: str
    conversation: str
    run_id: str
    worker_id: str
    env: Environment
    plan: FaultPlan
    result_path: str
    await_points: bool = False
    record_io: bool = False
    input_given: bool = True
    scope: str | None = None
    clock_offset_s: float = 0.0
    build: str = ""
    start_gate: str = ""
    gate_parties: int = 0
    hold_at: tuple[str, str] | None = None
    lead: bool = False
    gate_at: tuple[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role, "subject": self.subject, "workload": self.workload,
            "conversation": self.conversation, "run_id": self.run_id, "worker_id": self.worker_id,
            "env": self.env.to_dict(), "plan": self.plan.to_dict(), "result_path": self.result_path,
            "await_points": self.await_points, "record_io": self.record_io, "input_given": self.input_given,
            "scope": self.scope, "clock_offset_s": self.clock_offset_s, "build": self.build,
            "start_gate": self.start_gate, "gate_parties": self.gate_parties, "hold_at": list(self.hold_at) if self.hold_at else None,
            "lead": self.lead, "gate_at": list(self.gate_at) if self.gate_at else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        return cls(
            d["role"], d["subject"], d["workload"], d["conversation"], d["run_id"], d["worker_id"],
            Environment.from_dict(d["env"]), FaultPlan.from_dict(d["plan"]), d["result_path"],
            bool(d.get("await_points", False)), bool(d.get("record_io", False)), bool(d.get("input_given", True)),
            d.get("scope"), float(d.get("clock_offset_s", 0.0)), str(d.get("build", "")),
            str(d.get("start_gate", "")), int(d.get("gate_parties", 0)), tuple(d["hold_at"]) if d.get("hold_at") else None,  # type: ignore[arg-type]
            bool(d.get("lead", False)), tuple(d["gate_at"]) if d.get("gate_at") else None,  # type: ignore[arg-type]
        )


class Recorder:
    """Counts crash points per logical task, keeps the trace, fires armed faults."""

    def __init__(self, plan: FaultPlan, result_fd: int, env: Environment | None = None, *,
                 record_io: bool = False) -> None:
        # subjects may reach points from several threads (LangGraph saves on background
        # threads): counting, recording and firing are one critical section, and a kill
        # holds the lock until the signal lands, so no other thread acts in between
        self.lock = threading.Lock()
        self.trace: list[TraceEntry] = []
        self.counts: dict[tuple[str, str], int] = {}
        self.pending: list[Fault] = list(plan.faults)
        self.result_fd = result_fd
        self.scope: anyio.CancelScope | None = None
        self.env = env
        #: the live part of a fired fault that lasts until a heal point or the worker's
        #: end (a net fault's toxic, :class:`.netfaults.LinkToxic`): ``due(name, task,
        #: occurrence)`` and ``heal(emit, at)``
        self.lasting: Any = None
        #: the event loop the scope lives on: a cancel fired on another thread (a
        #: subject's background thread) is handed to it, CancelScope is not thread-safe
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the worker's I/O at each point of the trace (``Job.record_io``), and why it
        #: could not be measured
        self.meter: Any = None
        self.marks: list[list[int]] | None = None
        self.io_note: str | None = None
        if record_io:
            from .iostate import IoMeter, Unavailable

            try:
                self.meter, self.marks = IoMeter(), []
            except Unavailable as exc:
                self.io_note = str(exc)
        #: the asyncio task that runs the subject, and whether a ``cancel-edge`` fault
        #: cancelled it (its one ``CancelledError`` ends the run: :mod:`.faults.cancel_edge`)
        self.task: asyncio.Task[Any] | None = None
        self.edge_cancelled = False
        #: the lead of a staggered round says how far it got (``Job.lead``, :class:`Lead`)
        self.lead: Lead | None = None
        #: a round whose parties meet at a crash point (``Job.gate_at``, :class:`PointGate`)
        self.gate: PointGate | None = None
        #: a fault fired: every later point is reported (``passed``), the worker's
        #: progress, by which the controller tells a stuck worker (:class:`.history.Silence`)
        self.progress = False

    def _mark(self) -> None:
        from .iostate import Unavailable

        try:
            self.marks.append(list(self.meter.mark()))  # type: ignore[union-attr]
        except Unavailable as exc:
            self.meter, self.marks, self.io_note = None, None, str(exc)

    def point(self, source: str, name: str, task: str) -> None:
        with self.lock:
            key = (name, task)
            n = self.counts.get(key, 0) + 1
            self.counts[key] = n
            entry = TraceEntry(source, name, task, n)
            self.trace.append(entry)
            if self.progress:  # after a fault fired: each point is progress the controller sees
                self.emit(Passed(entry))
            if self.meter is not None:
                self._mark()
            if self.lasting is not None and self.lasting.due(name, task, n):
                self.lasting.heal(self.emit, entry)
            if self.lead is not None:
                self.lead.reached(name, task)
            if self.gate is not None:
                self.gate.reached(name, task)
            if not (self.pending and self.pending[0].point.key == (name, task, n)):
                return
            fault = self.pending.pop(0)
            kind = fault_registry.kind(fault.kind)
            if kind.fires_under_lock:
                self.fire(fault, kind)  # under the lock: nothing runs before it lands
                return
        self.fire(fault, kind)  # outside the lock: a cancel or term lets the subject go on

    def label_hook(self, name: str, task: str) -> None:
        self.point("label", name, task)

    def step_hook(self, phase: str, task: str) -> None:
        self.point("step", f"step.{phase}", task)

    def await_hook(self, name: str, task: str) -> None:
        self.point("await", name, task)

    def emit(self, event: WorkerEvent) -> None:
        os.write(self.result_fd, encode(event))

    def fire(self, fault: Fault, kind: fault_registry.Acting) -> None:
        """Report ``fired`` (with the trace so far), then let the fault's kind act."""
        self.emit(Fired(fault.to_dict(), self.trace, time.time()))
        self.progress = True
        kind.act(self, fault)


class _WithheldInput:
    """A workload whose ``run_input`` raises :class:`.adapter.InputWithheld` (the
    worker was not handed the input); everything else is the workload's."""

    def __init__(self, workload: Any, run_id: str) -> None:
        self._workload, self._run_id = workload, run_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._workload, name)

    def run_input(self, conversation: str) -> dict[str, Any]:
        from .adapter import InputWithheld

        raise InputWithheld(f"run {self._run_id}: this worker was not handed the input (input-once)")


#: seconds between looks at the start gate, and the longest a worker waits there (a party
#: that died before it must not hold the others: they go on as if started apart)
GATE_POLL_S = 0.0005
GATE_LIMIT_S = 10.0


def wait_at_gate(gate: str, parties: int, worker_id: str, *, limit_s: float = GATE_LIMIT_S) -> bool:
    """Mark this worker's arrival in directory ``gate`` (a file named ``worker_id``) and
    wait, polling every :data:`GATE_POLL_S`, until ``parties`` workers have arrived.
    Returns True when they all did, False after ``limit_s`` seconds without them.

    Forked one after another, N resumers would otherwise start up to a fork apart, and
    under load one may finish a short resume before the next takes its first step: the
    race the ``concurrent`` policy exists to run would not happen (the policy's mutants
    were then caught only sometimes)."""
    os.close(os.open(os.path.join(gate, worker_id), os.O_WRONLY | os.O_CREAT, 0o600))
    deadline = time.monotonic() + limit_s
    while len(os.listdir(gate)) < parties:
        if time.monotonic() >= deadline:
            return False
        time.sleep(GATE_POLL_S)
    return True


class PointGate:
    """A round whose parties meet at a crash point (``Job.gate_at``): at its first
    passage of ``at`` (``(name, task)``) a worker marks its arrival in the gate directory
    and waits there (:func:`wait_at_gate`, bounded by :data:`GATE_LIMIT_S`) until every
    party has arrived; a worker that ends first marks its arrival then (:meth:`ended`),
    so nobody waits for it. Two recoverers held there have both read what they are to
    recover before either acts on it: the interleaving a recovery race needs, every time."""

    def __init__(self, gate: str, at: tuple[str, str], parties: int, worker_id: str) -> None:
        self.gate, self.at, self.parties, self.worker_id = gate, tuple(at), parties, worker_id
        self.passed = False

    def reached(self, name: str, task: str) -> None:
        if self.passed or (name, task) != self.at:
            return
        self.passed = True
        wait_at_gate(self.gate, self.parties, self.worker_id)

    def ended(self) -> None:
        if not self.passed:
            self.passed = True
            _touch(os.path.join(self.gate, self.worker_id))


#: the longest the lead of a staggered round stays at its mark for the others to end
#: (one of them may wait for a row lock the lead holds: then both go on after it)
HOLD_LIMIT_S = 2.0


class Lead:
    """A staggered round of resumers (the ``concurrent`` policy's, ``Job.hold_at``). The
    *lead* starts at once; at its first passage of the hold point it says so (the file
    ``GATE-lead/held``) and stays there until every other resumer of the round has ended
    (``GATE-lead/ended-WORKER``) or :data:`HOLD_LIMIT_S` passed, then goes on. The others
    wait at the start gate until the lead is held (or ended), then run.

    It is the redelivery a queue makes while the first consumer is half way (its
    visibility timeout ran out while it worked, or it stalled): the second resumer takes
    the run over from a worker stopped in the middle of its own recovery (an effect
    probed and not yet retried, a provider call about to go out, a record not yet
    appended), and the first one then goes on from there. Resumers that start together
    meet only at the lease: the second steals it before the first has done anything its
    fence would not refuse, and the windows in between were reached by one case in tens,
    differently from run to run (measured: docs/benchmarks.md)."""

    def __init__(self, gate: str, hold_at: tuple[str, str], parties: int) -> None:
        self.marks, self.hold_at, self.parties = self.directory(gate), tuple(hold_at), parties
        self.held = False
        os.makedirs(self.marks, exist_ok=True)

    @staticmethod
    def directory(gate: str) -> str:
        """Where the round's marks go: beside the gate, whose files count its arrivals."""
        return gate.rstrip(os.sep) + "-lead"

    def reached(self, name: str, task: str, *, limit_s: float = HOLD_LIMIT_S) -> bool:
        """The lead is at crash point ``name`` of ``task``: the first time at the hold
        point, say so and hold until the others ended (True) or ``limit_s`` passed."""
        if self.held or (name, task) != self.hold_at:
            return False
        self.held = True
        _touch(os.path.join(self.marks, "held"))
        deadline = time.monotonic() + limit_s
        while sum(n.startswith("ended-") for n in os.listdir(self.marks)) < self.parties - 1:
            if time.monotonic() >= deadline:
                return False
            time.sleep(GATE_POLL_S)
        return True

    def ended(self) -> None:
        """The lead ended (before its hold point, or after): nobody waits for it."""
        _touch(os.path.join(self.marks, "held"))

    @staticmethod
    def follow(gate: str, *, limit_s: float = GATE_LIMIT_S) -> bool:
        """A follower: wait until the lead is held (or ended); False after ``limit_s``
        seconds without it."""
        mark = os.path.join(Lead.directory(gate), "held")
        deadline = time.monotonic() + limit_s
        while not os.path.exists(mark):
            if time.monotonic() >= deadline:
                return False
            time.sleep(GATE_POLL_S)
        return True

    @staticmethod
    def followed(gate: str, worker_id: str) -> None:
        """A follower ended: the lead need not hold for it any longer."""
        os.makedirs(Lead.directory(gate), exist_ok=True)
        _touch(os.path.join(Lead.directory(gate), f"ended-{worker_id}"))


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def run_job(job: Job, runner: asyncio.Runner | None = None) -> int:
    """Run one job in this (forked) process; return the exit code (0: the adapter
    returned, even after a cancellation; 1: the adapter raised). ``runner``: the event
    loop of a long-lived worker, kept from job to job (:mod:`.resident`); None: a loop
    of the job's own (``anyio.run``), closed when it ends."""
    from .builds import SERVICE_ROLES

    if job.role in SERVICE_ROLES:  # an adapter call of the controller's, in this build (builds.py)
        from .builds import run_service_job

        return run_service_job(job)
    fd = os.open(job.result_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return _run_reporting(job, runner, fd)
    finally:
        os.close(fd)  # a long-lived worker runs more jobs: nothing of this one stays open


async def _in_scope(job: Job, recorder: Recorder, adapter: Any, subject: Callable[[], Awaitable[str]]) -> str:
    """:func:`_run_reporting`'s run of ``subject()`` (the adapter's start, resume or
    recover) in a cancel scope the recorder holds (a ``cancel`` fault cancels it), and,
    when the job traces await points, in a task of its own with the await hook of
    ``adapter``'s subject packages installed; returns the run's status, re-raising the
    subject's exception."""
    status = "interrupted"
    with anyio.CancelScope() as scope:
        recorder.scope, recorder.loop = scope, asyncio.get_running_loop()
        if not job.await_points:
            return await subject()
        from .awaitpoints import install

        install(recorder.await_hook, tuple(adapter.subject_packages))
        result: list[str] = []
        errors: list[Exception] = []

        async def traced() -> None:  # a task of its own, so the factory wraps it
            try:
                result.append(await subject())
            except Exception as exc:  # re-raised below, not as an ExceptionGroup
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(traced)
        if errors:
            raise errors[0]
        status = result[0] if result else status
    return status


def _run_reporting(job: Job, runner: asyncio.Runner | None, fd: int) -> int:
    """:func:`run_job`'s run of the subject, reporting to the descriptor ``fd``."""
    recorder = Recorder(job.plan, fd, job.env, record_io=job.record_io)
    crashpoint_module.arm(recorder.label_hook)
    adapter = registry.subject(job.subject)
    workload = registry.workload(job.workload)
    if not job.input_given:  # an adapter that asks the workload directly is refused too
        workload = _WithheldInput(workload, job.run_id)
    acked: list[bool] = []

    def on_accepted() -> None:
        if not acked:
            acked.append(True)
            recorder.emit(Accepted(time.time()))
            # a crash point right after the caller was told "accepted": a run acknowledged
            # before it is durable is lost by a fault here (run.acknowledged_durable;
            # LangGraph issue 8764), whatever labels the subject has
            crashpoint_module.crashpoint(crashpoint_module.RUN_ACCEPTED)

    ctx = RunContext(job.env, job.run_id, workload, job.conversation, job.worker_id, recorder.step_hook,
                     input_given=job.input_given, scope=job.scope, clock_offset_s=job.clock_offset_s,
                     on_accepted=on_accepted)

    async def subject() -> str:
        """The adapter's start or resume, in the task a ``cancel-edge`` fault cancels:
        its one ``CancelledError``, reaching here, ends the run as a cancelled request
        does (``interrupted``); any other cancellation goes on."""
        recorder.task = asyncio.current_task()
        try:
            run = {"start": adapter.start, "resume": adapter.resume, "recover": adapter.recover,
                   "recover-other": adapter.recover_other}[job.role]
            return await run(ctx)
        except asyncio.CancelledError:
            assert recorder.scope is not None and recorder.task is not None
            if not recorder.edge_cancelled or recorder.scope.cancel_called:
                raise
            recorder.task.uncancel()
            return "interrupted"

    if job.start_gate and job.gate_at:
        recorder.gate = PointGate(job.start_gate, job.gate_at, job.gate_parties, job.worker_id)
    elif job.start_gate:
        wait_at_gate(job.start_gate, job.gate_parties, job.worker_id)
        if job.hold_at:
            if job.lead:
                recorder.lead = Lead(job.start_gate, job.hold_at, job.gate_parties)
            else:
                Lead.follow(job.start_gate)
    try:
        # a job of a long-lived worker runs in a fresh copy of the process's context, as a
        # task a production consumer starts per message would: the Runner's own context is
        # shared by every run() call, so a context variable a job set (the subject's logical
        # task, a request id) would reach the next job
        status = anyio.run(_in_scope, job, recorder, adapter, subject) if runner is None else \
            runner.run(_in_scope(job, recorder, adapter, subject), context=contextvars.copy_context())
    except BaseException as exc:  # reported, then the exit code says it
        recorder.emit(End("error", recorder.trace, f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=20)))
        return 1
    finally:
        if recorder.gate is not None:
            recorder.gate.ended()
        if recorder.lead is not None:
            recorder.lead.ended()
        elif job.hold_at and job.start_gate:
            Lead.followed(job.start_gate, job.worker_id)
        crashpoint_module.disarm()
        if recorder.lasting is not None:
            recorder.lasting.heal(recorder.emit, "worker-end")
    recorder.emit(End(status, recorder.trace, marks=recorder.marks, io_note=recorder.io_note))
    return 0
