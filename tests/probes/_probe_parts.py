"""Parts for the certifier's own tests: a probe that raises, a tool that goes around the
fault proxy, a truth that disagrees with the tool, a sandbox factory that keeps what it
made (for the cleanup checks)."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.certify import ProviderSandbox, Truth
from crashmatrix.reference_runtime.agent import ProbeOutcome, ToolContext, ToolOutcome
from crashmatrix.scenarios import probes_examples
from crashmatrix.scenarios.checkout import tools as checkout

MADE: list[ProviderSandbox] = []


def recording_payment_sandbox() -> ProviderSandbox:
    """The payment sandbox, kept in :data:`MADE`."""
    box = probes_examples.payment_sandbox()
    MADE.append(box)
    return box


async def probe_raises(ctx: ToolContext) -> ProbeOutcome:
    """A probe that raises instead of answering cannot_tell."""
    raise RuntimeError("provider client exploded")


async def charge_direct(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """The checkout charge, but sent straight to the provider, around the fault proxy:
    no window's fault can land on it."""
    direct = MADE[-1].url
    r = ctx.resources
    ctx.resources = checkout.Resources(r.session, {"payment": direct}, r.worker_id, r.conversation)
    return await checkout.charge(ctx, args)


def truth_wrong(sandbox: ProviderSandbox, key: str) -> Truth:
    """Reads the wrong operation: never sees the charge."""
    return sandbox.truth("refund", key, lambda row: ToolOutcome("succeeded", row["result"]))
