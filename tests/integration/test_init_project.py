"""A project ``crashmatrix init`` wrote passes its matrix from its own files alone:
``crashmatrix run`` in its folder, and pytest on its generated test (kill at every crash
point of conv1, a shard of it for the framework shapes: the small slices; the whole
default matrix is measured in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crashmatrix.harness import scaffold

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def _env(cli_env: dict[str, str]) -> dict[str, str]:
    env = dict(cli_env)
    env["PYTHONPATH"] = "."  # as the run line init prints says
    env["COLUMNS"] = "200"
    return env


@pytest.mark.parametrize("shape", ["postgres-loop", "sqlite-loop"])
def test_a_generated_loop_project_passes_the_kill_matrix(shape: str, cli_env, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    scaffold.write_project(project, shape)
    report = tmp_path / "report.json"
    proc = subprocess.run([*CLI, "run", "crashmatrix_workload:WORKLOAD", "--subject", "crashmatrix_adapter:SubjectAdapter",
                           "--conversation", "conv1", "--kinds", "kill", "--report", str(report)],
                          env=_env(cli_env), cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    outcomes = [c["outcome"] for c in data["cases"]]
    assert outcomes.count("pass") >= 40, outcomes  # kill at every step and label point of conv1
    assert "fail" not in outcomes and "flaky" not in outcomes


@pytest.mark.parametrize("shape", ["langgraph", "dbos"])
def test_a_generated_framework_workload_passes_a_kill_shard_on_the_shipped_adapter(shape: str, cli_env,
                                                                                   tmp_path: Path) -> None:
    """The framework shapes write only the workload and the test: their workload is what
    the shipped adapter reads (a quarter of the kill cases of conv1: a shard)."""
    pytest.importorskip(shape)
    project = tmp_path / "proj"
    scaffold.write_project(project, shape)
    report = tmp_path / "report.json"
    proc = subprocess.run([*CLI, "run", "crashmatrix_workload:WORKLOAD", "--subject", scaffold.SHAPES[shape].subject,
                           "--conversation", "conv1", "--kinds", "kill", "--shard", "1/4", "--report", str(report)],
                          env=_env(cli_env), cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = [c["outcome"] for c in json.loads(report.read_text())["cases"]]
    assert outcomes.count("pass") >= 10 and set(outcomes) <= {"pass", "not-run", "not-applicable"}, outcomes


def test_the_generated_pytest_test_passes(cli_env, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    scaffold.write_project(project, "sqlite-loop")
    env = _env(cli_env)
    env.pop("PYTHONPATH")  # the generated test puts its folder on the workers' path itself
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_crashmatrix.py",
                           "--crashmatrix-kinds", "kill"],
                          env=env, cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
