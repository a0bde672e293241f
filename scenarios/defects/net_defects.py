"""Mutants only network faults reach: defects in how a runtime handles a broken link."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.reference_runtime import AppendOnlyLog, codec
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.effects import idempotency_key
from crashmatrix.reference_runtime.executor import Execution
from crashmatrix.reference_runtime.logstore import RunStore
from crashmatrix.reference_runtime.records_pb2 import NodeSpec

from ._base import MutantAdapter

REAPPLY_ATTEMPTS = 3


class AppendFailed(RuntimeError):
    """The mutant's reading of a lost COMMIT acknowledgement: "the append failed"."""


class LostAckAsFailureLog(AppendOnlyLog):
    """The store half of mutant 15: when the connection breaks with the append in flight,
    it does not re-read the log to learn whether the COMMIT landed; it reports the
    append as failed."""

    async def landed(self, run_id: str, node_id: str, data: bytes) -> int | None:
        raise AppendFailed(f"append of {node_id} failed: connection lost before the COMMIT was acknowledged")


class LostAckReapplyExecution(Execution):
    """Defect (mutant 15): a lost COMMIT acknowledgement is taken for a failed COMMIT, so
    the turn is applied again: the node runs once more as a fresh attempt, and a tool
    with an effect makes a new call under a new idempotency key (the attempt number is
    part of it, as in runtimes that key effects per attempt). When the first COMMIT had
    in fact landed, the provider charges twice and the re-applied record conflicts with
    the one in the log.

    Class: the ambiguous commit, the "info" outcome that Jepsen's interpreter never
    counts as "fail" (STYLE.md); CockroachDB documents it as SQLSTATE 40003
    ``statement_completion_unknown`` ("result is ambiguous": retrying a non-idempotent
    transaction may apply it twice) and Couchbase as ``TransactionCommitAmbiguous``.
    Caught by the network section at a ``reset_peer`` on the db link during the append
    of an effect node, healed at the reconnection
    (``checkout/conv1/net:db.reset_peer@log.append.before[turn-5.tool-0]#1~db.reconnect[db]#1``):
    ``provider.mail.ledger_equal`` (a second receipt), ``net.resumable`` (the run
    ends ``failed``) and ``run.status``. At the charge's append (``turn-4.tool-0``, the
    first record with an effect on the connection) the answer lost is the one to
    asyncpg's implicit prepare, so nothing landed: the re-applied turn charges again
    (``provider.payment.ledger_equal``) and the run completes. Kill faults never reach
    it (a dead worker re-applies nothing; its resume rehydrates).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reapplied: dict[str, int] = {}  # tool-call id -> attempts made again

    def effect_key(self, call: dict[str, Any]) -> str:
        n = self.reapplied.get(call["id"], 0)
        return super().effect_key(call) if n == 0 else idempotency_key(self.graph.run_id, f"{call['id']}:attempt-{n}")

    async def run_tool(self, spec: NodeSpec) -> None:
        call_id = codec.decode(spec.input)["call"]["id"]
        for attempt in range(REAPPLY_ATTEMPTS):
            try:
                return await super().run_tool(spec)
            except AppendFailed:
                self.reapplied[call_id] = attempt + 1  # "it did not commit": apply the turn again
        raise AppendFailed(f"{spec.node_id}: append failed {REAPPLY_ATTEMPTS} times")

    async def run_model(self, spec: NodeSpec) -> None:
        for _ in range(REAPPLY_ATTEMPTS):
            try:
                return await super().run_model(spec)
            except AppendFailed:
                continue  # call the model again, record the new reply
        raise AppendFailed(f"{spec.node_id}: append failed {REAPPLY_ATTEMPTS} times")


class LostAckReapplyAdapter(MutantAdapter):
    """Mutant 15: a lost COMMIT acknowledgement re-applies the turn (LostAckReapplyExecution)."""

    name = "defect:lost-ack-reapply"
    defect = "a lost COMMIT acknowledgement is taken for a failed append: the turn is applied again under a new key"
    source = ("the ambiguous commit: Jepsen's info-is-not-fail (STYLE.md); CockroachDB SQLSTATE 40003 "
              "statement_completion_unknown; Couchbase TransactionCommitAmbiguous")
    caught_by = ("provider.payment.ledger_equal", "provider.mail.ledger_equal", "net.resumable", "run.status")
    fault_kinds = ("net",)
    point_sources = ("label",)
    conversations = ("conv1",)

    execution = LostAckReapplyExecution

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        return LostAckAsFailureLog(db)
