"""The resume policies on the reference runtime: two resumers at once, the same
crash in every worker, recovery without the run id, the input handed out once. A few
focused cases; the mutants each policy catches run in the selftest
(tests/integration/test_selftest.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def test_every_policy_passes_on_the_reference_runtime() -> None:
    ids = ("checkout/conv1/kill@tool.request.before[turn-4.tool-0]#1/concurrent",
           "checkout/conv1/kill@log.append.before[turn-4]#1/recurring",
           "checkout/conv1/cancel@log.append.before[turn-3]#1/discovery",
           "checkout/conv1/kill@log.append.after[turn-2]#1/input-once")
    report = asyncio.run(run_matrix("checkout", "reference", cases=[Case.parse(c) for c in ids], jobs=4))
    by_id = {r.case.id: r for r in report.results}
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad
    concurrent, recurring, discovery, once = (by_id[c] for c in ids)
    checks = {v.check: v for v in concurrent.verdicts}
    assert {"concurrent.one_terminal_status", "concurrent.loser_fenced", "concurrent.log_intact",
            "concurrent.effects_once"} <= set(checks)
    assert [w.get("concurrent") for w in concurrent.workers] == [None, 2, 2]
    assert "lease.taken_over" in concurrent.reached  # a concurrent round's branches count for coverage
    # the resumers wait for each other at a start gate (worker.wait_at_gate), so they race
    # for the lease and the loser is refused; only if the winner's short resume ended
    # before the other took a step (a scheduler's choice, seen once in CI under load) may
    # both exit 0, the late one having found the run ended and run no step
    fenced = checks["concurrent.loser_fenced"].details
    if sorted(w["returncode"] for w in concurrent.workers[1:]) == [0, 1]:
        assert "1 resumer(s) ran steps unrefused; refused: LeaseLost" in fenced, fenced
    else:
        assert [w["returncode"] for w in concurrent.workers[1:]] == [0, 0], concurrent.workers
        assert fenced == "1 resumer(s) ran steps unrefused", fenced
    # the same kill in every worker: six attempts, then the attempt limit says crash loop
    bounded = next(v for v in recurring.verdicts if v.check == "recurring.bounded")
    assert "gave up after 7 worker(s): failed (its crash-loop status)" in bounded.details, bounded.details
    assert [w["signal"] for w in recurring.workers] == [9] * 6 + [None]
    found = next(v for v in discovery.verdicts if v.check == "discovery.found")
    assert found.valid and "clock advanced 31 s" in found.details, found.details
    assert [w["role"] for w in discovery.workers] == ["start", "recover"]
    # acknowledged, then handed out no more: the resume read its input from the store
    assert any(v.check == "run.acknowledged_durable" and "acknowledged, and there" in v.details for v in once.verdicts)


def test_a_bad_resume_policy_is_one_line_and_exit_2(cli_env, tmp_path) -> None:
    proc = subprocess.run([*CLI, "run", "--resume", "sideways"], env=cli_env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-500:] + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("crashmatrix: error")]
    assert len(lines) == 1 and "resume='sideways' must be one of default, concurrent" in lines[0], proc.stderr
