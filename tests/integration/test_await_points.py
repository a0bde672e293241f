"""Await points on any asyncio subject, and the pause (zombie worker) fault."""

from __future__ import annotations

import asyncio


from crashmatrix.harness.matrix import run_matrix



def test_unlabelled_subject_gets_a_full_await_point_matrix(subjects_on_path) -> None:
    report = asyncio.run(run_matrix(
        "plainrun.adapter:WORKLOAD", "plainrun.adapter:PlainAdapter", kinds=("kill", "cancel"), sources=("await",)))
    names = {r.case.plan.faults[0].point.name for r in report.results}
    assert len(report.results) >= 20, len(report.results)
    assert all(n.startswith("plainrun.runtime:Runner.") for n in names), names
    assert "plainrun.runtime:Runner.call@1" in names  # the request on the wire
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad[:5]


def test_unshielded_recovery_write_is_caught_and_named_by_location(subjects_on_path) -> None:
    report = asyncio.run(run_matrix(
        "plainrun.adapter:WORKLOAD", "plainrun.adapter:UnshieldedPlainAdapter", kinds=("cancel",), sources=("await",)))
    failed = {r.case.plan.faults[0].point.name: {v.check for v in r.failed} for r in report.results if r.outcome == "fail"}
    assert "plainrun.runtime:Runner.call@1" in failed, sorted(failed)
    assert "cancel.left_unknown" in failed["plainrun.runtime:Runner.call@1"]
    assert report.counts["harness-error"] == 0


def test_reference_runtime_survives_kill_and_cancel_at_every_await_point() -> None:
    report = asyncio.run(run_matrix("checkout", "reference", kinds=("kill", "cancel"), sources=("await",),
                                    conversations=("conv1", "conv4")))
    names = {r.case.plan.faults[0].point.name for r in report.results}
    assert "crashmatrix.reference_runtime.executor:Execution.call_model@1" in names  # the model request on the wire
    assert any(n.startswith("crashmatrix.reference_runtime.db:Db.") for n in names)  # a statement on the wire
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad[:5]


def test_pause_matrix_passes_and_unfenced_zombie_is_caught() -> None:
    good = asyncio.run(run_matrix("checkout", "reference", kinds=("pause",), conversations=("conv1",)))
    assert good.counts == {"pass": len(good.results), "fail": 0, "flaky": 0, "harness-error": 0, "not-run": 0,
                           "not-applicable": 0}, [
        (r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in good.results if r.outcome != "pass"][:3]
    assert all(any(v.check == "pause.zombie_fenced" and v.valid for v in r.verdicts) for r in good.results)
    bad = asyncio.run(run_matrix("checkout", "defect:unfenced-lease", kinds=("pause",), conversations=("conv1",),
                            replay_failures=0))
    caught = [r for r in bad.results if any(v.check == "pause.zombie_fenced" and v.valid is False for v in r.failed)]
    assert len(caught) >= 10, [(r.case.id, r.outcome) for r in bad.results][:10]
