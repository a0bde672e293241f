"""A runtime that replaces the model's tool-call ids with ids of its own, derived from
the node (``tc.<node>.<i>``, as Temporal-style runtimes name activities), before it
records the reply, and keys effects by them: correct (the ids are stable across
attempts because they are made from the recorded node, not from the call), yet no id
the model provider minted appears in its record. Found by a blind trial: the
``model.answers_recorded`` invariant then looked for the provider's ids only and failed
every golden run (docs/checks.md)."""

from __future__ import annotations

import hashlib
from typing import Any

from crashmatrix.reference_runtime.agent import ModelReply, ToolCall
from crashmatrix.reference_runtime.executor import Execution

from .keys import KeyAdapter


class OwnCallIdExecution(Execution):
    async def call_model(self, node_id: str, messages: list[dict[str, Any]]) -> Any:
        reply = await super().call_model(node_id, messages)
        calls = [ToolCall(f"tc.{node_id}.{i}", c.name, c.arguments) for i, c in enumerate(reply.tool_calls)]
        return ModelReply(reply.content, calls, reply.tokens)

    def effect_key(self, call: dict[str, Any]) -> str:
        return hashlib.sha256(f"{self.graph.run_id}/{call['id']}".encode()).hexdigest()


class OwnCallIdAdapter(KeyAdapter):
    """Tool-call ids of its own (``tc.<node>.<i>``); keys sha256(run id, that id)."""

    name = "team-own-call-ids"
    execution = OwnCallIdExecution
