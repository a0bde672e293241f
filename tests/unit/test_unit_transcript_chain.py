"""The incremental transcript of a chain of turns (graph.py ``RunGraph._seen_by``): built
from the previous turn's as the run goes, it equals the full walk of a fresh graph at
every turn, also with a sub-agent scope in the middle and a graph whose ancestors are not
all recorded (which is never cached)."""

from __future__ import annotations

from typing import Any

from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.graph import RunGraph
from crashmatrix.reference_runtime.logstore import StoredRecord
from crashmatrix.reference_runtime.records_pb2 import NodeRecord, NodeSpec


def record(node: str, parents: list[str], text: str, spawned: list[NodeSpec] = (), kind: str = "model") -> NodeRecord:  # type: ignore[assignment]
    role = "assistant" if kind == "model" else "tool"
    return NodeRecord(format_version=2, node_id=node, parents=parents, kind=kind, spawned=list(spawned),
                      output=codec.encode({"messages": [{"role": role, "content": text}]}))


def spec(node: str, parents: list[str], kind: str, call: dict[str, Any] | None = None) -> NodeSpec:
    return NodeSpec(node_id=node, kind=kind, parents=parents, input=codec.encode({"call": call} if call else {}))


def chain(turns: int, tools: int) -> list[NodeRecord]:
    """The executor's shape: turn n spawns its tools and turn n+1 (parents: the tools);
    turn 3 also calls a sub-agent whose child runs two turns."""
    out = []
    for n in range(1, turns + 1):
        node = f"turn-{n}"
        parents = [f"turn-{n - 1}.tool-{i}" for i in range(tools)] if n > 1 else []
        if n == 3:
            parents = [f"turn-2.tool-{i}" for i in range(tools)]
        kids = [spec(f"{node}.tool-{i}", [node], "tool") for i in range(tools)]
        extra: list[NodeSpec] = []
        if n == 2:  # turn 2's last call is a sub-agent
            sub = f"{node}.tool-{tools}"
            kids.append(spec(sub, [node], "subagent", {"name": "ask", "arguments": {"task": "look"}}))
            extra = [spec(f"{sub}:turn-1", [node], "model")]
        if n == turns:
            out.append(record(node, parents, f"final {n}"))
            break
        nxt = spec(f"turn-{n + 1}", [k.node_id for k in kids], "model")
        out.append(record(node, parents, f"turn {n}", kids + [nxt] + extra))
        if n == 2:
            sub = f"{node}.tool-{tools}"
            out.append(record(f"{sub}:turn-1", [node], "child 1",
                              [spec(f"{sub}:turn-1.tool-0", [f"{sub}:turn-1"], "tool"), spec(f"{sub}:turn-2", [f"{sub}:turn-1.tool-0"], "model")]))
            out.append(record(f"{sub}:turn-1.tool-0", [f"{sub}:turn-1"], "child tool", kind="tool"))
            out.append(record(f"{sub}:turn-2", [f"{sub}:turn-1.tool-0"], "child 2"))
        out.extend(record(k.node_id, [node], f"tool {n}.{i}", kind="tool") for i, k in enumerate(kids))
    return out


def test_incremental_transcripts_equal_the_full_walk() -> None:
    records = chain(turns=12, tools=3)
    live = RunGraph.rehydrate("r", {"messages": [{"role": "user", "content": "go"}]}, [])
    for i, rec in enumerate(records):
        if rec.kind == "model" and rec.node_id in live.specs:  # what the executor does when it runs the node
            seen = live.transcript(upto=rec.node_id)
            fresh = RunGraph.rehydrate("r", live.input, [StoredRecord(j + 1, r.node_id, r) for j, r in enumerate(records[:i])])
            assert seen == fresh.transcript(upto=rec.node_id), rec.node_id
        live.add(rec)
    assert live.transcript(upto="turn-12")[-1]["content"].startswith("tool 11.")
    child = live.transcript(upto="turn-2.tool-3:turn-2")
    assert [m["content"] for m in child] == ["look", "child 1", "child tool"]


def test_a_transcript_with_unrecorded_ancestors_is_not_cached() -> None:
    records = chain(turns=4, tools=2)
    graph = RunGraph.rehydrate("r", {}, [StoredRecord(1, records[0].node_id, records[0])])
    # turn-2's parents are not recorded: its view is partial and must not be reused
    partial = graph.transcript(upto="turn-2")
    for j, rec in enumerate(records[1:], start=2):
        graph.add(rec)
    fresh = RunGraph.rehydrate("r", {}, [StoredRecord(j + 1, r.node_id, r) for j, r in enumerate(records)])
    assert graph.transcript(upto="turn-3") == fresh.transcript(upto="turn-3")
    assert len(graph.transcript(upto="turn-2")) > len(partial)
