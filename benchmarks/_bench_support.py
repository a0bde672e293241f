"""What the runtime benchmarks share: the issue-5 workloads driven in process.

The workloads' scripted models normally run inside the model provider; here
:class:`LocalModel` calls the same script function in the benchmark's process (no HTTP,
no provider bill), and :func:`local_effects` swaps each mail effect for an in-memory
provider with the same idempotency semantics, so what is measured is the runtime and
PostgreSQL, not the providers. :class:`MemoryStore` is a store strategy with no I/O at
all (the scheduler-overhead figure), and :class:`TimedExecution` records when each
node's append started and ended and how long it took (encode + insert + commit).
"""

from __future__ import annotations

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
from crashmatrix.reference_runtime.executor import Execution, Runtime
from crashmatrix.reference_runtime.leases import Lease
from crashmatrix.reference_runtime.logstore import EffectOutcome, StoredRecord
from crashmatrix.reference_runtime.records_pb2 import NodeRecord
from crashmatrix.reference_runtime.subagents import SubAgent

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
