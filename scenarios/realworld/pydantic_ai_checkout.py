"""The checkout agent as a Pydantic AI agent made durable by its DBOS integration.

Pydantic AI's durable execution (``pydantic_ai.durable_exec.dbos``, measured on
pydantic-ai-slim 2.68.0 with dbos 3.4.0): an ``Agent`` with the ``DBOSDurability``
capability, run inside the application's own ``@DBOS.workflow``, sends every *model
request* through a DBOS step (recorded as ``<agent name>__model.request``). Function
tools are **not** wrapped (Pydantic AI's DBOS page: "Custom tool functions ... are not
automatically wrapped by DBOS ... you should explicitly decorate them with
``@DBOS.step``"); the checkout tools here do what that page says, each call is the
``tool`` step of :mod:`.dbos_checkout`. So the run is the DBOS checkout's shape with
Pydantic AI's agent loop in the workflow::

    @DBOS.workflow  crashmatrix_pydantic_ai_checkout(flavour, run_input)
        agent.run(prompt): model-request step -> one ``tool`` step per call -> model-request step ...

The model is a ``FunctionModel`` (Pydantic AI's own test model) whose function asks the
harness's model provider (:func:`.dbos_checkout.model_turn`, billed to
``model-<DBOS step id>``), converting Pydantic AI's messages to the provider's chat dicts
and the reply back (:func:`to_chat`, :func:`from_reply`). The ``keyed`` tools send
``sha256(workflow id:step id)``, the ``naive`` ones a fresh key per attempt.
``UNWRAPPED`` / ``UNWRAPPED_KEYED`` leave the tools undecorated, as plain workflow code
(logical tasks ``tool-u<n>``, the n-th call of the run; keyed key ``sha256(workflow
id:tool call id)``): DBOS records only the model requests then, and a recovered workflow
calls every earlier tool again (docs/findings.md).

Importing this module builds the agent and registers the workflow and steps with DBOS's
global registry; it starts no DBOS instance, thread or connection. The conversation
reaches the model function through a ``ContextVar`` the workflow sets (the model request
step runs in the workflow's task, on a recovery too).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from dbos import DBOS
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from . import dbos_checkout

AGENT_NAME = "crashmatrix_checkout"
"""The agent's ``name``: Pydantic AI derives its DBOS step names from it."""
WORKFLOW_NAME = "crashmatrix_pydantic_ai_checkout"
MODEL_STEP = f"{AGENT_NAME}__model.request"
"""The DBOS step name of one model request (what ``list_workflow_steps`` shows)."""
TOOL_NAMES = ("search", "fetch_doc", "quote", "charge", "refund", "send_receipt")
MAX_REQUESTS = 20

_CONVERSATION: contextvars.ContextVar[str] = contextvars.ContextVar("crashmatrix_pydantic_ai_conversation")


def response_message(response: ModelResponse) -> dict[str, Any]:
    """A ``ModelResponse`` as the provider's assistant message (text, tool calls)."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(p.content for p in response.parts if isinstance(p, TextPart))}
    calls = [{"id": p.tool_call_id, "name": p.tool_name, "arguments": p.args_as_dict()}
             for p in response.parts if isinstance(p, ToolCallPart)]
    if calls:
        message["tool_calls"] = calls
    return message


def to_chat(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """Pydantic AI's message history as the provider's chat dicts: a user prompt, the
    assistant replies and the tool messages (a tool's return value *is* the tool
    message, see :func:`tools`). Raises ``TypeError`` on a part the checkout never
    makes (a retry prompt, a system prompt): the transcript would be wrong."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            out.append(response_message(message))
            continue
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                out.append({"role": "user", "content": part.content})
            elif isinstance(part, ToolReturnPart) and isinstance(part.content, dict):
                out.append(part.content)
            else:
                raise TypeError(f"the checkout agent cannot send a {type(part).__name__} to the model provider")
    return out


def from_reply(reply: dict[str, Any]) -> ModelResponse:
    """The provider's assistant message as a ``ModelResponse`` (its tool-call ids kept)."""
    parts: list[Any] = [TextPart(reply["content"])]
    parts += [ToolCallPart(c["name"], c["arguments"], tool_call_id=c["id"]) for c in reply.get("tool_calls") or []]
    return ModelResponse(parts=parts, model_name="crashmatrix-scripted")


async def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The ``FunctionModel`` function: one billed turn of the harness's model provider,
    inside Pydantic AI's model-request step."""
    return from_reply(await dbos_checkout.model_turn(_CONVERSATION.get(), to_chat(messages)))


@dataclass
class Deps:
    """The agent run's deps: the tool flavour, and whether tools run as DBOS steps (as
    Pydantic AI's DBOS page asks) or as plain workflow code (its quick start's agent has
    no tools; a tool left undecorated is not recorded, so a recovered workflow calls it
    again: :data:`UNWRAPPED`)."""

    flavour: str
    tools_as_steps: bool = True
    unwrapped_calls: int = 0


def _tool(name: str) -> Tool[Any]:
    async def call(ctx: RunContext[Deps], **arguments: Any) -> dict[str, Any]:
        request = {"id": ctx.tool_call_id, "name": name, "arguments": arguments}
        if ctx.deps.tools_as_steps:  # the DBOS step of the checkout (keyed: workflow id + step id)
            return await dbos_checkout.tool_step(ctx.deps.flavour, _CONVERSATION.get(), request)
        ctx.deps.unwrapped_calls += 1  # the same count on a replay: the calls run in the same order
        return await dbos_checkout.tool_call(ctx.deps.flavour, _CONVERSATION.get(), request,
                                             f"u{ctx.deps.unwrapped_calls}")

    return Tool.from_schema(call, name=name, description=f"the checkout tool {name}",
                            json_schema={"type": "object", "additionalProperties": True}, takes_ctx=True)


def tools() -> list[Tool[Any]]:
    """The checkout tools; each call is a DBOS step returning the tool message."""
    return [_tool(name) for name in TOOL_NAMES]


AGENT: Agent[Deps, str] = Agent(FunctionModel(scripted_model), name=AGENT_NAME, deps_type=Deps, tools=tools(),
                               capabilities=[DBOSDurability()])


@DBOS.workflow(name=WORKFLOW_NAME)
async def checkout(flavour: str, run_input: dict[str, Any], tools_as_steps: bool = True) -> dict[str, Any]:
    from pydantic_ai.usage import UsageLimits

    _CONVERSATION.set(run_input["conversation"])
    [first] = run_input["messages"]
    result = await AGENT.run(first["content"], deps=Deps(flavour, tools_as_steps),
                             usage_limits=UsageLimits(request_limit=MAX_REQUESTS))
    return {"answer": result.output}


def _model_message(out: Any) -> dict[str, Any] | None:
    return response_message(out) if isinstance(out, ModelResponse) else None


class PydanticAICheckout(dbos_checkout.DBOSCheckout):
    """A Pydantic AI checkout workload of one tool flavour (``naive`` or ``keyed``);
    ``tools_as_steps=False``: the tools run as plain workflow code (name suffix
    ``-unwrapped``; keyed key ``sha256(workflow id:tool call id)``)."""

    prefix = "pydantic-ai-checkout"
    model_step = MODEL_STEP
    as_message = staticmethod(_model_message)

    def __init__(self, flavour: str, tools_as_steps: bool = True) -> None:
        super().__init__(flavour)
        self.tools_as_steps = tools_as_steps
        if not tools_as_steps:
            self.name += "-unwrapped"

    @staticmethod
    def registered_workflow() -> Any:
        return checkout

    def workflow_args(self, conversation: str) -> tuple[Any, ...]:
        return (self.flavour, self.run_input(conversation), self.tools_as_steps)


NAIVE = PydanticAICheckout("naive")
KEYED = PydanticAICheckout("keyed")
UNWRAPPED = PydanticAICheckout("naive", tools_as_steps=False)
"""Naive tools left undecorated: DBOS records the model requests only."""
UNWRAPPED_KEYED = PydanticAICheckout("keyed", tools_as_steps=False)
