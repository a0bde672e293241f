"""reference_runtime.codec (durable payloads) and reference_runtime.graph.RunGraph."""

from __future__ import annotations

import copy
import decimal
import json
import pickle
from typing import Any

import enum

import pytest
from hypothesis import given, strategies as st

from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.codec import CodecError
from crashmatrix.reference_runtime.graph import ROOT_NODE, Deferred, RunGraph, node_order
from crashmatrix.reference_runtime.logstore import LogRead, StoredRecord, facts_of
from crashmatrix.reference_runtime.records_pb2 import BlobPointer, Budget, NodeRecord, NodeSpec, Payload

# -- codec -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -5, 2**62, "€ dock", [], {}, {"b": [1, {"a": None}], "a": "x"}, [[["deep"]]]],
)
def test_codec_round_trip(value: Any) -> None:
    payload = codec.encode(value)
    assert payload.codec == "json" and payload.format_version == codec.FORMAT_VERSION
    assert codec.decode(payload) == value
    # survives the wire
    again = Payload()
    again.ParseFromString(payload.SerializeToString())
    assert codec.decode(again) == value


def test_codec_canonical_bytes() -> None:
    assert codec.encode({"b": 1, "a": 2}).inline == codec.encode({"a": 2, "b": 1}).inline == b'{"a":2,"b":1}'


@pytest.mark.parametrize(
    "value, type_name",
    [
        (object(), "object"),
        ({"amount": {1, 2}}, "set"),
        ([b"raw"], "bytes"),
        ({"amount": decimal.Decimal("1.50")}, "Decimal"),
    ],
)
def test_codec_refuses_non_json_naming_type(value: Any, type_name: str) -> None:
    with pytest.raises(CodecError, match=f"type {type_name}"):
        codec.encode(value)


@pytest.mark.parametrize("value", [1.5, {"amount": 12.99}, [0.0], float("nan"), {"x": [1, 2, float("inf")]}])
def test_codec_refuses_floats(value: Any) -> None:
    """encode()'s contract: floats are refused (money is integer minor units; durable
    state must compare exactly). json.dumps never calls ``default`` for floats."""
    with pytest.raises(CodecError, match="float"):
        codec.encode(value)


class _Colour(enum.IntEnum):
    RED = 1


_ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3) | st.floats() | st.binary(max_size=2)
    | st.just(_Colour.RED),
    lambda children: st.lists(children, max_size=3) | st.tuples(children)
    | st.dictionaries(st.text(max_size=2) | st.integers(0, 3) | st.none() | st.just(_Colour.RED), children, max_size=3),
    max_leaves=12,
)


@given(_ANY_VALUE)
def test_fast_durability_check_agrees_with_the_walk_that_names_the_offence(value: Any) -> None:
    """encode() checks by reading its canonical text back (floats refused by the
    parser, the rest by comparing with the value) and names the offence with a walk;
    both must refuse exactly the same values as the reference walk ``_durable``, and
    ``encode_read`` must give what ``decode`` gives."""
    offence = codec._first_offence(value, "payload")
    assert codec._durable(value) is (offence is None)
    if offence is None:
        payload, read = codec.encode_read(value)
        assert codec.decode(payload) == read == json.loads(json.dumps(value))
    else:
        with pytest.raises(CodecError) as raised:
            codec.encode(value)
        assert str(raised.value) == str(offence)


_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(max_codepoint=0x7f), max_size=4)
    | st.text(max_size=3) | st.just(_Colour.RED),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@given(_JSON_VALUE)
def test_the_fast_encoder_writes_the_json_modules_canonical_text(value: Any) -> None:
    """``_dump_bytes`` (orjson when its text is printable ASCII) writes exactly the bytes
    the json module writes (``sort_keys``, no spaces, ASCII escapes): the same value gives
    the same record bytes whichever encoder wrote it (a retried append compares bytes)."""
    expected = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    assert codec._dump_bytes(value) == codec._dump(value).encode() == expected


@pytest.mark.parametrize("value", ["\x7f", {"k\x7f": 1}, "\u20ac", "\ud800", 2**64, -2**63 - 1, {"a": [2**70]}])
def test_the_fast_encoder_leaves_what_it_would_write_differently_to_the_json_module(value: Any) -> None:
    assert codec._dump_bytes(value) == json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def test_codec_error_names_the_path_of_the_first_offence_in_key_order() -> None:
    with pytest.raises(CodecError, match=r"payload\['a'\]\[1\]\['c'\] is a value of type float"):
        codec.encode({"a": [0, {"b": "ok", "c": 1.5}], "z": object()})
    with pytest.raises(CodecError, match=r"payload\['a'\] has a key of type int \(3\)"):
        codec.encode({"a": {3: "x"}})


def test_cyclic_value_is_refused_not_looped_over() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(RecursionError):
        codec.encode(value)


def test_codec_error_is_value_error() -> None:
    assert issubclass(CodecError, ValueError)


def test_decode_newer_version_refused() -> None:
    p = Payload(codec="json", format_version=codec.FORMAT_VERSION + 1, inline=b"{}")
    with pytest.raises(CodecError, match=f"format_version={codec.FORMAT_VERSION + 1} is newer"):
        codec.decode(p)


@pytest.mark.parametrize("name", ["pickle", "", "JSON"])
def test_decode_unknown_codec_refused(name: str) -> None:
    with pytest.raises(CodecError, match=f"codec={name!r} is unknown"):
        codec.decode(Payload(codec=name, format_version=1, inline=b"{}"))


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe\x00", b"", b'{"a":1'])
def test_decode_corrupt_refused(data: bytes) -> None:
    with pytest.raises(CodecError, match="not valid JSON"):
        codec.decode(Payload(codec="json", format_version=1, inline=data))


def test_decode_blob_pointer_refused() -> None:
    p = Payload(codec="json", format_version=1, blob=BlobPointer(uri="file:///x", size=3, sha256=b"\0" * 32))
    with pytest.raises(CodecError, match="not inline"):
        codec.decode(p)


def test_decode_applies_upgraders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "FORMAT_VERSION", 3)
    monkeypatch.setattr(codec, "UPGRADERS", {
        1: lambda v: {**v, "v2": True},
        2: lambda v: {**v, "v3": v["v2"]},
    })
    old = Payload(codec="json", format_version=1, inline=json.dumps({"a": 1}).encode())
    assert codec.decode(old) == {"a": 1, "v2": True, "v3": True}
    two = Payload(codec="json", format_version=2, inline=json.dumps({"v2": False}).encode())
    assert codec.decode(two) == {"v2": False, "v3": False}


# -- graph -------------------------------------------------------------------------------


def spec(node_id: str, parents: list[str], kind: str = "tool") -> NodeSpec:
    return NodeSpec(node_id=node_id, kind=kind, parents=parents, input=codec.encode({}))


def record(node_id: str, parents: list[str], output: dict[str, Any], spawned: list[NodeSpec] = (),  # type: ignore[assignment]
           kind: str = "model", tokens: int = 0) -> NodeRecord:
    return NodeRecord(
        format_version=1, node_id=node_id, parents=parents, kind=kind, output=codec.encode(output),
        spawned=list(spawned), budget=Budget(tokens=tokens, model_calls=1 if kind == "model" else 0,
                                             tool_calls=1 if kind == "tool" else 0), lease_epoch=1,
    )


def stored(*records: NodeRecord) -> list[StoredRecord]:
    return [StoredRecord(i, r.node_id, r) for i, r in enumerate(records, start=1)]


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_node_order_natural() -> None:
    ids = ["turn-10", "turn-9", "turn-1.tool-10", "turn-1.tool-2", "turn-1", "turn-2"]
    assert sorted(ids, key=node_order) == ["turn-1", "turn-1.tool-2", "turn-1.tool-10", "turn-2", "turn-9", "turn-10"]


def test_fresh_graph_has_root_ready() -> None:
    g = RunGraph.rehydrate("r", {"messages": []}, [])
    assert [s.node_id for s in g.ready()] == [ROOT_NODE]
    assert g.pending() == [ROOT_NODE] and not g.done() and g.last_seq == 0
    assert g.ready(exclude={ROOT_NODE}) == []


def test_ready_in_natural_order_turn10_after_turn9() -> None:
    spawned = [spec(f"turn-1.tool-{i}", ["turn-1"]) for i in (10, 2, 9, 0, 1)]
    spawned += [spec("turn-10", []), spec("turn-9", [])]
    g = RunGraph.rehydrate("r", {}, stored(record("turn-1", [], {"messages": []}, spawned)))
    assert [s.node_id for s in g.ready()] == [
        "turn-1.tool-0", "turn-1.tool-1", "turn-1.tool-2", "turn-1.tool-9", "turn-1.tool-10", "turn-9", "turn-10",
    ]
    assert g.last_seq == 1


def test_join_not_ready_until_both_parents_recorded() -> None:
    t0, t1 = spec("turn-1.tool-0", ["turn-1"]), spec("turn-1.tool-1", ["turn-1"])
    join = spec("turn-2", ["turn-1.tool-0", "turn-1.tool-1"], kind="model")
    root = record("turn-1", [], {"messages": []}, [t0, t1, join])
    g = RunGraph.rehydrate("r", {}, stored(root))
    assert [s.node_id for s in g.ready()] == ["turn-1.tool-0", "turn-1.tool-1"]
    g.add(record("turn-1.tool-1", ["turn-1"], {"messages": []}, kind="tool"))
    assert [s.node_id for s in g.ready()] == ["turn-1.tool-0"]
    assert "turn-2" in g.pending()
    g.add(record("turn-1.tool-0", ["turn-1"], {"messages": []}, kind="tool"))
    assert [s.node_id for s in g.ready()] == ["turn-2"]
    assert list(g.ready()[0].parents) == ["turn-1.tool-0", "turn-1.tool-1"]


def test_spawned_spec_first_writer_wins() -> None:
    a = spec("turn-2", ["turn-1"])
    b = spec("turn-2", ["turn-1", "other"])
    g = RunGraph.rehydrate("r", {}, stored(record("turn-1", [], {}, [a]), record("x", [], {}, [b])))
    assert list(g.specs["turn-2"].parents) == ["turn-1"]


def build_run() -> RunGraph:
    t0, t1 = spec("turn-1.tool-0", ["turn-1"]), spec("turn-1.tool-1", ["turn-1"])
    join = spec("turn-2", ["turn-1.tool-0"], kind="model")  # tool-1 is not its ancestor
    return RunGraph.rehydrate("r", {"messages": [msg("user", "hi")]}, stored(
        record("turn-1", [], {"messages": [msg("assistant", "calling")]}, [t0, t1, join], tokens=10),
        record("turn-1.tool-1", ["turn-1"], {"messages": [msg("tool", "one")]}, kind="tool"),
        record("turn-1.tool-0", ["turn-1"], {"messages": [msg("tool", "zero")]}, kind="tool"),
        record("turn-2", ["turn-1.tool-0"], {"messages": [msg("assistant", "bye")], "final": "bye"}, tokens=5),
    ))


def test_transcript_of_ancestors_only_in_natural_order() -> None:
    g = build_run()
    assert g.ancestors("turn-2") == ["turn-1", "turn-1.tool-0"]
    assert g.transcript(upto="turn-2") == [msg("user", "hi"), msg("assistant", "calling"), msg("tool", "zero")]
    assert g.transcript(upto="turn-1") == [msg("user", "hi")]
    # the whole conversation: every record, natural order (not seq order)
    assert g.transcript() == [
        msg("user", "hi"), msg("assistant", "calling"), msg("tool", "zero"), msg("tool", "one"), msg("assistant", "bye"),
    ]


def test_transcript_does_not_mutate_input() -> None:
    g = build_run()
    g.transcript()
    assert g.input == {"messages": [msg("user", "hi")]}


def test_final_answer_budget_done() -> None:
    g = build_run()
    assert g.final_answer() == "bye"
    assert g.budget() == {"tokens": 15, "model_calls": 2, "tool_calls": 2}
    assert g.done() and g.pending() == [] and g.last_seq == 4


def test_final_answer_none_while_running() -> None:
    g = RunGraph.rehydrate("r", {}, stored(record("turn-1", [], {"messages": []}, [spec("turn-1.tool-0", ["turn-1"])])))
    assert g.final_answer() is None
    assert RunGraph.rehydrate("r", {}, []).final_answer() is None


# -- log frames (logstore.split_frames) ----------------------------------------------------


def _frame(seq: int, node_id: str, record: bytes) -> bytes:
    import struct

    node = node_id.encode()
    return struct.pack(">qi", seq, len(node)) + node + struct.pack(">i", len(record)) + record


def test_split_frames_round_trip() -> None:
    from crashmatrix.reference_runtime.logstore import split_frames

    rows = [(1, "turn-1", b"\x08\x02"), (2, "turn-1.tool-0", b""), (3, "d\u00e9j\u00e0", b"x" * 70_000)]
    assert split_frames(b"".join(_frame(*r) for r in rows)) == rows
    assert split_frames(b"") == []


@pytest.mark.parametrize("cut", [1, 5, 13])
def test_split_frames_refuses_torn_frames(cut: int) -> None:
    from crashmatrix.reference_runtime.logstore import CorruptRecord, split_frames

    data = _frame(1, "turn-1", b"record") + _frame(2, "turn-2", b"record")
    with pytest.raises(CorruptRecord, match="torn"):
        split_frames(data[:-cut])


class _OneByOne(RunGraph):
    """Takes records one ``add`` at a time (a subclass overriding ``add`` gets that path)."""

    def add(self, record: NodeRecord, output: Any = None) -> None:
        super().add(record, output)


def test_bulk_rehydrate_leaves_what_adding_each_record_leaves() -> None:
    """The bulk rebuild (``RunGraph._rebuild``) against the record-by-record path: a
    fan-out, a sub-agent's scope with a node still pending, a spec spawned twice (the
    first wins) and a node recorded twice (its first record counts in the totals)."""
    sub = "turn-1.tool-1"
    root = record("turn-1", [], {"messages": []}, [
        spec("turn-1.tool-0", ["turn-1"]), spec(sub, ["turn-1"], kind="subagent"),
        spec(f"{sub}:turn-1", ["turn-1"], kind="model"), spec("turn-2", ["turn-1.tool-0", sub], kind="model"),
    ], tokens=7)
    tool = record("turn-1.tool-0", ["turn-1"], {"messages": []}, [spec("turn-2", [], kind="tool")], kind="tool")
    child = record(f"{sub}:turn-1", ["turn-1"], {"messages": []}, [spec(f"{sub}:turn-2", [f"{sub}:turn-1"], kind="model")],
                   tokens=5)
    again = record("turn-1.tool-0", ["turn-1"], {"messages": []}, kind="tool", tokens=100)
    log = stored(root, tool, child, again)
    bulk, one = RunGraph.rehydrate("r", {}, log), _OneByOne.rehydrate("r", {}, log)
    for graph in (bulk, one):
        assert graph.records["turn-1.tool-0"] is again and graph.specs["turn-2"].kind == "model"
    assert bulk.records == one.records and list(bulk.specs) == list(one.specs)
    assert dict(bulk._pending) == dict(one._pending) and +bulk._open == +one._open
    assert (bulk.turns_used, bulk.tokens_used, bulk.wall_ms_used, bulk.last_seq) == \
        (one.turns_used, one.tokens_used, one.wall_ms_used, one.last_seq) == (2, 12, 0, 4)
    assert [s.node_id for s in bulk.ready()] == [s.node_id for s in one.ready()] == [f"{sub}:turn-2"]


def test_a_second_record_of_a_node_replaces_the_output_kept_from_the_first() -> None:
    """``RunGraph.add`` holds a node's latest record; the output it keeps (given or
    decoded) is that record's too (the checkpoint-before-node mutant appends a tool's
    record twice: its golden run read the first one's empty result)."""
    g = RunGraph.rehydrate("r", {}, [])
    g.add(record("turn-1.tool-0", [], {"result": None}, kind="tool"), output={"result": None})
    assert g.output("turn-1.tool-0") == {"result": None}
    g.add(record("turn-1.tool-0", [], {"result": "ch_1"}, kind="tool"), output={"result": "ch_1"})
    assert g.output("turn-1.tool-0") == {"result": "ch_1"}
    g.add(record("turn-1.tool-0", [], {"result": "ch_2"}, kind="tool"))  # no output given: decoded from it
    assert g.output("turn-1.tool-0") == {"result": "ch_2"}


def adopted(*records: NodeRecord) -> LogRead:
    """The default store's read of ``records`` (format 2, as this build writes them), with
    the facts its server sums from the columns beside them."""
    current = []
    for r in records:
        r = NodeRecord.FromString(r.SerializeToString())
        r.format_version = 2
        current.append(r)
    return LogRead([r.node_id for r in current], current, facts_of(current))


def graph_facts(graph: RunGraph) -> tuple[Any, ...]:
    return (dict(graph.records), list(graph.specs), dict(graph.specs), dict(graph._pending), +graph._open,
            graph.turns_used, graph.tokens_used, graph.wall_ms_used, graph.last_seq,
            [s.node_id for s in graph.ready()], graph.pending(), graph.transcript(), graph.budget(), graph.done())


def test_the_rehydrate_from_the_facts_leaves_what_walking_the_records_leaves() -> None:
    """``RunGraph._adopt`` (a read with the facts written beside each record) against the
    walk of every record: a fan-out, a sub-agent's scope with its child done and a node of
    another scope pending, wall times and tokens; the records and specs are made only when
    read, and a graph built either way answers alike."""
    sub = "turn-1.tool-1"
    task = spec(sub, ["turn-1"], kind="subagent")
    task.input.CopyFrom(codec.encode({"call": {"id": "c1", "name": "helper", "arguments": {"task": "look"}}}))
    root = record("turn-1", [], {"messages": [msg("assistant", "a")]}, [
        spec("turn-1.tool-0", ["turn-1"]), task,
        spec(f"{sub}:turn-1", ["turn-1"], kind="model"), spec("turn-2", ["turn-1.tool-0", sub], kind="model"),
    ], tokens=7)
    root.budget.wall_ms = 40
    tool = record("turn-1.tool-0", ["turn-1"], {"messages": [msg("tool", "t")]}, kind="tool")
    child = record(f"{sub}:turn-1", ["turn-1"], {"messages": [msg("assistant", "c")], "final": "c"}, tokens=5)
    read = adopted(root, tool, child)
    fast, walked = RunGraph.rehydrate("r", {}, read), RunGraph.rehydrate("r", {}, list(read))
    assert isinstance(fast.records, Deferred) and isinstance(fast.specs, Deferred)
    assert not isinstance(walked.records, Deferred)
    assert graph_facts(fast) == graph_facts(walked)
    assert (fast.turns_used, fast.tokens_used, fast.wall_ms_used, fast.last_seq) == (2, 12, 40, 3)
    assert [s.node_id for s in fast.ready()] == [sub]  # its child's scope holds nothing pending
    fresh = RunGraph.rehydrate("r", {}, read)
    assert fresh.specs.get(f"{sub}:turn-1").parents == ["turn-1"] and fresh.specs.get("nope", 1) == 1
    assert fresh.records["turn-1.tool-0"].kind == "tool" and "turn-2" not in fresh.records


def test_the_rehydrate_from_the_facts_walks_the_records_when_an_id_is_spawned_twice() -> None:
    """A spec id spawned twice (the first wins) or the root's spawned again: the facts
    cannot place them by id alone, so the graph walks the records, as before."""
    first = record("turn-1", [], {"messages": []}, [spec("turn-1.tool-0", ["turn-1"]), spec("turn-2", ["turn-1.tool-0"], kind="model")])
    tool = record("turn-1.tool-0", ["turn-1"], {"messages": []}, [spec("turn-2", [], kind="tool"), spec(ROOT_NODE, [])],
                  kind="tool")
    read = adopted(first, tool)
    fast, walked = RunGraph.rehydrate("r", {}, read), RunGraph.rehydrate("r", {}, list(read))
    assert not isinstance(fast.specs, Deferred)
    assert graph_facts(fast) == graph_facts(walked)
    assert fast.specs["turn-2"].kind == "model" and fast.specs[ROOT_NODE].parents == []


def test_a_deferred_dict_makes_each_value_once_when_first_read() -> None:
    made: list[int] = []

    def make(i: int) -> str:
        made.append(i)
        return f"v{i}"

    d = Deferred(zip("abc", range(3)), make)
    assert len(d) == 3 and "b" in d and list(d) == ["a", "b", "c"] and made == []
    assert d["b"] == "v1" and d["b"] == "v1" and d.get("c") == "v2" and d.get("z", 0) == 0 and made == [1, 2]
    d["d"] = "x"
    assert dict(d) == {"a": "v0", "b": "v1", "c": "v2", "d": "x"} and made == [1, 2, 0]
    assert Deferred(zip("ab", range(2)), make) == {"a": "v0", "b": "v1"}
    assert list(Deferred(zip("ab", range(2)), make).values()) == ["v0", "v1"]
    assert Deferred(zip("ab", range(2)), make).pop("b") == "v1"
    assert pickle.loads(pickle.dumps(Deferred(zip("a", range(1)), make))) == {"a": "v0"}
    assert copy.deepcopy(Deferred(zip("a", range(1)), make)) == {"a": "v0"}
    assert repr(Deferred(zip("a", range(1)), make)) == "{'a': 'v0'}"


def test_a_log_read_is_a_sequence_of_stored_records() -> None:
    one, two = record("turn-1", [], {"messages": []}), record("turn-2", [], {"messages": []})
    read = adopted(one, two)
    assert len(read) == 2 and read[-1].seq == 2 and read[0].node_id == "turn-1" and read[1:][0].node_id == "turn-2"
    assert [tuple(s[:2]) for s in read] == [(1, "turn-1"), (2, "turn-2")] and type(read[0]) is StoredRecord
    assert read == list(read) and read != []
    with pytest.raises(IndexError):
        read[2]
