"""What the runtime benchmarks share: the reference runtime's workloads driven in process.

The workloads' scripted models normally run inside the model provider; here
:class:`LocalModel` calls the same script function in the benchmark's process (no HTTP,
no provider bill), and :func:`local_effects` swaps each mail effect for an in-memory
provider with the same idempotency semantics, so what is measured is the runtime and
PostgreSQL, not the providers. :class:`MemoryStore` is a store strategy with no I/O at
all (the scheduler-overhead figure), and :class:`TimedExecution` records when each
node's append started and ended and how long it took (encode + insert + commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from crashmatrix.reference_runtime import Agent, ModelReply, ProbeOutcome, Tool, ToolCall, ToolContext, ToolOutcome
from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.effects import idempotency_key
from crashmatrix.reference_runtime.executor import Execution, Runtime
from crashmatrix.reference_runtime.graph import RunGraph
from crashmatrix.reference_runtime.leases import Lease
from crashmatrix.reference_runtime.logstore import RECORD_FORMAT_VERSION, EffectOutcome, StoredRecord
from crashmatrix.reference_runtime.records_pb2 import Budget, NodeRecord
from crashmatrix.reference_runtime.state_codec import TrackedState
from crashmatrix.reference_runtime.subagents import SubAgent
from crashmatrix.scenarios import long_run, research

_ids = itertools.count(1)


@dataclass
class Resources:
    """What the workloads' tools read from their resources: the conversation only."""

    conversation: str


class LocalModel:
    """A workload's script (``respond(conversation, messages)``) called in process."""

    def __init__(self, script: Any, conversation: str) -> None:
        self.script = script
        self.conversation = conversation

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        await anyio.lowlevel.checkpoint()
        body = self.script(self.conversation, messages)
        calls = [ToolCall(f"call_{next(_ids):012x}", c["name"], c["arguments"]) for c in body["tool_calls"]]
        return ModelReply(body["content"], calls, tokens=len(body["content"]) + 10)


class MemoryProvider:
    """An in-memory mail provider: applies once per idempotency key, answers probes."""

    def __init__(self) -> None:
        self.applied: dict[str, dict[str, Any]] = {}

    async def send(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        await anyio.lowlevel.checkpoint()
        assert ctx.idem_key is not None
        body = self.applied.setdefault(ctx.idem_key, {"message_id": f"msg_{ctx.idem_key[:16]}", "status": "sent",
                                                      "to": args.get("to"), "subject": args.get("subject")})
        return ToolOutcome("succeeded", body)

    async def probe(self, ctx: ToolContext) -> ProbeOutcome:
        assert ctx.idem_key is not None
        if ctx.idem_key in self.applied:
            return ProbeOutcome("applied", ToolOutcome("succeeded", self.applied[ctx.idem_key]))
        return ProbeOutcome("not_applied")


def local_agent(agent: Agent, scripts: dict[str, Any], conversation: str, provider: MemoryProvider) -> Agent:
    """``agent`` (and its sub-agents) with in-process models (``scripts[agent.name]``) and
    every effect tool served by ``provider``."""
    agent.model = LocalModel(scripts[agent.name], conversation)
    for name, tool in list(agent.tools.items()):
        if isinstance(tool, SubAgent):
            local_agent(tool.agent, scripts, conversation, provider)
        elif tool.effect:
            agent.tools[name] = Tool(name, provider.send, effect=True, probe=provider.probe)
    return agent


SCRIPTS = {"research": research.respond, "investigator": research.respond_child, "long_run": long_run.respond}


class NoLedger:
    """An effects ledger with no I/O (nothing is ever found: every effect is new)."""

    async def get(self, run_id: str, key: str) -> None:
        return None

    async def mark_started(self, *args: Any) -> None:
        pass

    async def mark_unknown(self, *args: Any) -> None:
        pass


def agent(workload: Any, conversation: str) -> Any:
    """``workload``'s agent for ``conversation`` with its scripts as local models and its
    effects on an in-memory provider."""
    return local_agent(workload.build_agent(conversation, Resources(conversation)), SCRIPTS, conversation, MemoryProvider())


async def untimed_execution(rt: Runtime, run_id: str, run_input: dict[str, Any], lease: Lease) -> int:
    """Schedule one run to its end on ``rt`` (no lease, status or trace writes: the
    executor only), nothing timed (``bench_fanout.one_execution`` times each append: two
    clock reads and an :class:`AppendTiming` a node, ~35,000 instructions in the chain
    that are the benchmark's, not the executor's); the nodes recorded."""
    execution = Execution(rt, RunGraph.rehydrate(run_id, run_input, await rt.store.read(run_id), blobs=None), lease)
    status, _ = await execution.schedule()
    assert status == "completed", status
    return len(execution.graph.records)


async def drive_chain_floor(workload: Any, conversation: str, *, walls: bool = True, wl_agent: Any = None) -> int:
    """One run of a chain workload (``long_run``: a model node and a tool node a turn) by
    a bare loop, no executor; the nodes run. Per node: the workload's own code (the
    model's script or the tool, with their awaits; the transcript a list the loop
    extends) and, with ``walls``, what a durable executor cannot do without: the output
    through the codec's durability check, the state fields through the schema, one
    ``NodeRecord`` built as the executor builds it (with the specs a model turn spawns),
    the append's one suspension. Nothing else: no graph, scheduler, crash point, hook,
    budget or ledger. What the executor costs above ``walls=True`` is its bookkeeping;
    ``walls=False`` is the workload alone, what no executor can go below. ``wl_agent``:
    the agent to drive (default: :func:`agent`'s, built here)."""
    wl_agent = wl_agent if wl_agent is not None else agent(workload, conversation)
    schema, run_id = wl_agent.state_schema, f"floor-{next(_ids)}"
    messages = list(workload.run_input(conversation).get("messages", []))
    state: dict[str, Any] = {}
    nodes, turn, parents = 0, 1, []
    empty = codec.encode_trusted({})
    while True:
        node_id = f"turn-{turn}"
        reply = await wl_agent.model.complete(run_id, node_id, messages)
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            assistant["tool_calls"] = calls
        if walls:
            payload, read = codec.encode_read({"messages": [assistant]})
            tools = [f"{node_id}.tool-{i}" for i in range(len(calls))]
            spawned = [{"node_id": t, "kind": "tool", "parents": [node_id], "input": codec.encode_trusted({"call": c})}
                       for t, c in zip(tools, calls)]
            if calls:
                spawned.append({"node_id": f"turn-{turn + 1}", "kind": "model", "parents": tools, "input": empty})
            NodeRecord(format_version=RECORD_FORMAT_VERSION, node_id=node_id, parents=parents, kind="model",
                       output=payload, spawned=spawned, budget=Budget(tokens=reply.tokens, model_calls=1), lease_epoch=1)
            await asyncio.sleep(0)
            messages.extend(read["messages"])
        else:
            messages.append(assistant)
        nodes += 1
        if not calls:
            return nodes
        parents = []
        for i, call in enumerate(calls):
            tool_node = f"{node_id}.tool-{i}"
            tool = wl_agent.tools[call["name"]]
            ctx = ToolContext(run_id, tool_node, idempotency_key(run_id, call["id"]) if tool.effect else None,
                              wl_agent.resources, TrackedState(state))
            outcome = await tool.fn(ctx, call["arguments"])
            message = {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "status": outcome.status,
                       "content": outcome.result}
            updates = ctx.state.updates()
            if walls:
                payload, read = codec.encode_read({"messages": [message]})
                record = NodeRecord(format_version=RECORD_FORMAT_VERSION, node_id=tool_node, parents=[node_id], kind="tool",
                                    output=payload, budget=Budget(tool_calls=1), lease_epoch=1)
                if updates:
                    record.state.CopyFrom(schema.encode(updates))
                await asyncio.sleep(0)
                messages.extend(read["messages"])
            else:
                messages.append(message)
            state.update(updates)
            parents.append(tool_node)
            nodes += 1
        turn += 1


class MemoryStore:
    """A store strategy with no I/O (records kept in a dict): what the scheduler costs
    by itself. Not durable; benchmarks only."""

    def __init__(self) -> None:
        self.runs: dict[str, list[StoredRecord]] = {}

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        log = self.runs.setdefault(lease.run_id, [])
        assert len(log) == seq - 1, (len(log), seq)
        log.append(StoredRecord(seq, record.node_id, record))
        return True

    async def read(self, run_id: str) -> list[StoredRecord]:
        return list(self.runs.get(run_id, []))


@dataclass
class AppendTiming:
    """One append: the node, its seq, and perf_counter seconds at start and end."""

    node_id: str
    kind: str
    start: float
    end: float

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000


@dataclass
class Timings:
    appends: list[AppendTiming] = field(default_factory=list)
    beside: Callable[[], Awaitable[float]] | None = None
    """Awaited after each append, outside its timing: something measured beside the
    appends in the same run (``bench_runtime_store``: the one-row commit floor, so the
    ratio holds when the disk's speed drifts); its figure goes to ``besides``."""
    besides: list[tuple[str, float]] = field(default_factory=list)


class TimedExecution(Execution):
    """The executor's ``append`` (encode + insert + commit), timed per node."""

    timings: Timings

    async def append(self, spec: Any, output: Any, spawned: Any, budget: Any, effect: Any, *, state_updates: Any = None) -> None:
        t0 = time.perf_counter()
        await super().append(spec, output, spawned, budget, effect, state_updates=state_updates)
        self.timings.appends.append(AppendTiming(spec.node_id, spec.kind, t0, time.perf_counter()))
        if self.timings.beside is not None:
            self.timings.besides.append((spec.node_id, await self.timings.beside()))


class TimedRuntime(Runtime):
    """A runtime whose executions record :class:`Timings` into ``self.timings``."""

    timings: Timings

    @property
    def execution_class(self) -> type[Execution]:
        timings = self.timings

        class _Timed(TimedExecution):
            pass

        _Timed.timings = timings
        return _Timed


def print_figures(result: Any, json_path: str | None) -> None:
    """Print ``result`` as indented JSON and, with ``json_path``, write it there too
    (values JSON cannot hold are written as their ``str``)."""
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if json_path:
        Path(json_path).write_text(text + "\n")


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``xs``."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


@contextlib.asynccontextmanager
async def postgres_dsn(dsn: str | None) -> AsyncIterator[str]:
    """The DSN to measure on: ``dsn``, else ``$CRASHMATRIX_PG_DSN``, else an embedded
    PostgreSQL started here (fsync on) and stopped on exit."""
    from crashmatrix.harness.services.postgres import DSN_ENV, start_postgres

    dsn = dsn or os.environ.get(DSN_ENV)
    if dsn is not None:
        yield dsn
        return
    workdir = Path(tempfile.mkdtemp(prefix="cm-bench-"))
    try:
        service = start_postgres(workdir)
        try:
            yield service.dsn
        finally:
            service.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
