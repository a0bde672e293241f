"""The scripted model of the ticketing workload (runs inside the model provider).

:func:`respond` is the model-script contract (docs/adapters.md, "Model scripts"): given
the conversation name and the transcript so far it returns the next reply, a pure
function of its input. It imports nothing but the standard library, so the model
provider's process loads it in a millisecond.

``conv1``: look the order up, open one ticket in the ``returns`` queue, answer with
its id. ``conv2``: look the order up, open two tickets at once (``returns`` and
``billing``), answer with both ids.
"""

from __future__ import annotations

from typing import Any

ORDER = "1042"
TICKETS = {
    "returns": ("Broken USB-C dock, order 1042", "The dock arrived with a cracked case; the customer wants a replacement."),
    "billing": ("No receipt for order 1042", "The customer was charged but received no receipt mail."),
}
QUEUES = {"conv1": ("returns",), "conv2": ("returns", "billing")}


def _results(messages: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") == "tool" and m.get("name") == name]


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Next reply: ``{"content": str, "tool_calls": [{"name", "arguments"}]}``."""
    if not _results(messages, "lookup_order"):
        return {"content": f"Looking up order {ORDER}.",
                "tool_calls": [{"name": "lookup_order", "arguments": {"order": ORDER}}]}
    opened = _results(messages, "open_ticket")
    if not opened:
        calls = [{"name": "open_ticket", "arguments": {"queue": q, "subject": TICKETS[q][0], "body": TICKETS[q][1],
                                                       "order": ORDER}} for q in QUEUES[conversation]]
        return {"content": f"Opening {len(calls)} ticket(s).", "tool_calls": calls}
    ids = ", ".join(str(m["content"].get("ticket_id")) for m in opened)
    return {"content": f"Opened for order {ORDER}: {ids}.", "tool_calls": []}
