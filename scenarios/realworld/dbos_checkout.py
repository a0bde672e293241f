"""The checkout agent as a DBOS workflow: each model turn and each tool call is a step.

::

    @DBOS.workflow  checkout(flavour, run_input)
        loop: model step -> (tool calls?) -> one tool step per call -> model step ...

DBOS records each step's output in its system database (``operation_outputs``) after the
step returns; on recovery the workflow function runs again from the top and every step
with a recorded output returns it without running. A step that was running when the
process died has no output and runs again: at-least-once. The ``keyed`` flavour sends
``sha256(workflow_id:step_id)`` as the idempotency key (DBOS's own stable ids: the step
id is the step's position in the workflow, the same on every replay), so the repeated
step repeats the key.

The steps are ``async`` and open their own HTTP session: a workflow started by
``start_workflow_async`` runs on the caller's event loop, a recovered one on DBOS's
background loop. What the steps need from the worker (provider URLs, worker id, the
harness's step hook) is in :data:`WORKER`, set by the adapter in the worker process
(:mod:`crashmatrix.harness.adapters.dbos`); nothing is opened at import time. Importing
this module registers the workflow and steps with DBOS's global registry (no DBOS
instance, thread or connection is created).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from dbos import DBOS

from .common import Clients, FlavouredCheckout, effect_key, final_answer

MAX_TURNS = 20
WORKFLOW_NAME = "crashmatrix_checkout"


@dataclass
class WorkerState:
    """Set by the adapter in each worker before DBOS launches."""

    urls: dict[str, str] = field(default_factory=dict)
    worker_id: str = ""
    #: ``step(phase, kind) -> context manager`` yielding the logical task; and
    #: ``point(name)``: the adapter's thread-safe crash points
    step: Callable[..., Any] | None = None
    point: Callable[[str], None] = lambda name: None


WORKER = WorkerState()


def _clients(session: aiohttp.ClientSession, conversation: str) -> Clients:
    return Clients(session, WORKER.urls, WORKER.worker_id, conversation, str(DBOS.workflow_id))


def _step(kind: str) -> Any:
    assert WORKER.step is not None, "the DBOS adapter did not set up this worker"
    return WORKER.step(kind)


@DBOS.step(name="model")
async def model_step(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    with _step("model") as node_id:
        async with aiohttp.ClientSession() as session:
            WORKER.point("model.call.before")
            message = await _clients(session, conversation).model(node_id, messages)
            WORKER.point("model.call.after")
    return message


@DBOS.step(name="tool")
async def tool_step(flavour: str, conversation: str, call: dict[str, Any]) -> dict[str, Any]:
    with _step("tool") as node_id:
        key = effect_key(flavour, DBOS.workflow_id, DBOS.step_id)
        async with aiohttp.ClientSession() as session:
            WORKER.point("tool.request.before")
            message = await _clients(session, conversation).tool(call, key, node_id)
            WORKER.point("tool.request.after")
    return message


@DBOS.workflow(name=WORKFLOW_NAME)
async def checkout(flavour: str, run_input: dict[str, Any]) -> dict[str, Any]:
    conversation = run_input["conversation"]
    messages = list(run_input["messages"])
    for _ in range(MAX_TURNS):
        message = await model_step(conversation, messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return {"answer": message["content"]}
        for call in calls:
            messages.append(await tool_step(flavour, conversation, call))
    raise RuntimeError(f"checkout did not end within {MAX_TURNS} model turns")


def transcript(run_input_: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transcript rebuilt from the run input and the recorded step outputs (in
    step-id order), as DBOS would replay it."""
    messages = list(run_input_.get("messages") or [])
    for step in sorted(steps, key=lambda s: s["function_id"]):
        if step["function_name"] in ("model", "tool") and isinstance(step.get("output"), dict):
            messages.append(step["output"])
    return messages


class DBOSCheckout(FlavouredCheckout):
    """A DBOS checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "dbos-checkout"

    @property
    def workflow(self) -> Any:
        """The registered workflow function (a module attribute: as a class attribute
        it would bind as a method)."""
        return checkout

    def workflow_args(self, conversation: str) -> tuple[Any, ...]:
        return (self.flavour, self.run_input(conversation))

    @staticmethod
    def answer(messages: list[dict[str, Any]]) -> str | None:
        return final_answer(messages)


NAIVE = DBOSCheckout("naive")
KEYED = DBOSCheckout("keyed")
