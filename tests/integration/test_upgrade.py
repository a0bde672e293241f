"""Two builds in one matrix, on real services: a case crashes under build A and resumes
under build B (each from a zygote of its own), the ids name both, ``upgrade.migrated``
judges the hand-over; and ``crashmatrix upgrade-check``'s preparation of the base."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from crashmatrix.harness.builds import pair
from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.matrix import MatrixReport, run_matrix
from crashmatrix.harness.plan import Case
from crashmatrix.harness.upgrade_check import MARKER, prepare_base

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]
AFTER_CHARGE = "kill@log.append.after[turn-4.tool-0]#1"


def _run(subject: str, workload: str, ids: list[str]) -> MatrixReport:
    cases = [Case.parse(f"{workload}/{i}") for i in ids]
    return asyncio.run(run_matrix(workload, subject, cases=cases, jobs=2, replay_failures=0))


def _verdicts(report: MatrixReport, i: int = 0) -> dict[str, tuple[bool | None, str]]:
    return {v.check: (v.valid, v.details) for v in report.results[i].verdicts}


def test_the_next_build_finishes_what_the_current_one_left_and_a_rollback_parks_it() -> None:
    ahead = _run(pair("reference", "reference-next"), "checkout",
                 [f"conv1/{AFTER_CHARGE}/upgrade:reference>reference-next"])
    [case] = ahead.results
    assert case.outcome == "pass", case.failed
    assert [w["role"] for w in case.workers] == ["start", "resume"]
    assert _verdicts(ahead)["upgrade.migrated"] == (
        True, "crashed under reference, finished under reference-next: completed")
    assert case.replay.endswith("--subject reference --resume-with reference-next")
    # the other way round, the current build cannot read the next one's format 2
    back = _run(pair("reference-next", "reference"), "checkout", [f"conv1/{AFTER_CHARGE}/upgrade:reference-next>reference"])
    v = _verdicts(back)
    assert back.results[0].outcome == "fail"
    assert v["upgrade.migrated"][0] is True and "format_version=2 is newer than this build's 1" in v["upgrade.migrated"][1]
    assert v["run.status"] == (False, "status 'cannot_migrate', golden 'completed'")


def test_a_pickled_class_moved_between_two_source_trees_strands_the_run() -> None:
    from crashmatrix.scenarios.defects.upgrade_defects import TREES

    subject = "defect:pickle-moved-class"
    report = _run(pair(f"v1={subject}@{TREES / 'v1'}", f"{subject}@{TREES / 'v2'}"), "checkout",
                  [f"conv1/{AFTER_CHARGE}/upgrade:v1>v2"])
    v = _verdicts(report)
    assert v["upgrade.migrated"][0] is False and "No module named 'cm_pickleshop.messages'" in v["upgrade.migrated"][1], v
    assert v["resume.runs"][0] is False
    # the same tree on both sides is a build that reads what it wrote
    same = _run(pair(f"v1={subject}@{TREES / 'v1'}", f"again={subject}@{TREES / 'v1'}"), "checkout",
                [f"conv1/{AFTER_CHARGE}/upgrade:v1>again"])
    assert same.results[0].outcome == "pass", same.results[0].failed


def test_bad_builds_are_one_line_and_exit_2(cli_env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "run", "checkout", "--resume-with", "reference@/no/such/dir"], env=cli_env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'/no/such/dir' does not exist" in lines[0], proc.stderr
    proc = subprocess.run([*CLI, "replay", "checkout/conv1/kill@x[t]#1/upgrade:a>b"], env=cli_env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "--resume-with" in proc.stderr, proc.stdout + proc.stderr


def _repo(root: Path) -> Path:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)

    root.mkdir()
    git("init", "-q")
    git("config", "user.email", "t@example.test")
    git("config", "user.name", "t")
    (root / "app.py").write_text("VERSION = 1\n")
    git("add", "app.py")
    git("commit", "-qm", "one")
    (root / "app.py").write_text("VERSION = 2\n")
    git("commit", "-qam", "two")
    return root


def test_upgrade_check_builds_the_base_once_and_reuses_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    install = "{python} -c 'import sys; open(sys.argv[1] + \"/installed\", \"a\").write(\"x\")' {dir}"
    lines: list[str] = []
    commit, venv = prepare_base(repo, "HEAD~1", install=install, log=lines.append)
    base = venv.parent
    assert base == repo / ".crashmatrix_cache" / "upgrade" / commit[:12]
    assert (base / "app.py").read_text() == "VERSION = 1\n"  # the base commit's tree, not the working tree's
    assert (venv / "bin" / "python").exists() and (base / "installed").read_text() == "x"
    assert (repo / ".crashmatrix_cache" / ".gitignore").read_text() == "*\n" and (base / MARKER).exists()
    again = prepare_base(repo, "HEAD~1", install=install, log=lines.append)
    assert again == (commit, venv) and (base / "installed").read_text() == "x" and "reusing" in lines[-1]
    with pytest.raises(InvalidArgument, match="is not a commit"):
        prepare_base(repo, "no-such-ref")
    failing = "{python} -c 'raise SystemExit(\"no index\")'"
    from crashmatrix.harness.errors import HarnessError

    with pytest.raises(HarnessError, match="no index"):
        prepare_base(repo, "HEAD", install=failing)
