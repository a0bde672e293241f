"""Shared helpers of the walls tests: a scripted in-process model and a read-only tool."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import anyio

from crashmatrix.reference_runtime import ModelReply, ToolCall, ToolContext, ToolOutcome

_ids = itertools.count(1)


@dataclass
class ScriptedModel:
    """``script[node_id]``: a list of (tool, arguments) calls, or the final answer (str)."""

    script: dict[str, Any]
    calls: list[str] = field(default_factory=list)

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        self.calls.append(node_id)
        await anyio.lowlevel.checkpoint()
        step = self.script[node_id]
        if isinstance(step, str):
            return ModelReply(step, [], tokens=7)
        return ModelReply("", [ToolCall(f"call_{next(_ids):012x}", n, a) for n, a in step], tokens=11)


async def lookup(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"sku": args["sku"], "price": 12900})
