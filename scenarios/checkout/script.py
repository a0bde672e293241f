"""The scripted model of the checkout workload (docs/design.md, "The checkout workload").

:func:`respond` runs inside the model provider's process: given the conversation name
and the transcript so far, it returns the next reply. It is a pure function of its
input, so the golden run is deterministic; the provider adds a fresh id to every tool
call, as real models do.

Flow of ``conv1`` (eleven steps): plan -> search -> choose -> fetch_doc -> price -> quote
-> pay -> charge -> confirm -> send_receipt -> answer. ``conv2``: the first card is
declined, the model pays with the second. ``conv3``: purchase, receipt, then a refund in
the same run. ``conv4``: two searches in parallel and a ~200 KB document.
"""

from __future__ import annotations

from typing import Any

CARDS = ("4000-0000-0000-0002", "4242-4242-4242-4242")  # the first declines
CUSTOMER = "customer@example.test"


def _tool_results(messages: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") == "tool" and m.get("name") == name]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Next reply: ``{"content": str, "tool_calls": [{"name", "arguments"}]}``."""
    searches = _tool_results(messages, "search")
    if not searches:
        if conversation == "conv4":
            return {"content": "Searching two catalogues.", "tool_calls": [
                _call("search", query="usb-c dock", catalogue="main"),
                _call("search", query="usb-c dock", catalogue="outlet"),
            ]}
        return {"content": "Searching the catalogue.", "tool_calls": [_call("search", query="usb-c dock", catalogue="main")]}
    sku = searches[0]["content"]["results"][0]["sku"]
    if conversation == "conv4":
        sku = "dock-pro"  # the product with the large spec sheet
    if not _tool_results(messages, "fetch_doc"):
        return {"content": f"Reading the spec sheet of {sku}.", "tool_calls": [_call("fetch_doc", sku=sku)]}
    quotes = _tool_results(messages, "quote")
    if not quotes:
        return {"content": "Asking for a price.", "tool_calls": [_call("quote", sku=sku, qty=1)]}
    total = quotes[0]["content"]["total"]
    charges = _tool_results(messages, "charge")
    wanted_card = CARDS[0] if conversation == "conv2" else CARDS[1]
    if not charges:
        return {"content": f"Paying {total} cents.", "tool_calls": [_call("charge", amount=total, currency="eur", card=wanted_card)]}
    last = charges[-1]
    if last["status"] == "failed":
        if len(charges) >= len(CARDS):
            return {"content": "Every card was declined.", "tool_calls": []}
        return {"content": "The card was declined; trying the second card.",
                "tool_calls": [_call("charge", amount=total, currency="eur", card=CARDS[len(charges)])]}
    charge_id = last["content"]["charge_id"]
    if not _tool_results(messages, "send_receipt"):
        return {"content": "Sending the receipt.", "tool_calls": [_call(
            "send_receipt", to=CUSTOMER, subject=f"Receipt for {sku}", body=f"Charged {total} cents ({charge_id}).")]}
    if conversation == "conv3" and not _tool_results(messages, "refund"):
        return {"content": "Refunding as requested.", "tool_calls": [_call("refund", charge_id=charge_id, amount=total)]}
    done = "bought and refunded" if conversation == "conv3" else "bought"
    return {"content": f"Done: {sku} {done} for {total} cents, charge {charge_id}; receipt sent.", "tool_calls": []}
