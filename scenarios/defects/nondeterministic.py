"""A workload that is not deterministic: its receipt tool puts the wall clock and a draw
of ``random``'s global generator into the mail it sends. Two clean runs send different
mails, so no case can be judged against the golden run: the determinism gate stops the
matrix before the first case (exit 2) and names the field. Run it with::

    crashmatrix run crashmatrix.scenarios.defects.nondeterministic:WORKLOAD

The deterministic way (docs/adapters.md, "Determinism"): draw from
``crashmatrix.harness.determinism.rng(seed, node_id)`` and read
``crashmatrix.harness.determinism.clock()`` instead.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from crashmatrix.reference_runtime.agent import Agent, Tool, ToolContext, ToolOutcome
from crashmatrix.scenarios.checkout import CheckoutWorkload
from crashmatrix.scenarios.checkout.tools import Resources


def stamped(tool: Tool) -> Tool:
    """``tool`` with ``(ref N at T)`` appended to its ``body`` argument: N from
    ``random``, T from ``time.time()``."""

    async def fn(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        body = f"{args.get('body', '')} (ref {random.randint(1000, 99999)} at {time.time():.3f})"
        return await tool.fn(ctx, {**args, "body": body})

    return dataclasses.replace(tool, fn=fn)


class NondeterministicCheckout(CheckoutWorkload):
    """Checkout whose receipt carries a timestamp and a random reference."""

    name = "checkout-nondeterministic"

    def build_agent(self, conversation: str, resources: Resources) -> Agent:
        agent = super().build_agent(conversation, resources)
        agent.tools["send_receipt"] = stamped(agent.tools["send_receipt"])  # type: ignore[arg-type]
        return agent


WORKLOAD = NondeterministicCheckout()
