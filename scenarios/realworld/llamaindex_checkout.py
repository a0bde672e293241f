"""The checkout agent as a LlamaIndex workflow (``llama-index-workflows``, measured on 2.26.1;
or ``llama-index-core`` 0.12's embedded ``llama_index.core.workflow``, measured on 0.12.20).

A LlamaIndex ``Workflow`` is a set of ``@step`` methods that take and return events; its
``Context`` holds the events in flight and a state store, and is serialisable
(``Context.to_dict()`` / ``Context.from_dict(workflow, data)``). Durability is the
application's: LlamaIndex's "Writing durable workflows" page snapshots the context
whenever the event stream (``stream_events(expose_internal=True)``) shows a step ending
(``StepStateChanged`` with ``StepState.NOT_RUNNING``), and resumes with
``workflow.run(ctx=Context.from_dict(...))``: pending events are dispatched again, a step
that was running when the snapshot was taken runs again ("Resume is at-least-once").
The adapter (:mod:`crashmatrix.harness.adapters.llamaindex`) does exactly that. The
checkout loop as steps::

    model  (StartEvent | ModelTurn)  -> ToolCall (pending calls)  |  StopEvent (the answer)
    tool   (ToolCall: the next pending call)  -> ToolCall (more pending)  |  ModelTurn

Step ids (``model-N``, ``tool-N.i``) come from the state store, so they are the same on a
resumed run. Each step writes its whole result to the store in one ``edit_state`` block
*after* its model call or tool call, so a snapshot taken while it runs holds none of it.
Tool keys: ``keyed`` ``sha256(run id:step id)``, ``naive`` fresh per attempt.

The workflow object is built per worker (:meth:`LlamaIndexCheckout.workflow`) with the
worker's ``Clients`` and step hook; nothing runs at import time.

**Two APIs, chosen by what is importable** (:data:`API`): ``workflows`` (2.x: the state
store ``ctx.store``, snapshots ``Context.to_dict()`` with a ``state``), else
``llama_index.core.workflow`` (llama-index-core 0.12, before the workflows package split
off: ``ctx.get`` / ``ctx.set`` on the context's globals, snapshots with ``globals``, each
value JSON-encoded). The steps read and write through :func:`_read` and :func:`_write`;
the readers of a snapshot (:func:`snapshot_state`, :meth:`LlamaIndexCheckout.finished`)
go by the snapshot's own format, so a controller with either package (or neither) reads
what a worker of the other wrote.
"""

# no ``from __future__ import annotations``: llama-index-core 0.12 reads a step's event
# types from its signature's annotations as objects, not strings

from collections.abc import Callable
from typing import Any

from .common import Clients, FlavouredCheckout, effect_key, final_answer

try:
    from workflows import Context, Workflow, step
    from workflows.events import Event, HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent

    API = "workflows"
except ImportError:  # llama-index-core 0.12: the workflow engine embedded in the core package
    try:
        from llama_index.core.workflow import (
            Context, Event, HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent, Workflow, step,
        )
    except ImportError:  # neither: the controller only reads snapshots (no workflow is built)
        API = ""
        Context = Workflow = Event = StartEvent = StopEvent = object  # type: ignore[assignment,misc]
        HumanResponseEvent = InputRequiredEvent = object  # type: ignore[assignment,misc]

        def step(fn: Any) -> Any:  # type: ignore[no-redef]
            return fn
    else:
        API = "core"

MAX_TURNS = 20
#: the step hook the adapter passes in: ``hook(phase, step_id)``, phase "before"/"after"
StepHook = Callable[[str, str], None]


class ToolCall(Event):
    """Run the next pending tool call."""


class ModelTurn(Event):
    """Every call of the last reply has its result: ask the model again."""


async def _read(ctx: Context, *keys: str) -> list[Any]:
    """The values of ``keys`` in the run's state (2.x: the state store; 0.12: the
    context's globals)."""
    if API == "workflows":
        return [await ctx.store.get(k) for k in keys]
    return [await ctx.get(k) for k in keys]


async def _write(ctx: Context, **values: Any) -> None:
    """Write ``values`` to the run's state in one block (2.x: ``edit_state``; 0.12: one
    ``ctx.set`` each; a 0.12 checkpoint is taken after the step returned, never between
    them)."""
    if API == "workflows":
        async with ctx.store.edit_state() as state:
            for k, v in values.items():
                state[k] = v
        return
    for k, v in values.items():
        await ctx.set(k, v)


class CheckoutWorkflow(Workflow):
    """The checkout loop. ``finished`` gets each step's id as the step returns (the
    adapter names the snapshot that follows after it)."""

    def __init__(self, clients: Clients, hook: StepHook, flavour: str, run_id: str,
                 finished: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clients, self.hook, self.flavour, self.run_id, self.finished = clients, hook, flavour, run_id, finished

    @step
    async def model(self, ctx: Context, ev: StartEvent | ModelTurn) -> ToolCall | StopEvent:
        if isinstance(ev, StartEvent):
            messages, turn = list(ev.messages), 0
        else:
            messages, turn = await _read(ctx, "messages", "turn")
            messages = list(messages)
        turn += 1
        if turn > MAX_TURNS:
            raise RuntimeError(f"no answer after {MAX_TURNS} turns")
        step_id = f"model-{turn}"
        self.hook("before", step_id)
        reply = await self.clients.model(step_id, messages)
        self.hook("after", step_id)
        calls = list(reply.get("tool_calls") or [])
        await _write(ctx, messages=messages + [reply], turn=turn, pending=calls, call_index=0, step=step_id)
        self.finished(step_id)
        return ToolCall() if calls else StopEvent(result=reply["content"])

    @step
    async def tool(self, ctx: Context, ev: ToolCall) -> ToolCall | ModelTurn:
        turn, index, pending, messages = await _read(ctx, "turn", "call_index", "pending", "messages")
        pending, messages = list(pending), list(messages)
        step_id = f"tool-{turn}.{index}"
        self.hook("before", step_id)
        out = await self.clients.tool(pending[0], effect_key(self.flavour, self.run_id, step_id), step_id)
        self.hook("after", step_id)
        await _write(ctx, messages=messages + [out], pending=pending[1:], call_index=index + 1, step=step_id)
        self.finished(step_id)
        return ToolCall() if len(pending) > 1 else ModelTurn()


def snapshot_state(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The run's state in a snapshot as plain values: a 2.x ``Context.to_dict()`` (its
    ``DictState`` keeps each value JSON-encoded: ``state.state_data._data``), a 0.12 one
    (``globals``, each value JSON-encoded by the ``JsonSerializer``), or a 0.12
    checkpoint record (``ctx_state``: such a context). Raises ``ValueError`` when the
    snapshot has another store."""
    import json

    if "ctx_state" in snapshot:
        snapshot = snapshot["ctx_state"]
    if "globals" in snapshot:
        return {k: json.loads(v) if isinstance(v, str) else v for k, v in (snapshot["globals"] or {}).items()}
    state = snapshot.get("state") or {}
    if state.get("state_type") != "DictState":
        raise ValueError(f"snapshot state store is {state.get('state_type')!r}, not DictState")
    data = (state.get("state_data") or {}).get("_data") or {}
    return {k: json.loads(v) if isinstance(v, str) else v for k, v in data.items()}


class LlamaIndexCheckout(FlavouredCheckout):
    """A LlamaIndex checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "llamaindex-checkout"

    def workflow(self, clients: Clients, hook: StepHook, run_id: str, finished: Callable[[str], None],
                 timeout: float = 60.0) -> CheckoutWorkflow:
        """The workflow for one worker (``timeout``: LlamaIndex's run timeout, seconds)."""
        return CheckoutWorkflow(clients, hook, self.flavour, run_id, finished, timeout=timeout)

    def start_event(self, conversation: str) -> StartEvent:
        return StartEvent(messages=list(self.run_input(conversation)["messages"]))

    snapshot_state = staticmethod(snapshot_state)

    def finished(self, snapshot: dict[str, Any]) -> bool:
        """The run ended with its answer: its last message is a final assistant message
        and the snapshot is not running (2.x), or it is a 0.12 checkpoint record taken
        after the step that produced the ``StopEvent`` (all that is left is the engine's
        ``_done`` step, which does nothing durable). What the adapter reads, in the worker
        and in ``observe``."""
        done = final_answer(snapshot_state(snapshot).get("messages") or []) is not None
        return done and ("ctx_state" in snapshot or not snapshot.get("is_running"))


NAIVE = LlamaIndexCheckout("naive")
KEYED = LlamaIndexCheckout("keyed")
