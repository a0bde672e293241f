"""The ``long_run`` workload: hundreds of turns, for the cost-growth measurements.

Flow: turn ``n`` (1..N-1) calls ``step(n)``, a read-only tool that also keeps the run's
progress on the state (a durable field, written with the tool node's record); every
:data:`REPORT_EVERY`-th turn calls ``send_progress`` instead, a mail effect (keyed and
probed like checkout's receipt), so the effects ledger gets rows (and updates) over the
whole run; turn N answers with the checksum of every step. A turn is one model node and
one tool node, so conversation ``t200`` appends 399 records.

What it is for: a run whose log grows long. The matrix shows that a crash at turn 190
resumes from turn 190, not from the start (no re-billed turn, no second progress mail);
``benchmarks/bench_runtime_store.py`` drives the same agent for 1,000 turns in process
and measures the append at turn 10 and at turn 1,000 for each store strategy, and the
store's operating costs (bytes per 1,000 turns, TOAST, dead tuples, autovacuum).

Its full matrix (~2,400 step and label points x 3 kinds, each case a ~200-turn run) is a
CLI run (``crashmatrix run long_run --shard K/N``); the tests run a slice.
"""

from __future__ import annotations

import hashlib
from typing import Any

import anyio

from crashmatrix.reference_runtime.agent import Agent, Tool, ToolContext, ToolOutcome

from ._workload import ScriptedWorkload, durable_schema
from .checkout import ScriptedModel
from .checkout.script import _call, _tool_results
from .checkout.tools import probe_mail, send_receipt

REPORT_EVERY = 25
OWNER = "owner@example.test"
SCRIPT = "crashmatrix.scenarios.long_run:respond"


def turns_of(conversation: str) -> int:
    """``"t200"`` -> 200; raises KeyError naming the conversation otherwise."""
    if conversation.startswith("t") and conversation[1:].isdigit() and 2 <= int(conversation[1:]) <= 100_000:
        return int(conversation[1:])
    raise KeyError(f"conversation={conversation!r} must look like tN (N turns, 2 <= N <= 100000), e.g. t200")


def digest(n: int) -> str:
    """Step ``n``'s checksum (12 hex)."""
    return hashlib.sha256(f"step-{n}".encode()).hexdigest()[:12]


async def step(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    n = int(args["n"])
    ctx.state["progress"] = {"steps": n, "last": digest(n)}
    return ToolOutcome("succeeded", {"n": n, "digest": digest(n)})


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Turn n: the transcript holds the user's message and two messages per earlier turn
    (runs in the model provider; O(1) but for the last turn and the reports)."""
    total = turns_of(conversation)
    n = (len(messages) - 1) // 2 + 1
    if n >= total:
        steps = [m["content"]["digest"] for m in _tool_results(messages, "step")]
        mails = len(_tool_results(messages, "send_progress"))
        check = hashlib.sha256("".join(steps).encode()).hexdigest()[:12]
        return {"content": f"Done: {len(steps)} steps (checksum {check}), {mails} progress mails.", "tool_calls": []}
    if n % REPORT_EVERY == 0:
        return {"content": f"Turn {n}: reporting progress.", "tool_calls": [_call(
            "send_progress", to=OWNER, subject=f"Progress at turn {n}", body=f"{len(_tool_results(messages, 'step'))} steps done.")]}
    return {"content": f"Turn {n}: next step.", "tool_calls": [_call("step", n=n)]}


class LongRunWorkload(ScriptedWorkload):
    """See the module docstring. Providers: mail (progress reports), model. Any
    ``tN`` conversation is accepted (the benchmarks run ``t1000``); the matrix runs
    ``t200``."""

    name = "long_run"
    conversations = ("t200",)
    providers = ("mail", "model")
    request = "Work through the backlog."

    def check_conversation(self, conversation: str) -> None:
        turns_of(conversation)

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        return Agent(self.name, ScriptedModel(resources, SCRIPT), {
            "step": Tool("step", step),
            "send_progress": Tool("send_progress", send_receipt, effect=True, probe=probe_mail),
        }, resources=resources, max_turns=turns_of(conversation), state_schema=durable_schema("long_run", "progress"))


WORKLOAD = LongRunWorkload()
