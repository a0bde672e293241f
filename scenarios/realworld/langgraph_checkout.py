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

**Async variants** (``aio=True``): the same two programs with ``async def`` nodes and
tasks, for ``ainvoke`` with LangGraph's async checkpointers (``AsyncSqliteSaver``,
``AsyncPostgresSaver``). The nodes await the providers on the graph's own event loop
(no thread, no ``hooks.call``), so every await inside LangGraph is an await point and a
``cancel`` reaches the node that is running. Same logical tasks, labels and keys as the
sync programs.

The tool calls of one model turn run one after the other in the StateGraph's ``tools``
node, and concurrently (one task each) in the functional API (``conv4`` asks for two
searches at once).
"""

from __future__ import annotations

import operator
from crashmatrix.harness.crashpoint import MODEL_CALL_AFTER, MODEL_CALL_BEFORE, TOOL_REQUEST_AFTER, TOOL_REQUEST_BEFORE
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph

from .common import FlavouredCheckout, effect_key, final_answer

if TYPE_CHECKING:  # pragma: no cover
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.pregel import Pregel

    from crashmatrix.harness.adapters.langgraph import NodeHooks


class CheckoutState(TypedDict):
    conversation: str
    messages: Annotated[list[dict[str, Any]], operator.add]


def build_state_graph(hooks: NodeHooks, flavour: str, aio: bool = False) -> StateGraph:
    """The checkout agent as a StateGraph (uncompiled); ``aio``: async nodes."""

    def agent(state: CheckoutState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            hooks.point(MODEL_CALL_BEFORE)
            message = hooks.call(hooks.clients.model(node_id, state["messages"]))
            hooks.point(MODEL_CALL_AFTER)
        return {"messages": [message]}

    def tools(state: CheckoutState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            step = config["metadata"]["langgraph_step"]
            thread = config["configurable"]["thread_id"]
            out = []
            for i, call in enumerate(state["messages"][-1]["tool_calls"]):
                key = effect_key(flavour, thread, "tools", step, i)
                hooks.point(TOOL_REQUEST_BEFORE)
                out.append(hooks.call(hooks.clients.tool(call, key, node_id)))
                hooks.point(TOOL_REQUEST_AFTER)
        return {"messages": out}

    async def agent_aio(state: CheckoutState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            hooks.point(MODEL_CALL_BEFORE)
            message = await hooks.clients.model(node_id, state["messages"])
            hooks.point(MODEL_CALL_AFTER)
        return {"messages": [message]}

    async def tools_aio(state: CheckoutState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            step = config["metadata"]["langgraph_step"]
            thread = config["configurable"]["thread_id"]
            out = []
            for i, call in enumerate(state["messages"][-1]["tool_calls"]):
                key = effect_key(flavour, thread, "tools", step, i)
                hooks.point(TOOL_REQUEST_BEFORE)
                out.append(await hooks.clients.tool(call, key, node_id))
                hooks.point(TOOL_REQUEST_AFTER)
        return {"messages": out}

    def route(state: CheckoutState) -> str:
        return "tools" if state["messages"][-1].get("tool_calls") else END

    builder = StateGraph(CheckoutState)
    builder.add_node("agent", agent_aio if aio else agent)
    builder.add_node("tools", tools_aio if aio else tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


MAX_TURNS = 20


def build_entrypoint(hooks: NodeHooks, flavour: str, checkpointer: BaseCheckpointSaver | None,
                     aio: bool = False) -> Pregel:
    """The checkout agent as a functional-API entrypoint with tasks; ``aio``: async
    tasks and entrypoint."""
    if aio:
        return _build_entrypoint_aio(hooks, flavour, checkpointer)

    @task(name="model")
    def model_turn(turn: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        with hooks.task_step(f"model-{turn}") as node_id:
            hooks.point(MODEL_CALL_BEFORE)
            message = hooks.call(hooks.clients.model(node_id, messages))
            hooks.point(MODEL_CALL_AFTER)
        return message

    @task(name="tool")
    def run_tool(turn: int, i: int, thread: str, call: dict[str, Any]) -> dict[str, Any]:
        with hooks.task_step(f"tool-{turn}.{i}") as node_id:
            key = effect_key(flavour, thread, "tool", turn, i)
            hooks.point(TOOL_REQUEST_BEFORE)
            message = hooks.call(hooks.clients.tool(call, key, node_id))
            hooks.point(TOOL_REQUEST_AFTER)
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
            futures = [run_tool(turn, i, thread, call) for i, call in enumerate(calls)]  # concurrently
            messages.extend(f.result() for f in futures)
        raise RuntimeError(f"checkout did not end within {MAX_TURNS} model turns")

    return checkout


def _build_entrypoint_aio(hooks: NodeHooks, flavour: str, checkpointer: BaseCheckpointSaver | None) -> Pregel:
    @task(name="model")
    async def model_turn(turn: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        with hooks.task_step(f"model-{turn}") as node_id:
            hooks.point(MODEL_CALL_BEFORE)
            message = await hooks.clients.model(node_id, messages)
            hooks.point(MODEL_CALL_AFTER)
        return message

    @task(name="tool")
    async def run_tool(turn: int, i: int, thread: str, call: dict[str, Any]) -> dict[str, Any]:
        with hooks.task_step(f"tool-{turn}.{i}") as node_id:
            key = effect_key(flavour, thread, "tool", turn, i)
            hooks.point(TOOL_REQUEST_BEFORE)
            message = await hooks.clients.tool(call, key, node_id)
            hooks.point(TOOL_REQUEST_AFTER)
        return message

    @entrypoint(checkpointer=checkpointer)
    async def checkout(inputs: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        hooks.register_entrypoint(config)
        thread = config["configurable"]["thread_id"]
        messages = list(inputs["messages"])
        for turn in range(1, MAX_TURNS + 1):
            message = await model_turn(turn, messages)
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                return {"conversation": inputs["conversation"], "messages": messages}
            futures = [run_tool(turn, i, thread, call) for i, call in enumerate(calls)]  # concurrently
            messages.extend([await f for f in futures])
        raise RuntimeError(f"checkout did not end within {MAX_TURNS} model turns")

    return checkout


class LangGraphCheckout(FlavouredCheckout):
    """A LangGraph checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "lg-checkout"

    def compile(self, api: str, hooks: NodeHooks, checkpointer: BaseCheckpointSaver | None,
                aio: bool = False) -> Pregel:
        """The runnable graph for ``api`` (``"graph"`` or ``"functional"``); ``aio``:
        async nodes, for ``ainvoke`` (the graph's shape is the same, so ``get_state``
        of either reads the other's checkpoints)."""
        if api == "graph":
            return build_state_graph(hooks, self.flavour, aio).compile(checkpointer=checkpointer)
        if api == "functional":
            return build_entrypoint(hooks, self.flavour, checkpointer, aio)
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
