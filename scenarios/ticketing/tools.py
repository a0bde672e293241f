"""The ticketing workload's tools: a read-only order look-up and ``open_ticket``, which
calls the team-declared ticketing service (:data:`TICKETS`) with the runtime's
idempotency key in the ``Idempotency-Key`` header, and its probe, which reads the
service's status route by key.

The tools use only the harness's provider client API
(:func:`~crashmatrix.harness.services.providers.clients.request_effect` and
:func:`~crashmatrix.harness.services.providers.clients.get_status`) and the per-worker
:class:`~crashmatrix.harness.services.providers.clients.Resources` the reference
adapter hands ``build_agent`` (docs/adapters.md, "The provider client API").
"""

from __future__ import annotations

from typing import Any

import anyio

from crashmatrix.harness.services.providers import EffectRoute, ServiceSpec, clients
from crashmatrix.reference_runtime.agent import OutcomeUnknown, ProbeOutcome, Tool, ToolContext, ToolOutcome

TICKETS = ServiceSpec("ticketing", routes=(
    EffectRoute(
        "POST", "/v2/tickets", op="ticket",
        key="header:Idempotency-Key",                    # where the idempotency key travels
        same_effect=("queue", "subject", "body", "order"),  # a key reused with other values: 409
        answer={"state": "open", "priority": "normal"},  # the canned answer, plus the fields above
        id_field="ticket_id", id_prefix="TCK-",          # ticket_id = "TCK-" + sha256(key)
        http_status=201,
        status_path="/v2/tickets/by-key/{key}",          # what the probe reads
    ),
))
"""The ticketing service this workload declares (a help desk's "create ticket" API)."""

ORDERS = {"1042": {"order": "1042", "item": "USB-C dock", "customer": "customer@example.test", "paid": 12900}}


async def lookup_order(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    order = ORDERS.get(args["order"])
    return ToolOutcome("succeeded", order) if order else ToolOutcome("failed", {"error": "no such order"})


async def open_ticket(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Open one ticket, once per ``ctx.idem_key``; an answer that may or may not have
    been applied raises :class:`OutcomeUnknown` (the runtime then asks the probe)."""
    r: clients.Resources = ctx.resources
    assert ctx.idem_key is not None
    body = {name: args[name] for name in ("queue", "subject", "body", "order")}
    body["metadata"] = {"run_id": ctx.run_id}
    try:
        answer = await clients.request_effect(
            r.session, r.urls[TICKETS.name], "/v2/tickets", body, headers={"Idempotency-Key": ctx.idem_key},
            worker_id=r.worker_id, timeout=r.deadline_s)
    except clients.AmbiguousProviderError as exc:
        raise OutcomeUnknown(str(exc)) from exc
    return ToolOutcome("succeeded", answer)


async def probe_ticket(ctx: ToolContext) -> ProbeOutcome:
    """Was the ticket with key ``ctx.idem_key`` opened? Applied with the original answer,
    not applied, ``cannot_tell_yet`` when the service could not be asked (a broken link,
    a timeout, a 5xx), ``cannot_tell`` when its answer does not decide. Never raises."""
    r: clients.Resources = ctx.resources
    assert ctx.idem_key is not None
    answer = await clients.get_status(r.session, r.urls[TICKETS.name], TICKETS.route("ticket").status_path or "",
                                      ctx.idem_key, timeout=r.probe_bound_s)
    if answer.outcome == "applied":
        return ProbeOutcome("applied", ToolOutcome("succeeded", answer.result))
    if answer.outcome == "not_applied":
        return ProbeOutcome("not_applied")
    return ProbeOutcome("cannot_tell_yet" if answer.transient else "cannot_tell")


OPEN_TICKET = Tool("open_ticket", open_ticket, effect=True, probe=probe_ticket)
TOOLS: dict[str, Tool] = {"lookup_order": Tool("lookup_order", lookup_order), "open_ticket": OPEN_TICKET}
