"""The worker side of a case: arm the fault plan, run the subject, report.

A worker is forked from the preloaded parent (:mod:`.zygote`) and runs one *job*: start
or resume one run of one workload conversation on one subject. It records every crash
point it passes (the trace) and fires the plan's fault when the trace reaches the
fault's point. Reports go to a per-job result file as JSON lines, written with
``os.write`` on an ``O_APPEND`` descriptor, so a report written just before a SIGKILL
survives it (the page cache outlives the process):

- ``{"event": "fired", "fault": {...}, "trace": [...]}``: written *before* the fault
  acts ("a fault that did not fire is a harness error, never a pass");
- ``{"event": "end", "status": ..., "trace": [...], "error": ...}``: the adapter returned
  or raised.

Trace entries are ``[source, name, task, occurrence]`` lists.

Fault actions (DESIGN.md, "Fault kinds, precisely"): ``kill`` sends SIGKILL to the
worker itself; ``term`` sends SIGTERM and carries on (the subject must drain);
``cancel`` cancels the anyio ``CancelScope`` the worker runs the subject in, so
``CancelledError`` arrives at the next await and every later one until a shield;
``pause`` sends SIGSTOP to the worker itself (the controller lets another worker take
the run over, then sends SIGCONT: the worker carries on as a zombie); ``net`` adds the
plan's toxic to the case's proxy for that link before the subject goes on, and removes
it at its heal point or when the worker ends, writing ``{"event": "healed"}``
(:mod:`.netfaults`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import anyio

from . import crashpoint as crashpoint_module
from . import registry
from .adapter import Environment, RunContext
from .plan import Fault, FaultPlan

TraceEntry = tuple[str, str, str, int]


@dataclass(frozen=True)
class Job:
    """One worker's job; crosses the process boundary as JSON.

    ``role``: ``"start"`` (create and run) or ``"resume"``; ``plan``: faults to arm
    (empty for the golden run and resumes); ``result_path``: the JSON-lines report.
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role, "subject": self.subject, "workload": self.workload,
            "conversation": self.conversation, "run_id": self.run_id, "worker_id": self.worker_id,
            "env": self.env.to_dict(), "plan": self.plan.to_dict(), "result_path": self.result_path,
            "await_points": self.await_points,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        return cls(
            d["role"], d["subject"], d["workload"], d["conversation"], d["run_id"], d["worker_id"],
            Environment.from_dict(d["env"]), FaultPlan.from_dict(d["plan"]), d["result_path"],
            bool(d.get("await_points", False)),
        )


class Recorder:
    """Counts crash points per logical task, keeps the trace, fires armed faults."""

    def __init__(self, plan: FaultPlan, result_fd: int, env: Environment | None = None) -> None:
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
        self.net: Any = None  # the live toxic of a fired net fault (netfaults.LinkToxic)
        #: the event loop the scope lives on: a cancel fired on another thread (a
        #: subject's background thread) is handed to it, CancelScope is not thread-safe
        self.loop: asyncio.AbstractEventLoop | None = None

    def point(self, source: str, name: str, task: str) -> None:
        with self.lock:
            key = (name, task)
            n = self.counts.get(key, 0) + 1
            self.counts[key] = n
            self.trace.append((source, name, task, n))
            if self.net is not None and self.net.due(name, task, n):
                self.net.heal(self.emit, [source, name, task, n])
            if not (self.pending and self.pending[0].point.key == (name, task, n)):
                return
            fault = self.pending.pop(0)
            if fault.kind == "kill":
                self.fire(fault)  # never returns
        self.fire(fault)  # outside the lock: a cancel or term lets the subject go on

    def label_hook(self, name: str, task: str) -> None:
        self.point("label", name, task)

    def step_hook(self, phase: str, task: str) -> None:
        self.point("step", f"step.{phase}", task)

    def await_hook(self, name: str, task: str) -> None:
        self.point("await", name, task)

    def emit(self, event: dict[str, Any]) -> None:
        os.write(self.result_fd, (json.dumps(event) + "\n").encode())

    def fire(self, fault: Fault) -> None:
        self.emit({"event": "fired", "fault": fault.to_dict(), "trace": self.trace, "t": time.time()})
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            while True:  # pragma: no cover - SIGKILL is not delivered asynchronously late
                time.sleep(1)
        elif fault.kind == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif fault.kind == "cancel":
            assert self.scope is not None, "cancel fault fired outside the run's scope"
            if self.loop is not None and not _on_loop_thread(self.loop):
                self.loop.call_soon_threadsafe(self.scope.cancel)
            else:
                self.scope.cancel()
        elif fault.kind in ("pause", "db-restart"):
            # the controller takes it from here: another worker steals the run (pause),
            # or PostgreSQL is crashed and restarted (db-restart); then SIGCONT
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault.kind == "net":
            from .netfaults import LinkToxic

            try:
                self.net = LinkToxic.from_env(fault, self.env)
                self.net.add()
            except Exception as exc:  # the fault did not land: a harness error, never the subject's
                self.emit({"event": "fault-error", "error": f"{type(exc).__name__}: {exc}"})
                os._exit(70)


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop running in this thread
        return False


def run_job(job: Job) -> int:
    """Run one job in this (forked) process; return the exit code (0: the adapter
    returned, even after a cancellation; 1: the adapter raised)."""
    fd = os.open(job.result_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    recorder = Recorder(job.plan, fd, job.env)
    crashpoint_module.arm(recorder.label_hook)
    adapter = registry.subject(job.subject)
    workload = registry.workload(job.workload)
    ctx = RunContext(job.env, job.run_id, workload, job.conversation, job.worker_id, recorder.step_hook)

    async def main() -> str:
        run = adapter.start if job.role == "start" else adapter.resume
        status = "interrupted"
        with anyio.CancelScope() as scope:
            recorder.scope, recorder.loop = scope, asyncio.get_running_loop()
            if not job.await_points:
                return await run(ctx)
            from .awaitpoints import install

            install(recorder.await_hook, tuple(adapter.subject_packages))
            result: list[str] = []
            errors: list[Exception] = []

            async def traced() -> None:  # a task of its own, so the factory wraps it
                try:
                    result.append(await run(ctx))
                except Exception as exc:  # re-raised below, not as an ExceptionGroup
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(traced)
            if errors:
                raise errors[0]
            status = result[0] if result else status
        return status

    try:
        status = anyio.run(main)
    except BaseException as exc:  # reported, then the exit code says it
        recorder.emit({
            "event": "end", "status": "error", "trace": recorder.trace,
            "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=20),
        })
        return 1
    finally:
        crashpoint_module.disarm()
        if recorder.net is not None:
            recorder.net.heal(recorder.emit, "worker-end")
    recorder.emit({"event": "end", "status": status, "trace": recorder.trace})
    return 0


def read_events(path: str) -> list[dict[str, Any]]:
    """The events a worker wrote (a torn last line, from a kill mid-write, is dropped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
