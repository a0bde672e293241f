"""The public-bug corpus's entry schema, verdict and report logic (harness/bugs.py);
the installs and runs themselves are exercised by ``crashmatrix bugs``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from crashmatrix.harness import bugs
from crashmatrix.harness.errors import InvalidArgument


def test_every_entry_is_well_formed_and_named_once():
    names = [e.name for e in bugs.ENTRIES]
    assert len(names) == len(set(names))
    for e in bugs.ENTRIES:
        assert e.validate() == [], e.name
        assert e.url.startswith(f"https://github.com/{e.repo}/")


def test_a_runnable_entry_without_symptom_or_releases_is_refused():
    e = next(e for e in bugs.ENTRIES if e.needs is None)
    assert dataclasses.replace(e, symptom=()).validate()
    assert dataclasses.replace(e, fixed="").validate()
    assert dataclasses.replace(e, expect="maybe").validate()
    blocked = next(e for e in bugs.ENTRIES if e.needs is not None)
    assert dataclasses.replace(blocked, expect="found").validate()


def test_unknown_entry_names_the_known_ones():
    with pytest.raises(InvalidArgument, match="dbos-742"):
        bugs.entries(["no-such-bug"])
    assert [e.name for e in bugs.entries(["dbos-742"])] == ["dbos-742"]


def test_command_runs_the_release_from_its_venv_on_both_sides():
    e = bugs.entries(["dbos-742"])[0]
    cmd = e.command("/v", "/r.json")
    assert cmd[:2] == ["run", e.workload]
    assert cmd[cmd.index("--subject") + 1] == f"{e.subject}@/v" == cmd[cmd.index("--resume-with") + 1]
    assert cmd[cmd.index("--resume") + 1] == "concurrent"
    assert cmd[cmd.index("--report") + 1] == "/r.json"


ENTRY = bugs.Entry("x-1", "t", "o/r", "issue 1", "https://github.com/o/r/issues/1", "https://github.com/o/r/pull/2",
                   "x", "1.0", "1.1", "m:A", "m:W", symptom=("effects.",))


def side(status, checks=None, cases=10, release="1.0"):
    checks = checks or {}
    return bugs.Side(release=release, status=status, checks=checks, cases=cases, failed=max(checks.values(), default=0))


@pytest.mark.parametrize("buggy, fixed, outcome, why", [
    (side("failed", {"effects.applied_once": 3}), side("passed", release="1.1"), "found", "effects.applied_once"),
    (side("passed"), side("passed", release="1.1"), "not found", "passed all 10 cases"),
    (side("failed", {"model.calls_billed": 2}), side("passed", release="1.1"), "not found", "none naming the symptom"),
    (side("failed", {"effects.applied_once": 3}), side("failed", {"effects.applied_once": 1}, release="1.1"),
     "not found", "fails too"),
    (side("install-conflict"), side("passed", release="1.1"), "not found", "own environment"),
    (side("error"), side("passed", release="1.1"), "not found", "did not run"),
    (bugs.Side(release="1.0", status="error", cases=4, harness_errors=4), side("passed", release="1.1"), "not found",
     "every case of the buggy release 1.0 was a harness error"),
])
def test_judge(buggy, fixed, outcome, why):
    got, text = bugs.judge(ENTRY, buggy, fixed)
    assert got == outcome and why in text


def test_an_entry_that_needs_a_capability_is_not_found_with_it():
    e = dataclasses.replace(ENTRY, needs="a db-outage fault kind")
    assert bugs.judge(e, None, None) == ("not found", "needs a db-outage fault kind")


def test_read_report_counts_failing_checks(tmp_path):
    report = {"cases": [
        {"id": "a", "outcome": "fail", "replay": "crashmatrix replay a", "verdicts": [
            {"check": "effects.applied_once", "verdict": "invalid"}, {"check": "run.status", "verdict": "valid"}]},
        {"id": "b", "outcome": "pass", "verdicts": []},
        {"id": "c", "outcome": "harness-error", "verdicts": [], "error": "resume_cancelled failed: final\nmore"},
    ], "golden": {}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    got = bugs.read_report(path)
    assert got["cases"] == 3 and got["failed"] == 1 and got["harness_errors"] == 1
    assert got["checks"] == {"effects.applied_once": 1}
    assert got["first"] == "crashmatrix replay a"
    assert got["first_error"] == "resume_cancelled failed: final (case c)"
    # a golden run that fails (the release breaks with no fault) is a failing case
    report["golden_results"] = [{"id": "w/conv1/golden", "outcome": "fail", "replay": "crashmatrix replay g",
                                 "verdicts": [{"check": "run.ends", "verdict": "invalid"}]}]
    path.write_text(json.dumps(report))
    got = bugs.read_report(path)
    assert got["cases"] == 4 and got["failed"] == 2 and got["checks"] == {"effects.applied_once": 1, "run.ends": 1}


def test_report_marks_a_regression_and_tabulates_every_entry(tmp_path):
    found = bugs.Result(dataclasses.replace(ENTRY, expect="found"), "not found", "the buggy release passed",
                        side("passed"), side("passed", release="1.1"))
    blocked = bugs.Result(dataclasses.replace(ENTRY, name="x-2", needs="an adapter"), "not found", "needs an adapter")
    js, md = bugs.write([found, blocked], tmp_path / "bugs.json")
    data = json.loads(js.read_text())
    assert data["found"] == 0 and data["entries"] == 2
    assert data["results"][0]["regressed"] is True and data["results"][1]["regressed"] is False
    table = md.read_text()
    assert "| x-1 |" in table and "| x-2 |" in table and "needs an adapter" in table


def test_a_written_report_loads_back(tmp_path):
    e = bugs.entries(["dbos-742"])[0]
    r = bugs.Result(e, "found", "why", side("failed", {"concurrent.loser_fenced": 5}), side("passed", release="2.26.0"))
    js, _ = bugs.write([r], tmp_path / "b.json")
    (back,) = bugs.load(js)
    assert back.entry is e and back.outcome == "found" and back.buggy.checks == {"concurrent.loser_fenced": 5}
    assert back.fixed.release == "2.26.0"


def test_the_nightly_job_runs_the_corpus_with_options_the_command_has():
    """ci/bugs-nightly.yml and its GitLab twin run .ci/bugs-nightly on a schedule with the
    release venvs cached, and the script passes only options ``crashmatrix bugs`` takes."""
    import re
    from pathlib import Path

    import yaml
    from typer.testing import CliRunner

    from crashmatrix.harness import cli

    root = Path(__file__).resolve().parents[2]
    gh = yaml.safe_load((root / "ci" / "bugs-nightly.yml").read_text())
    triggers = gh.get("on", gh.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert set(triggers) == {"schedule", "workflow_dispatch"}
    job = gh["jobs"]["bug-corpus"]
    assert job["env"][bugs.CACHE_ENV] and any(s.get("run") == ".ci/bugs-nightly" for s in job["steps"])
    assert any(str(s.get("uses", "")).startswith("actions/cache") for s in job["steps"])
    gl = yaml.safe_load((root / "ci" / "bugs-nightly.gitlab-ci.yml").read_text())["bug-corpus"]
    assert gl["script"] == [".ci/bugs-nightly"] and gl["variables"][bugs.CACHE_ENV]
    script = (root / ".ci" / "bugs-nightly").read_text()
    runs = [line for line in script.splitlines() if "crashmatrix bugs" in line and not line.startswith("#")]
    assert len(runs) == 1 and "install -q -e ." in script
    help_text = CliRunner().invoke(cli.app, ["bugs", "--help"], env={"COLUMNS": "200"}).output
    for option in re.findall(r"(--[a-z-]+)", runs[0]):
        assert option in help_text, option


def test_an_entry_with_a_plan_replays_that_one_case_and_a_bad_plan_is_refused():
    from crashmatrix.harness.plan import Case

    entry = next(e for e in bugs.ENTRIES if e.plan)
    cmd = entry.command("/c/dbos-2.23.0", "/r/x.json")
    assert cmd[0] == "replay" and "--kinds" not in cmd and cmd[cmd.index("--report") + 1] == "/r/x.json"
    case = Case.parse(cmd[1])
    assert case.upgrade == "dbos-2.23.0-a>dbos-2.23.0-b" and case.workload == entry.workload
    assert [f.kind for f in case.plan.faults] == ["kill", "db-outage"]
    assert case.plan.faults[1].point.name == "recovery.listed" and case.plan.faults[1].window_ms == 2000
    bad = dataclasses.replace(entry, plan="kill@nowhere")
    assert any(p.startswith("plan: ") for p in bad.validate())
