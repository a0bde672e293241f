"""The checkout matrix on the reference runtime, as ``run_matrix`` runs it with no kinds
named (``crashmatrix run checkout``'s default, :mod:`crashmatrix.harness.defaults`):
every step and every labelled crash point x {kill, term, cancel}, the sampled kinds and
resume policies, four conversations, real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter

from crashmatrix.harness.matrix import run_matrix


def test_full_checkout_matrix_passes_on_reference_runtime() -> None:
    from crashmatrix.harness.defaults import default_matrix

    report = asyncio.run(run_matrix("checkout", "reference"))
    bad = [r for r in report.results if r.outcome != "pass"]
    assert not bad, "\n".join(
        f"{r.case.id}: {r.outcome}: {r.error or [(v.check, v.details) for v in r.failed]}" for r in bad[:10]
    )
    assert set(report.goldens) == {"conv1", "conv2", "conv3", "conv4"}
    assert report.kinds == default_matrix().all_kinds
    resumed = Counter(r.case.resume.label() for r in report.results if r.case.resume.label())
    assert resumed == {"concurrent": 24, "warm-worker": 24, "same-worker": 24}
    by_kind_source = Counter((r.case.plan.faults[0].kind, r.case.plan.faults[0].point.source) for r in report.results
                             if not r.case.resume.label())
    for kind in ("pause", "db-restart", "net", "cancel-edge"):
        assert sum(n for (k, _), n in by_kind_source.items() if k == kind) == 24
    # at least eleven step boundaries x four conversations, killed
    steps_killed = {(r.case.conversation, r.case.plan.faults[0].point.task) for r in report.results
                    if r.case.plan.faults[0].kind == "kill" and r.case.plan.faults[0].point.name == "step.after"}
    assert len(steps_killed) >= 44
    for kind in ("kill", "term", "cancel"):
        assert by_kind_source[(kind, "label")] > 0
        assert by_kind_source[(kind, "step")] > 0
    # every labelled point of every golden trace got every kind
    labels = sum(1 for g in report.goldens.values() for e in g.trace if e[0] == "label")
    assert by_kind_source[("kill", "label")] == labels
    # conversation 4 ran its two searches concurrently: both tool nodes of turn 1 exist
    tasks4 = {e[2] for e in report.goldens["conv4"].trace}
    assert {"turn-1.tool-0", "turn-1.tool-1"} <= tasks4
    # the golden runs themselves: conv2 declined once (a failed effect), conv3 refunded
    eff2 = report.goldens["conv2"].evidence.observation.effects
    assert sorted(e.status for e in eff2 if e.tool == "charge") == ["failed", "succeeded"]
    assert len(report.goldens["conv3"].evidence.ledgers["payment"]) == 2
    assert report.exit_code == 0
