"""The checkout workload as an Apache Burr application (the third runtime of docs/findings.md).

Burr runs a state machine of *actions*; after each action its persister hook saves the
whole state (``SQLitePersister``: one row per step, ``position`` = the action's name,
``status`` ``completed`` or ``failed``), and ``initialize_from(persister,
resume_at_next_action=True)`` continues an application from its last saved row. The
checkout loop as actions::

    model  (one billed model turn: step ``model-N``)  --pending calls-->  tool
    model  --no calls-->  finish  (the answer; no transition out: the run is done)
    tool   (the next pending call: step ``tool-N.i``)  --more pending-->  tool
    tool   --none left-->  model

Each action writes ``step`` (its step id) into the state, so a saved row says which step
it recorded. Tool keys come from :func:`~crashmatrix.scenarios.realworld.common.effect_key`:
``keyed`` from the run id and the step id (stable across attempts), ``naive`` fresh per
attempt. The actions take the worker's ``Clients`` and hooks as bound inputs, so nothing
runs at import time. Measured on apache-burr 0.43.0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from burr.core import ApplicationBuilder, State, action, default, expr

from .common import Clients, FlavouredCheckout, effect_key, final_answer

MAX_TURNS = 20
#: the step hook the adapter passes in: ``hook(phase, step_id)``, phase "before"/"after"
StepHook = Callable[[str, str], None]


@action(reads=["messages", "turn"], writes=["messages", "turn", "pending", "call_index", "step"])
async def model(state: State, clients: Clients, hook: StepHook) -> State:
    """One billed model turn; its tool calls become ``pending``."""
    turn = state["turn"] + 1
    if turn > MAX_TURNS:
        raise RuntimeError(f"no answer after {MAX_TURNS} turns")
    step = f"model-{turn}"
    hook("before", step)
    reply = await clients.model(step, list(state["messages"]))
    hook("after", step)
    return state.update(turn=turn, pending=list(reply.get("tool_calls") or []), call_index=0, step=step) \
        .append(messages=reply)


@action(reads=["messages", "turn", "pending", "call_index"], writes=["messages", "pending", "call_index", "step"])
async def tool(state: State, clients: Clients, hook: StepHook, flavour: str, run_id: str) -> State:
    """The next pending tool call (effects carry the flavour's idempotency key)."""
    step = f"tool-{state['turn']}.{state['call_index']}"
    call = state["pending"][0]
    hook("before", step)
    out = await clients.tool(call, effect_key(flavour, run_id, step), step)
    hook("after", step)
    return state.update(pending=list(state["pending"][1:]), call_index=state["call_index"] + 1, step=step) \
        .append(messages=out)


@action(reads=["messages"], writes=["answer", "step"])
async def finish(state: State, hook: StepHook) -> State:
    """The run's answer: the last assistant message."""
    hook("before", "finish")
    answer = final_answer(list(state["messages"]))
    hook("after", "finish")
    return state.update(answer=answer, step="finish")


class BurrCheckout(FlavouredCheckout):
    """A Burr checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "burr-checkout"

    def initial_state(self, conversation: str) -> dict[str, Any]:
        """The state a run starts from (Burr's ``default_state``)."""
        return {"messages": list(self.run_input(conversation)["messages"]), "turn": 0, "pending": [],
                "call_index": 0, "step": None, "answer": None}

    def builder(self, clients: Clients, hook: StepHook, run_id: str) -> ApplicationBuilder:
        """The application's actions and transitions, its inputs bound for one worker
        (the caller adds the persister, identifiers and initializer)."""
        return ApplicationBuilder().with_actions(
            model=model.bind(clients=clients, hook=hook),
            tool=tool.bind(clients=clients, hook=hook, flavour=self.flavour, run_id=run_id),
            finish=finish.bind(hook=hook),
        ).with_transitions(
            ("model", "tool", expr("len(pending) > 0")),
            ("model", "finish", default),
            ("tool", "tool", expr("len(pending) > 0")),
            ("tool", "model", default),
        )


NAIVE = BurrCheckout("naive")
KEYED = BurrCheckout("keyed")
