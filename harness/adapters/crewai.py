"""CrewAI Flows as a subject: a ``@persist`` flow (CrewAI's ``SQLiteFlowPersistence``,
one SQLite file per run under ``<workdir>/crewai/``), resumed with ``kickoff(inputs={"id":
run_id})``.

Needs ``crewai`` (measured on 1.15.30; not an extra of ``test``: its install is minutes and
a gigabyte, docs/findings.md "Install cost"). The workload is
:mod:`crashmatrix.scenarios.realworld.crewai_checkout` (``NAIVE`` or ``KEYED``), reached
through the workload object (its ``persistence``, ``flow``, ``inputs``,
``step_methods``); this module imports nothing of CrewAI (the workload's module does).

**Start and resume** are one code path: a worker builds the flow class, reads the run's
saved state (``load_state``); with none (a first start, or a start killed before its first
save) it kicks off with the run's inputs, otherwise with ``{"id": run_id}`` alone, which
reloads the latest saved state (passing the inputs again would overwrite the reloaded
fields: CrewAI applies the non-``id`` inputs after the reload). CrewAI then runs the flow
from its start method; the workload's router picks the next step from the state.

**Faults**: ``kill``; ``term`` (CrewAI installs no SIGTERM handler); ``cancel`` (the flow's
methods are coroutines of the worker's loop). No leases, no PostgreSQL: ``pause`` and
``db-restart`` do not apply.

**Crash points**: ``step.before/after`` in each step method (logical task ``model-N`` /
``tool-N.i``), the workload's ``model.call.*`` / ``tool.request.*``, ``log.append.before/after``
around the save after a step method. Await points: frames in ``crewai``.

**observe** reads the run's ``flow_states`` rows: one log entry per saved step method (its
``step``), the latest row's state as the run's (transcript, answer); ``completed`` once it
holds the answer.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import aiohttp

from ..adapter import Adapter, Environment, LogEntry, Observation, RunContext
from ._shared import point_under, worker_hooks

_POINT_LOCK = threading.Lock()
point = point_under(_POINT_LOCK)


class CrewAIAdapter(Adapter):
    """CrewAI Flows with ``@persist`` (SQLite), resumed by kickoff with the state id."""

    name = "crewai"
    subject_packages = ("crewai",)
    requires = ("crewai.flow.flow", "crewai.flow.persistence")
    extra = "crewai"

    def __init__(self) -> None:
        # before CrewAI is first imported (as the workload's module does): nothing may
        # leave this machine
        os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
        os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
        super().__init__()

    @staticmethod
    def path(env: Environment, run_id: str) -> Path:
        return Path(env.workdir) / "crewai" / f"{run_id}.sqlite"

    async def prepare(self, env: Environment) -> None:
        (Path(env.workdir) / "crewai").mkdir(parents=True, exist_ok=True)

    async def start(self, ctx: RunContext) -> str:
        return await self.resume(ctx)

    async def resume(self, ctx: RunContext) -> str:
        persistence = ctx.workload.persistence(str(self.path(ctx.env, ctx.run_id)))
        async with aiohttp.ClientSession() as session:
            flow_class = ctx.workload.flow(worker_hooks(ctx, session, point, _POINT_LOCK), persistence)
            flow = flow_class()
            saved = persistence.load_state(ctx.run_id)
            inputs = {"id": ctx.run_id} if saved else ctx.workload.inputs(ctx.run_id, ctx.conversation)
            await flow.kickoff_async(inputs=inputs)
            return "completed" if flow.state.answer is not None else "interrupted"

    async def observe(self, env: Environment, run_id: str) -> Observation:
        path = self.path(env, run_id)
        if not path.exists():
            return Observation(run_id, "absent", log=[], state=None, state_error="no flow database yet")
        db = sqlite3.connect(path)
        try:
            rows = db.execute("SELECT method_name, state_json FROM flow_states WHERE flow_uuid = ? ORDER BY id",
                              (run_id,)).fetchall()
        except sqlite3.OperationalError as exc:  # the table is created by the first worker
            return Observation(run_id, "absent", log=[], state=None, state_error=str(exc))
        finally:
            db.close()
        if not rows:
            return Observation(run_id, "absent", log=[], state=None, state_error="no saved state")
        step_methods = self.workload_of(env).step_methods
        states = [(method, json.loads(raw)) for method, raw in rows]
        log = [LogEntry(seq, str(state.get("step")), (), method, 0)
               for seq, (method, state) in enumerate((s for s in states if s[0] in step_methods), start=1)]
        state = states[-1][1]
        done = state.get("answer") is not None
        return Observation(run_id, "completed" if done else "interrupted", log=log, effects=None, state={
            "transcript": state.get("messages", []), "answer": state.get("answer"), "budget": None,
            "pending": [] if done else ["flow"]})


__all__ = ["CrewAIAdapter", "point"]
