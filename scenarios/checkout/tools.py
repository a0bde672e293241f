"""The checkout workload's tools and probes.

Read-only tools (``search``, ``fetch_doc``, ``quote``) answer from a fixed catalogue in
the worker. Tools with effects call providers in their own processes, always with the
idempotency key the runtime derived (``sha256(run_id:tool_call_id)``); their probes ask
the provider whether that key was applied and return the original result, not just
"applied" (docs/design.md: a crash after the provider answered but before the commit always
goes through the probe).
"""

from __future__ import annotations

from typing import Any

import anyio

from crashmatrix.harness.services.providers import clients
from crashmatrix.harness.services.providers.clients import PROBE_TIMEOUT_S, Resources  # noqa: F401 (re-exported)
from crashmatrix.reference_runtime.agent import OutcomeUnknown, ProbeOutcome, Tool, ToolContext, ToolOutcome

CATALOGUE = {
    "dock-1": {"sku": "dock-1", "name": "USB-C dock", "price": 12900},
    "dock-pro": {"sku": "dock-pro", "name": "USB-C dock pro", "price": 24900},
}
LARGE_DOC_BYTES = 200_000
# PROBE_TIMEOUT_S (a probe's own bound) and Resources (the per-worker clients the
# reference adapter builds) are the harness's: crashmatrix.harness.services.providers.clients


def _res(ctx: ToolContext) -> Resources:
    return ctx.resources


async def search(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    items = [CATALOGUE["dock-1"]] if args.get("catalogue") == "main" else [CATALOGUE["dock-pro"]]
    return ToolOutcome("succeeded", {"query": args["query"], "results": items})


def spec_sheet(sku: str) -> str:
    """A deterministic document; ``dock-pro``'s is ~200 KB (conversation 4)."""
    line = f"{sku}: 4x USB-C 40 Gbit/s, 2x HDMI 2.1, 100 W power delivery, aluminium.\n"
    size = LARGE_DOC_BYTES if sku == "dock-pro" else 600
    return (line * (size // len(line) + 1))[:size]


async def fetch_doc(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"sku": args["sku"], "text": spec_sheet(args["sku"])})


async def quote(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    item = CATALOGUE[args["sku"]]
    return ToolOutcome("succeeded", {"sku": item["sku"], "qty": args["qty"], "total": item["price"] * args["qty"], "currency": "eur"})


def _charge_outcome(body: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome("failed" if body.get("status") == "declined" else "succeeded", body)


async def charge(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    r = _res(ctx)
    try:
        body = await clients.charge(
            r.session, r.urls["payment"], key=ctx.idem_key, amount=args["amount"], currency=args["currency"],
            card=args["card"], run_id=ctx.run_id, worker_id=r.worker_id, timeout=r.deadline_s,
        )
    except clients.AmbiguousProviderError as exc:
        raise OutcomeUnknown(str(exc)) from exc
    return _charge_outcome(body)


async def _probe(ctx: ToolContext, ask: Any, url_kind: str, outcome: Any) -> ProbeOutcome:
    """Ask the provider about ``ctx.idem_key``; the clients' probes never raise. A
    provider that could not be asked (broken link, timeout, 5xx) is ``cannot_tell_yet``;
    one whose answer does not decide is ``cannot_tell``."""
    r = _res(ctx)
    answer = await ask(r.session, r.urls[url_kind], ctx.idem_key, timeout=r.probe_bound_s)
    if answer.outcome == "applied":
        return ProbeOutcome("applied", outcome(answer.result))
    if answer.outcome == "not_applied":
        return ProbeOutcome("not_applied")
    return ProbeOutcome("cannot_tell_yet" if answer.transient else "cannot_tell")


def _succeeded(body: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome("succeeded", body)


async def probe_charge(ctx: ToolContext) -> ProbeOutcome:
    return await _probe(ctx, clients.get_charge_status, "payment", _charge_outcome)


async def refund(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    r = _res(ctx)
    try:
        body = await clients.refund(
            r.session, r.urls["payment"], key=ctx.idem_key, charge_id=args["charge_id"], amount=args["amount"],
            run_id=ctx.run_id, worker_id=r.worker_id, timeout=r.deadline_s,
        )
    except clients.AmbiguousProviderError as exc:
        raise OutcomeUnknown(str(exc)) from exc
    return ToolOutcome("succeeded", body)


async def probe_refund(ctx: ToolContext) -> ProbeOutcome:
    return await _probe(ctx, clients.get_refund_status, "payment", _succeeded)


async def send_receipt(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    r = _res(ctx)
    try:
        body = await clients.send_mail(
            r.session, r.urls["mail"], key=ctx.idem_key, to=args["to"], subject=args["subject"], body=args["body"],
            run_id=ctx.run_id, worker_id=r.worker_id, timeout=r.deadline_s,
        )
    except clients.AmbiguousProviderError as exc:
        raise OutcomeUnknown(str(exc)) from exc
    return ToolOutcome("succeeded", body)


async def probe_mail(ctx: ToolContext) -> ProbeOutcome:
    return await _probe(ctx, clients.get_mail_status, "mail", _succeeded)


TOOLS: dict[str, Tool] = {
    "search": Tool("search", search),
    "fetch_doc": Tool("fetch_doc", fetch_doc),
    "quote": Tool("quote", quote),
    "charge": Tool("charge", charge, effect=True, probe=probe_charge),
    "refund": Tool("refund", refund, effect=True, probe=probe_refund),
    "send_receipt": Tool("send_receipt", send_receipt, effect=True, probe=probe_mail),
}
