"""No false alarm, no defect taken for the baseline: the determinism gate and
the invariants checked on the golden run, on the real harness (PostgreSQL, providers,
forked workers)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from crashmatrix.harness import checks
from crashmatrix.harness.matrix import run_matrix

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def test_a_nondeterministic_workload_exits_2_before_any_case_naming_the_field(cli_env, tmp_path) -> None:
    proc = subprocess.run([*CLI, "run", "crashmatrix.scenarios.defects.nondeterministic:WORKLOAD", "--conversation", "conv1"],
                          env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "workload is not deterministic" in proc.stderr
    assert "provider mail, request 1, request.body:" in proc.stderr and "(ref " in proc.stderr
    assert "cases:" not in proc.stdout  # not one case ran


def test_a_double_charge_in_every_run_fails_an_invariant_by_name_on_the_golden_run() -> None:
    report = asyncio.run(run_matrix("checkout", "defect:double-charge-tool", conversations=("conv1",), kinds=("kill",),
                                replay_failures=0))
    assert report.exit_code == 1
    assert report.results == []  # the golden run is no baseline: no case of it ran
    [golden] = report.golden_results
    assert golden.case.id == "checkout/conv1/golden" and golden.outcome == "fail"
    assert [v.check for v in golden.failed] == ["effects.applied_once"]
    assert "2 charge(s) applied for one tool call, turn-4.tool-0" in golden.failed[0].details
    # the clean twin: the same conversation's golden run is a valid baseline
    clean = asyncio.run(run_matrix("checkout", "reference", cases=[golden.case]))
    assert clean.exit_code == 0 and clean.golden_results[0].outcome == "pass"
    invariants = {name for name, c in checks.declared().items() if c.phase == "invariant"}
    assert "effects.applied_once" in invariants  # every invariant, as declared, and nothing else
    assert {v.check for v in clean.golden_results[0].verdicts} == invariants
