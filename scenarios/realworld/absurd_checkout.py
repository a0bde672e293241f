"""The checkout agent as an Absurd task: each model turn and each tool call is a step
checkpointed in PostgreSQL.

::

    task "checkout"  handler(params, ctx), params = {"flavour", "input"}
        loop: step "model-N" -> (tool calls?) -> step "tool-N.i" per call -> ...

Absurd (``absurd-sdk``) keeps everything in PostgreSQL (the ``absurd`` schema, one set
of tables per queue): a *task* is the durable workflow, a *run* one attempt of it,
claimed by a worker with a lease (``claim_timeout`` seconds, extended by every
checkpoint write). A step's result is a checkpoint row (``c_<queue>``), written after
the step's function returns; on the next attempt the handler runs from the top and
every step with a checkpoint returns it without running. A step that was running when
its worker died has no checkpoint and runs again once the lease has expired and another
worker claims the task: at-least-once, as Absurd's docs say ("code outside steps may
execute multiple times across retries"; a step is retried whole).

The steps use Absurd's decomposed step API (``begin_step`` / ``complete_step``, public)
so the harness can label the checkpoint write: ``log.append.before`` / ``.after``
around ``complete_step`` (after: committed; the SDK's connection is in autocommit).
**Tool flavours**: ``keyed`` sends ``sha256(task id:step name)`` (Absurd's stable ids:
the task id is fixed at spawn, step names are ``tool-<turn>.<i>``), ``naive`` a fresh
key per attempt.

The handler is built per worker (:func:`build_handler`): nothing runs at import time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from crashmatrix.harness.crashpoint import LOG_APPEND_AFTER, LOG_APPEND_BEFORE
from typing import Any

from .common import FlavouredCheckout, StepHooks, checkout_loop

TASK_NAME = "checkout"

Handler = Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]


def queue_name(run_id: str) -> str:
    """The run's queue (one per run: a worker claims any task of its queue, and parallel
    cases must not run each other's tasks): ``cm_<hex of the run id>``."""
    tail = "".join(ch for ch in run_id.removeprefix("cm-run-") if ch.isalnum()).lower()
    if not tail:
        raise ValueError(f"run_id={run_id!r} must contain letters or digits")
    return f"cm_{tail}"[:57]


def build_handler(hooks: StepHooks, run_id: str) -> Handler:
    """The task handler for one worker (its hooks bound)."""

    async def handler(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        run_input = params["input"]
        clients = hooks.clients(run_input["conversation"], run_id)

        async def durable(step: str, label: str, action: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
            handle = await ctx.begin_step(step)
            if handle.done:
                return dict(handle.state)
            hooks.set_task(step)
            hooks.step("before", step)
            hooks.point(f"{label}.before")
            out = await action()
            hooks.point(f"{label}.after")
            hooks.step("after", step)
            hooks.point(LOG_APPEND_BEFORE)
            out = await ctx.complete_step(handle, out)
            hooks.point(LOG_APPEND_AFTER)
            return out

        return await checkout_loop(run_input, clients, params["flavour"], ctx.task_id, durable)

    return handler


class AbsurdCheckout(FlavouredCheckout):
    """An Absurd checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "absurd-checkout"
    task_name = TASK_NAME
    queue_name = staticmethod(queue_name)

    @staticmethod
    def handler(hooks: StepHooks, run_id: str) -> Handler:
        """:func:`build_handler`: the task handler for one worker."""
        return build_handler(hooks, run_id)

    def params(self, conversation: str) -> dict[str, Any]:
        """The task's parameters (stored in its row at spawn)."""
        return {"flavour": self.flavour, "input": self.run_input(conversation)}


NAIVE = AbsurdCheckout("naive")
KEYED = AbsurdCheckout("keyed")
