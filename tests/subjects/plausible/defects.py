"""Five plausible runtime defects (package docstring), each the reference adapter with one
component swapped (as the catalogue's mutants are: ``scenarios/defects/_base.py``).

| subject | defect |
| --- | --- |
| :class:`RecountsTokensAdapter` | (a) a rehydrated record's tokens are counted twice |
| :class:`TurnKeyedAdapter` | (b) an effect's idempotency key is derived from its turn, so a turn's parallel effects share one |
| :class:`ChildSessionKeyedAdapter` | (c) a sub-agent's effects are keyed by the child session of the attempt, not by the child's node id |
| :class:`MovesBlobsAdapter` | (d) a resume moves an earlier attempt's blobs under its own address and keeps the old pointers |
| :class:`CompletionOrderAdapter` | (e) a turn's tool results join the conversation in completion order, not call order |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.adapters.reference import blob_store
from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime.blobs import LocalBlobStore
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.effects import idempotency_key
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.graph import RunGraph
from crashmatrix.reference_runtime.logstore import StoredRecord
from crashmatrix.reference_runtime.records_pb2 import BlobPointer, NodeSpec
from crashmatrix.reference_runtime.subagents import scope_of
from crashmatrix.scenarios.defects._base import MutantAdapter

# -- (a) tokens counted twice on rehydrate -------------------------------------------------


class RecountsTokensGraph(RunGraph):
    """Defect: rehydrate adds every record's tokens to the running total (as ``add``
    already did), the way a runtime that restores "the budget so far" and then replays
    the records on top of it does. A resumed run believes it spent its earlier tokens
    twice; a fresh run is unaffected."""

    @classmethod
    def rehydrate(cls, run_id: str, run_input: dict[str, Any], stored: list[StoredRecord], *,
                  blobs: Any = None) -> RunGraph:
        graph = super().rehydrate(run_id, run_input, stored, blobs=blobs)
        graph.tokens_used += sum(item.record.budget.tokens for item in stored)
        return graph


class RecountsTokensRuntime(Runtime):
    graph_class = RecountsTokensGraph


class RecountsTokensAdapter(MutantAdapter):
    name = "plausible:recounts-tokens"
    runtime_class = RecountsTokensRuntime
    defect = "(a) a resume counts the tokens of every rehydrated record twice"
    source = "plausible runtime-author defect: budget accounting across a resume"
    caught_by = ("run.status",)
    fault_kinds = ("kill", "term", "cancel")


# -- (b) and (c): keys from the wrong ids ------------------------------------------------------


class _NodeAwareExecution(Execution):
    """Knows which node asks for a key: ``run_tool`` calls ``effect_key`` before its first
    await, so the node set here is the caller's."""

    node_id = ""

    async def run_tool(self, spec: NodeSpec) -> None:
        self.node_id = spec.node_id
        await super().run_tool(spec)


class TurnKeyedExecution(_NodeAwareExecution):
    """Defect: the idempotency key is ``sha256(run_id:turn)``, the model turn that asked
    for the call (stable across attempts, which is all its author checked), instead of
    the tool call's id. With one effect per turn nothing shows; two effects of one turn
    share a key, hence one ledger row, and a resume takes one's result for the other's."""

    def effect_key(self, call: dict[str, Any]) -> str:
        return idempotency_key(self.graph.run_id, self.graph.specs[self.node_id].parents[0])


class TurnKeyedAdapter(MutantAdapter):
    name = "plausible:turn-keyed"
    execution = TurnKeyedExecution
    defect = "(b) parallel effects of one turn share one idempotency key (derived from the turn)"
    source = "plausible runtime-author defect: two effects in flight at once"
    caught_by = ("transcript.exact", "state.equal", "effects.ledger_equal")
    fault_kinds = ("kill", "term", "cancel")


class TurnKeyedOneByOneAdapter(TurnKeyedAdapter):
    """The same defect on a runtime that commits each record alone (``launch_batches=False``,
    as most runtimes do): there one sibling's record can be durable while the other is in
    flight, a crash state the reference runtime's launch batches no longer leave."""

    name = "plausible:turn-keyed-one-by-one"
    runtime_options = {"launch_batches": False}


class ChildSessionKeyedExecution(_NodeAwareExecution):
    """Defect: a sub-agent's effects are keyed by the child session this attempt opened
    for it (``<sub-agent node>@<lease epoch>``), not by the child's stable node ids. A
    resume opens a new session, so an effect of the child that was in flight is made
    again under a new key, and the old row is left unresolved."""

    def effect_key(self, call: dict[str, Any]) -> str:
        scope = scope_of(self.node_id)
        if not scope:
            return super().effect_key(call)
        return idempotency_key(f"{self.graph.run_id}/{scope}@{self.lease.epoch}", call["id"])


class ChildSessionKeyedAdapter(MutantAdapter):
    name = "plausible:child-session-keyed"
    execution = ChildSessionKeyedExecution
    defect = "(c) a sub-agent's effect is keyed per attempt, so a resume makes it again"
    source = "plausible runtime-author defect: a sub-agent's own effects"
    caught_by = ("provider.mail.ledger_equal", "effects.resolved")
    fault_kinds = ("kill", "term", "cancel")


# -- (d) blobs moved on resume, pointers kept ---------------------------------------------------


class AttemptBlobStore(LocalBlobStore):
    """Defect: each attempt writes its blobs under an address of its own
    (``<root>/attempts/<run>/<worker>/<sha256>``), and a resume that reads a blob an
    earlier attempt wrote moves it under its own address (and deletes the old file, so
    the earlier worker's area can be reclaimed). The log is append-only, so the records
    keep the old pointers; only this attempt knows where the bytes went."""

    def __init__(self, root: str | os.PathLike[str], run_id: str, worker_id: str) -> None:
        super().__init__(root)
        self.run_dir = self.root / "attempts" / run_id
        self.ns = self.run_dir / worker_id

    def path_for(self, digest_hex: str) -> Path:
        return self.ns / digest_hex

    def put(self, data: bytes) -> BlobPointer:
        self.ns.mkdir(parents=True, exist_ok=True)
        return super().put(data)

    def get(self, pointer: BlobPointer) -> bytes:
        digest = pointer.sha256.hex()
        path = Path(unquote(urlparse(pointer.uri).path))
        if not path.exists():  # moved by another attempt: look in the run's areas
            found = sorted(self.run_dir.glob(f"*/{digest}"))
            path = found[0] if found else path
        if path.exists() and path.parent != self.ns:  # an earlier attempt's: adopt it
            self.put(path.read_bytes())
            path.unlink()
        return super().get(BlobPointer(uri=self.path_for(digest).as_uri(), size=pointer.size, sha256=pointer.sha256))


class MovesBlobsAdapter(MutantAdapter):
    name = "plausible:moves-blobs"
    defect = "(d) a resume re-writes an earlier attempt's blobs under a new address and keeps the old pointers"
    source = "plausible runtime-author defect: a blob-sized output read by later turns"
    caught_by = ("state.equal",)
    fault_kinds = ("kill", "term", "cancel")

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        runtime = super().make_runtime(db, agent, ctx)
        runtime.blobs = AttemptBlobStore(blob_store(ctx.env).root, ctx.run_id, ctx.worker_id)
        return runtime


# -- (e) results in completion order ---------------------------------------------------------


class CompletionOrderGraph(RunGraph):
    """Defect: a model turn sees its ancestors' messages in the order their records were
    appended (``seq``: completion order, as a messages list that each finished tool
    appends to), not in the order of the calls; the run's transcript likewise."""

    def _seen_by(self, node_id: str) -> list[dict[str, Any]]:
        scope = scope_of(node_id)
        ancestors = set(self.ancestors(node_id))
        return self._messages(self.opening(scope), [n for n in self.records if n in ancestors and scope_of(n) == scope])

    def transcript(self, upto: str | None = None) -> list[dict[str, Any]]:
        if upto:
            return self._seen_by(upto)
        by_scope: dict[str, list[str]] = {}
        for n in self.records:  # seq order
            by_scope.setdefault(scope_of(n), []).append(n)
        messages = self._messages(self.opening(""), by_scope.pop("", []))
        for scope in by_scope:
            messages.extend({"scope": scope, **m} for m in self._messages(self.opening(scope), by_scope[scope]))
        return messages


class CompletionOrderRuntime(Runtime):
    graph_class = CompletionOrderGraph


class CompletionOrderAdapter(MutantAdapter):
    name = "plausible:completion-order"
    runtime_class = CompletionOrderRuntime
    graph_class = CompletionOrderGraph  # the runtime's own reading of its log
    defect = "(e) parallel results join the conversation in completion order, not call order"
    source = "plausible runtime-author defect: parallel calls that complete out of call order"
    caught_by = ("transcript.exact",)
    fault_kinds = ("kill", "term", "cancel")
