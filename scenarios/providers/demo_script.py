"""Tiny model scripts for the model provider's own tests and for manual use.

A script is ``function(conversation: str, messages: list) -> {"content": str,
"tool_calls": [{"name": str, "arguments": dict}]}``, named by its importable name, e.g.
``"crashmatrix.scenarios.providers.demo_script:echo"``. Scripts must be deterministic:
the same conversation and messages give the same answer (the provider, not the script,
adds the fresh tool-call ids).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["echo", "echo_async", "boom", "malformed"]


def echo(conversation: str, messages: list[Any]) -> dict[str, Any]:
    """Answer with the turn number and the last message; ask for one ``lookup`` tool call
    while fewer than 3 messages have been exchanged, none afterwards."""
    last = messages[-1] if messages else None
    text = last.get("content", "") if isinstance(last, dict) else str(last or "")
    turn = len(messages)
    calls = [{"name": "lookup", "arguments": {"turn": turn}}] if turn < 3 else []
    return {"content": f"[{conversation}] turn {turn}: {text}", "tool_calls": calls}


async def echo_async(conversation: str, messages: list[Any]) -> dict[str, Any]:
    """:func:`echo`, as a coroutine function (scripts may be async)."""
    await asyncio.sleep(0)
    return echo(conversation, messages)


def boom(conversation: str, messages: list[Any]) -> dict[str, Any]:
    """Always raises: the provider answers 500 and bills nothing."""
    raise RuntimeError(f"boom in {conversation}")


def malformed(conversation: str, messages: list[Any]) -> Any:
    """Returns a wrong shape: the provider answers 500 and bills nothing."""
    return {"content": 42}
