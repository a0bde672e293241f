"""The ``support_desk`` workload's shapes, on real services: its golden runs end
``completed`` just under their token and turn limits; the parallel turn's two effects are
two keys, two ledger rows and two provider rows; the statement is a blob read back two
turns later; and two plausible defects (``tests/subjects/plausible``) fail a named check
on a case the reference runtime passes. The whole matrices are CLI runs (docs/runtime.md,
"support_desk")."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from crashmatrix.harness.enumeration import validate_case
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.golden import GoldenRun
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan
from crashmatrix.harness.session import open_session
from crashmatrix.scenarios import support_desk

SUBJECTS = str(Path(__file__).resolve().parents[1] / "subjects")
RECOUNTS = "plausible.defects:RecountsTokensAdapter"
# one record a statement: a sibling's record can commit while the other is in flight (the
# reference runtime's launch batches commit both at once, and leave no such crash state)
TURN_KEYED = "plausible.defects:TurnKeyedOneByOneAdapter"


def case(kind: str, source: str, name: str, task: str) -> Case:
    return Case("support_desk", "exchange", FaultPlan((Fault(kind, CrashPoint(source, name, task, 1)),)))


LATE_KILL = case("kill", "step", "step.after", "turn-6")  # six turns rehydrated by the resume
REFUND_RECORDED = case("kill", "label", "log.append.after", "turn-4.tool-1")  # the charge beside it in flight
CASES = [(RECOUNTS, LATE_KILL), (TURN_KEYED, REFUND_RECORDED), ("reference", LATE_KILL), ("reference", REFUND_RECORDED)]


async def run_all() -> dict[str, Any]:
    async with open_session("reference", "support_desk", preload=(RECOUNTS, TURN_KEYED)) as ref:
        goldens: dict[str, GoldenRun] = {c: await ref.golden(c) for c in ("exchange", "declined")}
        results: dict[tuple[str, str], CaseResult] = {}
        for subject, c in CASES:
            async with ref.for_subject(subject) as ex:
                golden = goldens["exchange"] if subject == "reference" else await ex.golden("exchange")
                validate_case(c, {"exchange": golden})
                results[(subject, c.id)] = await ex.run_case(c, golden)
        blobs = sorted(f.stat().st_size for f in (Path(ref.env.workdir) / "blobs").rglob("*") if f.is_file())
    return {"goldens": goldens, "results": results, "blobs": blobs}


@pytest.fixture(scope="module")
def desk() -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:  # the controller imports the subjects, and so do the workers
        mp.syspath_prepend(SUBJECTS)
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (SUBJECTS, os.environ.get("PYTHONPATH")) if p))
        try:
            yield asyncio.run(run_all())
        finally:
            for name in [m for m in sys.modules if m == "plausible" or m.startswith("plausible.")]:
                del sys.modules[name]


def test_golden_runs_complete_just_under_their_limits(desk: dict[str, Any]) -> None:
    for conversation, golden in desk["goldens"].items():
        obs = golden.evidence.observation
        assert obs.status == "completed" and not golden.broken, (conversation, obs.status, golden.broken)
        tokens = obs.state["budget"]["tokens"]
        assert tokens == support_desk.GOLDEN_TOKENS[conversation], (conversation, tokens)
        agent = support_desk.WORKLOAD.build_agent(conversation, None)
        assert agent.max_tokens - support_desk.TOKEN_MARGIN == tokens < agent.max_tokens
        assert sum(e.kind == "model" for e in obs.log) == agent.max_turns == support_desk.MAX_TURNS[conversation]
    assert support_desk.MAX_TURNS["exchange"] - 3 >= 12  # twelve turns of its own, three of the sub-agent's


def test_parallel_effects_are_distinct_rows_everywhere(desk: dict[str, Any]) -> None:
    ev = desk["goldens"]["exchange"].evidence
    effects = {e.node_id: e for e in ev.observation.effects}
    charge, refund = effects["turn-4.tool-0"], effects["turn-4.tool-1"]
    assert (charge.tool, refund.tool) == ("charge_order", "refund_order") and charge.key != refund.key
    payment = {r["key"]: r for r in ev.ledgers["payment"]}
    assert payment[charge.key]["op"] == "charge" and payment[charge.key]["request"]["amount"] == 24900
    assert payment[refund.key]["op"] == "refund" and payment[refund.key]["request"]["amount"] == 12900
    # the refund is of the earlier charge (turn 2), the credit of the parallel one
    assert payment[refund.key]["request"]["charge_id"] == effects["turn-2.tool-0"].result["charge_id"]
    assert payment[effects["turn-9.tool-0"].key]["request"]["charge_id"] == charge.result["charge_id"]
    # the sub-agent's pick ticket is a mail of its own, keyed under its scoped node
    ticket = effects["turn-5.tool-0:turn-2.tool-0"]
    assert ticket.tool == "file_pick_ticket" and [r["request"]["to"] for r in ev.ledgers["mail"] if r["key"] == ticket.key] == [
        support_desk.WAREHOUSE]
    # declined: the charge failed (a definite failure) beside a refund that succeeded
    declined = {e.node_id: e for e in desk["goldens"]["declined"].evidence.observation.effects}
    assert (declined["turn-3.tool-0"].status, declined["turn-3.tool-1"].status) == ("failed", "succeeded")


def test_statement_is_a_blob_read_back_later(desk: dict[str, Any]) -> None:
    messages = desk["goldens"]["exchange"].evidence.observation.state["transcript"]
    [export] = [m["content"] for m in messages if m.get("name") == "export_statement"]
    [read] = [m["content"] for m in messages if m.get("name") == "read_statement"]
    assert export["bytes"] == read["bytes"] == support_desk.STATEMENT_BYTES and read["sha256"] == export["sha256"]
    assert read["balance"] == 24900
    assert len([b for b in desk["blobs"] if b > 4096]) >= 2  # the output and the state document


def test_a_double_count_of_rehydrated_tokens_trips_the_limit(desk: dict[str, Any]) -> None:
    bad = desk["results"][(RECOUNTS, LATE_KILL.id)]
    failed = {v.check: v.details for v in bad.failed}
    assert bad.outcome == "fail" and "limit_exceeded" in failed.get("run.status", ""), (bad.error, failed)
    good = desk["results"][("reference", LATE_KILL.id)]
    assert good.outcome == "pass", (good.error, [(v.check, v.details) for v in good.failed])


def test_parallel_effects_sharing_a_key_are_caught(desk: dict[str, Any]) -> None:
    bad = desk["results"][(TURN_KEYED, REFUND_RECORDED.id)]
    assert bad.outcome == "fail" and "transcript.exact" in {v.check for v in bad.failed}, (bad.error, bad.failed)
    good = desk["results"][("reference", REFUND_RECORDED.id)]
    assert good.outcome == "pass", (good.error, [(v.check, v.details) for v in good.failed])
