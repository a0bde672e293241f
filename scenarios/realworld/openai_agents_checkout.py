"""The checkout agent on the OpenAI Agents SDK, made durable by ``dbos-openai-agents``.

The integration (measured on openai-agents 0.24.0, dbos-openai-agents 0.3.0, dbos
3.4.0): ``DBOSRunner.run(agent, input)``, called inside the application's own
``@DBOS.workflow``, runs the SDK's ``Runner.run`` with every model call wrapped in one
DBOS step (``_model_call_step``) and the function tools gated by a turnstile so that
parallel calls start, and get their DBOS step ids, in the order of the model's call ids.
The tools themselves must be DBOS steps (its README: "Annotate tool calls and guardrails
with @DBOS.step()"); here each is the ``tool`` step of :mod:`.dbos_checkout`::

    @DBOS.workflow  crashmatrix_openai_agents_checkout(flavour, run_input)
        DBOSRunner.run(agent, prompt): model step -> one ``tool`` step per call -> model step ...

The model is an Agents SDK ``Model`` (:class:`ScriptedModel`) that asks the harness's
model provider for each turn (:func:`.dbos_checkout.model_turn`, billed to
``model-<DBOS step id>``), converting the SDK's Responses-format input items to the
provider's chat dicts and its reply to output items (:func:`to_chat`,
:func:`from_reply`); no OpenAI client is made and tracing is off (the SDK would export
traces to OpenAI's servers). ``keyed`` tools send ``sha256(workflow id:step id)``,
``naive`` ones a fresh key per attempt. A tool's output is the tool message as JSON
(the SDK hands the model a string).

Importing this module builds the agent and registers the workflow and steps with DBOS;
it starts no DBOS instance, thread or connection.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any

from agents import Agent, FunctionTool, Model, ModelResponse, RunConfig, Usage
from dbos import DBOS
from dbos_openai_agents import DBOSRunner
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from . import dbos_checkout

WORKFLOW_NAME = "crashmatrix_openai_agents_checkout"
MODEL_STEP = "_model_call_step"
"""The DBOS step name ``dbos-openai-agents`` records a model call under."""
TOOL_NAMES = ("search", "fetch_doc", "quote", "charge", "refund", "send_receipt")
MAX_TURNS = 20
"""The SDK's ``max_turns`` (the other checkout workloads' turn limit; the SDK's default is 10)."""

_RUN: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar("crashmatrix_openai_agents_run")
"""``(flavour, conversation)`` of the workflow being run (set by the workflow)."""


def _item(item: Any) -> dict[str, Any]:
    return item if isinstance(item, dict) else item.model_dump(exclude_unset=True)


def to_chat(items: str | list[Any]) -> list[dict[str, Any]]:
    """The SDK's input (a prompt string, or Responses-format items: user messages,
    output messages, ``function_call``, ``function_call_output``) as the provider's chat
    dicts. Raises ``TypeError`` on any other item: the transcript would be wrong."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for raw in items:
        item = _item(raw)
        kind = item.get("type", "message" if item.get("role") else None)
        if kind == "message" and item.get("role") == "user":
            out.append({"role": "user", "content": item["content"]})
        elif kind == "message" and item.get("role") == "assistant":
            text = "".join(c.get("text", "") for c in item["content"]) if isinstance(item["content"], list) \
                else str(item["content"])
            out.append({"role": "assistant", "content": text})
        elif kind == "function_call":
            if not out or out[-1].get("role") != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(
                {"id": item["call_id"], "name": item["name"], "arguments": json.loads(item["arguments"] or "{}")})
        elif kind == "function_call_output":
            out.append(json.loads(item["output"]))
        else:
            raise TypeError(f"the checkout agent cannot send a {kind!r} item to the model provider")
    return out


def from_reply(reply: dict[str, Any]) -> list[Any]:
    """The provider's assistant message as output items: one message, then one
    ``function_call`` per tool call (its call id kept)."""
    out: list[Any] = [ResponseOutputMessage(
        id="msg_crashmatrix", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=reply["content"], annotations=[])])]
    out += [ResponseFunctionToolCall(type="function_call", call_id=c["id"], id=f"fc_{c['id']}", name=c["name"],
                                     arguments=json.dumps(c["arguments"]))
            for c in reply.get("tool_calls") or []]
    return out


def response_message(response: ModelResponse) -> dict[str, Any]:
    """A recorded ``ModelResponse`` as the provider's assistant message."""
    [message] = to_chat(list(response.output))
    return message


class ScriptedModel(Model):
    """An Agents SDK model whose every turn is one billed call of the harness's model
    provider, inside ``dbos-openai-agents``' model step. Streaming is not offered (nor
    does ``DBOSRunner`` allow it)."""

    async def get_response(self, system_instructions: str | None, input: str | list[Any], model_settings: Any,
                           tools: list[Any], output_schema: Any, handoffs: list[Any], tracing: Any, *,
                           previous_response_id: str | None = None, conversation_id: str | None = None,
                           prompt: Any = None) -> ModelResponse:
        reply = await dbos_checkout.model_turn(_RUN.get()[1], to_chat(input))
        return ModelResponse(output=from_reply(reply), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the checkout model does not stream")


def _tool(name: str) -> FunctionTool:
    async def invoke(ctx: Any, arguments: str) -> str:
        flavour, conversation = _RUN.get()
        call = {"id": ctx.tool_call_id, "name": name, "arguments": json.loads(arguments or "{}")}
        return json.dumps(await dbos_checkout.tool_step(flavour, conversation, call))

    return FunctionTool(name=name, description=f"the checkout tool {name}",
                        params_json_schema={"type": "object", "additionalProperties": True},
                        on_invoke_tool=invoke, strict_json_schema=False)


AGENT = Agent(name="crashmatrix-checkout", model=ScriptedModel(), tools=[_tool(n) for n in TOOL_NAMES])


@DBOS.workflow(name=WORKFLOW_NAME)
async def checkout(flavour: str, run_input: dict[str, Any]) -> dict[str, Any]:
    _RUN.set((flavour, run_input["conversation"]))
    [first] = run_input["messages"]
    result = await DBOSRunner.run(AGENT, first["content"], max_turns=MAX_TURNS,
                                  run_config=RunConfig(tracing_disabled=True))
    return {"answer": str(result.final_output)}


def _model_message(out: Any) -> dict[str, Any] | None:
    return response_message(out) if isinstance(out, ModelResponse) else None


class OpenAIAgentsCheckout(dbos_checkout.DBOSCheckout):
    """An OpenAI Agents SDK checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "openai-agents-checkout"
    model_step = MODEL_STEP
    as_message = staticmethod(_model_message)

    @staticmethod
    def registered_workflow() -> Any:
        return checkout


NAIVE = OpenAIAgentsCheckout("naive")
KEYED = OpenAIAgentsCheckout("keyed")
