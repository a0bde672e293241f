"""Defects present in every run, the golden one included: a comparison with the golden
run takes them for the baseline, so only an invariant (:mod:`crashmatrix.harness.invariants`)
catches them."""

from __future__ import annotations

import dataclasses
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime.agent import Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db

from ._base import MutantAdapter


def charging_twice(tool: Tool) -> Tool:
    """``tool`` wrapped so that, once it succeeded, it runs again "to be safe" under a key
    of its own (the idempotency key plus ``:retry``), and returns the second answer."""

    async def twice(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        first = await tool.fn(ctx, args)
        if first.status != "succeeded" or ctx.idem_key is None:
            return first
        return await tool.fn(dataclasses.replace(ctx, idem_key=f"{ctx.idem_key}:retry"), args)

    return dataclasses.replace(tool, fn=twice)


class DoubleChargeToolAdapter(MutantAdapter):
    """Defect: the agent's charge tool, after a successful charge, charges again under a
    derived key "to be safe" and keeps the second answer: every run, the golden one
    included, charges the card twice per tool call.

    Class: a tool node that applies its effect twice per call in the golden run too
    (against LangGraph, such a double charge became the baseline and every case
    passed). Caught by the invariant ``effects.applied_once`` on the golden run: the
    payment ledger holds two applied charges for the run where its durable record names
    one. The matrix reports the golden run as the failure and runs no case of it.
    """

    defect = "the charge tool charges twice per call in every run, golden included"
    source = "a LangGraph tool node charging twice per call, golden run included"
    caught_by = ("effects.applied_once",)
    fault_kinds = ("kill",)

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        tools = dict(agent.tools)
        tools["charge"] = charging_twice(tools["charge"])
        return super().make_runtime(db, dataclasses.replace(agent, tools=tools), ctx)
