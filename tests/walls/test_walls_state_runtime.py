"""The state codec inside the runtime: a tool that puts a live client on the state is
refused at write time with the field's name; declared transient, the run completes and
the client is rebuilt on every load; durable fields survive a resume."""

from __future__ import annotations

import json
from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel

from crashmatrix.reference_runtime import Agent, RunGraph, Runtime, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog
from crashmatrix.reference_runtime.state_codec import StateSchema

pytestmark = pytest.mark.anyio
USER = {"role": "user", "content": "fill the cart"}


class InventoryClient:
    """A live client (think aiohttp session): must never be checkpointed."""

    made = 0

    def __init__(self, resources: Any = None) -> None:
        InventoryClient.made += 1
        self.serial = InventoryClient.made


async def connect_inventory(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    ctx.state["inventory"] = InventoryClient()
    ctx.state["cart"] = [args["sku"]]
    return ToolOutcome("succeeded", {"connected": True})


class Gate:
    def __init__(self) -> None:
        self.block = True
        self.entered = anyio.Event()
        self.seen: list[tuple[Any, Any]] = []


def make_check(gate: Gate):
    async def check_stock(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        gate.seen.append((ctx.state.get("cart"), ctx.state.get("inventory")))
        if gate.block:
            gate.entered.set()
            await anyio.sleep_forever()
        return ToolOutcome("succeeded", {"in_stock": True, "cart": ctx.state["cart"]})
    return check_stock


SCRIPT = {"turn-1": [("connect_inventory", {"sku": "dock-1"})], "turn-2": [("check_stock", {})], "turn-3": "in stock"}


def agent(schema: StateSchema | None, gate: Gate) -> Agent:
    return Agent(
        name="drift", model=ScriptedModel(SCRIPT), state_schema=schema,
        tools={"connect_inventory": Tool("connect_inventory", connect_inventory), "check_stock": Tool("check_stock", make_check(gate))},
    )


async def test_a_live_client_on_the_state_fails_at_write_time_naming_the_field(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    schema = StateSchema("drift")
    schema.field("cart")  # the client is not declared: the drift
    run_id = new_run_id()
    rt = Runtime(db, agent(schema, Gate()), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "drift", {"messages": [USER]})
    with pytest.raises(Exception, match="state field 'inventory'"):
        await rt.run(run_id)
    status, detail = await raw.fetchrow("SELECT status, detail FROM cm_runs WHERE run_id = $1", run_id)
    assert status == "failed" and "UnknownStateField" in detail and "'inventory'" in detail and "InventoryClient" in detail
    nodes = [r["node_id"] for r in await raw.fetch("SELECT node_id FROM cm_run_log WHERE run_id = $1", run_id)]
    assert nodes == ["turn-1"]  # the tool node that set it was never recorded


async def test_without_any_schema_setting_state_fails_too(db: Db, new_run_id: Any) -> None:
    run_id = new_run_id()
    rt = Runtime(db, agent(None, Gate()), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "drift", {"messages": [USER]})
    with pytest.raises(Exception, match="declares no state schema"):
        await rt.run(run_id)


async def test_transient_declaration_fixes_it_and_state_survives_a_resume(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    schema = StateSchema("drift")
    schema.field("cart")
    schema.transient("inventory", InventoryClient)
    gate = Gate()
    run_id = new_run_id()
    rt = Runtime(db, agent(schema, gate), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "drift", {"messages": [USER]})
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            async def cancel_when_blocked() -> None:
                await gate.entered.wait()
                scope.cancel()
            tg.start_soon(cancel_when_blocked)
            await rt.run(run_id)
    assert (await raw.fetchval("SELECT status FROM cm_runs WHERE run_id = $1", run_id)) == "interrupted"
    cart1, client1 = gate.seen[0]
    assert cart1 == ["dock-1"] and isinstance(client1, InventoryClient)
    # what was written: the cart, never the client
    stored = await AppendOnlyLog(db).read(run_id)
    states = [s.record.state for s in stored if s.record.HasField("state")]
    assert len(states) == 1 and b"inventory" not in states[0].inline and b"dock-1" in states[0].inline
    graph = RunGraph.rehydrate(run_id, {"messages": [USER]}, stored)
    assert graph.state(schema) == {"cart": ["dock-1"]}

    gate.block = False
    rt2 = Runtime(db, agent(schema, gate), worker_id="w2", handle_sigterm=False)
    assert await rt2.run(run_id) == "completed"
    cart2, client2 = gate.seen[-1]
    assert cart2 == ["dock-1"]  # the durable field, from the log
    assert isinstance(client2, InventoryClient) and client2 is not client1  # rebuilt by its factory
    out = json.loads(json.dumps(RunGraph.rehydrate(run_id, {"messages": [USER]}, await AppendOnlyLog(db).read(run_id)).transcript()))
    assert out[-2]["content"] == {"in_stock": True, "cart": ["dock-1"]}
