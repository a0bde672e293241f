"""Probe certification examples (docs/probes.md): sandboxes, ground truths, the payment
probe that certifies, three wrong probes that do not, a document store with a
read-back probe, and the ticketing workload's declared service with its status-route
probe (``crashmatrix certify-probe crashmatrix.scenarios.ticketing.tools:OPEN_TICKET
--truth crashmatrix.scenarios.probes_examples:ticket_truth``).

Certify them with::

    crashmatrix certify-probe crashmatrix.scenarios.checkout.tools:charge \\
        --probe crashmatrix.scenarios.checkout.tools:probe_charge \\
        --truth crashmatrix.scenarios.probes_examples:charge_truth

The wrong probes, and the window each is built to lie in (the certificate names every
window where it lies; see docs/probes.md for the full lists):

- :func:`probe_sent_log` (with the tool :func:`charge_logged`): "applied" whenever the
  key is in the application's log of requests sent -- lies in ``reset.upstream``, where
  the request was sent and never arrived;
- :func:`probe_most_recent`: compares the key with the provider's most recent charge
  only -- lies in ``neighbour.after``, where another caller charged after us;
- :func:`probe_by_amount` (with :func:`charge_logged`): ignores the key and looks for
  a charge of the intended amount -- lies in ``neighbour.same_args``, where ours was
  lost and another caller's charge of the same amount landed.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from crashmatrix.harness.certify import ProviderSandbox, Truth, ground_truth
from crashmatrix.harness.services.providers import clients
from crashmatrix.harness.services.providers.server import derive_id
from crashmatrix.reference_runtime.agent import OutcomeUnknown, ProbeOutcome, Tool, ToolContext, ToolOutcome
from crashmatrix.scenarios.checkout import tools as checkout
from crashmatrix.scenarios.ticketing.tools import TICKETS

__all__ = [
    "CHARGE_ARGUMENTS",
    "NOTE_ARGUMENTS",
    "TICKET_ARGUMENTS",
    "NOTES",
    "NoteResources",
    "charge_logged",
    "charge_truth",
    "create_note",
    "note_truth",
    "notes_sandbox",
    "payment_sandbox",
    "probe_by_amount",
    "probe_most_recent",
    "probe_note",
    "probe_sent_log",
    "ticket_sandbox",
    "ticket_truth",
    "CREATE_NOTE",
]

SANDBOX_PROBE_TIMEOUT_S = 1.0
"""The probes' own bound in the sandboxes (production: ``checkout.tools.PROBE_TIMEOUT_S``);
below the certifier's default bound of 2000 ms."""

CHARGE_ARGUMENTS = {"amount": 12900, "currency": "eur", "card": "4242424242424242"}


# -- payment ---------------------------------------------------------------------------


def _payment_resources(session: aiohttp.ClientSession, base_url: str, worker_id: str) -> checkout.Resources:
    return checkout.Resources(session, {"payment": base_url}, worker_id, "certify",
                              probe_timeout_s=SANDBOX_PROBE_TIMEOUT_S)


def payment_sandbox() -> ProviderSandbox:
    """A fresh payment provider sandbox for the checkout ``charge`` tool."""
    return ProviderSandbox("payment", arguments=CHARGE_ARGUMENTS, resources=_payment_resources)


def _charge_outcome(row: dict[str, Any]) -> ToolOutcome:
    # What checkout.tools.charge returns for this answer: a declined card is a definite failure.
    return ToolOutcome("failed" if row["result"].get("status") == "declined" else "succeeded", row["result"])


@ground_truth(payment_sandbox)
def charge_truth(sandbox: ProviderSandbox, key: str) -> Truth:
    """The payment ledger's own row for the charge with idempotency key ``key``."""
    return sandbox.truth("charge", key, _charge_outcome)


# -- three wrong probes ----------------------------------------------------------------

SENT: dict[str, dict[str, Any]] = {}
"""The application's own log of charge requests sent: idempotency key -> arguments."""


async def charge_logged(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """The checkout charge, logging each request in :data:`SENT` before sending it."""
    assert ctx.idem_key is not None
    SENT[ctx.idem_key] = dict(args)
    return await checkout.charge(ctx, args)


async def probe_sent_log(ctx: ToolContext) -> ProbeOutcome:
    """WRONG: "applied" whenever the key is in the log of requests sent, with the answer
    the provider would have given. A request sent is not a request applied."""
    assert ctx.idem_key is not None
    args = SENT.get(ctx.idem_key)
    if args is None:
        return ProbeOutcome("not_applied")
    result = {"charge_id": derive_id("ch_", ctx.idem_key), "status": "succeeded", **args}
    return ProbeOutcome("applied", ToolOutcome("succeeded", result))


async def _charges(ctx: ToolContext) -> list[dict[str, Any]] | None:
    """The provider's charges, oldest first (its list API), or None if it cannot be asked."""
    r: checkout.Resources = ctx.resources
    try:
        rows = await clients.read_ledger(r.session, r.urls["payment"], None, timeout=r.probe_timeout_s)
    except clients.ProviderError:
        return None
    return [row for row in rows if row["op"] == "charge"]


async def probe_most_recent(ctx: ToolContext) -> ProbeOutcome:
    """WRONG: looks at the provider's most recent charge only, and says applied when it
    carries our key. Any charge made after ours hides it."""
    charges = await _charges(ctx)
    if charges is None:
        return ProbeOutcome("cannot_tell")
    if charges and charges[-1]["key"] == ctx.idem_key:
        return ProbeOutcome("applied", _charge_outcome(charges[-1]))
    return ProbeOutcome("not_applied")


async def probe_by_amount(ctx: ToolContext) -> ProbeOutcome:
    """WRONG: ignores the key; looks up the intended amount in the application's own
    log and says applied when the provider's latest charge of that amount and currency
    exists. Another caller's charge of the same amount passes for ours."""
    assert ctx.idem_key is not None
    intended = SENT.get(ctx.idem_key)
    if intended is None:
        return ProbeOutcome("not_applied")
    charges = await _charges(ctx)
    if charges is None:
        return ProbeOutcome("cannot_tell")
    same = [c for c in charges
            if (c["request"]["amount"], c["request"]["currency"]) == (intended["amount"], intended["currency"])]
    if same:
        return ProbeOutcome("applied", _charge_outcome(same[-1]))
    return ProbeOutcome("not_applied")


# -- a document store with a read-back probe ---------------------------------------------

NOTES = "notes"
"""The collection the note tool writes to."""
NOTE_ARGUMENTS = {"document": {"title": "order 1042", "body": "USB-C dock, paid", "tags": ["checkout"]}}


class NoteResources:
    """What the note tool and its probe need: an HTTP session, the document store's URL,
    the worker id header, the probe's bound in seconds."""

    def __init__(self, session: aiohttp.ClientSession, url: str, worker_id: str,
                 probe_timeout_s: float = checkout.PROBE_TIMEOUT_S) -> None:
        self.session, self.url, self.worker_id, self.probe_timeout_s = session, url, worker_id, probe_timeout_s


async def create_note(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Create one note, named by the idempotency key (the row id *is* the key, so a
    retry with the same key can only find the row the first attempt made)."""
    r: NoteResources = ctx.resources
    assert ctx.idem_key is not None
    try:
        body = await clients.create_document(
            r.session, r.url, collection=NOTES, doc_id=ctx.idem_key, document=args["document"],
            run_id=ctx.run_id, worker_id=r.worker_id)
    except clients.AmbiguousProviderError as exc:
        raise OutcomeUnknown(str(exc)) from exc
    return ToolOutcome("succeeded", body)


async def probe_note(ctx: ToolContext) -> ProbeOutcome:
    """Read the row back by its id (the key): present is applied, with the create's
    answer; 404 is not applied; anything else, or no answer within the bound, cannot tell."""
    r: NoteResources = ctx.resources
    assert ctx.idem_key is not None
    answer = await clients.get_document_status(r.session, r.url, NOTES, ctx.idem_key, timeout=r.probe_timeout_s)
    if answer.outcome == "applied":
        return ProbeOutcome("applied", ToolOutcome("succeeded", answer.result))
    return ProbeOutcome("not_applied" if answer.outcome == "not_applied" else "cannot_tell")


CREATE_NOTE = Tool("create_note", create_note, effect=True, probe=probe_note)


def notes_sandbox() -> ProviderSandbox:
    """A fresh document store sandbox for :data:`CREATE_NOTE`."""
    return ProviderSandbox(
        "docstore", arguments=NOTE_ARGUMENTS,
        resources=lambda s, url, w: NoteResources(s, url, w, probe_timeout_s=SANDBOX_PROBE_TIMEOUT_S))


@ground_truth(notes_sandbox)
def note_truth(sandbox: ProviderSandbox, key: str) -> Truth:
    """The document store ledger's own row for the note named ``key``."""
    return sandbox.truth("document", f"{NOTES}/{key}", lambda row: ToolOutcome("succeeded", row["result"]))


# -- a service the workload declares (the ticketing workload) ------------------------------

TICKET_ARGUMENTS = {"queue": "returns", "subject": "Broken USB-C dock, order 1042",
                    "body": "The dock arrived with a cracked case.", "order": "1042"}


def ticket_sandbox() -> ProviderSandbox:
    """A fresh ticketing service (the workload's :data:`~crashmatrix.scenarios.ticketing.tools.TICKETS`
    spec, run by the harness) for ``crashmatrix.scenarios.ticketing.tools:OPEN_TICKET``."""
    return ProviderSandbox(
        TICKETS, arguments=TICKET_ARGUMENTS,
        resources=lambda s, url, w: clients.Resources(s, {TICKETS.name: url}, w, "certify",
                                                      probe_timeout_s=SANDBOX_PROBE_TIMEOUT_S))


@ground_truth(ticket_sandbox)
def ticket_truth(sandbox: ProviderSandbox, key: str) -> Truth:
    """The ticketing ledger's own row for the ticket with idempotency key ``key``."""
    return sandbox.truth("ticket", key, lambda row: ToolOutcome("succeeded", row["result"]))
