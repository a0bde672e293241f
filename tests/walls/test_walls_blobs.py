"""Blob pointers (reference_runtime/blobs.py): large outputs go to a content-addressed
local store, the record keeps uri/size/sha256, reads verify and fail clearly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel

from crashmatrix.reference_runtime import Agent, RunGraph, Runtime, Tool, ToolContext, ToolOutcome, codec
from crashmatrix.reference_runtime.blobs import DEFAULT_THRESHOLD, BlobIntegrityError, BlobMissing, LocalBlobStore
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import AppendOnlyLog
from crashmatrix.reference_runtime.records_pb2 import NodeRecord


def test_put_get_round_trip_content_addressed_and_atomic(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    data = b"x" * 10_000
    p1 = store.put(data)
    p2 = store.put(data)
    digest = hashlib.sha256(data).digest()
    assert p1 == p2 and p1.size == 10_000 and p1.sha256 == digest
    assert p1.uri == (tmp_path / "blobs" / digest.hex()[:2] / digest.hex()).resolve().as_uri()
    assert store.get(p1) == data
    files = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    assert [f.name for f in files] == [digest.hex()]  # no temporary file left behind


def test_corrupt_and_missing_blobs_fail_clearly(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    pointer = store.put(b"y" * 5000)
    path = store.path_for(pointer.sha256.hex())
    path.write_bytes(b"y" * 4999 + b"z")
    with pytest.raises(BlobIntegrityError, match=rf"blob {pointer.uri} is corrupt: expected 5000 bytes with sha256 {pointer.sha256.hex()}, found 5000 bytes with sha256 "):
        store.get(pointer)
    path.unlink()
    with pytest.raises(BlobMissing, match=rf"blob {pointer.uri} is missing"):
        store.get(pointer)


def test_moved_store_finds_blobs_by_digest(tmp_path: Path) -> None:
    pointer = LocalBlobStore(tmp_path / "a").put(b"q" * 100)
    (tmp_path / "a").rename(tmp_path / "b")
    assert LocalBlobStore(tmp_path / "b").get(pointer) == b"q" * 100


def test_codec_threshold_default_and_configurable(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    assert DEFAULT_THRESHOLD == 4096
    small, big = {"t": "a" * 100}, {"t": "a" * 5000}
    assert codec.encode(small, blobs=store).WhichOneof("body") == "inline"
    payload = codec.encode(big, blobs=store)
    assert payload.WhichOneof("body") == "blob" and payload.format_version == codec.FORMAT_VERSION
    assert codec.decode(payload, blobs=store) == big
    assert codec.encode(big).WhichOneof("body") == "inline"  # no store: inline
    assert codec.encode(small, blobs=store, threshold=50).WhichOneof("body") == "blob"
    with pytest.raises(codec.CodecError, match="needs a blob store"):
        codec.decode(payload)


DOC = ("dock-pro: 4x USB-C 40 Gbit/s, 2x HDMI 2.1, 100 W power delivery, aluminium.\n" * 3000)[:200_000]


async def fetch_doc(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"sku": args["sku"], "text": DOC})


SCRIPT = {"turn-1": [("fetch_doc", {"sku": "dock-pro"})], "turn-2": "read it"}


@pytest.mark.anyio
async def test_a_200kb_output_goes_to_the_blob_store_and_rehydrates(
    db: Db, raw: asyncpg.Connection, new_run_id: Any, tmp_path: Path
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    agent = Agent(name="doc", model=ScriptedModel(SCRIPT), tools={"fetch_doc": Tool("fetch_doc", fetch_doc)})
    run_id = new_run_id()
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False, blobs=store)
    await rt.create_run(run_id, "doc", {"messages": [{"role": "user", "content": "read"}]})
    assert await rt.run(run_id) == "completed"
    rows = await raw.fetch("SELECT node_id, octet_length(record) AS n, record FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
    sizes = {r["node_id"]: r["n"] for r in rows}
    assert sizes["turn-1.tool-0"] < 1024, sizes  # the record holds a pointer, not 200 KB
    rec = NodeRecord.FromString(bytes(rows[1]["record"]))
    assert rec.output.WhichOneof("body") == "blob" and rec.output.blob.size > 200_000
    graph = RunGraph.rehydrate(run_id, {"messages": []}, await AppendOnlyLog(db).read(run_id), blobs=store)
    assert graph.transcript()[1]["content"]["text"] == DOC

    # a corrupted blob fails the rehydrate with the blob named, never as data
    path = store.path_for(rec.output.blob.sha256.hex())
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    graph = RunGraph.rehydrate(run_id, {"messages": []}, await AppendOnlyLog(db).read(run_id), blobs=store)
    with pytest.raises(BlobIntegrityError, match=r"blob file://.* is corrupt"):
        graph.transcript()


def test_reference_adapter_gives_the_runtime_the_case_blob_dir(tmp_path: Path) -> None:
    """The adapter's runtime writes blobs under ``Environment.workdir``/blobs (shared by
    the case's workers and the oracle's observe), and conv4's ~200 KB document exceeds
    the threshold, so the checkout matrix exercises blob pointers."""
    from crashmatrix.harness.adapter import Environment, RunContext
    from crashmatrix.harness.adapters.reference import ReferenceAdapter
    from crashmatrix.scenarios.checkout.tools import spec_sheet

    env = Environment("postgresql://unused", {}, str(tmp_path))
    ctx = RunContext(env, "r", None, "conv4", "w1", lambda phase, task: None)
    rt = ReferenceAdapter().make_runtime(None, Agent("a", None, {}), ctx)  # type: ignore[arg-type]
    assert isinstance(rt.blobs, LocalBlobStore) and rt.blobs.root == (tmp_path / "blobs").resolve()
    assert len(spec_sheet("dock-pro")) > 40 * rt.blob_threshold


def test_a_removed_store_parent_is_never_recreated(tmp_path: Path) -> None:
    """A worker still writing after its session's workdir was removed must not
    resurrect the directory tree (the controller's cleanup would leave it behind)."""
    work = tmp_path / "crashmatrix-x"
    work.mkdir()
    store = LocalBlobStore(work / "blobs")
    store.put(b"a" * 10)
    import shutil

    shutil.rmtree(work)
    with pytest.raises(FileNotFoundError):
        store.put(b"b" * 10)
    assert not work.exists()
