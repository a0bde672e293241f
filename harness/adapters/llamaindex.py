"""LlamaIndex Workflows as a subject: the checkout workflow of
:mod:`crashmatrix.scenarios.realworld.llamaindex_checkout`, made durable the way
LlamaIndex's "Writing durable workflows" page says, by snapshotting the ``Context``.

Needs the optional extra ``crashmatrix[llamaindex]`` (``llama-index-workflows``, imported
only in a worker). The workload is reached through the workload object (``ctx.workload``,
:meth:`~.Adapter.workload_of`): its ``workflow``, ``start_event``, ``clients``,
``finished``, ``snapshot_state`` and ``answer``.

**Store**: one SQLite file per run (``<workdir>/llamaindex/<run id>.sqlite``), table
``snapshots(seq, step, ctx)``: one row per snapshot, ``ctx`` the JSON of
``handler.ctx.to_dict()``, ``step`` the id of the step whose end it follows.

**Start / resume** (one code path): no snapshot -> ``workflow.run(start_event=...)`` from
the run input; else ``workflow.run(ctx=Context.from_dict(workflow, last))``. The adapter
consumes ``handler.stream_events(expose_internal=True)`` and, at every
``StepStateChanged`` with ``StepState.NOT_RUNNING`` (a step ended), saves
``handler.ctx.to_dict()`` (LlamaIndex's checkpoint loop; there is no built-in
checkpointer). A finished run is one whose last snapshot is not running and holds the
answer: resuming such a context would *start the workflow again* from its StartEvent
(a context carries state across runs, by design), so the adapter does not.

Crash points: ``step.before`` / ``step.after`` around each step's model call or tool
call (logical task = the step id), ``model.call.before`` / ``.after`` and
``tool.request.before`` / ``.after`` just inside them (as in the DBOS workloads),
``log.append.before`` / ``log.append.after`` around each snapshot's INSERT + COMMIT,
counted under the step whose end it follows (the workflow's steps run one at a time, and
each step reports its id as it returns), and await points in ``workflows`` (LlamaIndex's
control loop and step runner).

**Cancel**: the stream consumer is cancelled; the adapter then cancels the run
(``handler.cancel_run()``, shielded) and re-raises: no snapshot is taken after it.
**SIGTERM**: no handler (LlamaIndex installs none); the worker dies of it.

``observe`` reads the last snapshot's state store (messages, answer) and the rows as the
log. What the matrix found: docs/findings.md ("LlamaIndex Workflows").

**llama-index-core 0.12** (the workflow engine embedded in ``llama_index.core.workflow``,
before ``llama-index-workflows`` split off; chosen when ``workflows`` is not importable,
as the workload chooses its API): its stream has no ``StepStateChanged``, and its
documented checkpointing is ``WorkflowCheckpointer``, which takes a ``Checkpoint``
(``last_completed_step``, ``input_event``, ``output_event``, ``ctx_state`` =
``ctx.to_dict(serializer=JsonSerializer())``) in the run's ``checkpoint_callback`` after
every step but ``_done``, just before the step's output event is sent, and resumes with
``workflow.run_from(checkpoint)`` (the context restored with ``Context.from_dict``; the
output event sent again unless a step was in progress). The checkpointer keeps its
checkpoints in memory; the adapter builds the same ``Checkpoint`` in the same callback
and saves it (its JSON, the events through the ``JsonSerializer``) as the row instead,
then resumes from the last row with ``run_from``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from crashmatrix.harness.adapter import Adapter, Environment, LogEntry, Observation, RunContext
from crashmatrix.harness.crashpoint import LOG_APPEND_AFTER, LOG_APPEND_BEFORE, crashpoint, set_logical_task

from ._shared import point_under

SCHEMA = "CREATE TABLE IF NOT EXISTS snapshots (seq INTEGER PRIMARY KEY, step TEXT NOT NULL, ctx TEXT NOT NULL)"
RUN_TIMEOUT_SECONDS = 60.0
"""LlamaIndex's own run timeout (the worker's deadline is the harness's)."""
_POINT_LOCK = threading.Lock()  # one process-wide lock for points (docs/adapters.md); LlamaIndex runs no threads here
point = point_under(_POINT_LOCK)


class SnapshotStore:
    """The run's snapshots in one SQLite file (sqlite3, autocommit off; each save is one
    INSERT and COMMIT)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path)
        self.db.execute(SCHEMA)
        self.db.commit()

    def last(self) -> dict[str, Any] | None:
        row = self.db.execute("SELECT ctx FROM snapshots ORDER BY seq DESC LIMIT 1").fetchone()
        return json.loads(row[0]) if row else None

    def save(self, step: str, ctx: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO snapshots (step, ctx) VALUES (?, ?)", (step, json.dumps(ctx)))
        self.db.commit()

    def close(self) -> None:
        self.db.close()


def _step_hook(ctx: RunContext) -> Any:
    """The workload's step hook, ``hook(phase, step_id)``: the step's points and its
    ``on_step`` calls around its model call or tool request."""

    def hook(phase: str, step_id: str) -> None:
        call = "model.call" if step_id.startswith("model-") else "tool.request"
        with _POINT_LOCK:
            if phase == "before":
                set_logical_task(step_id)
                ctx.on_step(phase, step_id)
                crashpoint(f"{call}.before")
            else:
                crashpoint(f"{call}.after")
                ctx.on_step(phase, step_id)

    return hook


async def _until_done(handler: Any, running: Any) -> None:
    """Await ``running`` (the run's handler, or what consumes its stream); a cancelled
    caller cancels the run (``handler.cancel_run()``, shielded) and re-raises."""
    try:
        await running
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await handler.cancel_run()
        raise


async def _drive_workflows(workflow: Any, start: Any, last: dict[str, Any] | None, save: Any, answer: Any) -> None:
    """Run ``workflow`` (llama-index-workflows 2.x) from ``start`` (no snapshot) or from
    the ``last`` snapshot, calling ``save(ctx.to_dict())`` at every step end and
    ``await answer(handler, event)`` for every other event of the stream (the operator).
    A restored run does not ask its pending question again: ``answer(handler, last)``
    answers what the snapshot says it waits on."""
    from workflows import Context
    from workflows.events import StepState, StepStateChanged

    handler = workflow.run(start_event=start) if last is None else workflow.run(ctx=Context.from_dict(workflow, last))

    async def consume() -> None:
        if last is not None:
            await answer(handler, last)
        async for event in handler.stream_events(expose_internal=True):
            if isinstance(event, StepStateChanged) and event.step_state == StepState.NOT_RUNNING:
                save(handler.ctx.to_dict())
            else:
                await answer(handler, event)
        await handler

    await _until_done(handler, consume())


async def _drive_core(workflow: Any, start: Any, last: dict[str, Any] | None, save: Any, answer: Any) -> None:
    """Run ``workflow`` (llama-index-core 0.12) from ``start`` or from the ``last``
    checkpoint record (``run_from``), calling ``save(record)`` with the
    ``WorkflowCheckpointer``'s checkpoint after every step (module docstring) and
    ``await answer(handler, event)`` for every event of the stream (the operator). A
    checkpoint whose output event asked the person (``InputRequiredEvent``) is answered
    after ``run_from``, which sends that event to the steps, not to the stream."""
    from llama_index.core.workflow.checkpointer import Checkpoint
    from llama_index.core.workflow.context_serializers import JsonSerializer

    serializer = JsonSerializer()

    async def checkpoint(run_id: str, last_completed_step: str | None, input_ev: Any, output_ev: Any,
                         ctx: Any) -> None:  # LlamaIndex's CheckpointCallback
        save({"last_completed_step": last_completed_step,
              "input_event": serializer.serialize(input_ev) if input_ev is not None else None,
              "output_event": serializer.serialize(output_ev), "ctx_state": ctx.to_dict(serializer=serializer)})

    if last is None:
        handler = workflow.run(start_event=start, checkpoint_callback=checkpoint)
    else:
        saved = Checkpoint(last_completed_step=last["last_completed_step"],
                           input_event=serializer.deserialize(last["input_event"]) if last["input_event"] else None,
                           output_event=serializer.deserialize(last["output_event"]), ctx_state=last["ctx_state"])
        handler = workflow.run_from(saved, ctx_serializer=serializer, checkpoint_callback=checkpoint)

    async def consume() -> None:
        if last is not None:
            await answer(handler, saved.output_event)
        async for event in handler.stream_events():
            await answer(handler, event)
        await handler

    await _until_done(handler, consume())


def _operator(ctx: RunContext) -> Any:
    """``answer(handler, event)``: the workload's scripted operator
    (:mod:`crashmatrix.harness.human`), answering each event the workload's
    ``interrupt`` names (or a restored snapshot, a dict, whose question the workload's
    ``waiting`` names) with its ``reply`` sent into the run's context; nothing for a
    workload without an operator script."""
    from crashmatrix.harness.crashpoint import reset_logical_task
    from crashmatrix.harness.human import ANSWER_AFTER, ANSWER_BEFORE, WAIT

    workload = ctx.workload
    script = getattr(workload, "operator_script", None)

    async def answer(handler: Any, event: Any) -> None:
        if script is None:
            return
        asked = workload.waiting(event) if isinstance(event, dict) else workload.interrupt(event)
        found = script.find(*asked) if asked is not None else None
        if found is None:
            return
        token = set_logical_task(found.task)
        try:
            point(WAIT)
            point(ANSWER_BEFORE)
            handler.ctx.send_event(workload.reply(found.node, found.ordinal, script.delivered(found)))
            point(ANSWER_AFTER)
        finally:
            reset_logical_task(token)

    return answer


class LlamaIndexAdapter(Adapter):
    """LlamaIndex workflow, context snapshots in SQLite at every step end; the tool
    flavour comes from the workload (``llamaindex_checkout:KEYED`` or ``:NAIVE``)."""

    name = "llamaindex"
    subject_packages = ("workflows",)
    requires = ("workflows", "workflows.events")
    extra = "llamaindex"
    #: a workload's scripted person answers the run's ``InputRequiredEvent`` on the stream
    #: (:mod:`crashmatrix.scenarios.realworld.llamaindex_human`)
    answers_operator = ("operator_script",)

    def __init__(self) -> None:
        from crashmatrix.harness.adapter import findable

        if not findable("workflows") and findable("llama_index.core.workflow"):  # llama-index-core 0.12
            self.subject_packages = self.requires = ("llama_index.core.workflow",)
        super().__init__()

    @staticmethod
    def path(env: Environment, run_id: str) -> Path:
        return Path(env.workdir) / "llamaindex" / f"{run_id}.sqlite"

    async def prepare(self, env: Environment) -> None:
        (Path(env.workdir) / "llamaindex").mkdir(parents=True, exist_ok=True)

    async def start(self, ctx: RunContext) -> str:
        return await self.resume(ctx)  # nothing saved yet: resume starts from the input

    async def resume(self, ctx: RunContext) -> str:
        workload = ctx.workload
        store = SnapshotStore(self.path(ctx.env, ctx.run_id))
        finished: collections.deque[str] = collections.deque()

        def save(snapshot: dict[str, Any]) -> None:  # the snapshot after the step that just ended
            step_id = finished.popleft() if finished else "run"
            set_logical_task(step_id)
            point(LOG_APPEND_BEFORE)
            store.save(step_id, snapshot)
            point(LOG_APPEND_AFTER)

        drive = _drive_core if self.requires == ("llama_index.core.workflow",) else _drive_workflows
        try:
            last = store.last()
            if last is not None and workload.finished(last):
                return "completed"
            async with aiohttp.ClientSession() as session:
                clients = workload.clients(session, ctx.env.providers, ctx.worker_id, ctx.conversation, ctx.run_id)
                workflow = workload.workflow(clients, _step_hook(ctx), ctx.run_id, finished.append, RUN_TIMEOUT_SECONDS)
                await drive(workflow, workload.start_event(ctx.conversation) if last is None else None, last, save,
                            _operator(ctx))
            last = store.last()
            return "completed" if last is not None and workload.finished(last) else "interrupted"
        finally:
            store.close()

    async def observe(self, env: Environment, run_id: str) -> Observation:
        workload = self.workload_of(env)
        path = self.path(env, run_id)
        if not path.exists():
            return Observation(run_id, "absent", log=[], state=None, state_error="no snapshot database yet")

        def read() -> list[tuple[int, str, str]]:
            db = sqlite3.connect(path)
            try:
                return db.execute("SELECT seq, step, ctx FROM snapshots ORDER BY seq").fetchall()
            except sqlite3.OperationalError:  # the table is created by the first worker
                return []
            finally:
                db.close()

        rows = await asyncio.to_thread(read)
        if not rows:
            return Observation(run_id, "absent", log=[], state=None, state_error="no snapshot")
        last = json.loads(rows[-1][2])
        done = workload.finished(last)
        messages = workload.snapshot_state(last).get("messages") or []
        log = [LogEntry(seq, step, (), step.split("-")[0], 0) for seq, step, _ in rows]
        return Observation(
            run_id, "completed" if done else "interrupted", log=log,
            effects=None,  # no effects ledger: the providers' own ledgers are checked
            state={"transcript": messages, "answer": workload.answer(messages), "budget": None,
                   "pending": [] if done else ["run"]})


__all__ = ["LlamaIndexAdapter", "SnapshotStore", "point"]
