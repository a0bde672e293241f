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
from crashmatrix.harness.crashpoint import MODEL_CALL_AFTER, MODEL_CALL_BEFORE, TOOL_REQUEST_AFTER, TOOL_REQUEST_BEFORE
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from dbos import DBOS

from .common import Clients, FlavouredCheckout, effect_key

MAX_TURNS = 20
WORKFLOW_NAME = "crashmatrix_checkout"
MAX_RECOVERY_ATTEMPTS = 5
"""The checkout workflow's ``max_recovery_attempts`` (DBOS's default is 100): a team
bounds a crash loop to what its on-call can look at; a workflow recovered more often is
dead-lettered (``MAX_RECOVERY_ATTEMPTS_EXCEEDED``) and waits for ``resume_workflow``."""
QUEUE_NAME = "crashmatrix_checkout_queue"
"""The DBOS queue the ``queued`` workloads enqueue their workflow on. DBOS keeps queues
in its system database (``DBOS.register_queue`` after launch, dbos 2.x and 3.x), so the
adapter registers it in each worker. A worker of the run's application version dequeues
the workflow; after a crash, launch-time recovery puts a dequeued ``PENDING`` workflow
back on its queue (DBOS's queued recovery path), and an ``ENQUEUED`` one waits there."""


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


def _clients(session: aiohttp.ClientSession, conversation: str, script: str | None = None,
             run_id: str | None = None) -> Clients:
    """The providers' clients, filing requests under ``run_id`` (default: this workflow's
    id; a child workflow files them under its parent's, the run's)."""
    clients = Clients(session, WORKER.urls, WORKER.worker_id, conversation, run_id or str(DBOS.workflow_id))
    clients.script = script or clients.script
    return clients


def _step(kind: str, step_id: object = None) -> Any:
    assert WORKER.step is not None, "the DBOS adapter did not set up this worker"
    return WORKER.step(kind, step_id)


async def run_model(kind: str, conversation: str, messages: list[dict[str, Any]], script: str | None = None
                    ) -> dict[str, Any]:
    """The body of a billed model step named ``kind``, run inside a DBOS step (this
    module's ``model`` step, an approval workload's ``approval_model``, or the
    model-request step of an integration built on DBOS: Pydantic AI's, the OpenAI Agents
    SDK's); its logical task is ``<kind>-<DBOS step id>``. Returns the assistant message."""
    with _step(kind) as node_id:
        async with aiohttp.ClientSession() as session:
            WORKER.point(MODEL_CALL_BEFORE)
            message = await _clients(session, conversation, script).model(node_id, messages)
            WORKER.point(MODEL_CALL_AFTER)
    return message


async def model_turn(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One billed model turn (:func:`run_model` of kind ``model``)."""
    return await run_model("model", conversation, messages)


@DBOS.step(name="model")
async def model_step(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return await model_turn(conversation, messages)


async def run_tool(kind: str, flavour: str, conversation: str, call: dict[str, Any], script: str | None = None,
                   step_id: object = None, run_id: str | None = None) -> dict[str, Any]:
    """The body of a tool step named ``kind``; returns the tool message. Inside a DBOS
    step (``step_id`` None) its logical task is ``<kind>-<DBOS step id>`` and the keyed
    flavour's key ``sha256(workflow id:step id)``; outside one (workflow code, which DBOS
    does not record) the caller names it: ``<kind>-<step_id>``, and the keyed key is
    ``sha256(workflow id:call id)`` (the call id is in the model step's recorded output,
    so it is the same on a replay). ``call`` without an ``id`` gets the step's. ``run_id``:
    the run the providers file the request under (default: this workflow)."""
    with _step(kind, step_id) as node_id:
        key = effect_key(flavour, DBOS.workflow_id, DBOS.step_id if step_id is None else call["id"])
        async with aiohttp.ClientSession() as session:
            WORKER.point(TOOL_REQUEST_BEFORE)
            message = await _clients(session, conversation, script, run_id).tool({"id": node_id, **call}, key, node_id)
            WORKER.point(TOOL_REQUEST_AFTER)
    return message


async def tool_call(flavour: str, conversation: str, call: dict[str, Any], step_id: object = None) -> dict[str, Any]:
    """One tool call (:func:`run_tool` of kind ``tool``)."""
    return await run_tool("tool", flavour, conversation, call, step_id=step_id)


@DBOS.step(name="tool")
async def tool_step(flavour: str, conversation: str, call: dict[str, Any]) -> dict[str, Any]:
    return await tool_call(flavour, conversation, call)


@DBOS.workflow(name=WORKFLOW_NAME, max_recovery_attempts=MAX_RECOVERY_ATTEMPTS)
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


CHILD_WORKFLOW_NAME = "crashmatrix_checkout_parent"
TOOL_WORKFLOW_NAME = "crashmatrix_tool_child"
CHILD_TOOL_STEP = "child_tool"
GET_RESULT = "DBOS.getResult"
"""The name DBOS records a parent's wait for a child's result under (its output is the
child's result)."""


@DBOS.step(name=CHILD_TOOL_STEP)
async def child_tool_step(flavour: str, conversation: str, call: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A tool call in a child workflow, filed under the run (the parent's id); its
    logical task ``child_tool-<start id>.<step id>`` (the child's id ends with the
    function id of its start in the parent), the node id the adapter's log gives it."""
    start = str(DBOS.workflow_id).rsplit("-", 1)[-1]
    return await run_tool(CHILD_TOOL_STEP, flavour, conversation, call, step_id=f"{start}.{DBOS.step_id}",
                          run_id=run_id)


@DBOS.workflow(name=TOOL_WORKFLOW_NAME, max_recovery_attempts=MAX_RECOVERY_ATTEMPTS)
async def tool_workflow(flavour: str, conversation: str, call: dict[str, Any], run_id: str) -> dict[str, Any]:
    """One tool call as a child workflow of its own (one step), for run ``run_id``."""
    return await child_tool_step(flavour, conversation, call, run_id)


@DBOS.workflow(name=CHILD_WORKFLOW_NAME, max_recovery_attempts=MAX_RECOVERY_ATTEMPTS)
async def checkout_with_children(flavour: str, run_input: dict[str, Any]) -> dict[str, Any]:
    """:func:`checkout` whose tool calls each run as a child workflow the parent starts
    (``DBOS.start_workflow_async``: DBOS records the child's start as a step of the parent
    and gives the child an id derived from the parent's) and awaits
    (``handle.get_result()``: recorded as :data:`GET_RESULT`, the child's output)."""
    conversation = run_input["conversation"]
    messages = list(run_input["messages"])
    for _ in range(MAX_TURNS):
        message = await model_step(conversation, messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return {"answer": message["content"]}
        for call in calls:
            child = await DBOS.start_workflow_async(tool_workflow, flavour, conversation, call, DBOS.workflow_id)
            messages.append(await child.get_result())
    raise RuntimeError(f"checkout did not end within {MAX_TURNS} model turns")


MODEL_STEP = "model"
"""The name DBOS records a model turn under (this module's ``model`` step)."""


def transcript(run_input_: dict[str, Any], steps: list[dict[str, Any]], model_step: str = MODEL_STEP,
               as_message: Callable[[Any], Any] = lambda out: out) -> list[dict[str, Any]]:
    """The transcript rebuilt from the run input and the recorded step outputs (in
    step-id order), as DBOS would replay it: each ``model_step`` output as the assistant
    message (``as_message(output)``: an integration records its own response object, or
    None when it is not one), each ``tool`` step's tool message."""
    messages = list(run_input_.get("messages") or [])
    for step in sorted(steps, key=lambda s: s["function_id"]):
        out = step.get("output")
        name = step["function_name"]
        if name == model_step:
            out = as_message(out)
        elif name == "DBOS.recv" and isinstance(out, dict) and "interrupt" in out:
            out = {"role": "human", **out}  # a person's answer (dbos_human.py)
        elif name not in ("tool", "approval_model", "approval_tool", GET_RESULT):
            continue
        if isinstance(out, dict):
            messages.append(out)
    return messages


class DBOSCheckout(FlavouredCheckout):
    """A DBOS checkout workload of one tool flavour (``naive`` or ``keyed``); a workload
    of an integration built on DBOS subclasses it and names its workflow
    (:meth:`registered_workflow`)."""

    prefix = "dbos-checkout"
    #: the name DBOS records a model turn under (an integration's model-request step)
    model_step = MODEL_STEP

    @staticmethod
    def registered_workflow() -> Any:
        """The registered workflow function (a module attribute: as a class attribute
        it would bind as a method)."""
        return checkout

    @property
    def workflow(self) -> Any:
        return self.registered_workflow()

    def workflow_args(self, conversation: str) -> tuple[Any, ...]:
        return (self.flavour, self.run_input(conversation))

    @property
    def worker(self) -> WorkerState:
        """This process's :data:`WORKER` (the adapter fills it in before launching DBOS)."""
        return WORKER

    @staticmethod
    def as_message(output: Any) -> Any:
        """The assistant message of a recorded :attr:`model_step` output (an
        integration records its own response object: None when it is not one)."""
        return output

    def transcript(self, run_input_: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """:func:`transcript` with this workload's :attr:`model_step` and
        :meth:`as_message`, for the adapter's ``observe``."""
        return transcript(run_input_, steps, self.model_step, self.as_message)


class DBOSQueuedCheckout(DBOSCheckout):
    """The checkout enqueued on a DBOS ``Queue`` (:data:`QUEUE`) instead of started
    directly: how a service hands work to its workers."""

    prefix = "dbos-checkout-queued"
    #: the queue the adapter registers and enqueues the workflow on (``enqueue_async``)
    queue_name = QUEUE_NAME


class DBOSChildCheckout(DBOSCheckout):
    """The checkout whose tool calls run as child workflows the parent starts and awaits
    (:func:`checkout_with_children`): how a DBOS application fans work out to workflows
    of their own. The parent's recorded steps are its model turns, each child's start
    and each :data:`GET_RESULT` (the tool message)."""

    prefix = "dbos-checkout-children"

    @staticmethod
    def registered_workflow() -> Any:
        return checkout_with_children


class DBOSTimedCheckout(DBOSCheckout):
    """The checkout started under a workflow timeout (``SetWorkflowTimeout``, the
    adapter's start reads :attr:`workflow_timeout_s`): DBOS keeps a deadline for the
    workflow and a timer task in the process that runs it, as an application with a
    request deadline does. Far longer than a run: a run that ends never meets it."""

    prefix = "dbos-checkout-timed"
    #: seconds of the workflow's timeout (``SetWorkflowTimeout``)
    workflow_timeout_s = 600.0


NAIVE = DBOSCheckout("naive")
KEYED = DBOSCheckout("keyed")
QUEUED_NAIVE = DBOSQueuedCheckout("naive")
QUEUED_KEYED = DBOSQueuedCheckout("keyed")
CHILD_KEYED = DBOSChildCheckout("keyed")
TIMED_KEYED = DBOSTimedCheckout("keyed")
