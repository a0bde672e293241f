"""Record format versions: a log written by an older build (NodeRecord
format 1, committed in fixtures/log_v1.json) rehydrates and resumes on this build."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _walls_support import lookup

from crashmatrix.reference_runtime import Agent, ModelReply, RunGraph, Runtime, Tool
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import RECORD_FORMAT_VERSION, AppendOnlyLog, CorruptRecord, decode_row
from crashmatrix.reference_runtime.records_pb2 import NodeRecord

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "log_v1.json").read_text())
ROWS = FIXTURE["rows"]
pytestmark = pytest.mark.anyio


def _stored(rows: list[dict[str, Any]], run_id: str = "fixture-run") -> list[Any]:
    return [decode_row(run_id, r["seq"], r["node_id"], base64.b64decode(r["record_b64"])) for r in rows]


def test_fixture_is_format_1_and_upgrades_on_read() -> None:
    raw = NodeRecord()
    raw.ParseFromString(base64.b64decode(ROWS[0]["record_b64"]))
    assert raw.format_version == 1 and RECORD_FORMAT_VERSION == 2
    stored = _stored(ROWS)
    assert [s.record.format_version for s in stored] == [2] * len(ROWS)
    assert all(s.record.budget.wall_ms == 0 and not s.record.HasField("state") for s in stored)


def test_fixture_rehydrates_to_the_old_builds_final_state() -> None:
    graph = RunGraph.rehydrate("fixture-run", FIXTURE["input"], _stored(ROWS))
    assert graph.done() and graph.final_answer() == "dock-1 costs 12900"
    assert graph.budget() == {"tokens": 29, "model_calls": 3, "tool_calls": 3}
    assert [m["role"] for m in graph.transcript()] == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]


def test_newer_record_format_is_refused_naming_the_row() -> None:
    rec = NodeRecord(format_version=RECORD_FORMAT_VERSION + 1, node_id="turn-1", kind="model")
    with pytest.raises(CorruptRecord, match=r"run r seq 1 node 'turn-1': record format_version=3 is newer than this build's 2"):
        decode_row("r", 1, "turn-1", rec.SerializeToString())


class Continue:
    """The fixture's script from turn-2's tool call on (the old build recorded the rest)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        self.calls.append(node_id)
        assert node_id == "turn-3", node_id
        return ModelReply("dock-1 costs 12900", [], tokens=7)


async def test_a_v1_log_prefix_resumes_on_this_build(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    """The old build crashed after turn-2's record (seq 4): this build rehydrates the v1
    records, runs turn-2's tool and turn-3, and ends with the old build's transcript."""
    run_id = new_run_id()
    prefix = [r for r in ROWS if r["seq"] <= 4]
    assert prefix[-1]["node_id"] == "turn-2"
    await raw.execute(
        "INSERT INTO cm_runs (run_id, workload, input, status, lease_epoch) VALUES ($1, 'fixture', $2::jsonb, 'interrupted', 1)",
        run_id, json.dumps(FIXTURE["input"]),
    )
    for r in prefix:
        await raw.execute(
            "INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch) VALUES ($1, $2, $3, $4, $5)",
            run_id, r["seq"], r["node_id"], base64.b64decode(r["record_b64"]), r["lease_epoch"],
        )
    model = Continue()
    agent = Agent(name="fixture", model=model, tools={"lookup": Tool("lookup", lookup)})
    rt = Runtime(db, agent, worker_id="w-new", handle_sigterm=False)
    assert await rt.run(run_id) == "completed"
    assert model.calls == ["turn-3"]
    stored = await AppendOnlyLog(db).read(run_id)
    assert [s.node_id for s in stored] == [r["node_id"] for r in ROWS]
    old = RunGraph.rehydrate("fixture-run", FIXTURE["input"], _stored(ROWS))
    new = RunGraph.rehydrate(run_id, FIXTURE["input"], stored)
    assert new.transcript() == old.transcript()
    assert new.budget() == old.budget()
    formats = [NodeRecord.FromString(bytes(r["record"])).format_version for r in await raw.fetch(
        "SELECT record FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)]
    assert formats == [1, 1, 1, 1, 2, 2]  # old rows stay as written; new rows are format 2
