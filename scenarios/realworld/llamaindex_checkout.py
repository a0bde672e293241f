"""The checkout agent as a LlamaIndex workflow (``llama-index-workflows``, measured on 2.26.1).

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workflows import Context, Workflow, step
from workflows.events import Event, StartEvent, StopEvent

from .common import Clients, FlavouredCheckout, effect_key, final_answer

MAX_TURNS = 20
#: the step hook the adapter passes in: ``hook(phase, step_id)``, phase "before"/"after"
StepHook = Callable[[str, str], None]


class ToolCall(Event):
    """Run the next pending tool call."""


class ModelTurn(Event):
    """Every call of the last reply has its result: ask the model again."""


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
            messages, turn = list(await ctx.store.get("messages")), await ctx.store.get("turn")
        turn += 1
        if turn > MAX_TURNS:
            raise RuntimeError(f"no answer after {MAX_TURNS} turns")
        step_id = f"model-{turn}"
        self.hook("before", step_id)
        reply = await self.clients.model(step_id, messages)
        self.hook("after", step_id)
        calls = list(reply.get("tool_calls") or [])
        async with ctx.store.edit_state() as state:
            state["messages"] = messages + [reply]
            state["turn"], state["pending"], state["call_index"], state["step"] = turn, calls, 0, step_id
        self.finished(step_id)
        return ToolCall() if calls else StopEvent(result=reply["content"])

    @step
    async def tool(self, ctx: Context, ev: ToolCall) -> ToolCall | ModelTurn:
        turn, index = await ctx.store.get("turn"), await ctx.store.get("call_index")
        pending, messages = list(await ctx.store.get("pending")), list(await ctx.store.get("messages"))
        step_id = f"tool-{turn}.{index}"
        self.hook("before", step_id)
        out = await self.clients.tool(pending[0], effect_key(self.flavour, self.run_id, step_id), step_id)
        self.hook("after", step_id)
        async with ctx.store.edit_state() as state:
            state["messages"] = messages + [out]
            state["pending"], state["call_index"], state["step"] = pending[1:], index + 1, step_id
        self.finished(step_id)
        return ToolCall() if len(pending) > 1 else ModelTurn()


def snapshot_state(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The state store of a ``Context.to_dict()`` snapshot as plain values (its
    ``DictState`` keeps each value JSON-encoded: ``state.state_data._data``). Raises
    ``ValueError`` when the snapshot has another store."""
    import json

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
        """The run ended with its answer: the snapshot is not running and its last
        message is a final assistant message (what the adapter reads, in the worker
        and in ``observe``)."""
        return not snapshot.get("is_running") and final_answer(snapshot_state(snapshot).get("messages") or []) is not None


NAIVE = LlamaIndexCheckout("naive")
KEYED = LlamaIndexCheckout("keyed")
