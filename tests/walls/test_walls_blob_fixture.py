"""An older build's blobs resume on this build (an old-version blob fixture).

``fixtures/log_v2_blobs.json`` was written by build f0cc892 (``make_log_v2_blobs.py``
says how): a ~20 KB document in a tool's output (the record holds a blob pointer whose
file URI names a directory that is gone) and the same document on the run's state, in a
state document of schema ``report-fixture`` **version 1**, also a blob. This build loads
the log up to that tool's record, resolves both pointers by digest in a new blob
directory, upgrades the v1 state document with the v2 schema's upgrader, and finishes
the run with the old build's answer."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import asyncpg
import pytest

from crashmatrix.reference_runtime import Agent, ModelReply, RunGraph, Runtime, Tool, ToolCall, ToolContext, ToolOutcome, codec
from crashmatrix.reference_runtime.blobs import BlobIntegrityError, LocalBlobStore
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog, decode_row
from crashmatrix.reference_runtime.state_codec import StateSchema

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "log_v2_blobs.json").read_text())
ROWS = FIXTURE["rows"]
RENDERED = 2  # seq of render's record (turn-1.tool-0): the old build "crashed" after it
pytestmark = pytest.mark.anyio


def blob_store(root: Path) -> LocalBlobStore:
    store = LocalBlobStore(root)
    for digest, data in FIXTURE["blobs"].items():
        assert store.put(base64.b64decode(data)).sha256.hex() == digest
    return store


def schema_v2() -> StateSchema:
    """This build's schema: version 2 keeps the report's title and text as two fields."""
    schema = StateSchema("report-fixture", version=2)
    schema.field("title")
    schema.field("text")

    @schema.upgrader(1)
    def split(fields: dict[str, Any]) -> dict[str, Any]:
        report = fields.pop("report")
        return {**fields, "title": report["title"], "text": report["text"]}

    return schema


class Continue:
    """The old build's script from turn-2 on."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        self.calls.append(node_id)
        if node_id == "turn-2":
            return ModelReply("", [ToolCall("call_turn-2", "publish", {"to": "desk@example.test"})], tokens=11)
        assert node_id == "turn-3", node_id
        return ModelReply(f"published, sha256 {messages[-1]['content']['sha256']}", [], tokens=7)


async def publish(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    text = ctx.state["text"]  # the v2 field, filled from the v1 document by the upgrader
    return ToolOutcome("succeeded", {"to": args["to"], "bytes": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()})


def test_the_fixture_holds_blob_pointers_to_a_gone_directory_and_a_v1_state(tmp_path: Path) -> None:
    stored = [decode_row("fixture-run", r["seq"], r["node_id"], base64.b64decode(r["record_b64"])) for r in ROWS]
    render = stored[RENDERED - 1].record
    assert render.node_id == "turn-1.tool-0" and render.format_version == 2
    assert render.output.WhichOneof("body") == "blob" and render.state.WhichOneof("body") == "blob"
    assert not Path(urlparse(render.output.blob.uri).path).exists()  # the old build's directory
    doc = json.loads(base64.b64decode(FIXTURE["blobs"][render.state.blob.sha256.hex()]))
    assert doc["schema"] == "report-fixture" and doc["version"] == 1 and set(doc["fields"]) == {"report"}
    # the whole old log rehydrates here, outputs read from the blobs by digest
    graph = RunGraph.rehydrate("fixture-run", FIXTURE["input"], stored, blobs=blob_store(tmp_path / "blobs"))
    assert graph.final_answer() == FIXTURE["answer"]
    assert graph.state(schema_v2())["title"] == "Dock soak test"


async def test_an_old_builds_blobs_resume_on_this_build(db: Db, raw: asyncpg.Connection, new_run_id: Any, tmp_path: Path) -> None:
    run_id = new_run_id()
    await raw.execute(
        "INSERT INTO cm_runs (run_id, workload, input, status, lease_epoch) VALUES ($1, 'fixture', $2::jsonb, 'interrupted', 1)",
        run_id, json.dumps(FIXTURE["input"]))
    for r in ROWS[:RENDERED]:
        await raw.execute("INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch) VALUES ($1, $2, $3, $4, $5)",
                          run_id, r["seq"], r["node_id"], base64.b64decode(r["record_b64"]), r["lease_epoch"])
    blobs = blob_store(tmp_path / "blobs")
    model = Continue()
    agent = Agent("fixture", model, {"publish": Tool("publish", publish)}, state_schema=schema_v2())
    rt = Runtime(db, agent, worker_id="w-new", handle_sigterm=False, blobs=blobs)
    assert await rt.run(run_id) == "completed"
    assert model.calls == ["turn-2", "turn-3"]
    graph = RunGraph.rehydrate(run_id, FIXTURE["input"], await AppendOnlyLog(db).read(run_id), blobs=blobs)
    assert graph.final_answer() == FIXTURE["answer"]  # the digest of the document read back from the v1 state blob
    old = RunGraph.rehydrate("fixture-run", FIXTURE["input"], [
        decode_row("fixture-run", r["seq"], r["node_id"], base64.b64decode(r["record_b64"])) for r in ROWS], blobs=blobs)
    assert graph.transcript() == old.transcript()


def test_a_corrupted_old_blob_is_refused_not_read(tmp_path: Path) -> None:
    blobs = blob_store(tmp_path / "blobs")
    render = decode_row("fixture-run", RENDERED, "turn-1.tool-0", base64.b64decode(ROWS[RENDERED - 1]["record_b64"])).record
    path = blobs.path_for(render.output.blob.sha256.hex())
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(BlobIntegrityError, match="is corrupt"):
        codec.decode(render.output, blobs=blobs)
