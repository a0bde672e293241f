"""The scripted model of the person-in-the-loop workloads
(:mod:`.langgraph_human`); it runs inside the model provider. A pure function of the
conversation and the transcript (messages as plain dicts, the shapes of
:mod:`.common`), so golden runs are deterministic.

- ``approve`` (two sequential interrupts): turn 1 plans the purchase (no tool call: the
  graph asks the person, then pays and mails); turn 2 sums up.
- ``parallel`` (parallel tools, one interrupts): turn 1 asks for two tool calls at once,
  ``notify_warehouse`` (a mail) and ``approve_charge`` (a person approves, then the card is
  charged); turn 2 sums up.
"""

from __future__ import annotations

import json
from typing import Any

AMOUNT = 12900
CARD = "4242-4242-4242-4242"
WAREHOUSE = "warehouse@example.test"


def _content(message: dict[str, Any]) -> Any:
    content = message.get("content")
    if isinstance(content, str) and content[:1] == "{":
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Next reply: ``{"content": str, "tool_calls": [{"name", "arguments"}]}``."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    if not assistant:
        if conversation == "parallel":
            return {"content": "Telling the warehouse and asking for the approval at once.", "tool_calls": [
                {"name": "notify_warehouse", "arguments": {"item": "dock-1", "to": WAREHOUSE}},
                {"name": "approve_charge", "arguments": {"amount": AMOUNT, "card": CARD}},
            ]}
        return {"content": f"Plan: buy dock-1 for {AMOUNT} cents once it is approved and the address confirmed.",
                "tool_calls": []}
    tools = [_content(m) for m in messages if m.get("role") == "tool"]
    charge_ids = sorted(str(t.get("charge", t).get("charge_id")) for t in tools
                        if isinstance(t, dict) and isinstance(t.get("charge", t), dict) and t.get("charge", t).get("charge_id"))
    return {"content": f"Done: charged {', '.join(charge_ids) or 'nothing'}.", "tool_calls": []}
