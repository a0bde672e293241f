"""Runtime.run end to end without the harness: real PostgreSQL, a scripted in-process
model and an in-memory provider (the provider's dict is its truth; the probe reads it)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import pytest

from crashmatrix.harness import crashpoint as cp
from crashmatrix.harness.services.postgres import PostgresService
from crashmatrix.reference_runtime import (
    Agent,
    AppendOnlyLog,
    ModelReply,
    OutcomeUnknown,
    ProbeOutcome,
    RunGraph,
    Runtime,
    Tool,
    ToolCall,
    ToolContext,
    ToolOutcome,
    connect,
    idempotency_key,
)
from crashmatrix.reference_runtime import attempts
from crashmatrix.reference_runtime.db import Db

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "buy one dock"}
_ids = itertools.count(1)


@dataclass
class ScriptedModel:
    """``script[node_id]`` is a list of (tool, arguments) calls, or a final answer (str).
    Every call issues fresh tool-call ids, as real models do."""

    script: dict[str, list[tuple[str, dict[str, Any]]] | str]
    calls: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        self.calls.append((node_id, json.loads(json.dumps(messages))))
        await anyio.lowlevel.checkpoint()
        step = self.script[node_id]
        if isinstance(step, str):
            return ModelReply(step, [], tokens=7)
        calls = [ToolCall(f"call_{next(_ids):012x}", name, args) for name, args in step]
        return ModelReply("", calls, tokens=11)

    def billed(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for node, _ in self.calls:
            out[node] = out.get(node, 0) + 1
        return out


@dataclass
class Provider:
    """A payment provider: deduplicates on the idempotency key; ``applied`` is the truth."""

    applied: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: int = 0
    probes: int = 0
    # behaviour knobs
    lose_response: int = 0  # the next N requests apply, then raise OutcomeUnknown
    lose_request: int = 0  # the next N requests raise OutcomeUnknown without applying
    probe_says: str | None = None  # force the probe's answer ("cannot_tell")
    before_apply: Callable[[ToolContext], Awaitable[None]] | None = None
    after_apply: Callable[[ToolContext], Awaitable[None]] | None = None

    async def charge(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        assert ctx.idem_key is not None
        self.requests += 1
        if self.before_apply is not None:
            await self.before_apply(ctx)
        if self.lose_request:
            self.lose_request -= 1
            raise OutcomeUnknown("connection reset before the request was sent")
        if ctx.idem_key not in self.applied:
            self.applied[ctx.idem_key] = {
                "id": "ch_" + hashlib.sha256(ctx.idem_key.encode()).hexdigest()[:12],
                "amount": args["amount"],
                "status": "succeeded",
            }
        if self.after_apply is not None:
            await self.after_apply(ctx)
        if self.lose_response:
            self.lose_response -= 1
            raise OutcomeUnknown("connection reset after the request was sent")
        return ToolOutcome("succeeded", dict(self.applied[ctx.idem_key]))

    async def probe(self, ctx: ToolContext) -> ProbeOutcome:
        self.probes += 1
        await anyio.lowlevel.checkpoint()
        if self.probe_says is not None:
            return ProbeOutcome(self.probe_says)  # type: ignore[arg-type]
        assert ctx.idem_key is not None
        if ctx.idem_key in self.applied:
            return ProbeOutcome("applied", ToolOutcome("succeeded", dict(self.applied[ctx.idem_key])))
        return ProbeOutcome("not_applied")


async def lookup(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"sku": args["sku"], "price": 12900})


def make_agent(model: ScriptedModel, provider: Provider, *, probe: bool = True) -> Agent:
    return Agent(
        name="mini-checkout",
        model=model,
        tools={
            "lookup": Tool("lookup", lookup),
            "charge": Tool("charge", provider.charge, effect=True, probe=provider.probe if probe else None),
        },
    )


ONE_CHARGE = {"turn-1": [("charge", {"amount": 12900})], "turn-2": "paid"}


async def start(db: Db, agent: Agent, run_id: str, worker: str = "w1", on_step: Any = None) -> Runtime:
    rt = Runtime(db, agent, worker_id=worker, handle_sigterm=False, on_step=on_step)
    await rt.create_run(run_id, agent.name, {"messages": [USER]})
    return rt


async def run_status(raw: asyncpg.Connection, run_id: str) -> tuple[str, str | None]:
    row = await raw.fetchrow("SELECT status, detail FROM cm_runs WHERE run_id = $1", run_id)
    return row["status"], row["detail"]


async def log_nodes(raw: asyncpg.Connection, run_id: str) -> list[tuple[int, str]]:
    rows = await raw.fetch("SELECT seq, node_id FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
    return [(r["seq"], r["node_id"]) for r in rows]


async def effects(raw: asyncpg.Connection, run_id: str) -> list[dict[str, Any]]:
    rows = await raw.fetch(
        "SELECT idem_key, node_id, status, result FROM cm_effects WHERE run_id = $1 ORDER BY node_id", run_id
    )
    return [{"key": r["idem_key"], "node": r["node_id"], "status": r["status"],
             "result": json.loads(r["result"]) if r["result"] else None} for r in rows]


async def rehydrate(db: Db, run_id: str) -> RunGraph:
    return RunGraph.rehydrate(run_id, {"messages": [USER]}, await AppendOnlyLog(db).read(run_id))


def call_ids(graph: RunGraph, node: str) -> list[str]:
    return [c["id"] for c in graph.output(node)["messages"][0].get("tool_calls", [])]


# -- the happy path ----------------------------------------------------------------------


async def test_run_to_completion(db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, provider = ScriptedModel({"turn-1": [("lookup", {"sku": "dock-1"}), ("charge", {"amount": 12900})],
                                     "turn-2": "paid"}), Provider()
    steps: list[tuple[str, str]] = []
    trace: list[tuple[str, str]] = []
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider), run_id, on_step=lambda phase, node: steps.append((phase, node)))
    cp.arm(lambda name, task: trace.append((name, task)))
    try:
        assert await rt.run(run_id) == "completed"
    finally:
        cp.disarm()

    assert await run_status(raw, run_id) == ("completed", None)
    nodes = await log_nodes(raw, run_id)
    assert [seq for seq, _ in nodes] == [1, 2, 3, 4]
    assert nodes[0][1] == "turn-1" and nodes[3][1] == "turn-2"
    assert {n for _, n in nodes[1:3]} == {"turn-1.tool-0", "turn-1.tool-1"}  # either commit order
    graph = await rehydrate(db, run_id)
    charge_call = call_ids(graph, "turn-1")[1]
    key = idempotency_key(run_id, charge_call)
    assert list(provider.applied) == [key] and provider.requests == 1 and provider.probes == 0
    assert await effects(raw, run_id) == [{"key": key, "node": "turn-1.tool-1", "status": "succeeded",
                                          "result": provider.applied[key]}]
    assert graph.final_answer() == "paid" and graph.done()
    assert graph.budget() == {"tokens": 18, "model_calls": 2, "tool_calls": 2}
    # the second turn saw the user, the first reply and both tool results, in node order
    turn2_messages = model.calls[1][1]
    assert [m["role"] for m in turn2_messages] == ["user", "assistant", "tool", "tool"]
    assert turn2_messages[3]["content"] == provider.applied[key]
    assert model.billed() == {"turn-1": 1, "turn-2": 1}
    # step boundaries and labelled points with their logical tasks
    for node in ("turn-1", "turn-1.tool-0", "turn-1.tool-1", "turn-2"):
        assert steps.index(("before", node)) < steps.index(("after", node))
    assert ("effect.started.before", "turn-1.tool-1") in trace
    assert ("tool.request.before", "turn-1.tool-0") in trace
    assert ("model.call.before", "turn-2") in trace
    assert trace.index(("effect.started.after", "turn-1.tool-1")) < trace.index(("tool.request.before", "turn-1.tool-1"))
    assert trace.count(("node.launch", "turn-2")) == 1
    assert not any(name.startswith(("probe.", "effect.unknown")) for name, _ in trace)

    # running a completed run again is a no-op: nothing re-billed, nothing re-charged
    assert await Runtime(db, make_agent(model, provider), worker_id="w2", handle_sigterm=False).run(run_id) == "completed"
    assert model.billed() == {"turn-1": 1, "turn-2": 1} and provider.requests == 1
    assert len(await log_nodes(raw, run_id)) == 4
    # nor is it taken again: a queue that redelivers its message (the ack was lost) more
    # often than the attempt limit allows must not turn it "failed" (attempts.py)
    epoch = await raw.fetchval("SELECT lease_epoch FROM cm_runs WHERE run_id = $1", run_id)
    for n in range(attempts.MAX_ATTEMPTS_WITHOUT_PROGRESS + 2):
        again = Runtime(db, make_agent(model, provider), worker_id=f"w{n + 3}", handle_sigterm=False)
        assert await again.run(run_id) == "completed"
    assert await run_status(raw, run_id) == ("completed", None)
    assert await raw.fetchval("SELECT lease_epoch FROM cm_runs WHERE run_id = $1", run_id) == epoch


# -- ambiguous outcomes ------------------------------------------------------------------


async def test_outcome_unknown_resolved_by_probe_applied(db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, provider = ScriptedModel(ONE_CHARGE), Provider(lose_response=1)
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider), run_id)
    assert await rt.run(run_id) == "completed"
    (key,) = provider.applied
    assert provider.requests == 1, "the probe said applied: the tool must not be called again"
    assert provider.probes == 1
    assert await effects(raw, run_id) == [{"key": key, "node": "turn-1.tool-0", "status": "succeeded",
                                          "result": provider.applied[key]}]
    graph = await rehydrate(db, run_id)
    assert graph.output("turn-1.tool-0")["messages"][0]["content"] == provider.applied[key]
    assert await log_nodes(raw, run_id) == [(1, "turn-1"), (2, "turn-1.tool-0"), (3, "turn-2")]


async def test_outcome_unknown_not_applied_retries_once(db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, provider = ScriptedModel(ONE_CHARGE), Provider(lose_request=1)
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider), run_id)
    assert await rt.run(run_id) == "completed"
    assert provider.requests == 2 and provider.probes == 1 and len(provider.applied) == 1
    assert [e["status"] for e in await effects(raw, run_id)] == ["succeeded"]


async def test_probe_cannot_tell_needs_human(db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, provider = ScriptedModel(ONE_CHARGE), Provider(lose_response=1, probe_says="cannot_tell")
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider), run_id)
    assert await rt.run(run_id) == "needs_human"
    status, detail = await run_status(raw, run_id)
    assert status == "needs_human" and detail is not None and "cannot tell" in detail and "turn-1.tool-0" in detail
    assert [e["status"] for e in await effects(raw, run_id)] == ["unknown"]
    assert await log_nodes(raw, run_id) == [(1, "turn-1")]
    assert provider.requests == 1 and model.billed() == {"turn-1": 1}


async def test_no_probe_needs_human(db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, provider = ScriptedModel(ONE_CHARGE), Provider(lose_response=1)
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider, probe=False), run_id)
    assert await rt.run(run_id) == "needs_human"
    assert "no probe" in ((await run_status(raw, run_id))[1] or "")
    assert provider.requests == 1


# -- cancellation and resume -------------------------------------------------------------


@pytest.mark.parametrize("applied_before_cancel", [True, False], ids=["applied", "not-applied"])
async def test_cancel_leaves_unknown_then_resume_completes(
    db: Db, raw: asyncpg.Connection, pg: PostgresService, new_run_id: Callable[[], str], applied_before_cancel: bool,
) -> None:
    entered = anyio.Event()

    async def hang(ctx: ToolContext) -> None:
        entered.set()
        await anyio.sleep_forever()

    model = ScriptedModel(ONE_CHARGE)
    provider = Provider(**({"after_apply": hang} if applied_before_cancel else {"before_apply": hang}))
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider), run_id)
    scope = anyio.CancelScope()
    outcome: list[str] = []

    async def worker() -> None:
        with scope:
            outcome.append(await rt.run(run_id))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            await entered.wait()
            scope.cancel()
    assert outcome == [], "the cancellation must propagate out of Runtime.run"
    assert scope.cancelled_caught

    # crash state: the effect is unknown (never left started), the run interrupted
    assert [(e["node"], e["status"]) for e in await effects(raw, run_id)] == [("turn-1.tool-0", "unknown")]
    assert (await run_status(raw, run_id))[0] == "interrupted"
    assert await log_nodes(raw, run_id) == [(1, "turn-1")]
    assert len(provider.applied) == (1 if applied_before_cancel else 0)

    # resume on another worker with its own connection: the probe decides
    provider.before_apply = provider.after_apply = None
    other = await connect(pg.dsn, application_name="cm-test-resume")
    try:
        rt2 = Runtime(other, make_agent(model, provider), worker_id="w2", handle_sigterm=False)
        with anyio.fail_after(10):
            assert await rt2.run(run_id) == "completed"
    finally:
        await other.close()
    assert provider.probes == 1
    assert provider.requests == (1 if applied_before_cancel else 2)
    (key,) = provider.applied
    assert await effects(raw, run_id) == [{"key": key, "node": "turn-1.tool-0", "status": "succeeded",
                                          "result": provider.applied[key]}]
    assert await run_status(raw, run_id) == ("completed", None)
    assert await log_nodes(raw, run_id) == [(1, "turn-1"), (2, "turn-1.tool-0"), (3, "turn-2")]
    epochs = [r["lease_epoch"] for r in await raw.fetch(
        "SELECT lease_epoch FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)]
    assert epochs == [1, 2, 2]
    assert model.billed() == {"turn-1": 1, "turn-2": 1}
    # the key is the one the recorded turn-1 issued: stable across attempts
    graph = await rehydrate(db, run_id)
    assert key == idempotency_key(run_id, call_ids(graph, "turn-1")[0])


# -- concurrency -------------------------------------------------------------------------


async def test_parallel_tool_calls_overlap_and_log_stays_contiguous(
    db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str],
) -> None:
    arrived = {"turn-1.tool-0": anyio.Event(), "turn-1.tool-1": anyio.Event()}
    active = 0
    most = 0

    async def rendezvous(ctx: ToolContext) -> None:
        """Each call waits until the other one has started: only concurrent calls pass."""
        nonlocal active, most
        active += 1
        most = max(most, active)
        arrived[ctx.node_id].set()
        other = "turn-1.tool-1" if ctx.node_id == "turn-1.tool-0" else "turn-1.tool-0"
        try:
            with anyio.fail_after(5):
                await arrived[other].wait()
        finally:
            active -= 1

    model = ScriptedModel({"turn-1": [("charge", {"amount": 100}), ("charge", {"amount": 200})], "turn-2": "paid twice"})
    provider = Provider(before_apply=rendezvous)
    run_id = new_run_id()
    rt = await start(db, make_agent(model, provider), run_id)
    with anyio.fail_after(15):
        assert await rt.run(run_id) == "completed"
    assert most == 2, "the two tool calls never ran at the same time"
    nodes = await log_nodes(raw, run_id)
    assert [seq for seq, _ in nodes] == [1, 2, 3, 4]
    assert nodes[0] == (1, "turn-1") and nodes[3] == (4, "turn-2")
    assert {n for _, n in nodes[1:3]} == {"turn-1.tool-0", "turn-1.tool-1"}
    rows = await effects(raw, run_id)
    assert [(e["node"], e["status"], e["result"]["amount"]) for e in rows] == [
        ("turn-1.tool-0", "succeeded", 100), ("turn-1.tool-1", "succeeded", 200),
    ]
    assert len(provider.applied) == 2 and provider.requests == 2
    # the join turn saw both tool results, in node order
    turn2 = model.calls[-1][1]
    assert [m.get("content", {}).get("amount") for m in turn2 if m["role"] == "tool"] == [100, 200]
