"""A person in the loop, on LangGraph: two workloads whose runs wait for a scripted
operator (:mod:`crashmatrix.harness.human`), answered with ``Command(resume=...)`` by
the LangGraph adapter.

**Two sequential interrupts** (``SEQUENTIAL_*``, conversation ``approve``)::

    START -> plan -> review -> pay -> notify -> answer -> END

``plan`` and ``answer`` are billed model turns; ``review`` calls ``interrupt()`` twice,
first for the approval of the amount, then for the shipping address, and records what
each returned (:func:`crashmatrix.harness.human.record`); ``pay`` charges the approved
amount (payment provider), ``notify`` mails the receipt to the confirmed address (mail
provider). LangGraph re-runs ``review`` from its top on each answer and matches the
answers to its interrupts in order. LangGraph issue 8837: after the first answer, a thread whose
second interrupt is pending and is continued with ``invoke(None)`` gets the first answer
again for the second interrupt (the ``-none`` adapters recover that way).

**Parallel tools, one interrupts** (``PARALLEL_*``, conversation ``parallel``)::

    START -> agent -> tools -> agent -> END

The first model turn asks for two tool calls at once: ``notify_warehouse`` (a mail) and
``approve_charge`` (``interrupt()`` for a person's approval, then the charge). ``tools``
is LangGraph's prebuilt ``ToolNode``, given either the whole message (``whole``: every
call in one task, the shape of ``create_react_agent``'s default) or one call per task
through the ``Send`` API (``send``: LangGraph PR 3126's fix). With the whole message, the
node raises the interrupt and its completed sibling's result is not saved: after the
answer every call of it runs again (LangGraph issue 6626's comment; LangGraph PR 3126's description).

Keys (``keyed`` flavour): ``sha256(thread:node:step:0)`` for ``pay`` and ``notify``,
``sha256(thread:tool:<tool call id>)`` for the tools (the call id is the model's, stable
once its turn is saved).
"""

from __future__ import annotations

import asyncio
import json
import operator
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Send, interrupt

from crashmatrix.harness.crashpoint import (
    MODEL_CALL_AFTER, MODEL_CALL_BEFORE, TOOL_REQUEST_AFTER, TOOL_REQUEST_BEFORE, reset_logical_task,
    set_logical_task,
)
from crashmatrix.harness.human import Answer, OperatorScript, record

from ..checkout.script import CUSTOMER
from .common import FLAVOURS, FlavouredCheckout, effect_key, final_answer
from .human_script import AMOUNT, CARD

if TYPE_CHECKING:  # pragma: no cover
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.pregel import Pregel

    from crashmatrix.harness.adapters.langgraph import NodeHooks

SCRIPT = "crashmatrix.scenarios.realworld.human_script:respond"
SHIP_TO = "Ada Lovelace, 12 Analytical Row, London"
SHAPES = ("sequential", "whole", "send")


class SequentialState(TypedDict):
    conversation: str
    messages: Annotated[list[dict[str, Any]], operator.add]


def _answers(messages: list[dict[str, Any]], label: str) -> Any:
    """What interrupt ``label`` returned, as ``review`` recorded it."""
    return next((m["answer"] for m in messages if m.get("interrupt") == label), None)


def build_sequential(hooks: NodeHooks, flavour: str) -> StateGraph:
    """The two-interrupt graph (module docstring), async nodes."""

    async def model_node(state: SequentialState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            hooks.point(MODEL_CALL_BEFORE)
            message = await hooks.clients.model(node_id, state["messages"])
            hooks.point(MODEL_CALL_AFTER)
        return {"messages": [message]}

    async def review(state: SequentialState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config):
            approval = interrupt({"ask": "approve the purchase", "amount": AMOUNT})
            address = interrupt({"ask": "confirm the shipping address"})
        return {"messages": [{"role": "human", **record("review", 1, approval)},
                             {"role": "human", **record("review", 2, address)}]}

    async def effect(state: SequentialState, config: RunnableConfig, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            step = config["metadata"]["langgraph_step"]
            key = effect_key(flavour, config["configurable"]["thread_id"], config["metadata"]["langgraph_node"], step, 0)
            hooks.point(TOOL_REQUEST_BEFORE)
            message = await hooks.clients.tool({"id": f"{node_id}.0", "name": name, "arguments": arguments}, key, node_id)
            hooks.point(TOOL_REQUEST_AFTER)
        return {"messages": [message]}

    async def pay(state: SequentialState, config: RunnableConfig) -> dict[str, Any]:
        approval = _answers(state["messages"], "review#1") or {}
        return await effect(state, config, "charge", {"amount": approval.get("amount", 0), "currency": "eur",
                                                       "card": CARD})

    async def notify(state: SequentialState, config: RunnableConfig) -> dict[str, Any]:
        address = (_answers(state["messages"], "review#2") or {}).get("address")
        charge = next(m["content"] for m in state["messages"] if m.get("role") == "tool" and m.get("name") == "charge")
        return await effect(state, config, "send_receipt", {
            "to": CUSTOMER, "subject": "Your order",
            "body": f"Charged {charge.get('amount')} cents ({charge.get('charge_id')}); shipping to {address}."})

    builder = StateGraph(SequentialState)
    for name, fn in (("plan", model_node), ("review", review), ("pay", pay), ("notify", notify),
                     ("answer", model_node)):
        builder.add_node(name, fn)
    for a, b in ((START, "plan"), ("plan", "review"), ("review", "pay"), ("pay", "notify"), ("notify", "answer"),
                 ("answer", END)):
        builder.add_edge(a, b)
    return builder


def call_task(config: RunnableConfig, tool_name: str) -> str:
    """The logical task of one tool call: ``tools-<superstep>.<tool's first word>``
    (stable across attempts; the model's call ids are not, between runs)."""
    return f"tools-{config['metadata']['langgraph_step']}.{tool_name.split('_')[0]}"


class ToolState(TypedDict):
    conversation: str
    messages: Annotated[list[BaseMessage], add_messages]


def message_dict(m: BaseMessage | dict[str, Any]) -> dict[str, Any]:
    """A LangChain message as the transcript's plain dict (no message ids: they are
    fresh per process and carry no meaning; a tool result's JSON content parsed)."""
    if isinstance(m, dict):
        return m
    if isinstance(m, HumanMessage):
        return {"role": "user", "content": m.content}
    if isinstance(m, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            out["tool_calls"] = [{"id": c["id"], "name": c["name"], "arguments": c["args"]} for c in m.tool_calls]
        return out
    if isinstance(m, ToolMessage):
        content: Any = m.content
        if isinstance(content, str) and content[:1] == "{":
            content = json.loads(content)
        return {"role": "tool", "tool_call_id": m.tool_call_id, "name": m.name, "status": m.status, "content": content}
    return {"role": m.type, "content": m.content}


def build_tools(hooks: NodeHooks, flavour: str, send: bool) -> StateGraph:
    """The parallel-tools graph (module docstring): ``send``: one ``ToolNode`` task per
    call (``Send``); else one task for the whole message.

    Given the whole message, ``ToolNode`` runs the calls under one ``asyncio.gather``,
    which raises the interrupt at once and leaves the sibling's task running unowned:
    whether its mail reached the provider before the run stopped was the scheduler's
    timing (two golden runs differed under load). So ``approve_charge`` waits until
    ``notify_warehouse`` has ended in this process before it interrupts: the sibling
    completes, as the issue describes. With ``Send`` it does not wait: after the answer
    LangGraph runs only the interrupted call again, perhaps in another process."""
    sibling_ended: dict[str, asyncio.Event] = {}  # thread id -> notify_warehouse ended here

    def ended(config: RunnableConfig) -> asyncio.Event:
        return sibling_ended.setdefault(config["configurable"]["thread_id"], asyncio.Event())

    async def call_provider(config: RunnableConfig, call_id: str, tool_name: str, name: str,
                            arguments: dict[str, Any]) -> Any:
        logical = call_task(config, tool_name)
        key = effect_key(flavour, config["configurable"]["thread_id"], "tool", call_id)
        token = set_logical_task(logical)
        try:
            hooks.point(TOOL_REQUEST_BEFORE)
            message = await hooks.clients.tool({"id": call_id, "name": name, "arguments": arguments}, key, logical)
            hooks.point(TOOL_REQUEST_AFTER)
        finally:
            reset_logical_task(token)
        return message["content"]

    @tool
    async def notify_warehouse(item: str, to: str, tool_call_id: Annotated[str, InjectedToolCallId],
                               config: RunnableConfig) -> str:
        """Tell the warehouse to reserve ``item`` (a mail)."""
        try:
            sent = await call_provider(config, tool_call_id, "notify_warehouse", "send_receipt",
                                       {"to": to, "subject": f"Reserve {item}", "body": f"Please reserve one {item}."})
        finally:
            ended(config).set()
        return json.dumps(sent, sort_keys=True)

    @tool
    async def approve_charge(amount: int, card: str, tool_call_id: Annotated[str, InjectedToolCallId],
                             config: RunnableConfig) -> str:
        """Ask a person to approve ``amount``; charge ``card`` once approved."""
        if not send:
            await ended(config).wait()
        answer = interrupt({"ask": "approve the charge", "amount": amount})
        kept = record("tools", 1, answer)
        if not answer.get("approved"):
            return json.dumps({**kept, "charge": None}, sort_keys=True)
        charged = await call_provider(config, tool_call_id, "approve_charge", "charge",
                                      {"amount": amount, "currency": "eur", "card": card})
        return json.dumps({**kept, "charge": charged}, sort_keys=True)

    tool_node = ToolNode([notify_warehouse, approve_charge])

    async def agent(state: ToolState, config: RunnableConfig) -> dict[str, Any]:
        with hooks.step(config) as node_id:
            hooks.point(MODEL_CALL_BEFORE)
            message = await hooks.clients.model(node_id, [message_dict(m) for m in state["messages"]])
            hooks.point(MODEL_CALL_AFTER)
        calls = [{"name": c["name"], "args": c["arguments"], "id": c["id"], "type": "tool_call"}
                 for c in message.get("tool_calls", [])]
        return {"messages": [AIMessage(message["content"], tool_calls=calls)]}

    async def tools(payload: Any, config: RunnableConfig) -> Any:
        if isinstance(payload, dict) and payload.get("__type") == "tool_call_with_context":
            with hooks.task_step(call_task(config, payload["tool_call"]["name"])):  # one task per call
                return await tool_node.ainvoke(payload, config)
        with hooks.step(config):
            return await tool_node.ainvoke(payload, config)

    def route(state: ToolState) -> Any:
        calls = state["messages"][-1].tool_calls
        if not calls:
            return END
        if send:
            return [Send("tools", {"__type": "tool_call_with_context", "tool_call": c, "state": state}) for c in calls]
        return "tools"

    builder = StateGraph(ToolState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


class HumanWorkload(FlavouredCheckout):
    """A LangGraph workload with a person in the loop (module docstring): ``shape`` one
    of :data:`SHAPES`, ``flavour`` of the tools' keys; ``operator_script`` the person."""

    providers = ("payment", "mail", "model")
    model_script = SCRIPT

    def __init__(self, shape: str, flavour: str) -> None:
        if shape not in SHAPES:
            raise ValueError(f"shape={shape!r} must be one of {', '.join(SHAPES)}")
        super().__init__(flavour)
        self.shape = shape
        self.name = f"lg-human-{shape}-{flavour}"
        if shape == "sequential":
            self.conversations = ("approve",)
            self.operator_script = OperatorScript((
                Answer("review", 1, {"approved": True, "by": "carol", "amount": AMOUNT}, takes_s=3600),
                Answer("review", 2, {"address": SHIP_TO, "by": "carol"}, takes_s=5400),
            ))
        else:
            self.conversations = ("parallel",)
            self.operator_script = OperatorScript((
                Answer("tools", 1, {"approved": True, "by": "carol"}, takes_s=1800),
            ))

    def run_input(self, conversation: str) -> dict[str, Any]:
        if conversation not in self.conversations:
            raise KeyError(f"conversation={conversation!r} is not one of {', '.join(self.conversations)}")
        request = ("Buy a USB-C dock once I approve it." if self.shape == "sequential"
                   else "Reserve a dock at the warehouse and charge me once I approve.")
        return {"conversation": conversation, "messages": [{"role": "user", "content": request}]}

    def compile(self, api: str, hooks: NodeHooks, checkpointer: BaseCheckpointSaver | None, aio: bool = False) -> Pregel:
        """The graph (``api`` must be ``"graph"``; the nodes are async, so ``aio``)."""
        if api != "graph":
            raise ValueError(f"{self.name} is a StateGraph workload (api='graph'), not {api!r}")
        builder = (build_sequential(hooks, self.flavour) if self.shape == "sequential"
                   else build_tools(hooks, self.flavour, send=self.shape == "send"))
        return builder.compile(checkpointer=checkpointer)

    @staticmethod
    def messages(values: Any) -> list[dict[str, Any]]:
        if isinstance(values, dict):
            return [message_dict(m) for m in values.get("messages") or []]
        return []

    @staticmethod
    def answer(messages: list[dict[str, Any]]) -> str | None:
        return final_answer(messages)


WORKLOADS = {f"{shape}-{flavour}": HumanWorkload(shape, flavour) for shape in SHAPES for flavour in FLAVOURS}
SEQUENTIAL_NAIVE, SEQUENTIAL_KEYED = WORKLOADS["sequential-naive"], WORKLOADS["sequential-keyed"]
WHOLE_NAIVE, WHOLE_KEYED = WORKLOADS["whole-naive"], WORKLOADS["whole-keyed"]
SEND_NAIVE, SEND_KEYED = WORKLOADS["send-naive"], WORKLOADS["send-keyed"]


def _adapter(shape: str, none_recovery: bool) -> type:
    from crashmatrix.harness.adapters.langgraph import LangGraphAioSqliteSyncAdapter

    suffix = "-none" if none_recovery else ""
    name = f"LangGraphHuman{shape.capitalize()}{'None' if none_recovery else ''}Adapter"
    doc = (f"LangGraph (ainvoke, AsyncSqliteSaver, sync durability) on the {shape} person-in-the-loop graph"
           + (", a waiting thread recovered with invoke(None) before the answer." if none_recovery else "."))
    cls = type(name, (LangGraphAioSqliteSyncAdapter,), {
        "__doc__": doc, "name": f"langgraph-human-{shape}{suffix}", "__module__": __name__, "__qualname__": name,
        "none_recovery": none_recovery})
    return cls


SequentialAdapter = _adapter("sequential", False)
SequentialNoneAdapter = _adapter("sequential", True)
WholeAdapter = _adapter("whole", False)
SendAdapter = _adapter("send", False)
