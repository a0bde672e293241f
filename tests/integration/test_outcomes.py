"""Outcomes classified and counted right, through the command line on real subjects
(tests/subjects/misbehaving): a cancel the runtime's API acknowledged and ignored is a
failure (``cancel.honoured``), never "not run"; a worker silent after its fault is a
failure (``worker.stuck``), never a pass or a harness error at the deadline; a resume
policy that needs what the adapter does not declare makes its cases "not applicable",
never failed, and nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from crashmatrix.harness.plan import Case

pytestmark = pytest.mark.usefixtures("subjects_on_path")

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300, cwd=cwd)


def _plan(tmp_path: Path, case_id: str) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(Case.parse(case_id).plan.to_json())
    return path


def _none_left(tag: str, tmp_path: Path) -> None:
    procs = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("CRASHMATRIX_TEST_TAG") == tag:
                procs.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    assert not procs and not list(tmp_path.glob("crashmatrix-*")), (procs, list(tmp_path.glob("crashmatrix-*")))


def _replay(case: str, subject: str, exit_code: int, env: dict[str, str], tmp_path: Path) -> tuple[str, dict]:
    """``crashmatrix replay CASE --subject SUBJECT`` with no replays of a failure: its
    output and the case's JSON record, once it exited ``exit_code``."""
    proc = _cli(["replay", case, "--subject", subject, "--replay-failures", "0", "--report", str(tmp_path / "r.json")],
                env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == exit_code, out[-3000:]
    [record] = json.loads((tmp_path / "r.json").read_text())["cases"]
    return out, record


def test_a_cancel_acknowledged_and_ignored_is_a_failure_not_a_non_event(cli_env, test_tag, tmp_path) -> None:
    case = "checkout/conv1/cancel-api@log.append.after[turn-2]#1"
    out, record = _replay(case, "misbehaving.adapter:IgnoresCancel", 1, cli_env, tmp_path)
    assert f"FAIL {case}" in out and "NOT-RUN" not in out
    assert record["outcome"] == "fail" and record["failed_check"] == "cancel.honoured", record
    honoured = next(v for v in record["verdicts"] if v["check"] == "cancel.honoured")
    assert "acknowledged and ignored" in honoured["details"] and "'completed'" in honoured["details"]
    assert honoured["property"] == "cancellation"
    _none_left(test_tag, tmp_path)


def test_a_run_ended_after_its_cancel_is_judged_not_resumed(cli_env, test_tag, tmp_path) -> None:
    """A runtime whose woken worker finished the run its own cancel API had accepted
    (``defect:unfenced-lease``: the worker's status write is not fenced, so
    ``completed`` overwrites ``cancelled``): the controller does not resume an ended run
    through the runtime's resume API (which refuses a run that is not cancelled); the
    case fails on ``cancel.honoured``, never a harness error."""
    _, record = _replay("checkout/conv1/cancel-api@run.accepted[run]#1", "defect:unfenced-lease", 1, cli_env, tmp_path)
    assert record["outcome"] == "fail" and record["failed_check"] == "cancel.honoured", record
    assert record["error"] is None, record["error"]
    _none_left(test_tag, tmp_path)


def test_a_pause_whose_run_was_taken_over_and_ended_while_it_slept_took_effect(cli_env, test_tag, tmp_path) -> None:
    """A pause at the run's last step: the successor took the run over and completed it
    while the zombie slept; the zombie (``defect:unfenced-lease``: its writes are not
    fenced) then finished too, writing what was already there. The fault took effect (a
    takeover happened), so the case is judged, not "not run" with a guess that no worker
    took the run over; and the zombie check says what it saw: nothing it did changed the
    durable state, not that its writes were refused."""
    _, record = _replay("checkout/conv1/pause@step.after[turn-6]#1", "defect:unfenced-lease", 0, cli_env, tmp_path)
    assert record["outcome"] == "pass" and record["workers"][0]["took_effect"] is True, record["workers"]
    assert [w["role"] for w in record["workers"]] == ["zombie", "resume"], record["workers"]
    fenced = next(v for v in record["verdicts"] if v["check"] == "pause.zombie_fenced")
    assert fenced["details"] == "nothing the zombie did changed the durable state (it ended 'completed' by itself)"
    _none_left(test_tag, tmp_path)


@pytest.mark.parametrize("subject,case,option", [
    ("misbehaving.adapter:HangsOnTerm", "checkout/conv1/term@log.append.after[turn-2]#1", ["--term-grace", "2"]),
    ("misbehaving.adapter:HangsOnCancel", "checkout/conv1/cancel@log.append.before[turn-2]#1", ["--stuck-after", "1.5"]),
], ids=["after-sigterm", "after-cancel-in-a-long-lived-worker"])
def test_a_worker_silent_after_its_fault_is_stuck_a_failure_of_the_subject(cli_env, test_tag, tmp_path, subject, case,
                                                                           option) -> None:
    report = tmp_path / "r.json"
    proc = _cli(["run", "checkout", "--conversation", "conv1", "--plan", str(_plan(tmp_path, case)), "--subject", subject,
                 *option, "--replay-failures", "0", "--report", str(report)], cli_env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]  # the subject's failure, not a harness error (3), not a pass (0)
    data = json.loads(report.read_text())
    assert data["summary"]["fail"] == 1 and data["summary"]["harness-error"] == 0
    [record] = data["cases"]
    stuck = next(v for v in record["verdicts"] if v["check"] == "worker.stuck")
    assert stuck["verdict"] == "invalid" and "last point it passed: " + case.split("@")[1].split("#")[0] in stuck["details"]
    first = record["workers"][0]
    seconds = float(option[1])
    assert first["signal"] == 9 and not first["timed_out"] and seconds <= first["stuck_s"] < seconds + 2, first
    assert "worker.stuck" in proc.stdout
    _none_left(test_tag, tmp_path)


def test_a_policy_the_adapter_cannot_serve_is_not_applicable_never_failed(cli_env, test_tag, tmp_path) -> None:
    report = tmp_path / "r.json"
    proc = _cli(["run", "checkout", "--conversation", "conv1", "--kinds", "kill", "--sources", "step",
                 "--resume", "discovery", "--subject", "misbehaving.adapter:NoRecovery", "--report", str(report)],
                cli_env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    data = json.loads(report.read_text())
    s = data["summary"]
    assert s["cases"] > 0 and s["not-applicable"] == s["cases"] and s["fail"] == 0 and s["pass"] == 0, s
    assert "0 failed" in proc.stdout and f"{s['cases']} not applicable" in proc.stdout
    assert f"NOT APPLICABLE {s['cases']} case(s)" in proc.stdout
    assert "policy discovery:" in proc.stdout and "declares no recover()" in proc.stdout
    assert "FAIL " not in proc.stdout
    [group] = data["non_events"]
    assert (group["outcome"], group["by"], group["name"], group["count"]) == ("not-applicable", "policy", "discovery",
                                                                              s["cases"])
    _none_left(test_tag, tmp_path)
