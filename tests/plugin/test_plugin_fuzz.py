"""A user's property test (tests/plugin/user_fuzz: one line) finds the planted defect of
``defect:unkeyed-retry`` (an idempotency key that changes per attempt: a resumed
charge or receipt is applied twice), shrinks the plan to one or two faults, prints it
as JSON and as a replay command that reproduces it, and stores it in Hypothesis'
example database, so the next run replays it first."""

from __future__ import annotations

import json
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crashmatrix.harness.plan import Case, FaultPlan

from _plugin_support import crashmatrix_cli, run_pytest


def test_property_finds_shrinks_replays_and_remembers_the_defect(fuzz_project: Path) -> None:
    first = run_pytest(fuzz_project, "-q", "--crashmatrix-report=first.json")
    assert first.returncode == 1, first.output[-3000:]
    out = first.stdout
    headline = re.search(r"FaultPlanFailed: fault plan of (\d) fault\(s\) fail on defect:unkeyed-retry: (\S+)", out)
    assert headline, out[-3000:]
    n_faults, case_id = int(headline.group(1)), headline.group(2)
    assert n_faults in (1, 2)
    plan_json = re.search(r"^plan \(JSON\): (.+)$", out, re.M).group(1)  # type: ignore[union-attr]
    plan = FaultPlan.from_json(plan_json)
    assert Case.parse(case_id).plan == plan and len(plan.faults) == n_faults
    replay = re.search(r"^replay: (crashmatrix replay .+)$", out, re.M).group(1)  # type: ignore[union-attr]
    assert shlex.split(replay) == ["crashmatrix", "replay", case_id, "--subject", "defect:unkeyed-retry"]
    # the failing check is one the mutant's docstring names: the receipt or the charge twice
    assert re.search(r"failed (effects|provider\.(payment|mail))\.ledger_equal", out), out[-3000:]
    # Hypothesis searched: more cases ran than the minimal plan (passing ones included)
    report = json.loads((fuzz_project / "first.json").read_text())
    outcomes = [c["outcome"] for m in report["matrices"] for c in m["cases"]]
    assert outcomes.count("pass") >= 1 and "fail" in outcomes
    # stored in the example database ...
    stored = [p for p in (fuzz_project / ".hypothesis" / "examples").rglob("*") if p.is_file()]
    assert stored, "no example saved"

    # ... so the next run replays it first (its first case is the minimal plan); and
    # the printed replay command reproduces the failure on its own (both at once)
    with ThreadPoolExecutor(2) as pool:
        second_f = pool.submit(run_pytest, fuzz_project, "-q", "--crashmatrix-report=second.json")
        rerun_f = pool.submit(crashmatrix_cli, fuzz_project, *shlex.split(replay)[1:])
        second, rerun = second_f.result(), rerun_f.result()
    assert second.returncode == 1, second.output[-3000:]
    cases = [c for m in json.loads((fuzz_project / "second.json").read_text())["matrices"] for c in m["cases"]]
    # Hypothesis' reuse phase replays the database's entries (shortest first; it may keep
    # more than the minimal failure, e.g. a one-fault plan met while shrinking) before it
    # generates anything new: the minimal plan is the first failure, within those replays
    failing = [i for i, c in enumerate(cases) if c["outcome"] == "fail"]
    assert failing and cases[failing[0]]["id"] == case_id, [(c["id"], c["outcome"]) for c in cases]
    assert failing[0] < len(stored), (failing[0], len(stored), [c["id"] for c in cases])
    assert f"fail on defect:unkeyed-retry: {case_id}" in second.stdout
    assert rerun.returncode == 1, rerun.output[-3000:]
    assert f"FAIL {case_id}" in rerun.stdout and "invalid" in rerun.stdout
