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
resume_at_next_action=True)``: Burr continues from the last saved row (the input is read
only when nothing is saved; the run is acknowledged at its first save). ``recover``
(``discovery``) lists the apps saved under the case's scope as partition key
(``list_app_ids``) and resumes each. ``observe`` reads
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
        #: called (under the point lock) after each save: the adapter acknowledges the
        #: run at the first one
        on_saved: Any = None

        def save(self, *args: Any, **kwargs: Any) -> None:
            with _POINT_LOCK:
                crashpoint(LOG_APPEND_BEFORE)
            super().save(*args, **kwargs)
            with _POINT_LOCK:
                crashpoint(LOG_APPEND_AFTER)
                if self.on_saved is not None:
                    self.on_saved()

    return CrashpointSQLitePersister


class BurrAdapter(Adapter):
    """Apache Burr with its SQLite persister; the tool flavour comes from the workload
    (``burr_checkout:KEYED`` or ``:NAIVE``)."""

    name = "burr"
    #: a resume reads the run from the runtime's own store and needs the input only when
    #: nothing was stored (then the harness still hands it: the run was never acknowledged)
    expects_redelivery = False
    subject_packages = ("burr",)
    requires = ("burr.core.persistence",)
    extra = "burr"
    #: why fault kind ``restore`` is not applicable (the kind's reason names it)
    restore_not_applicable = ("Burr forks an application from a persisted sequence id, "
                              "ApplicationBuilder.initialize_from(fork_from_app_id=..., fork_from_sequence_id=...); "
                              "this adapter does not wire it")

    @staticmethod
    def path(env: Environment, run_id: str) -> Path:
        """The run's SQLite file; in a ``discovery`` case the scope's
        (``env.options["recovery_scope"]``), where the recovering worker looks."""
        return Path(env.workdir) / "burr" / f"{env.options.get('recovery_scope') or run_id}.sqlite"

    async def prepare(self, env: Environment) -> None:
        (Path(env.workdir) / "burr").mkdir(parents=True, exist_ok=True)

    async def start(self, ctx: RunContext) -> str:
        return await self.resume(ctx)  # Burr starts from default_state when nothing is saved

    async def recover(self, ctx: RunContext) -> str:
        """Recovery without a run id (``discovery``): Burr's persister lists the
        applications saved under a partition key (``list_app_ids``); each run of a
        discovery case is saved under the case's scope as its partition key, and every
        one found is resumed. Raises ``RecoveryByIdOnly`` without a scope."""
        import dataclasses

        from crashmatrix.harness.adapter import RecoveryByIdOnly

        if ctx.scope is None:
            raise RecoveryByIdOnly("this Burr worker was given no scope (partition key) to look in")
        persister = persister_class()(str(self.path(ctx.env, "")))
        try:
            persister.initialize()
            app_ids = sorted(persister.list_app_ids(partition_key=ctx.scope))
        finally:
            persister.connection.close()
        ended = [f"{a}: {await self.resume(dataclasses.replace(ctx, run_id=a))}" for a in app_ids]
        return f"recovered {len(app_ids)} app(s) of partition {ctx.scope}" + (f" ({', '.join(ended)})" if ended else "")

    async def resume(self, ctx: RunContext) -> str:
        """Continue app ``ctx.run_id`` from its last saved row, or start it from its
        input when nothing is saved: the input is read only then (``--resume
        input-once``). The run is acknowledged at its first save, or at once when rows
        are found."""
        workload = ctx.workload
        scope = ctx.env.options.get("recovery_scope")
        persister = persister_class()(str(self.path(ctx.env, ctx.run_id)))
        persister.initialize()
        persister.on_saved = ctx.accepted
        saved = self._rows(self.path(ctx.env, ctx.run_id), ctx.run_id)

        def hook(phase: str, step: str) -> None:
            with _POINT_LOCK:
                if phase == "before":
                    set_logical_task(step)
                    if step.startswith("model-"):
                        crashpoint(MODEL_CALL_BEFORE)
                ctx.on_step(phase, step)

        try:
            if saved:
                with _POINT_LOCK:
                    ctx.accepted()
            # default_state is used only when nothing is saved: a resumer needs no input
            default = {} if saved else workload.initial_state(ctx.conversation)
            async with aiohttp.ClientSession() as session:
                clients = workload.clients(session, ctx.env.providers, ctx.worker_id, ctx.conversation, ctx.run_id)
                app = (workload.builder(clients, hook, ctx.run_id)
                       .initialize_from(persister, resume_at_next_action=True,
                                        default_state=default, default_entrypoint="model")
                       .with_state_persister(persister)
                       .with_identifiers(app_id=ctx.run_id, **({"partition_key": scope} if scope else {}))
                       .build())
                while app.has_next_action():
                    await app.astep()
                return "completed" if app.state["step"] == "finish" else "interrupted"
        finally:
            persister.connection.close()

    @staticmethod
    def _rows(path: Path, run_id: str) -> list[tuple[str, str, str]]:
        """The saved rows of app ``run_id`` in ``path`` (position, status, state JSON),
        in save order; [] when there are none (no file or table yet)."""
        if not path.exists():
            return []
        db = sqlite3.connect(path)
        try:
            return db.execute(
                f"SELECT position, status, state FROM {TABLE} WHERE app_id = ? ORDER BY sequence_id, created_at",
                (run_id,)).fetchall()
        except sqlite3.OperationalError:  # the table is created by the first worker
            return []
        finally:
            db.close()

    async def observe(self, env: Environment, run_id: str) -> Observation:
        path = self.path(env, run_id)
        if not path.exists():
            return Observation(run_id, "absent", log=[], state=None, state_error="no Burr database yet")
        rows = self._rows(path, run_id)
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
