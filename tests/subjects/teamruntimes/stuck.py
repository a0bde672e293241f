"""A runtime that cannot finish one conversation even with no fault: conv2's run raises
(a tool schema it rejects) while the others complete. Its golden run is the subject's
own failure, reported as such (``run.ends``, exit 1), never a harness error."""

from __future__ import annotations

import asyncio

from crashmatrix.harness.adapter import RunContext

from .keys import KeyAdapter


class RejectsConv2Adapter(KeyAdapter):
    name = "team-rejects-conv2"

    async def start(self, ctx: RunContext) -> str:
        if ctx.conversation == "conv2":
            raise ValueError("tool 'refund': unsupported schema")
        return await super().start(ctx)


class NoOperatorAdapter(KeyAdapter):
    """A team's runtime with its own human protocol: it leaves a run that waits for a
    person ``needs_human`` and hands it to nobody here (it declares no
    ``answers_operator``). support_desk's goodwill conversation needs the workload's
    operator, so it is not applicable to this subject, never a failure."""

    name = "team-no-operator"
    answers_operator = ()

    async def hand_off(self, runtime, db, ctx, resources, status):  # type: ignore[no-untyped-def]
        return status


class HangsOnConv2Adapter(KeyAdapter):
    """A runtime whose worker never returns from conv2's run (a shutdown that waits on
    itself): the run completes, then the call blocks. Its golden run is the subject's
    failure too (``run.ends``: it did not return within the worker deadline)."""

    name = "team-hangs-conv2"

    async def start(self, ctx: RunContext) -> str:
        status = await super().start(ctx)
        if ctx.conversation == "conv2":
            await asyncio.Event().wait()  # never set
        return status
