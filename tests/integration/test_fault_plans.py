"""Plans beyond one fault: double faults (a crash during recovery), db-restart on a
PostgreSQL of its own, shards, plan files and malformed plans."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from crashmatrix.harness.enumeration import shard
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def test_double_faults_sampled_and_reproducible() -> None:
    report = asyncio.run(run_matrix("checkout", "reference", kinds=("kill", "cancel"), sources=("step",),
                                    conversations=("conv3",), depth=2, sample=40, seed=11))
    doubles = [r for r in report.results if len(r.case.plan.faults) == 2]
    assert len(doubles) == 40
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad[:5]
    # every double fault fired in the resume: its crash-state checks ran twice
    assert all(sum(v.check == "log.clean_prefix" for v in r.verdicts) == 2 for r in doubles)
    # the same seed draws the same cases; the ids replay
    again = asyncio.run(run_matrix("checkout", "reference", cases=[doubles[0].case]))
    assert again.results[0].case.id == doubles[0].case.id and again.results[0].outcome == "pass"
    assert Case.parse(doubles[0].case.id) == doubles[0].case


def test_db_restart_at_steps_loses_nothing() -> None:
    cases = [Case.parse(c) for c in (
        "checkout/conv1/db-restart@step.after[turn-4.tool-0]#1",
        "checkout/conv1/db-restart@step.before[turn-5.tool-0]#1",
        "checkout/conv1/db-restart@log.append.before[turn-2]#1",
    )]
    report = asyncio.run(run_matrix("checkout", "reference", cases=cases))
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad


def test_shards_are_disjoint_and_cover() -> None:
    cases = [Case.parse(f"checkout/conv1/kill@step.after[turn-{i}]#1") for i in range(1, 11)]
    parts = [shard(cases, f"{k}/3") for k in (1, 2, 3)]
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cases)
    assert all(not set(map(id, a)) & set(map(id, b)) for a in parts for b in parts if a is not b)


def test_plan_file_runs_one_case_and_bad_plans_are_one_line(tmp_path) -> None:
    plan = {"version": 1, "faults": [{"kind": "term", "point": {"source": "label", "name": "log.append.after", "task": "turn-3", "occurrence": 1}}]}
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(plan))
    proc = subprocess.run([*CLI, "run", "--plan", str(good), "--conversation", "conv1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "1 cases: 1 passed" in proc.stdout
    for text, expected in (
        ("{not json", "plan is not valid JSON"),
        (json.dumps({"version": 1, "faults": [{"kind": "explode", "point": plan["faults"][0]["point"]}]}), "kind='explode'"),
        (json.dumps({"version": 1, "faults": [{"kind": "kill", "point": {**plan["faults"][0]["point"], "task": "turn-99"}}]}), "not in the golden trace"),
        (json.dumps({"version": 1, "faults": [{"kind": "kill", "point": {**plan["faults"][0]["point"], "occurrence": 7}}]}), "out of range"),
        (json.dumps({"version": 3, "faults": []}), "plan.version=3"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        proc = subprocess.run([*CLI, "run", "--plan", str(bad), "--conversation", "conv1"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (text, proc.stdout[-500:], proc.stderr)
        lines = [l for l in proc.stderr.splitlines() if l.startswith("crashmatrix: error")]
        assert len(lines) == 1 and expected in lines[0], (text, proc.stderr)


def test_worker_profile_switch_writes_a_cpu_profile_per_worker(tmp_path) -> None:
    """``CRASHMATRIX_WORKER_PROFILE=DIR`` (docs/benchmarks.md): each worker that exits by
    itself leaves ``DIR/worker-PID.prof``, a cProfile of its run_job."""
    import os
    import pstats

    plan = {"version": 1, "faults": [{"kind": "term", "point": {"source": "label", "name": "log.append.after", "task": "turn-3", "occurrence": 1}}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    profiles = tmp_path / "prof"
    profiles.mkdir()
    proc = subprocess.run([*CLI, "run", "--plan", str(tmp_path / "plan.json"), "--conversation", "conv1"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CRASHMATRIX_WORKER_PROFILE": str(profiles)})
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    files = sorted(profiles.glob("worker-*.prof"))
    assert len(files) >= 3, files  # the golden run, the terminated start, its resume
    stats = pstats.Stats(*map(str, files))
    assert any(fn == "run_job" and path.endswith("worker.py") for path, _line, fn in stats.stats), "run_job not profiled"
