"""The ``support_desk`` workload: an order desk's agent with production's shapes.

Checkout (docs/design.md, "The checkout workload") is a short, one-effect-at-a-time run;
the defects runtime authors really make show only on longer runs with more in flight.
This workload is the default's second half: a support agent for Dana, whose
order ``ord-1001`` (a dock) awaits payment and who then wants it swapped for the dock pro
(``ord-1002``). Its shapes, and the class of defect each is there for:

- **a long run**: conversation ``exchange`` has 12 turns of its own and 3 of its
  sub-agent's (33 records); ordering and accounting bugs that need a long log show here;
- **parallel effects in one turn**: ``exchange`` turn 4 charges ``ord-1002``, refunds
  ``ord-1001`` and reads stock and shipping, all four at once. The charge is an
  authorisation the provider holds for :data:`AUTH_DELAY_MS` (a card network's 3-D
  Secure step), so the refund's answer comes first: completion order is not call order.
  A runtime must keep the two effects apart (two keys, two ledger rows, two provider
  rows) and the results in call order;
- **limits a double count trips**: ``Agent.max_tokens`` is the conversation's golden
  usage plus :data:`TOKEN_MARGIN` (a few characters of one reply), and ``max_turns`` is
  exactly its model turns (the sub-agent's included), so a runtime that counts a
  rehydrated record's tokens or turns twice ends ``limit_exceeded``
  (:mod:`crashmatrix.reference_runtime.budgets`);
- **a sub-agent with an effect of its own**: the ``warehouse`` sub-agent
  (:mod:`crashmatrix.reference_runtime.subagents`) checks stock and files a pick ticket
  (a mail), concurrently with the parent's statement export;
- **a blob-sized output that later turns read**: ``export_statement`` returns a
  :data:`STATEMENT_BYTES`-byte statement (over the 4 KB threshold of
  :mod:`crashmatrix.reference_runtime.blobs`) and keeps it on the state (a second
  blob); ``read_statement`` two turns later reads it back from the state, and the
  statement mail quotes its digest;
- **an approval wait**: in ``goodwill`` a credit above the desk's :data:`DESK_LIMIT`
  needs a supervisor; the run stops ``needs_human`` on ``await_approval`` and the
  workload's :data:`operator` (as ``human_pause``'s: a simulated day with a retention
  pass, then the approval) answers;
- **a declined effect beside a succeeded one**: in ``declined`` the parallel turn's
  charge is declined (a definite failure, ledger ``failed``) while the refund beside it
  succeeds; the next turn charges the other card and mails Dana, in parallel.

| conversation | turns (model nodes) | effects (payment / mail) | limits | also |
| --- | --- | --- | --- | --- |
| ``exchange`` | 12 + 3 of the sub-agent | 2 charges, 2 refunds / 4 mails (one the sub-agent's) | tokens, turns | blob read later; a refund of the parallel charge |
| ``declined`` | 5 | 3 charges (one declined), 1 refund / 1 mail | tokens, turns | parallel charge + mail |
| ``goodwill`` | 6 | 1 charge, 1 refund / 2 mails | turns | approval wait; parallel refund + mail |

``goodwill``'s golden run resumes once by design (after the supervisor's decision), so it
has a turn limit only: a tight token limit would make a double-counting subject fail its
golden run, which the harness refuses before any case, instead of failing a named check
in ``exchange`` and ``declined``.

Every value is deterministic (docs/adapters.md, "Determinism"): no clock, no random
draw; the statement holds no identifier, so its digest is the same in every run; the
simulated day moves the run's timestamps, never the wall clock.

Run it: ``crashmatrix run support_desk``; one golden run:
``crashmatrix replay support_desk/exchange/golden``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import anyio

from crashmatrix.reference_runtime.agent import Agent, OutcomeUnknown, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.subagents import SubAgent

from ._workload import ScriptedWorkload, durable_schema
from .checkout import ScriptedModel
from .checkout.script import CARDS, _call, _tool_results
from .checkout.tools import _charge_outcome, probe_charge, probe_mail, probe_refund, refund, send_receipt
from .human_pause import approver, await_approval

NAME = "support_desk"
CUSTOMER = "dana@example.test"
SUPERVISOR = "sam@example.test"
WAREHOUSE = "warehouse@example.test"
ORDER_A, ORDER_B = "ord-1001", "ord-1002"
ORDERS = {
    ORDER_A: {"order": ORDER_A, "sku": "dock-1", "item": "USB-C dock", "amount": 12900},
    ORDER_B: {"order": ORDER_B, "sku": "dock-pro", "item": "USB-C dock pro", "amount": 24900},
}
AUTH_DELAY_MS = 50
"""How long the payment provider holds a charge before it answers (ms, server side): a
refund sent beside it answers first, so a turn's results complete out of call order."""
DELAY_CREDIT = 1500  # minor units: the credit for a late parcel (under the desk's limit)
GOODWILL_CREDIT = 5000  # minor units: above the desk's limit, so a supervisor decides
DESK_LIMIT = 2000
STATEMENT_BYTES = 6000
TOKEN_MARGIN = 5
"""Tokens between a conversation's golden usage and its ``max_tokens`` (tokens are
``len(content) + 10`` per model call, the model provider's rule)."""
GOLDEN_TOKENS = {"exchange": 791, "declined": 358}
"""Tokens a golden run of each conversation bills (``state["budget"]["tokens"]``);
``tests/walls/test_walls_support_desk.py`` pins them against a real golden run."""
MAX_TURNS = {"exchange": 15, "declined": 5, "goodwill": 6}
"""Model nodes of each conversation's golden run, the sub-agent's included."""
SCRIPT = "crashmatrix.scenarios.support_desk:respond"
CHILD_SCRIPT = "crashmatrix.scenarios.support_desk:respond_warehouse"
HISTORY = tuple(f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}  ord-{900 + i}  USB-C cable x{1 + i % 3}  {1900 * (1 + i % 3):>7}"
                for i in range(100))
"""Dana's older statement lines (fixed), which make the statement blob-sized."""


# -- tools ---------------------------------------------------------------------------------


async def _read_only(result: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", result)


async def lookup_customer(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return await _read_only({"customer": args["customer"], "name": "Dana", "tier": "gold", "cards": list(CARDS)})


async def list_orders(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    orders = [{**o, "status": "awaiting payment"} for o in ORDERS.values()]
    return await _read_only({"customer": args["customer"], "orders": orders})


async def check_stock(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return await _read_only({"sku": args["sku"], "in_stock": 7 if args["sku"] == "dock-pro" else 31})


async def quote_shipping(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return await _read_only({"sku": args["sku"], "to": args["to"], "days": 2, "amount": 0})


async def track_parcel(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return await _read_only({"order": args["order"], "status": "delayed", "eta_days": 3})


async def close_case(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    return await _read_only({"case": f"case-{args['order']}", "status": "closed", "notes": args["notes"]})


async def charge_order(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Charge ``amount`` to ``card``; the provider holds the answer :data:`AUTH_DELAY_MS`.
    Probe: checkout's ``probe_charge`` (the provider's stored answer)."""
    from crashmatrix.harness.services.providers import clients

    r = ctx.resources
    try:
        body = await clients.charge(
            r.session, r.urls["payment"], key=ctx.idem_key, amount=args["amount"], currency="eur",
            card=args["card"], run_id=ctx.run_id, worker_id=r.worker_id, delay_ms=AUTH_DELAY_MS, timeout=r.deadline_s,
        )
    except clients.AmbiguousProviderError as exc:
        raise OutcomeUnknown(str(exc)) from exc
    return _charge_outcome(body)


def statement(entries: list[dict[str, Any]]) -> str:
    """Dana's statement: :data:`HISTORY`, then this run's ``entries`` (``{"order", "kind":
    "charge"|"refund", "amount"}``, no identifiers), then the balance; exactly
    :data:`STATEMENT_BYTES` bytes (ASCII)."""
    lines = [f"Statement for {CUSTOMER}", *HISTORY]
    balance = 0
    for e in entries:
        signed = e["amount"] if e["kind"] == "charge" else -e["amount"]
        balance += signed
        lines.append(f"2026-12-01  {e['order']}  {e['kind']:<6}  {signed:>7}")
    text = "\n".join(lines) + "\n"
    tail = f"balance {balance}\n"
    if len(text) + len(tail) > STATEMENT_BYTES:
        raise ValueError(f"statement of {len(entries)} entries needs {len(text) + len(tail)} bytes, more than {STATEMENT_BYTES}")
    return text.ljust(STATEMENT_BYTES - len(tail)) + tail


async def export_statement(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Render the statement (a blob-sized output) and keep it on the state (a blob too)."""
    await anyio.lowlevel.checkpoint()
    text = statement(list(args["entries"]))
    digest = hashlib.sha256(text.encode()).hexdigest()
    ctx.state["statement"] = {"name": "statement.txt", "text": text, "sha256": digest}
    return ToolOutcome("succeeded", {"file": "statement.txt", "bytes": len(text), "sha256": digest, "text": text})


async def read_statement(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Read the statement back from the state (not from the arguments): its size, digest
    (recomputed from the text read), line count and balance."""
    await anyio.lowlevel.checkpoint()
    text = ctx.state["statement"]["text"]
    balance = int(re.findall(r"balance (-?\d+)", text)[-1])
    return ToolOutcome("succeeded", {"bytes": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest(),
                                     "lines": text.count("\n"), "balance": balance})


def _mail(name: str) -> Tool:
    return Tool(name, send_receipt, effect=True, probe=probe_mail)


TOOLS: dict[str, Tool] = {
    "lookup_customer": Tool("lookup_customer", lookup_customer),
    "list_orders": Tool("list_orders", list_orders),
    "check_stock": Tool("check_stock", check_stock),
    "quote_shipping": Tool("quote_shipping", quote_shipping),
    "track_parcel": Tool("track_parcel", track_parcel),
    "close_case": Tool("close_case", close_case),
    "export_statement": Tool("export_statement", export_statement),
    "read_statement": Tool("read_statement", read_statement),
    "charge_order": Tool("charge_order", charge_order, effect=True, probe=probe_charge),
    "refund_order": Tool("refund_order", refund, effect=True, probe=probe_refund),
    "send_mail": _mail("send_mail"),
    "request_approval": _mail("request_approval"),
    "await_approval": Tool("await_approval", await_approval, effect=True),
}


# -- the scripted model (runs in the model provider) ----------------------------------------


def _reply(content: str, *calls: dict[str, Any]) -> dict[str, Any]:
    return {"content": content, "tool_calls": list(calls)}


def _charges(messages: list[dict[str, Any]]) -> tuple[dict[int, str], int]:
    """Succeeded charges as amount -> charge id, and how many were declined."""
    done = _tool_results(messages, "charge_order")
    ok = {m["content"]["amount"]: m["content"]["charge_id"] for m in done if m["status"] == "succeeded"}
    return ok, sum(m["status"] == "failed" for m in done)


def _refunds(messages: list[dict[str, Any]]) -> dict[int, str]:
    """Refunds as amount -> refund id."""
    return {m["content"]["amount"]: m["content"]["refund_id"] for m in _tool_results(messages, "refund_order")}


def _swap(charge_a: str, card: str) -> list[dict[str, Any]]:
    """The parallel turn: charge B, refund A, and two reads, in one reply."""
    b = ORDERS[ORDER_B]
    return [_call("charge_order", order=ORDER_B, amount=b["amount"], card=card),
            _call("refund_order", charge_id=charge_a, amount=ORDERS[ORDER_A]["amount"]),
            _call("check_stock", sku=b["sku"]), _call("quote_shipping", sku=b["sku"], to=CUSTOMER)]


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Dana's support agent: a pure function of the conversation and the transcript."""
    if not _tool_results(messages, "lookup_customer"):
        return _reply("Looking up Dana and her orders.", _call("lookup_customer", customer=CUSTOMER),
                      _call("list_orders", customer=CUSTOMER))
    a, b = ORDERS[ORDER_A], ORDERS[ORDER_B]
    charged, declined = _charges(messages)
    if a["amount"] not in charged:
        return _reply(f"Taking payment for {ORDER_A}.", _call("charge_order", order=ORDER_A, amount=a["amount"], card=CARDS[1]))
    charge_a = charged[a["amount"]]
    if conversation == "goodwill":
        return _goodwill(messages, charge_a)
    if conversation == "exchange" and not _tool_results(messages, "send_mail"):
        return _reply("Confirming the payment.", _call("send_mail", to=CUSTOMER, subject=f"{ORDER_A} is paid",
                                                       body=f"We charged {a['amount']} cents ({charge_a})."))
    refunded = _refunds(messages)
    if a["amount"] not in refunded:
        card = CARDS[0] if conversation == "declined" else CARDS[1]  # the first card declines
        return _reply(f"Swapping {ORDER_A} for {ORDER_B}: charge, refund, stock and shipping at once.", *_swap(charge_a, card))
    if b["amount"] not in charged:  # declined: the other card, and a word to Dana, at once
        return _reply("The first card was declined; using the other one and telling Dana.",
                      _call("charge_order", order=ORDER_B, amount=b["amount"], card=CARDS[1]),
                      _call("send_mail", to=CUSTOMER, subject=f"{ORDER_B}: card declined",
                            body=f"Your card ending {CARDS[0][-4:]} was declined; we used the one ending {CARDS[1][-4:]}."))
    charge_b = charged[b["amount"]]
    if conversation == "declined":
        return _reply(f"Done: {ORDER_A} refunded ({refunded[a['amount']]}), {ORDER_B} charged ({charge_b}) after "
                      f"{declined} declined card.")
    return _exchange(messages, charge_b, refunded)


def _exchange(messages: list[dict[str, Any]], charge_b: str, refunded: dict[int, str]) -> dict[str, Any]:
    """``exchange`` from turn 5: the sub-agent and the statement, the parcel, a credit."""
    a, b = ORDERS[ORDER_A], ORDERS[ORDER_B]
    tickets = _tool_results(messages, "warehouse")
    if not tickets:
        entries = [{"order": ORDER_A, "kind": "charge", "amount": a["amount"]},
                   {"order": ORDER_A, "kind": "refund", "amount": a["amount"]},
                   {"order": ORDER_B, "kind": "charge", "amount": b["amount"]}]
        return _reply("Asking the warehouse to swap the parcels; exporting Dana's statement.",
                      _call("warehouse", task=f"Ship {ORDER_B} ({b['sku']}) to {CUSTOMER} and stop {ORDER_A} ({a['sku']})."),
                      _call("export_statement", customer=CUSTOMER, entries=entries))
    read = _tool_results(messages, "read_statement")
    if not read:
        return _reply("Reading the statement back.", _call("read_statement"))
    mails = _tool_results(messages, "send_mail")
    st = read[0]["content"]
    if len(mails) < 2:
        return _reply("Mailing Dana her statement.", _call(
            "send_mail", to=CUSTOMER, subject="Your statement",
            body=f"{st['lines']} lines, balance {st['balance']} cents, sha256 {st['sha256'][:16]}."))
    parcels = _tool_results(messages, "track_parcel")
    if not parcels:
        return _reply(f"Tracking {ORDER_B}.", _call("track_parcel", order=ORDER_B))
    if DELAY_CREDIT not in refunded:
        return _reply("The parcel is late: a credit on the new charge.",
                      _call("refund_order", charge_id=charge_b, amount=DELAY_CREDIT))
    if len(mails) < 3:
        return _reply("Telling Dana about the credit.", _call(
            "send_mail", to=CUSTOMER, subject=f"{ORDER_B} is late",
            body=f"It arrives in {parcels[0]['content']['eta_days']} days; we refunded {DELAY_CREDIT} cents "
                 f"({refunded[DELAY_CREDIT]})."))
    cases = _tool_results(messages, "close_case")
    if not cases:
        return _reply("Closing the case.", _call("close_case", order=ORDER_B, notes=tickets[0]["content"]["answer"]))
    return _reply(f"Done: {ORDER_A} refunded, {ORDER_B} charged ({charge_b}) and shipping; credit "
                  f"{refunded[DELAY_CREDIT]}; {cases[0]['content']['case']} closed.")


def _goodwill(messages: list[dict[str, Any]], charge_a: str) -> dict[str, Any]:
    """``goodwill`` from turn 3: the approval request, the wait, then refund and mail."""
    requests = _tool_results(messages, "request_approval")
    if not requests:
        return _reply(f"A {GOODWILL_CREDIT}-cent credit is above the desk's limit: asking the supervisor.", _call(
            "request_approval", to=SUPERVISOR, subject=f"Approval: credit on {ORDER_A}",
            body=f"Please approve a {GOODWILL_CREDIT}-cent credit on {charge_a} for Dana."))
    approvals = _tool_results(messages, "await_approval")
    if not approvals:
        return _reply("Waiting for the supervisor.", _call(
            "await_approval", request_id=requests[0]["content"]["message_id"], amount=GOODWILL_CREDIT))
    refunded = _refunds(messages)
    decision = approvals[0]["content"]
    if GOODWILL_CREDIT not in refunded:
        return _reply(f"Approved by {decision['by']}: crediting and telling Dana at once.",
                      _call("refund_order", charge_id=charge_a, amount=GOODWILL_CREDIT),
                      _call("send_mail", to=CUSTOMER, subject="A credit for the trouble",
                            body=f"We are refunding {GOODWILL_CREDIT} cents of {charge_a}."),
                      _call("lookup_customer", customer=CUSTOMER))
    return _reply(f"Done: credit {refunded[GOODWILL_CREDIT]} approved by {decision['by']} after "
                  f"{decision['waited_days']} day(s).")


def respond_warehouse(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The warehouse sub-agent (its transcript is its own scope's: the task, its tools)."""
    stock = _tool_results(messages, "check_stock")
    if not stock:
        return _reply("Checking stock of the dock pro.", _call("check_stock", sku=ORDERS[ORDER_B]["sku"]))
    tickets = _tool_results(messages, "file_pick_ticket")
    if not tickets:
        return _reply("Filing the pick ticket.", _call(
            "file_pick_ticket", to=WAREHOUSE, subject=f"Pick {ORDER_B}, stop {ORDER_A}",
            body=f"Ship {ORDER_B} to {CUSTOMER} ({stock[0]['content']['in_stock']} in stock); stop {ORDER_A}."))
    return _reply(f"Ticket {tickets[0]['content']['message_id']} filed; {ORDER_B} ships, {ORDER_A} stopped.")


# -- the workload ---------------------------------------------------------------------------


operator = approver(NAME, SUPERVISOR, days=1)
"""The supervisor (``goodwill``): a simulated day with a retention pass, then approval."""


class SupportDeskWorkload(ScriptedWorkload):
    """See the module docstring. Providers: payment, mail, model; ``operator`` is the
    supervisor who answers the approval wait."""

    name = NAME
    conversations = ("exchange", "declined", "goodwill")
    providers = ("payment", "mail", "model")
    request = (f"Hi, this is {CUSTOMER}. Please take payment for {ORDER_A}, then swap it for {ORDER_B}; "
               "send me my statement, and sort out anything that goes wrong.")
    operator = staticmethod(operator)

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        """The desk's agent for ``conversation`` with its limits (module docstring)."""
        self.check_conversation(conversation)
        warehouse = Agent("warehouse", ScriptedModel(resources, CHILD_SCRIPT), {
            "check_stock": Tool("check_stock", check_stock),
            "file_pick_ticket": _mail("file_pick_ticket"),
        }, resources=resources)
        tokens = GOLDEN_TOKENS.get(conversation)
        return Agent(self.name, ScriptedModel(resources, SCRIPT), {**TOOLS, "warehouse": SubAgent("warehouse", warehouse)},
                     resources=resources, max_turns=MAX_TURNS[conversation],
                     max_tokens=None if tokens is None else tokens + TOKEN_MARGIN,
                     state_schema=durable_schema(NAME, "statement"))


WORKLOAD = SupportDeskWorkload()
