"""The ``restore`` fault kind through the command line on the reference runtime (real
PostgreSQL, real workers): a restore that keeps its walls passes, the mutant that asks
the model again is caught by ``restore.effect_reapplied``, a point the golden run never
passed is bad input (exit 2, one line, nothing left), and a subject with no restore API
makes the cases not applicable, never failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_outcomes import _none_left

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]
CASE = "checkout/conv1/restore@node.launch[turn-4.tool-0]#1"


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300, cwd=cwd)


def _verdicts(report: Path) -> dict[str, dict]:
    [case] = json.loads(report.read_text())["cases"]
    return {v["check"]: v for v in case["verdicts"]}


def test_a_restore_replays_its_record_and_the_mutant_that_asks_the_model_again_applies_again(
        cli_env, test_tag, tmp_path) -> None:
    clean, bad = tmp_path / "clean.json", tmp_path / "bad.json"
    proc = _cli(["replay", CASE, "--report", str(clean)], cli_env, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    v = _verdicts(clean)
    assert all(v[c]["verdict"] == "valid" for c in ("restore.effect_reapplied", "restore.model_rebilled",
                                                     "restore.state_possible")), v
    assert "none sent again" in v["restore.effect_reapplied"]["details"]
    assert v["restore.effect_reapplied"]["property"] == "restore"
    proc = _cli(["replay", CASE, "--subject", "defect:restore-recalls-model", "--report", str(bad)], cli_env, tmp_path)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    v = _verdicts(bad)
    assert v["restore.effect_reapplied"]["verdict"] == "invalid"
    assert v["restore.effect_reapplied"]["anomaly"] == "effect re-applied after restore"
    assert "mail" in v["restore.effect_reapplied"]["details"]  # the receipt, asked for again under a new call id
    assert v["provider.mail.ledger_equal"]["verdict"] == "invalid"
    _none_left(test_tag, tmp_path)


def test_a_point_the_golden_run_never_passed_is_bad_input(cli_env, test_tag, tmp_path) -> None:
    proc = _cli(["replay", "checkout/conv1/restore@log.append.after[turn-99]#1"], cli_env, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "log.append.after[turn-99] is not in the golden trace of conv1" in lines[0], lines
    _none_left(test_tag, tmp_path)


@pytest.mark.usefixtures("subjects_on_path")
def test_a_subject_without_a_restore_api_is_not_applicable(cli_env, test_tag, tmp_path) -> None:
    report = tmp_path / "r.json"
    proc = _cli(["run", "checkout", "--conversation", "conv1", "--kinds", "restore", "--sources", "step",
                 "--subject", "misbehaving.adapter:NoRestore", "--report", str(report)], cli_env, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    s = json.loads(report.read_text())["summary"]
    assert s["cases"] > 0 and s["not-applicable"] == s["cases"] and s["fail"] == 0, s
    assert "declares none" in proc.stdout and "FAIL " not in proc.stdout
    _none_left(test_tag, tmp_path)


def test_a_fork_resumed_by_two_workers_at_once_is_judged_with_the_refused_ones_allowance() -> None:
    """``reference-fork`` restores to a fork that two resumers take up at once
    (``concurrent``): the one refused mid-node leaves its model call unrecorded and may
    have sent an effect before its refusal; the restore checks allow both, as the
    concurrent checks do, and the fork passes. The mutant that goes back to the run's start is still caught."""
    import asyncio

    from crashmatrix.harness.matrix import run_matrix
    from crashmatrix.harness.plan import Case

    points = ("run.accepted[run]#1", "step.before[turn-1]#1", "model.call.after[turn-1]#1",
              "step.before[turn-1.tool-0]#1")
    cases = [Case.parse(f"checkout/conv1/restore@{p}/concurrent") for p in points]
    report = asyncio.run(run_matrix("checkout", "reference-fork", cases=cases, replay_failures=0))
    assert report.counts["pass"] == len(cases), [(r.case.id, [(v.check, v.details) for v in r.failed])
                                                 for r in report.results if r.outcome != "pass"]
    assert all(sum(1 for w in r.workers if w.get("concurrent")) == 2 for r in report.results), report.results[0].workers
    later = [Case.parse(f"checkout/conv1/restore@{p}/concurrent") for p in ("log.append.after[turn-3]#1",
                                                                             "node.launch[turn-3.tool-0]#1")]
    bad = asyncio.run(run_matrix("checkout", "defect:restore-to-start", cases=later, replay_failures=0))
    assert all("restore.model_rebilled" in {v.check for v in r.failed} for r in bad.results), \
        [(r.case.id, [v.check for v in r.failed]) for r in bad.results]
