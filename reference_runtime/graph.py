"""The run's dynamic graph, rebuilt from the log ("rehydrate").

Completed nodes are those with a record; pending nodes are those some record spawned
(or the root) without a record yet. A pending node is *ready* when all its parents
completed (and, for a sub-agent node, when its child's scope holds no pending node:
:mod:`.subagents`). Readiness is returned in a fixed order (natural order of node ids),
never by iterating a set, so the same log always yields the same schedule (docs/design.md,
"Determinism"). The graph keeps its pending nodes (and how many are pending per
sub-agent scope) as records arrive, so a readiness query costs O(frontier), not O(run).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import codec, state_codec
from .subagents import SCOPE_SEPARATOR, SUBAGENT_KIND, child_messages, scope_of
from .blobs import BlobStore
from .logstore import LogFacts, LogRead, StoredRecord
from .records_pb2 import NodeRecord, NodeSpec

ROOT_NODE = "turn-1"
_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)
def node_order(node_id: str) -> tuple[Any, ...]:
    """Natural sort key: ``turn-10`` after ``turn-9``; ``turn-3.tool-1`` after ``turn-3``
    (cached: every transcript sorts a node's ancestors, so a long run asks for the same
    keys again and again)."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(node_id))


_UNSET = object()


def _spec_order(spec: NodeSpec) -> tuple[Any, ...]:
    return node_order(spec.node_id)


class Deferred(dict):  # type: ignore[type-arg]
    """A dict some of whose values are made when first read: a value still to be made is
    stored as an ``int``, the argument ``make`` turns into it (once; the value replaces
    it). A rehydrate's records and specs are these: making a protobuf object costs ~1 us,
    and a resume reads few of them before it runs (every key is there from the start, so
    ``in``, ``len`` and iteration over keys are the dict's own). Reading every value
    (``values``, ``items``, ``==``, a copy) makes the rest first."""

    __slots__ = ("_make",)

    def __init__(self, items: Any, make: Callable[[int], Any]) -> None:
        super().__init__(items)
        self._make = make

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if type(value) is int:
            value = self._make(value)
            dict.__setitem__(self, key, value)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        value = dict.get(self, key, _UNSET)
        if value is _UNSET:
            return default
        if type(value) is int:
            value = self._make(value)
            dict.__setitem__(self, key, value)
        return value

    def make_all(self) -> None:
        make = self._make
        for key, value in dict.items(self):
            if type(value) is int:
                dict.__setitem__(self, key, make(value))  # a value replaced, not a key added

    def __iter__(self) -> Any:  # not the dict's own: dict(d) and {**d} then read through __getitem__
        return dict.__iter__(self)

    def values(self) -> Any:
        self.make_all()
        return dict.values(self)

    def items(self) -> Any:
        self.make_all()
        return dict.items(self)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            self[key]  # noqa: B018  # made before it leaves
        return dict.pop(self, key, *default)

    def popitem(self) -> Any:
        self.make_all()
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        return dict.setdefault(self, key, default)

    def copy(self) -> dict[Any, Any]:
        self.make_all()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self.make_all()
        if isinstance(other, Deferred):
            other.make_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> Any:
        self.make_all()
        return dict(dict.items(self)) | other

    def __ror__(self, other: Any) -> Any:
        self.make_all()
        return other | dict(dict.items(self))

    def __repr__(self) -> str:
        self.make_all()
        return dict.__repr__(self)

    def __reduce__(self) -> Any:
        return (dict, (self.copy(),))


def _open_scopes(pending: dict[str, NodeSpec]) -> Counter[str]:
    """How many of the ``pending`` nodes each sub-agent scope holds (``RunGraph._open``)."""
    return Counter(scope_of(node_id) for node_id in pending if SCOPE_SEPARATOR in node_id)


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
    #: specs without a record, and how many of them each sub-agent scope holds (the
    #: run's own scope ``""`` is not counted: only a sub-agent node waits on a count)
    _pending: dict[str, NodeSpec] = field(default_factory=dict, repr=False)
    _open: Counter[str] = field(default_factory=Counter, repr=False)
    #: the transcript the newest model node of each chain saw (see _seen_by)
    _seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    #: running totals of the recorded nodes (budgets.py reads them at every launch)
    turns_used: int = 0
    tokens_used: int = 0
    wall_ms_used: int = 0

    @classmethod
    def rehydrate(
        cls, run_id: str, run_input: dict[str, Any], stored: Sequence[StoredRecord], *, blobs: BlobStore | None = None
    ) -> RunGraph:
        """Rebuild the graph from the log; ``blobs`` reads outputs that live in a blob store."""
        graph = cls(run_id, run_input, blobs=blobs)
        graph.add_spec(NodeSpec(node_id=ROOT_NODE, kind="model", input=codec.encode({})))
        if cls.add is not RunGraph.add or cls.add_spec is not RunGraph.add_spec:
            for item in stored:  # a subclass that takes records its own way: one at a time
                graph.add(item.record)
                graph.last_seq = item.seq
            return graph
        if isinstance(stored, LogRead) and stored.facts is not None:
            graph._adopt(stored.nodes, stored.records, stored.facts)
        else:
            graph._rebuild(stored)
        return graph

    def _adopt(self, nodes: list[str], recs: Sequence[NodeRecord], facts: LogFacts) -> None:
        """What :meth:`_rebuild` leaves, from a :class:`.logstore.LogRead` whose rows carry
        their facts (records ``1..n``, one per node id: the log's keys), without an object
        or an attribute read per record: the totals as the server summed them, the records
        and the specs as :class:`Deferred` dicts (a record's object is made when it is
        first read, a spec's from where the counts say it is), the pending nodes and open
        scopes from the few specs without a record."""
        n = len(nodes)
        records = Deferred(zip(nodes, range(n)), recs.__getitem__)
        ids = facts.spawned_ids
        ends = list(itertools.accumulate(facts.spawned_counts))  # ints only: no object for the collector

        def spec_at(k: int) -> NodeSpec:  # the k-th spawned spec of the log
            i = bisect.bisect_right(ends, k)
            return recs[i].spawned[k - ends[i - 1] if i else k]

        root = self.specs
        specs = Deferred(root, spec_at)
        known = len(specs)
        specs.update(zip(ids, range(len(ids))))
        if len(records) != n or len(specs) != known + len(ids):
            # a node id twice (not a log this store writes) or a spec id twice (the first
            # of an id wins) or the root's: walk the records
            self.specs = root
            self._rebuild(LogRead(nodes, recs, None))
            return
        self.records = records
        self.specs = specs
        self.turns_used += facts.turns
        self.tokens_used += facts.tokens
        self.wall_ms_used += facts.wall_ms
        self.last_seq = n
        # the specs without a record: spawned ids not recorded (a C loop: no set of every id), and the root's
        unrecorded = list(itertools.filterfalse(records.__contains__, ids))
        unrecorded.extend(node_id for node_id in root if node_id not in records)
        self._pending = {node_id: specs[node_id] for node_id in sorted(unrecorded, key=node_order)}
        self._open = _open_scopes(self._pending)

    def _rebuild(self, stored: Sequence[StoredRecord]) -> None:
        """What :meth:`add` for each record in ``seq`` order leaves, in bulk: the records
        (the last of a node id), the totals (its first), the specs (the first of an id,
        in record order), the pending nodes (specs without a record) and the open count
        per scope computed once at the end instead of kept up to date record by record."""
        records = self.records
        specs = self.specs
        turns = tokens = wall_ms = 0
        for _, node_id, record in stored:  # the row's node id: the store checked it is the record's
            if node_id not in records:
                budget = record.budget
                if record.kind == "model":
                    turns += 1
                tokens += budget.tokens
                wall_ms += budget.wall_ms
            records[node_id] = record
            spawned = record.spawned
            if spawned:  # a tool's record spawns nothing: no iterator for it
                for spec in spawned[:]:  # a slice: iterating upb's container raises IndexError at its end
                    spec_id = spec.node_id
                    if spec_id not in specs:
                        specs[spec_id] = spec
        self.turns_used += turns
        self.tokens_used += tokens
        self.wall_ms_used += wall_ms
        if stored:
            self.last_seq = stored[-1].seq
        self._pending = {node_id: spec for node_id, spec in specs.items() if node_id not in records}
        self._open = _open_scopes(self._pending)

    def add_spec(self, spec: NodeSpec) -> None:
        """Know a node (the first spec of an id wins; a recorded node is not pending)."""
        node_id = spec.node_id  # read once: each read of a upb field decodes a new str
        if node_id in self.specs:
            return
        self.specs[node_id] = spec
        if node_id not in self.records:
            self._pending[node_id] = spec
            if SCOPE_SEPARATOR in node_id:
                self._open[scope_of(node_id)] += 1

    def add(self, record: NodeRecord, output: Any = None) -> None:
        """Take a record (the first of a node counts in the totals). ``output``: its
        output as :func:`.codec.encode_read` read it back when it was written (kept,
        so :meth:`output` does not decode it again); None: decoded when first asked."""
        node_id = record.node_id
        # the output kept is always the latest record's, as ``records`` holds the latest
        if output is not None:
            self._outputs[node_id] = output
        else:
            self._outputs.pop(node_id, None)
        if node_id not in self.records:
            self.turns_used += record.kind == "model"
            budget = record.budget  # read once: every read of a field makes a new Python object
            self.tokens_used += budget.tokens
            self.wall_ms_used += budget.wall_ms
            if self._pending.pop(node_id, None) is not None and SCOPE_SEPARATOR in node_id:
                self._open[scope_of(node_id)] -= 1
        self.records[node_id] = record
        # a slice, a list made in C: iterating upb's repeated container goes through the
        # sequence protocol and ends in an IndexError built and dropped (~2,000 instructions)
        for spec in record.spawned[:]:
            self.add_spec(spec)

    def ready(self, exclude: set[str] | frozenset[str] = frozenset()) -> list[NodeSpec]:
        """Pending nodes whose parents are recorded, in natural order; a sub-agent node
        also waits until its child's scope has no pending node (the child's completion
        record is in)."""
        records = self.records
        out = []
        for node_id, spec in self._pending.items():
            if node_id in exclude:
                continue
            for p in spec.parents[:]:  # a slice: see add
                if p not in records:
                    break
            else:
                if spec.kind != SUBAGENT_KIND or not self._open[node_id]:
                    out.append(spec)
        if len(out) > 1:
            out.sort(key=_spec_order)
        return out

    def pending(self) -> list[str]:
        return sorted(self._pending, key=node_order)

    def ancestors(self, node_id: str) -> list[str]:
        """Every ancestor of ``node_id`` (not itself), in natural order."""
        seen: set[str] = set()
        stack = self.specs[node_id].parents[:] if node_id in self.specs else []
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(self.specs[n].parents[:] if n in self.specs else [])
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

    def opening(self, scope: str = "") -> list[dict[str, Any]]:
        """The messages a scope's conversation starts from: the run's input messages,
        or for a sub-agent's scope the task its parent gave it."""
        if not scope:
            return list(self.input.get("messages", []))
        return child_messages(codec.decode(self.specs[scope].input)["call"])

    def transcript(self, upto: str | None = None) -> list[dict[str, Any]]:
        """With ``upto``: what that node's model sees, its scope's opening messages then
        the messages of its ancestors in the same scope, in natural order. Without: the
        whole run, i.e. the run's conversation (input messages, then every completed
        top-level node's messages in natural order) followed by each sub-agent's
        conversation in natural order of the scopes, each of its messages tagged
        ``"scope": <sub-agent node id>``."""
        if upto:
            return list(self._seen_by(upto))
        by_scope: dict[str, list[str]] = {}
        for n in sorted(self.records, key=node_order):
            by_scope.setdefault(scope_of(n), []).append(n)
        messages = self._messages(self.opening(""), by_scope.pop("", []))
        for scope in sorted(by_scope, key=node_order):
            messages.extend({"scope": scope, **m} for m in self._messages(self.opening(scope), by_scope[scope]))
        return messages

    def _seen_by(self, node_id: str) -> list[dict[str, Any]]:
        """What ``node_id``'s model sees (do not mutate: it is cached).

        The executor builds turns as a chain: turn ``n + 1``'s parents are the tool nodes
        of turn ``n``. Then its ancestors are turn ``n``'s ancestors, turn ``n`` and those
        tool nodes, and in natural order they come in exactly that order, so the
        transcript is turn ``n``'s (cached when turn ``n`` ran) plus turn ``n``'s messages
        plus its tools' messages: O(new messages) per turn instead of a walk and a sort of
        the whole run. Any other shape (or no cached predecessor) takes the full walk."""
        scope = scope_of(node_id)
        specs, records, seen = self.specs, self.records, self._seen
        spec = specs.get(node_id)
        parents = spec.parents[:] if spec is not None else []
        # the chain's shape: every parent recorded, in this scope, with the same single
        # parent (turn n), whose transcript is cached (a loop, not sets and generators:
        # this runs once a model turn)
        first = specs.get(parents[0]) if parents else None
        before = first.parents[:] if first is not None else None
        if before is not None and len(before) == 1 and before[0] in seen and before[0] in records:
            for p in parents:
                p_spec = specs.get(p)
                if p not in records or scope_of(p) != scope or p_spec is None or p_spec.parents[:] != before:
                    break
            else:
                messages = seen.pop(before[0])  # turn n's successor is its only reader
                self._messages(messages, [before[0], *sorted(parents, key=node_order)])
                seen[node_id] = messages
                return messages
        ancestors = self.ancestors(node_id)
        nodes = [n for n in ancestors if scope_of(n) == scope]
        messages = self._messages(self.opening(scope), nodes)
        if all(n in self.records for n in ancestors):  # complete: a successor may build on it
            self._seen[node_id] = messages
        return messages

    def _messages(self, opening: list[dict[str, Any]], nodes: list[str]) -> list[dict[str, Any]]:
        for n in nodes:
            if n in self.records:
                opening.extend(self.output(n).get("messages", []))
        return opening

    def budget(self) -> dict[str, int]:
        total = {"tokens": 0, "model_calls": 0, "tool_calls": 0}
        for r in self.records.values():
            total["tokens"] += r.budget.tokens
            total["model_calls"] += r.budget.model_calls
            total["tool_calls"] += r.budget.tool_calls
        return total

    def final_answer(self, scope: str = "") -> str | None:
        """Content of the completed model node of ``scope`` (``""``: the run's own; a
        sub-agent node id: its child's) that spawned nothing, if any."""
        for n in sorted(self.records, key=node_order, reverse=True):
            r = self.records[n]
            if r.kind == "model" and not r.spawned and scope_of(n) == scope:
                return self.output(n).get("final")
        return None

    def done(self) -> bool:
        return not self._pending
