"""Apache Burr as a subject: the checkout application of
:mod:`crashmatrix.scenarios.realworld.burr_checkout`, persisted by Burr's own
``SQLitePersister`` in one SQLite file per run (``<workdir>/burr/<run_id>.sqlite``).

Written from docs/adapters.md alone by a reader who had never seen the harness (the
guide's test of "a third runtime"), then brought here. What it reports:

* **steps**: ``ctx.on_step`` around each action's work, under the step's own id
  (``model-N``, ``tool-N.i``, ``finish``), which is also the logical task;
* **labels**: ``model.call.before`` before each model turn; ``log.append.before`` /
  ``log.append.after`` around each ``SQLitePersister.save`` (Burr's persister hook saves
  after every action, in the same task, so the save counts under the action's step);
* **await points**: every suspension whose innermost frame is in ``burr``. The adapter
  drives the application with ``while app.has_next_action(): await app.astep()``; under
  ``app.arun()`` the walk would stop at Burr's async generator and name every suspension
  after the ``async for`` (docs/adapters.md, "Await points").

``resume`` builds the application with ``initialize_from(persister,
resume_at_next_action=True)``: Burr continues from the last saved row. ``observe`` reads
those rows (the last one's state is the run's state) and calls the run completed when
the last row is ``finish``. Burr has no SIGTERM drain and no effects ledger.

Found by the matrix (docs/findings.md, "Apache Burr"): a cancellation inside an action
is saved as that action *completed* with the state from before it (``Application._astep``
catches ``Exception``, not ``CancelledError``, and its ``finally`` runs the persister hook
with no exception), so the resume skips the step.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import aiohttp

from crashmatrix.harness.adapter import Adapter, Environment, LogEntry, Observation, RunContext
from crashmatrix.harness.crashpoint import (
    LOG_APPEND_AFTER, LOG_APPEND_BEFORE, MODEL_CALL_BEFORE, crashpoint, set_logical_task,
)

TABLE = "burr_state"  # SQLitePersister's default table
_POINT_LOCK = threading.Lock()  # one process-wide lock for points (docs/adapters.md); Burr runs no threads here


@functools.cache
def persister_class() -> type:
    """``CrashpointSQLitePersister``: Burr's SQLite persister with ``log.append.before`` /
    ``log.append.after`` around each save (after: the row is committed). Made on first
    use, so this module imports Burr only when a worker needs it."""
    from burr.core.persistence import SQLitePersister

    class CrashpointSQLitePersister(SQLitePersister):
        def save(self, *args: Any, **kwargs: Any) -> None:
            with _POINT_LOCK:
                crashpoint(LOG_APPEND_BEFORE)
            super().save(*args, **kwargs)
            with _POINT_LOCK:
                crashpoint(LOG_APPEND_AFTER)

    return CrashpointSQLitePersister


class BurrAdapter(Adapter):
    """Apache Burr with its SQLite persister; the tool flavour comes from the workload
    (``burr_checkout:KEYED`` or ``:NAIVE``)."""

    name = "burr"
    subject_packages = ("burr",)
    requires = ("burr.core.persistence",)
    extra = "burr"

    @staticmethod
    def path(env: Environment, run_id: str) -> Path:
        """The run's SQLite file."""
        return Path(env.workdir) / "burr" / f"{run_id}.sqlite"

    async def prepare(self, env: Environment) -> None:
        (Path(env.workdir) / "burr").mkdir(parents=True, exist_ok=True)

    async def start(self, ctx: RunContext) -> str:
        return await self.resume(ctx)  # Burr starts from default_state when nothing is saved

    async def resume(self, ctx: RunContext) -> str:
        workload = ctx.workload
        persister = persister_class()(str(self.path(ctx.env, ctx.run_id)))
        persister.initialize()

        def hook(phase: str, step: str) -> None:
            with _POINT_LOCK:
                if phase == "before":
                    set_logical_task(step)
                    if step.startswith("model-"):
                        crashpoint(MODEL_CALL_BEFORE)
                ctx.on_step(phase, step)

        try:
            async with aiohttp.ClientSession() as session:
                clients = workload.clients(session, ctx.env.providers, ctx.worker_id, ctx.conversation, ctx.run_id)
                app = (workload.builder(clients, hook, ctx.run_id)
                       .initialize_from(persister, resume_at_next_action=True,
                                        default_state=workload.initial_state(ctx.conversation),
                                        default_entrypoint="model")
                       .with_state_persister(persister)
                       .with_identifiers(app_id=ctx.run_id)
                       .build())
                while app.has_next_action():
                    await app.astep()
                return "completed" if app.state["step"] == "finish" else "interrupted"
        finally:
            persister.connection.close()

    async def observe(self, env: Environment, run_id: str) -> Observation:
        path = self.path(env, run_id)
        if not path.exists():
            return Observation(run_id, "absent", log=[], state=None, state_error="no Burr database yet")
        db = sqlite3.connect(path)
        try:
            rows = db.execute(
                f"SELECT position, status, state FROM {TABLE} WHERE app_id = ? ORDER BY sequence_id, created_at",
                (run_id,)).fetchall()
        except sqlite3.OperationalError as exc:  # the table is created by the first worker
            return Observation(run_id, "absent", log=[], state=None, state_error=str(exc))
        finally:
            db.close()
        if not rows:
            return Observation(run_id, "absent", log=[], state=None, state_error="no saved step")
        log, state = [], {}
        for seq, (position, status, raw) in enumerate(rows, start=1):
            state = json.loads(raw)
            log.append(LogEntry(seq, str(state.get("step")), (), position, 0,
                                None if status == "completed" else f"saved {status}"))
        done = rows[-1][0] == "finish" and rows[-1][1] == "completed"
        return Observation(
            run_id, "completed" if done else "interrupted", log=log,
            effects=None,  # no effects ledger: the providers' own ledgers are checked
            state={"transcript": state.get("messages", []), "answer": state.get("answer"), "budget": None,
                   "pending": [] if done else ["run"]})
