"""The checkout agent as a Restate workflow: each model turn and each tool call is a
``ctx.run`` action journaled by the Restate server.

::

    Workflow "Checkout_<run>"  handler run(ctx, run_input), key = the run id
        loop: ctx.run("model-N") -> (tool calls?) -> ctx.run("tool-N.i") per call -> ...

The handler runs in the service endpoint (the worker process); the journal lives in
``restate-server``. A ``ctx.run`` action's result is sent to the server and the handler
waits for the server's acknowledgement before it goes on; on a retry (the endpoint died,
the server invokes the deployment again) the handler runs from the top and every action
whose result is in the journal returns it without running. An action that was running
when the endpoint died has no result and runs again: at-least-once, as the Restate
docs say of side effects in ``ctx.run``.

**Tool flavours**: ``keyed`` sends ``sha256(workflow key:action name)`` (Restate's stable
ids: the workflow key is the run id, action names are ``tool-<turn>.<i>``, the same on
every replay), ``naive`` a fresh key per attempt.

A definite refusal by a provider (``DefiniteProviderError``, a 4xx) is raised as
Restate's ``TerminalError`` (Restate retries every other exception of an action forever,
its documented default), so a refused re-run refund fails the workflow as it fails a
DBOS workflow.

One workflow *service* per run (its name from the run id, :func:`service_name`):
Restate pins an invocation to the deployment it started on, and a deployment is an
endpoint URL, so each run's endpoint keeps its own port across workers and parallel
cases never serve each other's invocations. Nothing runs at import time:
:func:`build_workflow` is called by the adapter in the worker.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from crashmatrix.harness.crashpoint import LOG_APPEND_AFTER
from typing import Any

from restate import RunOptions, TerminalError, Workflow, WorkflowContext

from crashmatrix.scenarios.providers.clients import DefiniteProviderError

from .common import FlavouredCheckout, StepHooks, checkout_loop

HANDLER = "run"


def service_name(run_id: str) -> str:
    """The run's workflow service name: ``Checkout_<hex of the run id>``."""
    tail = re.sub(r"[^0-9A-Za-z]", "", run_id.removeprefix("cm-run-"))
    if not tail:
        raise ValueError(f"run_id={run_id!r} must contain letters or digits")
    return f"Checkout_{tail}"


async def journaled(ctx: WorkflowContext, hooks: StepHooks, step: str, label: str,
                    action: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """``ctx.run(step, ...)`` with the harness's points: ``step.before``, ``<label>.before``,
    the action, ``<label>.after``, ``step.after`` inside it; ``log.append.after`` once
    the server acknowledged the result (only when the action ran in this attempt, not
    when the journal replayed it)."""
    hooks.set_task(step)
    ran: list[bool] = []

    async def body() -> dict[str, Any]:
        ran.append(True)
        hooks.step("before", step)
        hooks.point(f"{label}.before")
        try:
            out = await action()
        except DefiniteProviderError as exc:
            raise TerminalError(f"{step}: {exc}", 400) from exc
        hooks.point(f"{label}.after")
        hooks.step("after", step)
        return out

    out = await ctx.run_typed(step, body, RunOptions(type_hint=dict))
    if ran:
        hooks.point(LOG_APPEND_AFTER)
    return out


def build_workflow(name: str, flavour: str, hooks: StepHooks) -> Workflow:
    """The checkout workflow service ``name`` for one worker (its hooks bound)."""
    wf = Workflow(name)

    @wf.main(name=HANDLER)
    async def run(ctx: WorkflowContext, run_input: dict[str, Any]) -> dict[str, Any]:
        clients = hooks.clients(run_input["conversation"], ctx.key())

        async def durable(step: str, label: str, action: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
            return await journaled(ctx, hooks, step, label, action)

        try:
            return await checkout_loop(run_input, clients, flavour, ctx.key(), durable)
        except RuntimeError as exc:  # no answer within the turns: not worth a retry
            raise TerminalError(str(exc)) from exc

    return wf


class RestateCheckout(FlavouredCheckout):
    """A Restate checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "restate-checkout"
    service_name = staticmethod(service_name)

    def build(self, run_id: str, hooks: StepHooks) -> Workflow:
        return build_workflow(service_name(run_id), self.flavour, hooks)


NAIVE = RestateCheckout("naive")
KEYED = RestateCheckout("keyed")
