"""The ``research`` workload: a fan-out of 40 independent tool calls and a sub-agent.

Flow (conversation ``fanout``): the researcher's first turn calls ``read_source`` 40
times and the ``investigate`` sub-agent once, all in one reply, so 41 nodes run
concurrently; the investigator (a child graph scoped under the sub-agent node,
:mod:`crashmatrix.reference_runtime.subagents`) reads the two sources that disagree,
files a note through the mail provider (an effect, keyed and probed like checkout's
receipt) and answers; the researcher's second turn sums the sources and quotes the
investigator. What the matrix proves: a crash at any of the 41 concurrent nodes, or
anywhere inside the child, resumes without re-running a recorded node, without billing
a model call twice (the child's turns are billed per scoped node id) and without a
second note.

Conversation ``slow`` is the same with 50 ms tools (the fan-out benchmark,
``benchmarks/bench_fanout.py``); it is not in the default matrix.

Run it: ``crashmatrix run research`` (``--subject reference-delta`` for the other store).
"""

from __future__ import annotations

from typing import Any

import anyio

from crashmatrix.reference_runtime.agent import Agent, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.subagents import SubAgent

from ._workload import ScriptedWorkload
from .checkout import ScriptedModel
from .checkout.script import _call, _tool_results
from .checkout.tools import probe_mail, send_receipt

SOURCES = 40
DISPUTED = (7, 31)
DESK = "research-desk@example.test"
TOOL_LATENCY_MS = {"fanout": 0, "slow": 50}
SCRIPT = "crashmatrix.scenarios.research:respond"
CHILD_SCRIPT = "crashmatrix.scenarios.research:respond_child"


def source(i: int) -> dict[str, Any]:
    """Source ``i``'s content: deterministic; the two disputed ones disagree on power."""
    watts = 90 if i == DISPUTED[0] else 100
    return {"source": i, "title": f"Review {i} of the USB-C dock", "score": (i * 37) % 11, "power_w": watts}


async def read_source(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Read-only: one source (``latency_ms`` of the conversation, else a checkpoint)."""
    latency = TOOL_LATENCY_MS.get(getattr(ctx.resources, "conversation", ""), 0)
    if latency:
        await anyio.sleep(latency / 1000)
    else:
        await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", source(int(args["source"])))


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The researcher (runs in the model provider)."""
    read = _tool_results(messages, "read_source")
    if not read:
        calls = [_call("read_source", source=i) for i in range(1, SOURCES + 1)]
        calls.append(_call("investigate", task=f"Sources {DISPUTED[0]} and {DISPUTED[1]} disagree on the dock's power "
                                                 "rating: find out which is right and file a note for the desk."))
        return {"content": f"Reading {SOURCES} sources; asking an investigator about the disagreement.", "tool_calls": calls}
    total = sum(m["content"]["score"] for m in read)
    [finding] = [m["content"]["answer"] for m in _tool_results(messages, "investigate")]
    return {"content": f"Read {len(read)} sources (total score {total}). Investigator: {finding}", "tool_calls": []}


def respond_child(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The investigator (runs in the model provider; its transcript is its own scope's)."""
    read = _tool_results(messages, "read_source")
    if not read:
        return {"content": "Reading the two disputed sources.", "tool_calls": [_call("read_source", source=i) for i in DISPUTED]}
    notes = _tool_results(messages, "file_note")
    watts = sorted({m["content"]["power_w"] for m in read})
    if not notes:
        return {"content": "Filing a note.", "tool_calls": [_call(
            "file_note", to=DESK, subject="Power rating dispute",
            body=f"Sources {DISPUTED[0]} and {DISPUTED[1]} say {watts} W; the manufacturer sheet says 100 W.")]}
    return {"content": f"100 W is right (sources said {watts}); note {notes[0]['content']['message_id']} filed.", "tool_calls": []}


class ResearchWorkload(ScriptedWorkload):
    """See the module docstring. Providers: mail (the note), model."""

    name = "research"
    conversations = ("fanout",)
    all_conversations = ("fanout", "slow")  # type: ignore[assignment]
    providers = ("mail", "model")
    request = "Is the USB-C dock any good?"

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        investigator = Agent("investigator", ScriptedModel(resources, CHILD_SCRIPT), {
            "read_source": Tool("read_source", read_source),
            "file_note": Tool("file_note", send_receipt, effect=True, probe=probe_mail),
        }, resources=resources)
        return Agent(self.name, ScriptedModel(resources, SCRIPT), {
            "read_source": Tool("read_source", read_source),
            "investigate": SubAgent("investigate", investigator),
        }, resources=resources)


WORKLOAD = ResearchWorkload()
