"""`crashmatrix selftest --fast` as CI runs it: every mutant of the catalogue is caught by
a check its metadata names, the clean runtimes pass the cases that caught them, the
table and the JSON report say so, and nothing is left behind. One run of the whole
catalogue (one session for every subject)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

from crashmatrix.harness.plan import Case
from crashmatrix.harness.selftest import catalogue

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def _tagged(tag: str) -> list[str]:
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("CRASHMATRIX_TEST_TAG") == tag:
                out.append(" ".join(proc.cmdline()[:4]))
        except psutil.Error:
            continue
    return out


def test_selftest_fast_catches_every_mutant_and_the_clean_runtime_passes(cli_env, test_tag, tmp_path: Path) -> None:
    report_path = tmp_path / "selftest.json"
    env = dict(cli_env, COLUMNS="220")
    proc = subprocess.run([*CLI, "selftest", "--fast", "--report", str(report_path)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    report = json.loads(report_path.read_text())
    assert report["mode"] == "fast" and report["exit_code"] == 0

    specs = {s.subject: s for s in catalogue()}
    mutants = {m["subject"]: m for m in report["mutants"]}
    assert set(mutants) == set(specs)  # the whole catalogue, as registered
    for subject, m in mutants.items():
        spec = specs[subject]
        assert m["caught"] and m["ok"] and m["error"] is None, m
        assert m["check"] in spec.caught_by, m  # caught by a check the mutant names
        assert m["failed_checks"][m["check"]] >= 1
        case = Case.parse(m["first_case"])
        assert case.conversation in spec.conversations  # the smallest set, in --fast
        assert case.plan.faults[0].kind in spec.fault_kinds + ("kill", "term", "cancel")
        assert case.resume.policy in spec.resume_policies  # under the policy that reaches it
        assert 0 < m["seconds_to_detection"] <= m["seconds"]
        if spec.crash_with is None:
            assert f"--subject {subject}" in m["replay"]
        else:  # a mutant of a deploy: the runs crash under crash_with and resume under the mutant
            assert case.upgrade is not None and "--resume-with" in m["replay"] and subject in m["replay"], m
        # the table has the mutant's row, caught, with its first case and check
        row = next(line for line in proc.stdout.splitlines() if f" {spec.name} " in line)
        assert "caught" in row and m["first_case"] in row and m["check"] in row, row

    baselines = {b["subject"]: b for b in report["baselines"]}
    assert set(baselines) == {s.baseline for s in specs.values()} == {"reference", "reference-delta", "reference-fork",
                                                                      "reference>>reference-next"}
    for b in baselines.values():
        assert b["ok"] and b["failures"] == [] and b["cases"]["pass"] == b["cases"]["run"] >= 1, b
    # each clean runtime ran the catches of its mutants (those at a point it has)
    for name, b in baselines.items():
        catches = {m["first_case"] for m in mutants.values() if m["baseline"] == name}
        assert b["cases"]["run"] + len(b["skipped"]) == len(catches), (name, b, catches)
    assert "reference (baseline)" in proc.stdout and "clean" in proc.stdout

    deadline = time.monotonic() + 15
    while (_tagged(test_tag) or list(tmp_path.glob("crashmatrix-*"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _tagged(test_tag) == [] and list(tmp_path.glob("crashmatrix-*")) == []


def test_selftest_unknown_mutant_is_one_line_and_exit_2(cli_env, tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "selftest", "--mutant", "nosuch"], env=cli_env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "mutant='nosuch' is not in the catalogue; known:" in lines[0], proc.stderr
    assert "unkeyed-retry" in lines[0] and not list(tmp_path.glob("crashmatrix-*"))
