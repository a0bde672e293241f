"""A subject in its own environment (``--subject SUBJECT@VENV``, ``--python``): its
workers and the adapter's controller-side calls run under that interpreter, with
crashmatrix's worker side on its path and none of crashmatrix's dependencies installed
there; the controller keeps its own (protobuf 6 beside a subject's protobuf 5)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import google.protobuf
import pytest

from crashmatrix.harness.matrix import run_matrix

SUBJECTS = Path(__file__).resolve().parents[1] / "subjects"


def _venv(root: Path, *requirements: str) -> Path:
    """A virtual environment at ``root`` with ``requirements`` installed from the package
    index, and the test subjects on its path (a .pth file: a team's venv has its runtime
    installed)."""
    subprocess.run([sys.executable, "-m", "venv", *([] if requirements else ["--without-pip"]), str(root)],
                   check=True, timeout=120)
    if requirements:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        proc = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", *requirements],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    site = next((root / "lib").glob("python3.*")) / "site-packages"
    (site / "crashmatrix_test_subjects.pth").write_text(f"{SUBJECTS}\n")
    return root


@pytest.fixture(scope="module")
def protobuf5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with protobuf 5 (crashmatrix needs 6), anyio and plainrun's
    asyncpg and aiohttp: no crashmatrix."""
    return _venv(tmp_path_factory.mktemp("pb5") / "venv", "protobuf>=5,<6", "anyio>=4.4,<5", "asyncpg", "aiohttp")


@pytest.mark.install
def test_a_subject_on_protobuf_5_runs_while_the_controller_has_protobuf_6(protobuf5: Path, subjects_on_path) -> None:
    venv = protobuf5
    assert google.protobuf.__version__.split(".")[0] == "6"
    report = asyncio.run(run_matrix("plainrun.adapter:WORKLOAD", f"pinned.adapter:PinnedAdapter@{venv}",
                                    kinds=("kill", "cancel"), sources=("await",)))
    failed = [(r.case.id, r.outcome, r.error) for r in report.results if r.outcome != "pass"]
    assert failed == [] and report.golden_results == [] and len(report.results) > 20, failed[:4]
    # the observation came from a service worker under the subject's interpreter
    observed = report.goldens["three-charges"].evidence.observation.state["protobuf"]
    assert observed.split(".")[0] == "5", observed
    # the runtime's release as the subject's interpreter has it installed, not the controller's
    assert list(report.releases.values()) == [{"protobuf": observed}], report.releases
    assert f"runtime under test: protobuf {observed}" in report.notes, report.notes
    # the workload is imported from tests/subjects on $PYTHONPATH: the line carries it
    assert all(r.replay.startswith("PYTHONPATH=") and " crashmatrix replay " in r.replay and f"@{venv}" in r.replay
               for r in report.results[:3]), report.results[0].replay


@pytest.mark.install
def test_a_build_pair_whose_first_build_has_no_crashmatrix_installed(protobuf5: Path, subjects_on_path) -> None:
    """``--resume-with``: build A in the protobuf-5 environment (crashmatrix's packages put
    on its path), build B in the controller's."""
    from crashmatrix.harness.builds import pair
    from crashmatrix.harness.plan import Case

    subject = pair(f"pb5=pinned.adapter:PinnedAdapter@{protobuf5}", "here=plainrun.adapter:PlainAdapter")
    cases = [Case.parse(f"plainrun.adapter:WORKLOAD/three-charges/kill@plainrun.runtime:Runner.{p}[run]#1/upgrade:pb5>here")
             for p in ("call@1", "charge_step@2")]
    report = asyncio.run(run_matrix("plainrun.adapter:WORKLOAD", subject, cases=cases, sources=("await",)))
    assert [r.outcome for r in report.results] == ["pass", "pass"], [(r.case.id, r.failed, r.error) for r in report.results]
    migrated = [v.details for r in report.results for v in r.verdicts if v.check == "upgrade.migrated"]
    assert migrated == ["crashed under pb5, finished under here: completed"] * 2, migrated
    assert report.releases["here"] == {} and report.releases["pb5"]["protobuf"].split(".")[0] == "5", report.releases


def _cli(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run([sys.executable, "-m", "crashmatrix.harness.cli", "run", "--conversation", "conv1", *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_bad_environments_fail_in_one_line_and_leave_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "notes.txt").write_text("not python\n")
    bare = _venv(tmp_path / "bare")
    cases = {
        ("--python", str(tmp_path / "missing")): "does not exist",
        ("--python", "/bin/true"): "is not a Python interpreter",
        ("--python", str(tmp_path / "notes.txt")): "neither a virtual environment, an interpreter nor a source tree",
        ("--python", str(bare)): "lacks anyio, which crashmatrix's workers import: pip install 'anyio>=4.4,<5'",
        ("--subject", f"nosuch.module:Adapter@{bare / 'bin' / 'python'}", "--python", str(bare)): "give the environment once",
    }
    for args, words in cases.items():
        proc = _cli(*args, tmp=work)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], (args, proc.returncode, proc.stderr)
    assert list(work.iterdir()) == []  # no probe directory, no session directory
