"""The run's dynamic graph, rebuilt from the log ("rehydrate").

Completed nodes are those with a record; pending nodes are those some record spawned
(or the root) without a record yet. A pending node is *ready* when all its parents
completed. Readiness is returned in a fixed order (natural order of node ids), never by
iterating a set, so the same log always yields the same schedule (DESIGN.md,
"Determinism").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import codec, state_codec
from .blobs import BlobStore
from .logstore import StoredRecord
from .records_pb2 import NodeRecord, NodeSpec

ROOT_NODE = "turn-1"


def node_order(node_id: str) -> tuple[Any, ...]:
    """Natural sort key: ``turn-10`` after ``turn-9``; ``turn-3.tool-1`` after ``turn-3``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", node_id))


@dataclass
class RunGraph:
    """Rehydrated state of one run: records by node id, specs of every known node."""

    run_id: str
    input: dict[str, Any]
    records: dict[str, NodeRecord] = field(default_factory=dict)
    specs: dict[str, NodeSpec] = field(default_factory=dict)
    last_seq: int = 0
    blobs: BlobStore | None = None
    _outputs: dict[str, Any] = field(default_factory=dict, repr=False)
    #: running totals of the recorded nodes (budgets.py reads them at every launch)
    turns_used: int = 0
    tokens_used: int = 0
    wall_ms_used: int = 0

    @classmethod
    def rehydrate(
        cls, run_id: str, run_input: dict[str, Any], stored: list[StoredRecord], *, blobs: BlobStore | None = None
    ) -> RunGraph:
        """Rebuild the graph from the log; ``blobs`` reads outputs that live in a blob store."""
        graph = cls(run_id, run_input, blobs=blobs)
        graph.specs[ROOT_NODE] = NodeSpec(node_id=ROOT_NODE, kind="model", input=codec.encode({}))
        for item in stored:
            graph.add(item.record)
            graph.last_seq = item.seq
        return graph

    def add(self, record: NodeRecord) -> None:
        if record.node_id not in self.records:
            self.turns_used += record.kind == "model"
            self.tokens_used += record.budget.tokens
            self.wall_ms_used += record.budget.wall_ms
        self.records[record.node_id] = record
        for spec in record.spawned:
            self.specs.setdefault(spec.node_id, spec)

    def ready(self, exclude: set[str] | frozenset[str] = frozenset()) -> list[NodeSpec]:
        out = [
            spec
            for node_id, spec in self.specs.items()
            if node_id not in self.records
            and node_id not in exclude
            and all(p in self.records for p in spec.parents)
        ]
        out.sort(key=lambda s: node_order(s.node_id))
        return out

    def pending(self) -> list[str]:
        return sorted((n for n in self.specs if n not in self.records), key=node_order)

    def ancestors(self, node_id: str) -> list[str]:
        """Every ancestor of ``node_id`` (not itself), in natural order."""
        seen: set[str] = set()
        stack = list(self.specs[node_id].parents) if node_id in self.specs else []
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(self.specs[n].parents if n in self.specs else [])
        return sorted(seen, key=node_order)

    def output(self, node_id: str) -> Any:
        """The decoded output of a completed node (cached: a blob is read and verified once
        per process, not once per turn)."""
        if node_id not in self._outputs:
            self._outputs[node_id] = codec.decode(self.records[node_id].output, blobs=self.blobs)
        return self._outputs[node_id]

    def state(self, schema: state_codec.StateSchema | None) -> dict[str, Any]:
        """The durable state fields: every record's updates applied in ``seq`` order."""
        payloads = [r.state for r in self.records.values() if r.HasField("state")]
        return state_codec.fold(schema, payloads, blobs=self.blobs)

    def wall_ms(self) -> int:
        """Summed wall time of the completed nodes (not part of :meth:`budget`: it differs
        between any two runs, so the oracle never compares it)."""
        return self.wall_ms_used

    def transcript(self, upto: str | None = None) -> list[dict[str, Any]]:
        """The conversation: input messages, then each completed node's messages in
        natural order (only ``upto``'s ancestors when given)."""
        nodes = self.ancestors(upto) if upto else sorted(self.records, key=node_order)
        messages = list(self.input.get("messages", []))
        for n in nodes:
            if n in self.records:
                messages.extend(self.output(n).get("messages", []))
        return messages

    def budget(self) -> dict[str, int]:
        total = {"tokens": 0, "model_calls": 0, "tool_calls": 0}
        for r in self.records.values():
            total["tokens"] += r.budget.tokens
            total["model_calls"] += r.budget.model_calls
            total["tool_calls"] += r.budget.tool_calls
        return total

    def final_answer(self) -> str | None:
        """Content of the completed model node that spawned nothing, if any."""
        for n in sorted(self.records, key=node_order, reverse=True):
            r = self.records[n]
            if r.kind == "model" and not r.spawned:
                return self.output(n).get("final")
        return None

    def done(self) -> bool:
        return not self.pending()
