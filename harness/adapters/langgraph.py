"""LangGraph as a subject: StateGraph or functional API, SQLite or PostgreSQL
checkpointer, ``sync`` / ``async`` / ``exit`` durability.

Needs the optional extra ``crashmatrix[langgraph]`` (langgraph, langgraph-checkpoint-sqlite,
langgraph-checkpoint-postgres, psycopg), imported only inside the functions that use it
(:func:`saver_classes` for the wrapping savers). The workload is
:mod:`crashmatrix.scenarios.realworld.langgraph_checkout` (``NAIVE`` or ``KEYED``), reached
through the workload object (``compile``, ``clients``, ``run_input``, ``messages``,
``answer``; in ``observe`` the session's, :meth:`~.Adapter.workload_of`).

How a run is driven (in a forked worker), two ways:

- ``invoke`` (the default variants): LangGraph's sync savers (``SqliteSaver``,
  ``PostgresSaver``) have no async API, so the graph runs with ``graph.invoke`` in a
  thread (``anyio.to_thread``); its nodes reach the worker's event loop (where the HTTP
  session lives) with ``asyncio.run_coroutine_threadsafe``. A ``cancel`` fault cannot
  reach that thread and there are no await points: use ``kill`` and ``term``.
- ``ainvoke`` (the ``-aio`` variants, ``aio = True``): async nodes, ``AsyncSqliteSaver``
  / ``AsyncPostgresSaver``, all on the worker's loop. Await points are LangGraph's own
  suspensions (:attr:`LangGraphAdapter.subject_packages`); a ``cancel`` cancels
  ``ainvoke``, and LangGraph cancels the node tasks in flight and waits for the saves
  already handed to the saver.

SIGTERM: LangGraph installs no handler; the worker dies of the signal (``term.drained``
fails: the finding). The ``-drain`` variants (``drain = True``) wire SIGTERM to
LangGraph's own cooperative drain, ``RunControl.request_drain()`` (checked at the next
superstep boundary; the run raises ``GraphDrained`` and is ``paused``), and label
``drain.begin`` and ``node.launch`` for ``term.drained``.

Crash points:

- step boundaries: ``step.before`` / ``step.after`` around each node (graph) or task
  (functional), logical task ``agent-<superstep>`` / ``tools-<superstep>`` (graph),
  ``model-<turn>`` / ``tool-<turn>.<i>`` (functional);
- the workload's labels ``model.call.before/after`` and ``tool.request.before/after``;
- the checkpointer's own calls, through :class:`CrashpointSaver` (or
  :class:`AsyncCrashpointSaver`) which wraps the saver:
  ``log.append.before/after`` around ``put_writes`` (a finished task's writes: the
  node's output is durable after it; the oracle's model-billing allowance reads this
  name), logical task = the node's; ``checkpoint.put.before/after`` around ``put``,
  logical task ``checkpoint-s<step>``.

- await points (``-aio`` variants, ``--sources await``): ``module:Qualname@N`` of the
  innermost LangGraph frame, e.g. ``langgraph._internal._runnable:RunnableCallable.ainvoke@6``
  (a node's body is awaiting the provider) or
  ``langgraph.checkpoint.sqlite.aio:AsyncSqliteSaver.aput_writes@3`` (a save in flight).

LangGraph calls ``put`` and ``put_writes`` on background threads or tasks (also under ``sync``,
which only waits for ``put`` before the next superstep), so a point in the saver races
the node that runs next: its *name and count* are deterministic per logical task (the
trace check passes), but what the other thread had done when the kill landed is not.
Such cases are racy by construction; run them several times (docs/findings.md).

Resume protocol (:func:`drive`), from the thread's durable state only; the thread is
read first, the input only when the thread has none:

1. no checkpoint at all (``exit`` durability, or a kill before the first save):
   ``invoke(None)`` would raise ``EmptyInputError``; restart with the original input
   (the only case that needs it: ``--resume input-once`` hands it to no resumer of an
   acknowledged run);
2. a pending interrupt: ``invoke(None)`` first (LangGraph's documented recovery after a
   failure: it re-raises the interrupt, or finishes what was left), then the run waits
   for a human (``needs_human``), or the workload's scripted operator answers it;
3. the latest checkpoint still has tasks (with or without saved writes): ``invoke(None)``
   continues, reusing saved writes and re-running the rest;
4. otherwise the run is complete only if the graph's output is a final answer.

Acknowledgement (``ctx.accepted()``): when the thread's first checkpoint is written
(the input checkpoint under ``sync``/``async``, the only one under ``exit``), or at once
when a resumer finds a checkpoint. Recovery without a run id (:meth:`LangGraphAdapter.
recover`, resume policy ``discovery``): the threads whose checkpoints carry the case's
scope (metadata ``crashmatrix_scope``, from ``config["metadata"]``) are resumed by the
same protocol; LangGraph itself has no lease and no sweeper, so a deployment runs this
at start-up.

An empty ``next`` is *not* proof of completion: ``get_state`` leaves out of ``next`` the
tasks whose writes were saved, so a run killed after a node's writes and before its
checkpoint shows ``next == ()`` with work left (:func:`judge` looks at ``tasks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from crashmatrix.harness.crashpoint import (
    DRAIN_BEGIN, LOG_APPEND_AFTER, LOG_APPEND_BEFORE, NODE_LAUNCH, crashpoint, reset_logical_task,
    set_logical_task,
)

from ..adapter import Adapter, Environment, Observation, RunContext

DURABILITIES = ("sync", "async", "exit")
BACKENDS = ("sqlite", "postgres")
APIS = ("graph", "functional")
TASK_ID_KEY = "__pregel_task_id"
SCOPE_KEY = "crashmatrix_scope"
"""Checkpoint metadata key a run's recovery scope is filed under (``discovery``)."""
LANGGRAPH_CORE_PACKAGES = (
    "langgraph.pregel", "langgraph._internal", "langgraph.graph", "langgraph.func", "langgraph.channels",
    "langgraph.checkpoint.base", "langgraph.checkpoint.serde", "langgraph.checkpoint.memory",
)  # langgraph._internal._constants.CONFIG_KEY_TASK_ID

_POINT_LOCK = threading.Lock()


def point(name: str) -> None:
    """``crashpoint(name)`` under one process-wide lock.

    LangGraph runs nodes and saves on several threads. The worker reports a kill
    (``os.write``, which releases the GIL) before it sends SIGKILL; without the lock
    another thread could pass further crash points, and act (call the model, charge a
    card), in that window, unrecorded. Under the lock, a thread that reaches its next
    crash point while a fault fires waits there until the process dies, so everything
    a killed worker did past a crash point is in the trace the oracle reads.
    """
    with _POINT_LOCK:
        crashpoint(name)


# -- worker side: hooks the workload's nodes call ---------------------------------------


class NodeHooks:
    """What the workload's nodes get from the adapter in a worker: the providers'
    clients, a way to run a coroutine on the worker's loop, and step boundaries."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, clients: Any, on_step: Any,
                 launch_label: bool = False, on_saved: Any = None) -> None:
        self.loop = loop
        self.clients = clients
        self.on_step = on_step
        #: called (under the point lock) after each checkpoint ``put`` returned: the
        #: thread is durable from the first one on (the adapter acknowledges the run there)
        self.on_saved = on_saved
        #: label ``node.launch`` before each node (``term.drained`` reads it)
        self.launch_label = launch_label
        #: LangGraph task id -> logical task, so the saver names ``put_writes`` points
        self.task_names: dict[str, str] = {}
        self._lock = threading.Lock()

    def point(self, name: str) -> None:
        """A labelled crash point in the current logical task (see :func:`point`)."""
        point(name)

    def saved(self) -> None:
        """A checkpoint was written: :attr:`on_saved`, under the point lock (it may
        reach a crash point, ``run.accepted``)."""
        if self.on_saved is not None:
            with _POINT_LOCK:
                self.on_saved()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the worker's event loop from a LangGraph thread; wait."""
        if self.loop is None:
            coro.close()
            raise RuntimeError("no event loop: these hooks only observe (controller side)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _name(self, task_id: str | None, logical: str) -> None:
        if task_id:
            with self._lock:
                self.task_names[task_id] = logical

    @contextlib.contextmanager
    def _boundaries(self, logical: str) -> Iterator[str]:
        token = set_logical_task(logical)
        try:
            if self.launch_label:
                point(NODE_LAUNCH)
            if self.on_step is not None:
                with _POINT_LOCK:
                    self.on_step("before", logical)
            yield logical
            if self.on_step is not None:
                with _POINT_LOCK:
                    self.on_step("after", logical)
        finally:
            reset_logical_task(token)

    @contextlib.contextmanager
    def step(self, config: dict[str, Any]) -> Iterator[str]:
        """A StateGraph node: logical task ``<node>-<superstep>``."""
        meta = config.get("metadata", {})
        logical = f"{meta['langgraph_node']}-{meta['langgraph_step']}"
        self._name(config.get("configurable", {}).get(TASK_ID_KEY), logical)
        with self._boundaries(logical) as name:
            yield name

    @contextlib.contextmanager
    def task_step(self, logical: str) -> Iterator[str]:
        """A functional-API task with the stable id ``logical`` (from its arguments)."""
        from langgraph.config import get_config

        self._name(get_config().get("configurable", {}).get(TASK_ID_KEY), logical)
        with self._boundaries(logical) as name:
            yield name

    def register_entrypoint(self, config: dict[str, Any]) -> None:
        self._name(config.get("configurable", {}).get(TASK_ID_KEY), "entrypoint")


def _path_name(task_path: str) -> str:
    """A logical name for a task the workload did not name (``__start__``)."""
    last = task_path.rsplit(",", 1)[-1].strip() if task_path else "task"
    return last.strip("_") or "task"


def _sync_saver_class(BaseCheckpointSaver: type) -> type:
    """The ``CrashpointSaver`` class of :func:`saver_classes`, subclassing LangGraph's
    ``BaseCheckpointSaver`` (passed in: LangGraph is imported by the caller)."""
    class CrashpointSaver(BaseCheckpointSaver):
        """Wraps a sync checkpointer: crash points before and after its ``put`` and
        ``put_writes`` (module docstring); every other call goes straight through."""

        def __init__(self, inner: BaseCheckpointSaver, hooks: NodeHooks) -> None:
            super().__init__(serde=inner.serde)
            self.inner = inner
            self.hooks = hooks

        @property
        def config_specs(self) -> list:  # type: ignore[override]
            return self.inner.config_specs

        def get_tuple(self, config: Any) -> Any:
            return self.inner.get_tuple(config)

        def list(self, config: Any, **kwargs: Any) -> Any:
            return self.inner.list(config, **kwargs)

        def get_next_version(self, current: Any, channel: Any) -> Any:
            return self.inner.get_next_version(current, channel)

        def get_delta_channel_history(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner.get_delta_channel_history(*args, **kwargs)

        def delete_thread(self, thread_id: str) -> None:
            self.inner.delete_thread(thread_id)

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            token = set_logical_task(f"checkpoint-s{metadata.get('step')}")
            try:
                point("checkpoint.put.before")
                out = self.inner.put(config, checkpoint, metadata, new_versions)
                point("checkpoint.put.after")
                self.hooks.saved()
                return out
            finally:
                reset_logical_task(token)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            token = set_logical_task(self.hooks.task_names.get(task_id) or _path_name(task_path))
            try:
                point(LOG_APPEND_BEFORE)
                self.inner.put_writes(config, writes, task_id, task_path)
                point(LOG_APPEND_AFTER)
            finally:
                reset_logical_task(token)

    return CrashpointSaver


def _async_saver_class(CrashpointSaver: type) -> type:
    """The ``AsyncCrashpointSaver`` class of :func:`saver_classes`, subclassing its
    ``CrashpointSaver`` (:func:`_sync_saver_class`)."""
    class AsyncCrashpointSaver(CrashpointSaver):
        """Wraps an async checkpointer (``AsyncSqliteSaver``, ``AsyncPostgresSaver``) for
        ``ainvoke``: the same points as :class:`CrashpointSaver` around ``aput`` and
        ``aput_writes``, which LangGraph runs as background asyncio tasks on the graph's loop
        (so the savers' own awaits are await points, named in the saver's logical task).

        The two calls are serialised by a lock of this wrapper. Both savers already serialise
        them (one connection behind the saver's own ``asyncio.Lock``), so nothing runs in
        another order; but a *contended* lock suspends and an uncontended one does not, so
        waiting on the saver's lock made the await trace depend on timing (measured: 5-10 of
        17-26 logical tasks differed between three golden runs on PostgreSQL and in the
        functional API). Waiting here, in a frame outside ``subject_packages``, is not an
        await point."""

        _serial: asyncio.Lock | None = None

        def _lock(self) -> asyncio.Lock:
            if self._serial is None:
                self._serial = asyncio.Lock()
            return self._serial

        async def aget_tuple(self, config: Any) -> Any:
            return await self.inner.aget_tuple(config)

        async def alist(self, config: Any, **kwargs: Any) -> Any:
            async for item in self.inner.alist(config, **kwargs):
                yield item

        async def aget_delta_channel_history(self, *args: Any, **kwargs: Any) -> Any:
            return await self.inner.aget_delta_channel_history(*args, **kwargs)

        async def adelete_thread(self, thread_id: str) -> None:
            await self.inner.adelete_thread(thread_id)

        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            token = set_logical_task(f"checkpoint-s{metadata.get('step')}")
            try:
                async with self._lock():
                    point("checkpoint.put.before")
                    out = await self.inner.aput(config, checkpoint, metadata, new_versions)
                    point("checkpoint.put.after")
                    self.hooks.saved()
                return out
            finally:
                reset_logical_task(token)

        async def aput_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            token = set_logical_task(self.hooks.task_names.get(task_id) or _path_name(task_path))
            try:
                async with self._lock():
                    point(LOG_APPEND_BEFORE)
                    await self.inner.aput_writes(config, writes, task_id, task_path)
                    point(LOG_APPEND_AFTER)
            finally:
                reset_logical_task(token)

    return AsyncCrashpointSaver


@functools.cache
def saver_classes() -> tuple[type, type]:
    """``(CrashpointSaver, AsyncCrashpointSaver)``, made on first use: they subclass
    LangGraph's ``BaseCheckpointSaver`` (LangGraph checks that a checkpointer is one), so
    this module imports LangGraph only when a saver is wanted. Also reachable as this
    module's attributes ``CrashpointSaver`` / ``AsyncCrashpointSaver``."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    sync = _sync_saver_class(BaseCheckpointSaver)
    return sync, _async_saver_class(sync)


def __getattr__(name: str) -> Any:
    """``CrashpointSaver`` and ``AsyncCrashpointSaver`` (:func:`saver_classes`)."""
    if name in ("CrashpointSaver", "AsyncCrashpointSaver"):
        return dict(zip(("CrashpointSaver", "AsyncCrashpointSaver"), saver_classes(), strict=True))[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the resume protocol ------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """What a thread's durable state says: ``status`` (``absent``: no checkpoint;
    ``paused``: work left; ``needs_human``: a pending interrupt; ``completed``;
    ``failed``) and why."""

    status: str
    reason: str
    has_checkpoint: bool


def judge(snapshot: Any, answer_of: Any) -> Judgement:
    """Judge a ``StateSnapshot``. ``answer_of(values)`` returns the final answer or None."""
    cfg = (snapshot.config or {}).get("configurable", {})
    if not cfg.get("checkpoint_id"):
        return Judgement("absent", "no checkpoint: the run restarts from its input", False)
    # StateSnapshot.interrupts gathers the tasks' interrupts; read both, count each once
    interrupts = {getattr(i, "id", id(i)): i for i in
                  [*(snapshot.interrupts or ()), *(i for t in snapshot.tasks for i in (t.interrupts or ()))]}
    if interrupts:
        return Judgement("needs_human", f"{len(interrupts)} pending interrupt(s)", True)
    if snapshot.tasks:
        saved = [t.name for t in snapshot.tasks if t.result is not None or getattr(t, "error", None)]
        todo = [t.name for t in snapshot.tasks if t.name not in saved]
        return Judgement("paused", f"tasks left: to run {todo}, writes saved {saved} (next={list(snapshot.next)})", True)
    if answer_of(snapshot.values) is not None:
        return Judgement("completed", "no task left and the output is a final answer", True)
    return Judgement("failed", "no task left but the output is not a final answer", True)


def _decide(role: str, before: Judgement | None, run_input: Any,
            call: str, none_recovery: bool = True) -> tuple[str, Any, tuple[str, str] | None]:
    """The resume protocol's choice: ``(action, what to invoke with, None)``, or
    ``(.., .., (status, reason))`` when there is nothing to run. ``run_input``: the
    input, or a callable returning it, called only when the thread has no checkpoint
    (a resumer reads the rest from the thread; under ``input-once`` the callable
    raises ``InputWithheld`` for a worker not handed the input). ``none_recovery``
    (default): a thread waiting on an interrupt is continued with ``invoke(None)`` too
    (LangGraph's documented recovery after a failure, as a generic recovery loop does
    it), before any answer is given; False answers it at once."""
    def given() -> Any:
        return run_input() if callable(run_input) else run_input

    if role == "start" or before is None:
        return f"{call}(input)", given(), None
    if before.status == "absent":
        return f"{call}(input): no checkpoint", given(), None
    if before.status == "needs_human" and none_recovery:
        return f"{call}(None): recovery of a thread waiting on an interrupt", None, None
    if before.status in ("needs_human", "completed", "failed"):
        return "", None, (before.status, f"nothing to do: {before.reason}")
    return f"{call}(None)", None, None


def graph_drained() -> type[BaseException]:
    """LangGraph's ``GraphDrained`` (what a drained run raises; ``RunControl`` came with
    it), or, on a LangGraph without a drain, an exception nothing raises: the adapters
    that do not drain run on those releases too (docs/findings.md, "Reach back")."""
    try:
        from langgraph.errors import GraphDrained
    except ImportError:
        class NoDrain(Exception):
            """Never raised: this LangGraph has no ``RunControl`` drain."""

        return NoDrain
    return GraphDrained


def _invoke_kwargs(durability: str, control: Any) -> dict[str, Any]:
    return {"durability": durability, **({"control": control} if control is not None else {})}


MAX_ANSWERS = 20
"""Operator answers one worker gives before it leaves the run to the next."""


def pending_interrupts(snapshot: Any, pending_writes: Any) -> list[tuple[Any, str, int]]:
    """``(interrupt, node, ordinal)`` of every interrupt a thread waits on: the node is
    the task's name; the ordinal counts the task's interrupts in the order LangGraph
    matches answers to them (1 + the resume values the task has consumed: its
    ``__resume__`` writes; the interrupt docs: "each will be handled sequentially")."""
    from langgraph._internal._constants import RESUME

    consumed = {task_id: len(value) for task_id, channel, value in pending_writes or ()
                if channel == RESUME and isinstance(value, list)}
    return [(intr, t.name, consumed.get(t.id, 0) + 1 + k)
            for t in snapshot.tasks for k, intr in enumerate(t.interrupts or ())]


def _resume_with(script: Any, pending: list[tuple[Any, str, int]]) -> tuple[Any, list[Any]] | None:
    """What the scripted operator answers (:mod:`crashmatrix.harness.human`): the value
    for one pending interrupt, a map of interrupt id -> value for several (LangGraph PR
    6108: several pending interrupts are answered by id); None when the script has no
    answer for one of them (the run stays waiting)."""
    chosen = []
    for intr, node, ordinal in pending:
        answer = script.find(node, ordinal)
        if answer is None:
            return None
        chosen.append((intr, answer))
    if not chosen:
        return None
    if len(chosen) == 1:
        return script.delivered(chosen[0][1]), [chosen[0][1]]
    return {intr.id: script.delivered(a) for intr, a in chosen}, [a for _, a in chosen]


def _operator_answers(answers: list[Any]) -> str:
    """The operator's turn up to handing the answers over: the person waits
    (``human.wait``), then answers (``human.answer.before``); the action's words."""
    from crashmatrix.harness.human import ANSWER_BEFORE, WAIT

    _operator_points(answers, WAIT)
    _operator_points(answers, ANSWER_BEFORE)
    return f"; answered {', '.join(a.label for a in answers)}"


def _operator_points(answers: list[Any], label: str) -> None:
    """The crash point ``label`` in each answer's logical task (``human-<node>-<n>``)."""
    for answer in answers:
        token = set_logical_task(answer.task)
        try:
            point(label)
        finally:
            reset_logical_task(token)


def drive(graph: Any, config: dict[str, Any], run_input: Any, durability: str, role: str,
          answer_of: Any, control: Any = None, script: Any = None, none_recovery: bool = True,
          found: Any = None) -> tuple[str, str]:
    """Start (``role="start"``) or resume a thread; return ``(status, action)``.
    ``control``: a ``langgraph.runtime.RunControl`` the caller may drain (SIGTERM); a
    drained run ends ``GraphDrained``, and its status is judged like any other.
    ``script``: the workload's operator (:class:`crashmatrix.harness.human.OperatorScript`):
    each interrupt the thread waits on is answered with ``Command(resume=...)``, the
    operator's turn labelled (``human.wait``, ``human.answer.before/after``), until the
    run ends or waits on an interrupt the script does not answer. ``run_input`` and
    ``none_recovery``: see :func:`_decide`. ``found()``: called when a resumed thread
    already has a checkpoint (the run is durable: the adapter acknowledges it)."""
    GraphDrained = graph_drained()  # noqa: N806 - a class
    from langgraph.types import Command

    from crashmatrix.harness.human import ANSWER_AFTER

    def invoke(value: Any) -> bool:
        try:
            graph.invoke(value, config, **_invoke_kwargs(durability, control))
        except GraphDrained as exc:
            nonlocal action
            action += f"; drained ({exc.reason})"
            return False
        return True

    before = None if role == "start" else judge(graph.get_state(config), answer_of)
    if found is not None and before is not None and before.has_checkpoint:
        found()
    action, run_with, done = _decide(role, before, run_input, "invoke", none_recovery)
    if done and not (done[0] == "needs_human" and script is not None):
        return done
    if not done and not invoke(run_with):
        return judge(graph.get_state(config), answer_of).status, action
    for _ in range(MAX_ANSWERS):
        snapshot = graph.get_state(config)
        status = judge(snapshot, answer_of).status
        if status != "needs_human" or script is None:
            return status, action
        got = _resume_with(script, pending_interrupts(snapshot, graph.checkpointer.get_tuple(config).pending_writes))
        if got is None:
            return status, action + "; no scripted answer"
        value, answers = got
        action += _operator_answers(answers)
        if not invoke(Command(resume=value)):
            break
        _operator_points(answers, ANSWER_AFTER)
    return judge(graph.get_state(config), answer_of).status, action


async def adrive(graph: Any, config: dict[str, Any], run_input: Any, durability: str, role: str,
                 answer_of: Any, control: Any = None, script: Any = None,
                 none_recovery: bool = True, found: Any = None) -> tuple[str, str]:
    """:func:`drive` with LangGraph's async API (``aget_state``, ``ainvoke``)."""
    GraphDrained = graph_drained()  # noqa: N806 - a class
    from langgraph.types import Command

    from crashmatrix.harness.human import ANSWER_AFTER

    async def invoke(value: Any) -> bool:
        try:
            await graph.ainvoke(value, config, **_invoke_kwargs(durability, control))
        except GraphDrained as exc:
            nonlocal action
            action += f"; drained ({exc.reason})"
            return False
        return True

    before = None if role == "start" else judge(await graph.aget_state(config), answer_of)
    if found is not None and before is not None and before.has_checkpoint:
        found()
    action, run_with, done = _decide(role, before, run_input, "ainvoke", none_recovery)
    if done and not (done[0] == "needs_human" and script is not None):
        return done
    if not done and not await invoke(run_with):
        return judge(await graph.aget_state(config), answer_of).status, action
    for _ in range(MAX_ANSWERS):
        snapshot = await graph.aget_state(config)
        status = judge(snapshot, answer_of).status
        if status != "needs_human" or script is None:
            return status, action
        saved = await graph.checkpointer.aget_tuple(config)
        got = _resume_with(script, pending_interrupts(snapshot, saved.pending_writes))
        if got is None:
            return status, action + "; no scripted answer"
        value, answers = got
        action += _operator_answers(answers)
        if not await invoke(Command(resume=value)):
            break
        _operator_points(answers, ANSWER_AFTER)
    return judge(await graph.aget_state(config), answer_of).status, action


# -- the adapter --------------------------------------------------------------------------


class LangGraphAdapter(Adapter):
    """LangGraph StateGraph, SqliteSaver, ``sync`` durability."""

    name = "langgraph"
    #: a resume reads the run from the runtime's own store and needs the input only when
    #: nothing was stored (then the harness still hands it: the run was never acknowledged)
    expects_redelivery = False
    #: an interrupt is answered from ``workload.operator_script`` with ``Command(resume=...)``
    answers_operator = ("operator_script",)
    api = "graph"
    backend = "sqlite"
    durability = "sync"
    #: run with LangGraph's async API (``ainvoke``, ``AsyncSqliteSaver`` /
    #: ``AsyncPostgresSaver``, async nodes) instead of ``invoke`` in a thread
    aio = False
    #: ``invoke`` runs the graph in a thread a cancel cannot reach; ``ainvoke`` on the loop
    cancel_reaches_run = False
    #: on SIGTERM, ask LangGraph to drain (``RunControl.request_drain()``: the run stops
    #: at the next superstep boundary and raises ``GraphDrained``); labels ``drain.begin``
    #: when the signal is handled and ``node.launch`` before each node. Without it
    #: LangGraph installs no handler and SIGTERM's default action ends the worker.
    drain = False
    #: a resumed thread that waits on an interrupt is first continued with
    #: ``invoke(None)``, the documented recovery after a failure, before the operator
    #: answers (:func:`_decide`); False answers it at once (the person-in-the-loop
    #: adapters without ``-none``, :mod:`crashmatrix.scenarios.realworld.langgraph_human`)
    none_recovery = True

    requires = ("langgraph.checkpoint.base", "langgraph.checkpoint.sqlite", "psycopg")
    extra = "langgraph"

    def __init__(self) -> None:
        super().__init__()
        for attr, allowed in (("api", APIS), ("backend", BACKENDS), ("durability", DURABILITIES)):
            if getattr(self, attr) not in allowed:
                raise ValueError(f"{type(self).__name__}.{attr}={getattr(self, attr)!r} must be one of {allowed}")

    @property
    def subject_packages(self) -> tuple[str, ...]:  # type: ignore[override]
        """LangGraph's own modules, whose frames name await points: the Pregel loop and
        runner, the node wrappers, and on SQLite the ``AsyncSqliteSaver``. Not the
        ``AsyncPostgresSaver``: it writes in psycopg's pipeline mode, where whether an
        ``execute`` suspends depends on the socket (measured: 6-9 of 26 logical tasks
        differed between golden runs), and an await point must be reproducible; its
        saves are still crash points, by label (``checkpoint.put.*``, ``log.append.*``)
        and as the loop's await on them."""
        core = LANGGRAPH_CORE_PACKAGES
        return core + ("langgraph.checkpoint.sqlite",) if self.backend == "sqlite" else core

    # -- storage ------------------------------------------------------------------

    @staticmethod
    def sqlite_path(env: Environment, run_id: str) -> Path:
        """One SQLite file per run (parallel cases never share a writer lock); in a
        ``discovery`` case one per recovery scope (``env.options["recovery_scope"]``),
        the store a recovering worker that knows no run id opens."""
        name = env.options.get("recovery_scope") or run_id
        return Path(env.workdir) / "langgraph" / f"{name}.sqlite"

    @contextlib.contextmanager
    def open_saver(self, env: Environment, run_id: str, application_name: str,
                   create: bool = True) -> Iterator[Any]:
        """The sync checkpointer on the run's storage (``None`` when ``create`` is
        false and the run's SQLite file does not exist). The async savers write the same
        tables, so this reads what either API saved."""
        if self.backend == "sqlite":
            path = self.sqlite_path(env, run_id)
            if not create and not path.exists():
                yield None
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(str(path), check_same_thread=False)
            try:
                saver = SqliteSaver(conn)
                saver.setup()
                yield saver
            finally:
                conn.close()
        else:
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg.rows import dict_row

            with psycopg.connect(env.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                                 application_name=application_name) as conn:
                yield PostgresSaver(conn)

    @contextlib.asynccontextmanager
    async def open_async_saver(self, env: Environment, run_id: str, application_name: str) -> AsyncIterator[Any]:
        """The async checkpointer on the run's storage, for ``ainvoke``. Its connection is
        closed inside a shielded scope, so a ``cancel`` fault does not leak it."""
        if self.backend == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            path = self.sqlite_path(env, run_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = await aiosqlite.connect(str(path))
            try:
                saver = AsyncSqliteSaver(conn)
                await saver.setup()
                yield saver
            finally:
                with anyio.CancelScope(shield=True):
                    await conn.close()
        else:
            import psycopg
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row

            aconn = await psycopg.AsyncConnection.connect(
                env.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row, application_name=application_name)
            try:
                yield AsyncPostgresSaver(aconn)
            finally:
                with anyio.CancelScope(shield=True):
                    await aconn.close()

    async def prepare(self, env: Environment) -> None:
        if self.backend == "postgres":
            def setup() -> None:
                with self.open_saver(env, "", "crashmatrix-prepare") as saver:
                    assert saver is not None
                    saver.setup()  # CREATE ... IF NOT EXISTS + versioned migrations

            await asyncio.to_thread(setup)
        else:
            (Path(env.workdir) / "langgraph").mkdir(parents=True, exist_ok=True)

    # -- worker side --------------------------------------------------------------

    async def start(self, ctx: RunContext) -> str:
        return await self._run(ctx, "start")

    async def resume(self, ctx: RunContext) -> str:
        return await self._run(ctx, "resume")

    def _answer_of(self, ctx: RunContext) -> Any:
        return lambda values: ctx.workload.answer(ctx.workload.messages(values))

    @contextlib.contextmanager
    def _drain_on_sigterm(self, loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
        """A ``RunControl`` that SIGTERM drains (``drain`` variants), else None.

        The drain is requested by a Python-level handler (``signal.signal``), which runs
        at the main thread's next bytecode: ``request_drain`` is one attribute write,
        safe there, so LangGraph's next superstep sees it. A handler of asyncio's
        (``loop.add_signal_handler``) would run a loop iteration later, after LangGraph
        had launched the next node (``term.drained`` counts launches from the signal's
        delivery). ``drain.begin`` is labelled in the loop (the label takes
        :func:`point`'s lock, which the interrupted code may hold), in a context of its
        own (no node's logical task)."""
        if not self.drain:
            yield None
            return
        import contextvars

        from langgraph.runtime import RunControl

        control = RunControl()

        def on_sigterm(signum: int, frame: Any) -> None:
            if control.drain_requested:
                return
            control.request_drain("SIGTERM")
            if not loop.is_closed():
                loop.call_soon_threadsafe(point, DRAIN_BEGIN, context=contextvars.Context())

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            yield control
        finally:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    async def recover(self, ctx: RunContext) -> str:
        """Recovery without a run id (resume policy ``discovery``), as a LangGraph
        service restarted after a crash does it: list the threads filed under
        ``ctx.scope`` (their checkpoints carry it as metadata, ``SCOPE_KEY``, from the
        run's config) and resume each with the resume protocol (:func:`drive`: a thread
        with work left is continued with ``invoke(None)``; no input is needed, none is
        given). LangGraph has no lease (``lease_seconds`` None): every thread found that
        is not finished is taken. A run killed before its first checkpoint is in no
        thread, so nothing finds it (it was never acknowledged either). Returns
        ``"recovered N thread(s) ...: <status of each>"``; raises ``RecoveryByIdOnly``
        without a scope."""
        from ..adapter import RecoveryByIdOnly

        if ctx.scope is None:
            raise RecoveryByIdOnly("this LangGraph worker was given no scope to look for threads in")
        scope = ctx.scope

        def threads() -> list[str]:
            with self.open_saver(ctx.env, scope, ctx.worker_id, create=False) as saver:
                if saver is None:
                    return []
                return sorted({c.config["configurable"]["thread_id"] for c in saver.list(None, filter={SCOPE_KEY: scope})})

        found = await asyncio.to_thread(threads)
        statuses = [f"{t}: {await self._run(dataclasses.replace(ctx, run_id=t), 'resume')}" for t in found]
        return f"recovered {len(found)} thread(s) filed under {scope}" + (f" ({', '.join(statuses)})" if statuses else "")

    async def _run(self, ctx: RunContext, role: str) -> str:
        """Start or resume thread ``ctx.run_id``. The input is read only when the
        thread has no checkpoint (``ctx.run_input()``: under ``input-once`` a resumer
        of an acknowledged run is not handed it, and needs none). The run is
        acknowledged (``ctx.accepted()``) when its first checkpoint is written, or at
        once when a resumer finds one: from then on the thread holds the request."""
        loop = asyncio.get_running_loop()
        CrashpointSaver, AsyncCrashpointSaver = saver_classes()  # noqa: N806 - classes
        async with aiohttp.ClientSession() as session:
            clients = ctx.workload.clients(session, ctx.env.providers, ctx.worker_id, ctx.conversation, ctx.run_id)
            clients.script = getattr(ctx.workload, "model_script", None) or clients.script
            hooks = NodeHooks(loop, clients, ctx.on_step, launch_label=self.drain, on_saved=ctx.accepted)
            config = self.thread_config(ctx.run_id, self._scope(ctx.env))
            script = getattr(ctx.workload, "operator_script", None)  # a person in the loop (harness/human.py)
            with self._drain_on_sigterm(loop) as control:
                if self.aio:
                    async with self.open_async_saver(ctx.env, ctx.run_id, ctx.worker_id) as saver:
                        graph = ctx.workload.compile(self.api, hooks, AsyncCrashpointSaver(saver, hooks), aio=True)
                        status, _ = await adrive(graph, config, ctx.run_input, self.durability, role,
                                                 self._answer_of(ctx), control, script, self.none_recovery,
                                                 found=hooks.saved)
                        return status

                def body() -> str:
                    with self.open_saver(ctx.env, ctx.run_id, ctx.worker_id) as saver:
                        assert saver is not None
                        graph = ctx.workload.compile(self.api, hooks, CrashpointSaver(saver, hooks))
                        status, _ = drive(graph, config, ctx.run_input, self.durability, role, self._answer_of(ctx),
                                          control, script, self.none_recovery, found=hooks.saved)
                        return status

                return await anyio.to_thread.run_sync(body)

    @staticmethod
    def _scope(env: Environment) -> str | None:
        """The case's recovery scope (a ``discovery`` case), else None."""
        scope = env.options.get("recovery_scope")
        return str(scope) if scope else None

    @staticmethod
    def thread_config(run_id: str, scope: str | None = None) -> dict[str, Any]:
        """The run's config: thread ``run_id``; with a recovery ``scope``, also the
        metadata ``SCOPE_KEY`` (LangGraph copies ``config["metadata"]`` into every
        checkpoint's metadata, which ``list(None, filter=...)`` searches)."""
        config: dict[str, Any] = {"configurable": {"thread_id": run_id}, "recursion_limit": 100}
        if scope:
            config["metadata"] = {SCOPE_KEY: scope}
        return config

    # -- controller side ----------------------------------------------------------

    async def observe(self, env: Environment, run_id: str) -> Observation:
        # the session's workload compiles the graph (``compile``, ``messages``, ``answer``)
        workload = self.workload_of(env)

        def read() -> Observation:
            with self.open_saver(env, run_id, "crashmatrix-oracle", create=False) as saver:
                if saver is None:
                    return Observation(run_id, "absent", state=None, state_error="no checkpoint file")
                graph = workload.compile(self.api, NodeHooks(None, None, None), saver)
                snapshot = graph.get_state(self.thread_config(run_id))
            messages = workload.messages(snapshot.values)
            verdict = judge(snapshot, lambda v: workload.answer(workload.messages(v)))
            if not verdict.has_checkpoint:
                return Observation(run_id, "absent", state=None, state_error=verdict.reason)
            state = {
                "transcript": messages,
                "answer": workload.answer(messages),
                "budget": None,
                "pending": sorted(t.name for t in snapshot.tasks),
            }
            return Observation(run_id, verdict.status, log=None, effects=None, state=state)

        return await asyncio.to_thread(read)

    #: LangGraph's time travel runs the nodes after the checkpoint again, "including any
    #: LLM calls, API requests, and interrupts" (its docs, "Use time-travel")
    restore_effects = "fresh attempt"
    #: a restore point is a checkpoint: the one ``put`` made durable (the ``restore``
    #: kind finds it in a trace by this label)
    restore_point_label = "checkpoint.put.after"

    @contextlib.contextmanager
    def _graph_on(self, env: Environment, run_id: str, application_name: str) -> Iterator[Any]:
        """The session's workload's graph compiled on the run's saver (no hooks), or
        None when the run has no storage yet."""
        workload = self.workload_of(env)
        with self.open_saver(env, run_id, application_name, create=False) as saver:
            yield None if saver is None else workload.compile(self.api, NodeHooks(None, None, None), saver)

    async def restore_point(self, env: Environment, run_id: str) -> str | None:
        """The id of the thread's latest checkpoint (``get_state(...).config``), None
        before its first."""
        def read() -> str | None:
            with self._graph_on(env, run_id, "crashmatrix-oracle") as graph:
                if graph is None:
                    return None
                snapshot = graph.get_state(self.thread_config(run_id))
                return (snapshot.config or {}).get("configurable", {}).get("checkpoint_id")

        return await asyncio.to_thread(read)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        """Time travel to checkpoint ``point`` of the thread, as LangGraph's docs fork
        it: ``update_state`` on that checkpoint's config with ``as_node="__copy__"`` (a
        copy of it becomes the thread's head, the history stays), so the next
        ``invoke(None)`` of the thread, a resume worker's, runs on from it. The thread
        (the run id) stays the same. Raises ``ValueError`` when the thread has no such
        checkpoint."""
        def fork() -> None:
            with self._graph_on(env, run_id, "crashmatrix-restore") as graph:
                config = self.thread_config(run_id)
                config["configurable"].update(checkpoint_ns="", checkpoint_id=point)
                if graph is None or graph.get_state(config).config is None:
                    raise ValueError(f"thread {run_id} has no checkpoint {point}")
                graph.update_state(config, None, as_node="__copy__")

        await asyncio.to_thread(fork)
        return run_id


def _variant(api: str, backend: str, durability: str, aio: bool = False, drain: bool = False) -> type[LangGraphAdapter]:
    api_word = "StateGraph" if api == "graph" else "functional API"
    saver = ("Async" if aio else "") + ("SqliteSaver" if backend == "sqlite" else "PostgresSaver")
    how = "ainvoke" if aio else "invoke in a thread"
    doc = (f"LangGraph {api_word} ({how}), {saver}, `{durability}` durability"
           + (", SIGTERM drains (RunControl)." if drain else "."))
    name = (f"LangGraph{'Aio' if aio else ''}{'Functional' if api == 'functional' else ''}"
            f"{backend.capitalize()}{durability.capitalize()}{'Drain' if drain else ''}Adapter")
    registry_name = (f"langgraph{'-aio' if aio else ''}{'-func' if api == 'functional' else ''}-{backend}-{durability}"
                     f"{'-drain' if drain else ''}")
    cls = type(name, (LangGraphAdapter,), {
        "__doc__": doc, "api": api, "backend": backend, "durability": durability, "aio": aio, "drain": drain,
        "cancel_reaches_run": aio,
        "name": registry_name, "__module__": __name__, "__qualname__": name,
    })
    globals()[name] = cls
    return cls


VARIANTS: dict[str, type[LangGraphAdapter]] = {
    cls.name: cls for cls in (
        _variant(api, backend, durability, aio, drain)
        for aio in (False, True)
        for api in APIS
        for backend in BACKENDS
        for durability in DURABILITIES
        for drain in ((False, True) if api == "graph" else (False,))
    )
}
"""Registry name -> adapter class: ``langgraph[-aio][-func]-{sqlite,postgres}-{sync,async,exit}[-drain]``
(class ``LangGraph[Aio][Functional]{Sqlite,Postgres}{Sync,Async,Exit}[Drain]Adapter``)."""

# the names written out, for readers and static tools (the classes are made above)
LangGraphSqliteSyncAdapter = VARIANTS["langgraph-sqlite-sync"]
LangGraphAioSqliteSyncAdapter = VARIANTS["langgraph-aio-sqlite-sync"]
LangGraphAioPostgresSyncAdapter = VARIANTS["langgraph-aio-postgres-sync"]
