"""The ``drift`` workload (scenarios/drift.py) in process: undeclared, the live client is
refused at write time naming the field; declared transient, the run completes with a
live client in the second tool. (Its harness matrix: ``crashmatrix run
crashmatrix.scenarios.drift:WORKLOAD --conversation fixed``.)"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg
import pytest

from crashmatrix.reference_runtime import ModelReply, RunGraph, Runtime, ToolCall
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog
from crashmatrix.scenarios import drift

pytestmark = pytest.mark.anyio
_ids = itertools.count(1)


@dataclass
class Session:
    closed: bool = False


@dataclass
class Res:
    session: Session
    conversation: str


class LocalModel:
    """drift.respond, called in process instead of through the model provider."""

    def __init__(self, conversation: str) -> None:
        self.conversation = conversation

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        await anyio.lowlevel.checkpoint()
        body = drift.respond(self.conversation, messages)
        calls = [ToolCall(f"call_{next(_ids)}", c["name"], c["arguments"]) for c in body["tool_calls"]]
        return ModelReply(body["content"], calls, tokens=5)


async def run(db: Db, conversation: str, run_id: str) -> str:
    agent = drift.WORKLOAD.build_agent(conversation, Res(Session(), conversation))
    agent.model = LocalModel(conversation)
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "drift", drift.WORKLOAD.run_input(conversation))
    try:
        return await rt.run(run_id)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"


async def test_undeclared_live_client_is_refused_naming_the_field(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    run_id = new_run_id()
    outcome = await run(db, "drift", run_id)
    assert outcome.startswith("raised UnknownStateField") and "'inventory'" in outcome and "InventoryClient" in outcome
    status, detail = await raw.fetchrow("SELECT status, detail FROM cm_runs WHERE run_id = $1", run_id)
    assert status == "failed" and "state field 'inventory'" in detail


async def test_transient_declaration_fixes_it(db: Db, new_run_id: Any) -> None:
    run_id = new_run_id()
    assert await run(db, "fixed", run_id) == "completed"
    graph = RunGraph.rehydrate(run_id, {}, await AppendOnlyLog(db).read(run_id))
    assert graph.final_answer() == "Reserved: {'reserved': [{'qty': 1, 'sku': 'dock-1'}]}"
    assert graph.state(drift.schema(True)) == {"cart": [{"sku": "dock-1", "qty": 1}]}
