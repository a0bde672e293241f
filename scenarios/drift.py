"""The ``drift`` workload: a tool puts a live client on the run's state.

Schema drift as it happens in practice: someone adds ``state["inventory"] = client`` to a
tool so the next tool can reuse the connection. The state codec
(:mod:`crashmatrix.reference_runtime.state_codec`) must refuse it **at write time, naming
the field** (conversation ``drift``: the run ends ``failed`` with
``UnknownStateField: ... 'inventory' ...`` and the tool node is never recorded), and
declaring the field transient with a factory must fix it (conversation ``fixed``: the
client is never written, the next load rebuilds it, the cart survives every crash; its
matrix is green).

Flow: ``open_inventory`` (sets ``inventory``, a live client, and ``cart``) ->
``reserve`` (uses both: the client must be alive, the cart must be the one written) ->
answer. Read-only tools; only the model provider is needed.

Run it: ``crashmatrix run crashmatrix.scenarios.drift:WORKLOAD --conversation fixed``.
"""

from __future__ import annotations

from typing import Any

import anyio

from crashmatrix.reference_runtime.agent import Agent, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.state_codec import StateSchema

from .checkout import ScriptedModel

SCRIPT = "crashmatrix.scenarios.drift:respond"


class InventoryClient:
    """A live client: wraps the worker's HTTP session. Not data; must never be written."""

    def __init__(self, resources: Any) -> None:
        self.session = getattr(resources, "session", None)

    def alive(self) -> bool:
        return self.session is not None and not self.session.closed


async def open_inventory(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    ctx.state["inventory"] = InventoryClient(ctx.resources)
    ctx.state["cart"] = [{"sku": args["sku"], "qty": 1}]
    return ToolOutcome("succeeded", {"opened": True})


async def reserve(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    client = ctx.state.get("inventory")
    if not isinstance(client, InventoryClient) or not client.alive():
        return ToolOutcome("failed", {"error": "no live inventory client on the state"})
    return ToolOutcome("succeeded", {"reserved": ctx.state["cart"]})


TOOLS = {"open_inventory": Tool("open_inventory", open_inventory), "reserve": Tool("reserve", reserve)}


def schema(declare_transient: bool) -> StateSchema:
    """``cart`` is durable; ``inventory`` is declared transient only when asked (the fix)."""
    s = StateSchema("drift", version=1)
    s.field("cart")
    if declare_transient:
        s.transient("inventory", InventoryClient)
    return s


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The scripted model (runs in the model provider)."""
    tools = [m for m in messages if m.get("role") == "tool"]
    if not tools:
        return {"content": "Opening the inventory.", "tool_calls": [{"name": "open_inventory", "arguments": {"sku": "dock-1"}}]}
    if len(tools) == 1:
        return {"content": "Reserving the cart.", "tool_calls": [{"name": "reserve", "arguments": {}}]}
    return {"content": f"Reserved: {tools[-1]['content']}", "tool_calls": []}


class DriftWorkload:
    """``conversations`` lists what a matrix runs by default: ``fixed`` only, since the
    ``drift`` conversation's golden run ends ``failed`` on purpose (run it in process:
    tests/walls/test_walls_drift.py)."""

    name = "drift"
    conversations = ("fixed",)
    all_conversations = ("fixed", "drift")
    providers = ("model",)

    def run_input(self, conversation: str) -> dict[str, Any]:
        if conversation not in self.all_conversations:
            raise KeyError(f"conversation={conversation!r} is not one of {', '.join(self.all_conversations)}")
        return {"conversation": conversation, "messages": [{"role": "user", "content": "Reserve a dock."}]}

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        return Agent(name=self.name, model=_Model(resources), tools=dict(TOOLS),
                     resources=resources, state_schema=schema(declare_transient=conversation == "fixed"))


class _Model(ScriptedModel):
    """The checkout model client with this workload's script."""

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> Any:
        from crashmatrix.reference_runtime.agent import ModelReply, ToolCall
        from crashmatrix.harness.services.providers import clients

        body = await clients.complete(
            self.r.session, self.r.urls["model"], script=SCRIPT, conversation=self.r.conversation,
            node_id=node_id, messages=messages, run_id=run_id, worker_id=self.r.worker_id,
        )
        calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in body["tool_calls"]]
        return ModelReply(body["content"], calls, int(body["usage"]["tokens"]))


WORKLOAD = DriftWorkload()
