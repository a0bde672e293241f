"""The checkout workload (docs/design.md, "The checkout workload"): an eleven-step purchase agent in four
conversations, against payment, mail and model providers in their own processes.

``WORKLOAD`` is what the registry hands out: conversations, the providers to start, the
run input of each conversation, and :meth:`CheckoutWorkload.build_agent` for the
reference runtime.
"""

from __future__ import annotations

from typing import Any

from crashmatrix.reference_runtime.agent import Agent, ModelReply, ToolCall, TransientFailure

from .tools import TOOLS, Resources

SCRIPT = "crashmatrix.scenarios.checkout.script:respond"

_REQUESTS = {
    "conv1": "Buy a USB-C dock.",
    "conv2": "Buy a USB-C dock; try my first card, then the second.",
    "conv3": "Buy a USB-C dock, then refund it.",
    "conv4": "Compare two catalogues and buy the dock pro.",
}


class ScriptedModel:
    """The model client: calls the model provider, which bills every call and answers
    with ``script`` (``"package.module:function"``, run inside the provider; other
    workloads pass their own). A broken, timed-out or 5xx call raises
    :class:`TransientFailure` (the runtime calls again)."""

    def __init__(self, resources: Resources, script: str = SCRIPT) -> None:
        self.r = resources
        self.script = script

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        from crashmatrix.harness.services.providers import clients

        try:
            body = await clients.complete(
                self.r.session, self.r.urls["model"], script=self.script, conversation=self.r.conversation,
                node_id=node_id, messages=messages, run_id=run_id, worker_id=self.r.worker_id,
                timeout=self.r.deadline_s,
            )
        except (clients.AmbiguousProviderError, clients.ProviderUnreachableError) as exc:
            raise TransientFailure(str(exc)) from exc  # a model call changes nothing: call again
        calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in body["tool_calls"]]
        return ModelReply(body["content"], calls, int(body["usage"]["tokens"]))


class CheckoutWorkload:
    name = "checkout"
    conversations = ("conv1", "conv2", "conv3", "conv4")
    providers = ("payment", "mail", "model")

    def run_input(self, conversation: str) -> dict[str, Any]:
        if conversation not in _REQUESTS:
            raise KeyError(f"conversation={conversation!r} is not one of {', '.join(self.conversations)}")
        return {"conversation": conversation, "messages": [{"role": "user", "content": _REQUESTS[conversation]}]}

    def build_agent(self, conversation: str, resources: Resources) -> Agent:
        return Agent(name=self.name, model=ScriptedModel(resources), tools=dict(TOOLS), resources=resources)


WORKLOAD = CheckoutWorkload()
