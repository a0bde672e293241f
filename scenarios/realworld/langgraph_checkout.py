"""The checkout agent as LangGraph code: a ``StateGraph`` and a functional-API entrypoint.

Both are ordinary LangGraph programs; the only harness-specific lines are the
``hooks.step(...)`` blocks (step boundaries and the logical task) and the
``hooks.point(...)`` labels around the model call and each tool request (a
``crashpoint`` call made under the adapter's point lock, see
:class:`crashmatrix.harness.adapters.langgraph.NodeHooks`).

**StateGraph** (``api="graph"``)::

    START -> agent -> (tool calls?) -> tools -> agent -> ... -> END

``agent`` makes one billed model call and appends the assistant message; ``tools`` runs
the last message's tool calls in order and appends one tool message each. The state is
``{"messages": [...]}`` with an appending reducer. Logical tasks are ``agent-<step>`` and
``tools-<step>`` (node name and LangGraph superstep: stable across attempts, because
supersteps are numbered from the thread's checkpoints, and from the input again when a
run restarts from it).

**Functional API** (``api="functional"``): an ``entrypoint`` that loops over model turns;
each model turn is a ``task`` (``model-<turn>``), each tool call a ``task``
(``tool-<turn>.<i>``). LangGraph saves each finished task's result as a pending write
of the entrypoint's checkpoint; on resume the entrypoint runs again from the top and
finished tasks return their saved results.

Keys of the ``keyed`` flavour: ``sha256(thread_id:tools:<step>:<i>)`` (graph) and
``sha256(thread_id:tool:<turn>:<i>)`` (functional).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph

from .common import CONVERSATIONS, FLAVOURS, PROVIDERS, effect_key, final_answer, run_input

if TYPE_CHECKING:  # pragma: no cover
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.pregel import Pregel

    from crashmatrix.harness.adapters.langgraph import NodeHooks


class CheckoutState(TypedDict):
    conversation: str
    messages: Annotated[list[dict[str, Any]], operator.add]


def build_state_graph(hooks: NodeHooks, flavour: str) -> StateGraph:
    """The checkout agent as a StateGraph (uncompiled)."""

    def agent(state: CheckoutState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            hooks.point("model.call.before")
            message = hooks.call(hooks.clients.model(node_id, state["messages"]))
            hooks.point("model.call.after")
        return {"messages": [message]}

    def tools(state: CheckoutState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            step = config["metadata"]["langgraph_step"]
            thread = config["configurable"]["thread_id"]
            out = []
            for i, call in enumerate(state["messages"][-1]["tool_calls"]):
                key = effect_key(flavour, thread, "tools", step, i)
                hooks.point("tool.request.before")
                out.append(hooks.call(hooks.clients.tool(call, key, node_id)))
                hooks.point("tool.request.after")
        return {"messages": out}

    def route(state: CheckoutState) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    builder = StateGraph(CheckoutState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


MAX_TURNS = 20


def build_entrypoint(hooks: NodeHooks, flavour: str, checkpointer: BaseCheckpointSaver | None) -> Pregel:
    """The checkout agent as a functional-API entrypoint with tasks."""

    @task(name="model")
    def model_turn(turn: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        with hooks.task_step(f"model-{turn}") as node_id:
            hooks.point("model.call.before")
            message = hooks.call(hooks.clients.model(node_id, messages))
            hooks.point("model.call.after")
        return message

    @task(name="tool")
    def run_tool(turn: int, i: int, thread: str, call: dict[str, Any]) -> dict[str, Any]:
        with hooks.task_step(f"tool-{turn}.{i}") as node_id:
            key = effect_key(flavour, thread, "tool", turn, i)
            hooks.point("tool.request.before")
            message = hooks.call(hooks.clients.tool(call, key, node_id))
            hooks.point("tool.request.after")
        return message

    @entrypoint(checkpointer=checkpointer)
    def checkout(inputs: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        hooks.register_entrypoint(config)
        thread = config["configurable"]["thread_id"]
        messages = list(inputs["messages"])
        for turn in range(1, MAX_TURNS + 1):
            message = model_turn(turn, messages).result()
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                return {"conversation": inputs["conversation"], "messages": messages}
            messages.extend(run_tool(turn, i, thread, call).result() for i, call in enumerate(calls))
        raise RuntimeError(f"checkout did not end within {MAX_TURNS} model turns")

    return checkout


class LangGraphCheckout:
    """A LangGraph checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    conversations = CONVERSATIONS
    providers = PROVIDERS

    def __init__(self, flavour: str) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour={flavour!r} must be one of {', '.join(FLAVOURS)}")
        self.flavour = flavour
        self.name = f"lg-checkout-{flavour}"

    def run_input(self, conversation: str) -> dict[str, Any]:
        return run_input(conversation)

    def compile(self, api: str, hooks: NodeHooks, checkpointer: BaseCheckpointSaver | None) -> Pregel:
        """The runnable graph for ``api`` (``"graph"`` or ``"functional"``)."""
        if api == "graph":
            return build_state_graph(hooks, self.flavour).compile(checkpointer=checkpointer)
        if api == "functional":
            return build_entrypoint(hooks, self.flavour, checkpointer)
        raise ValueError(f"api={api!r} must be 'graph' or 'functional'")

    @staticmethod
    def messages(values: Any) -> list[dict[str, Any]]:
        """The transcript in a state snapshot's values (graph: the state; functional:
        the entrypoint's return value, present once it returned)."""
        if isinstance(values, dict):
            return list(values.get("messages") or [])
        return []

    @staticmethod
    def answer(messages: list[dict[str, Any]]) -> str | None:
        return final_answer(messages)


NAIVE = LangGraphCheckout("naive")
KEYED = LangGraphCheckout("keyed")
