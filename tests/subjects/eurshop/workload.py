"""The checkout workload as a new user wrote it: its model pays in ``"EUR"`` (the payment
provider wants lower-case ISO 4217 and answers 400) and its ``charge`` tool turns a
refused charge into a failed outcome, so the run completes and applies no effect: a
golden run every case would pass against. ``NO_EFFECTS`` declares that it makes none
(``makes_no_effects``), which the harness then holds it to. ``BROKEN_MODEL``'s model
script raises at the payment turn: the model provider answers 500.

Lives with the tests (``tests/subjects`` on ``PYTHONPATH``: the model provider imports
:func:`respond` by name).
"""

from __future__ import annotations

from typing import Any

import dataclasses

from crashmatrix.reference_runtime.agent import Agent, ToolOutcome
from crashmatrix.harness.services.providers import clients
from crashmatrix.scenarios.checkout import CheckoutWorkload, ScriptedModel
from crashmatrix.scenarios.checkout import script as checkout_script
from crashmatrix.scenarios.checkout.tools import TOOLS

SCRIPT = "eurshop.workload:respond"


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """checkout's model, paying in ``"EUR"``."""
    reply = checkout_script.respond(conversation, messages)
    for call in reply.get("tool_calls") or []:
        if "currency" in call["arguments"]:
            call["arguments"]["currency"] = call["arguments"]["currency"].upper()
    return reply


async def charge(ctx: Any, args: dict[str, Any]) -> ToolOutcome:
    """checkout's charge; a refused charge (4xx) is a failed outcome the model reads."""
    try:
        return await TOOLS["charge"].fn(ctx, args)
    except clients.DefiniteProviderError as exc:
        return ToolOutcome("failed", {"error": str(exc)})


def broken_respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """checkout's model until it would pay; then it raises (the provider answers 500)."""
    reply = checkout_script.respond(conversation, messages)
    if any(call["name"] == "charge" for call in reply.get("tool_calls") or []):
        raise RuntimeError("pricing table missing")
    return reply


class EurShopWorkload(CheckoutWorkload):
    name = "eurshop"

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        tools = dict(TOOLS)
        tools["charge"] = dataclasses.replace(TOOLS["charge"], fn=charge)
        return Agent(name=self.name, model=ScriptedModel(resources, SCRIPT), tools=tools, resources=resources)


class NoEffectsWorkload(CheckoutWorkload):
    """checkout, declaring (wrongly) that it makes no effects."""

    name = "noeffects"
    makes_no_effects = True


class BrokenModelWorkload(CheckoutWorkload):
    name = "brokenmodel"

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        return Agent(name=self.name, model=ScriptedModel(resources, "eurshop.workload:broken_respond"),
                     tools=dict(TOOLS), resources=resources)


WORKLOAD = EurShopWorkload()
BROKEN_MODEL = BrokenModelWorkload()
NO_EFFECTS = NoEffectsWorkload()
