"""What the LangGraph and DBOS checkout workloads share: input, model, tools, key flavours.

The model is the checkout workload's scripted model (``scenarios/checkout/script.py``),
run inside the model provider, which bills every call to ``(run_id, node_id)``. The
tools are the checkout tools (``scenarios/checkout/tools.py``): read-only ``search``,
``fetch_doc``, ``quote``; effects ``charge``, ``refund``, ``send_receipt`` against the
payment and mail providers, which deduplicate on the idempotency key. So the oracle's
provider-ledger and model-billing checks apply unchanged.

Messages are plain JSON dicts, the shapes the script reads::

    {"role": "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments"}]}
    {"role": "tool", "tool_call_id": str, "name": str, "status": str, "content": dict}

**Tool flavours** (:data:`FLAVOURS`):

- ``naive``: every attempt of an effect sends a fresh key (``sha256`` of a random
  UUID). A step the runtime re-executes repeats the effect at the provider.
- ``keyed``: the key is ``sha256`` of the runtime's stable ids for that effect (LangGraph:
  thread id, node, superstep, call index; DBOS: workflow id and step id). A re-executed
  step sends the same key; the provider answers the first result again.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from crashmatrix.reference_runtime.agent import OutcomeUnknown, ToolContext
from crashmatrix.scenarios.checkout import SCRIPT
from crashmatrix.scenarios.checkout import WORKLOAD as CHECKOUT
from crashmatrix.scenarios.checkout.tools import TOOLS, Resources
from crashmatrix.harness.services.providers import clients

FLAVOURS = ("naive", "keyed")
CONVERSATIONS = CHECKOUT.conversations
PROVIDERS = ("payment", "mail", "model")


def effect_key(flavour: str, *stable_ids: object) -> str:
    """The idempotency key an effect is sent with. ``naive``: fresh per attempt;
    ``keyed``: ``sha256("id1:id2:...")`` of the runtime's stable ids."""
    if flavour == "naive":
        return hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    if flavour == "keyed":
        if not stable_ids:
            raise ValueError("a keyed effect needs the runtime's stable ids")
        return hashlib.sha256(":".join(str(p) for p in stable_ids).encode()).hexdigest()
    raise ValueError(f"flavour={flavour!r} must be one of {', '.join(FLAVOURS)}")


def run_input(conversation: str) -> dict[str, Any]:
    """The run's input: the conversation name and the user's request."""
    return CHECKOUT.run_input(conversation)


def final_answer(messages: list[dict[str, Any]]) -> str | None:
    """The run's answer: the content of the last assistant message when it has no tool
    calls (the model ended the run), else None."""
    if messages and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls"):
        return str(messages[-1].get("content"))
    return None


class FlavouredCheckout:
    """The checkout workload of one tool flavour (``naive`` or ``keyed``): what every
    runtime's workload class shares (conversations, providers, the run input, its name
    ``<prefix>-<flavour>``). Raises ``ValueError`` for an unknown flavour."""

    conversations = CONVERSATIONS
    providers = PROVIDERS
    prefix = "checkout"

    def __init__(self, flavour: str) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour={flavour!r} must be one of {', '.join(FLAVOURS)}")
        self.flavour = flavour
        self.name = f"{self.prefix}-{flavour}"

    def run_input(self, conversation: str) -> dict[str, Any]:
        return run_input(conversation)

    def clients(self, session: aiohttp.ClientSession, urls: dict[str, str], worker_id: str, conversation: str,
                run_id: str) -> Clients:
        """One worker's :class:`Clients` (how the harness's adapters reach this
        workload's model and tools without importing it)."""
        return Clients(session, urls, worker_id, conversation, run_id)

    def step_hooks(self, session: aiohttp.ClientSession, urls: dict[str, str], worker_id: str,
                   step: Callable[[str, str], None], point: Callable[[str], None],
                   set_task: Callable[[str], None]) -> StepHooks:
        """The :class:`StepHooks` one worker hands this workload's step code: the
        providers' clients on ``session`` (:meth:`clients`), and the adapter's step
        boundary, label and logical-task setter."""
        return StepHooks(clients=lambda conversation, run_id: self.clients(session, urls, worker_id, conversation, run_id),
                         step=step, point=point, set_task=set_task)

    @staticmethod
    def answer(messages: list[dict[str, Any]]) -> str | None:
        """:func:`final_answer` (what an adapter's ``observe`` reports as the answer)."""
        return final_answer(messages)

    @staticmethod
    def step_order(step_id: str) -> tuple[int, int, int]:
        """:func:`step_order`: the sort key of the loop's step ids."""
        return step_order(step_id)


@dataclass
class Clients:
    """One worker's access to the providers (the HTTP session is the caller's)."""

    session: aiohttp.ClientSession
    urls: dict[str, str]
    worker_id: str
    conversation: str
    run_id: str
    #: the model script the provider answers with (``module:function``)
    script: str = SCRIPT

    async def model(self, node_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One billed model turn for ``node_id``; returns the assistant message."""
        body = await clients.complete(
            self.session, self.urls["model"], script=self.script, conversation=self.conversation,
            node_id=node_id, messages=messages, run_id=self.run_id, worker_id=self.worker_id,
        )
        message: dict[str, Any] = {"role": "assistant", "content": body["content"]}
        calls = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in body["tool_calls"]]
        if calls:
            message["tool_calls"] = calls
        return message

    async def tool(self, call: dict[str, Any], key: str, node_id: str) -> dict[str, Any]:
        """Run one tool call (effects with idempotency key ``key``); returns the tool
        message. An ambiguous provider answer raises :class:`OutcomeUnknown`."""
        tool = TOOLS.get(call["name"])
        if tool is None:
            raise RuntimeError(f"{node_id}: model called unknown tool {call['name']!r}")
        resources = Resources(self.session, self.urls, self.worker_id, self.conversation)
        ctx = ToolContext(self.run_id, node_id, key if tool.effect else None, resources)
        outcome = await tool.fn(ctx, call["arguments"])
        return {"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                "status": outcome.status, "content": outcome.result}


@dataclass
class StepHooks:
    """What a workload's step code gets from its adapter in a worker (workloads whose
    runtime builds its steps per worker: Restate, Absurd): ``clients(conversation,
    run_id)`` (the providers), ``step(phase, step_id)`` (the harness's step boundary),
    ``point(name)`` (a label) and ``set_task(step_id)`` (the logical task); ``step`` and
    ``point`` run under the adapter's point lock."""

    clients: Callable[[str, str], Clients]
    step: Callable[[str, str], None]
    point: Callable[[str], None]
    set_task: Callable[[str], None]


MAX_TURNS = 20

#: ``durable(step_id, label, action)``: run ``action`` as the runtime's durable step
#: ``step_id`` (``label``: ``"model.call"`` or ``"tool.request"``) and return its output
DurableStep = Callable[[str, str, Callable[[], Awaitable[dict[str, Any]]]], Awaitable[dict[str, Any]]]


async def checkout_loop(run_input_: dict[str, Any], clients: Clients, flavour: str, run_key: str,
                        durable: DurableStep, max_turns: int = MAX_TURNS) -> dict[str, Any]:
    """The checkout agent's loop on a runtime's durable steps: model turn ``model-N``,
    then one step ``tool-N.i`` per tool call (effects keyed by
    :func:`effect_key` of ``run_key`` and the step id), until a turn asks for no tool.
    Returns ``{"answer": ...}``; raises ``RuntimeError`` after ``max_turns`` turns."""
    messages = list(run_input_["messages"])
    for turn in range(1, max_turns + 1):
        step = f"model-{turn}"
        sent = list(messages)
        message = await durable(step, "model.call", lambda step=step, sent=sent: clients.model(step, sent))
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return {"answer": message["content"]}
        for i, call in enumerate(calls):
            step = f"tool-{turn}.{i}"
            key = effect_key(flavour, run_key, step)
            messages.append(await durable(step, "tool.request",
                                          lambda step=step, call=call, key=key: clients.tool(call, key, step)))
    raise RuntimeError(f"checkout did not end within {max_turns} model turns")


def step_order(step_id: str) -> tuple[int, int, int]:
    """Sort key of the loop's step ids: ``model-N`` before ``tool-N.i``, by turn."""
    kind, _, rest = step_id.partition("-")
    turn, _, index = rest.partition(".")
    return (int(turn or 0), 0 if kind == "model" else 1, int(index or 0))


def is_effect(call: dict[str, Any]) -> bool:
    tool = TOOLS.get(call["name"])
    return bool(tool and tool.effect)


__all__ = ["FLAVOURS", "CONVERSATIONS", "PROVIDERS", "Clients", "OutcomeUnknown", "StepHooks", "checkout_loop", "effect_key",
           "final_answer", "is_effect", "run_input", "step_order"]
