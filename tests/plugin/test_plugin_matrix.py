"""A user's matrix test file (tests/plugin/user_project: a few lines and a pytest.ini
slice) expands into the checkout matrix and passes under ``-n 2`` and serially, with
identical ids and verdicts, each run running its cases ahead of their items in the
CLI's case loop (under xdist, one share of the matrix a harness session, the run's jobs
divided among the share workers, results exchanged). The
xdist run starts cold: its two workers collect at once, one computes the golden trace
under the cache's lock while the other waits and reads it; the serial run collects
from the warm cache."""

from __future__ import annotations

import importlib.metadata
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from _plugin_support import run_pytest


def _verdicts(path: Path) -> dict[str, str]:
    data = json.loads(path.read_text())
    return {c["id"]: c["outcome"] for m in data["matrices"] for c in m["cases"]}


def _ran_ahead(path: Path) -> int:
    data = json.loads(path.read_text())
    return sum(c["ran_ahead"] for m in data["matrices"] for c in m["cases"])


def test_user_matrix_file_xdist_and_serial_agree(matrix_project: Path) -> None:
    xdist = run_pytest(matrix_project, "-n", "2", "--crashmatrix-jobs=4", "--crashmatrix-report=xdist.json")
    # xdist fails the run when its workers collect different ids
    assert xdist.returncode == 0, xdist.output[-3000:]
    cache_files = list((matrix_project / ".crashmatrix_cache" / "goldens").glob("checkout--reference--*.json"))
    assert len(cache_files) == 1, cache_files
    cached = json.loads(cache_files[0].read_text())
    assert list(cached["conversations"]) == ["conv1"]
    computed_at = cached["conversations"]["conv1"]["computed_at"]
    verdicts = _verdicts(matrix_project / "xdist.json")
    # kill,term x every step and label point of conv1 (82 today: 164 cases); shard 1/15
    # keeps every 15th case from the first (11 today)
    points = [e for e in cached["conversations"]["conv1"]["trace"] if e[0] in ("step", "label")]
    expected = len(range(0, 2 * len(points), 15))
    assert len(verdicts) == expected >= 5, sorted(verdicts)
    assert set(verdicts.values()) == {"pass"}
    assert {cid.split("/")[2].split("@")[0] for cid in verdicts} == {"kill", "term"}
    assert f"{expected} passed" in xdist.stdout
    # 4 jobs are one share's (one harness session keeps two cores busy): gw0 ran the
    # matrix with all 4, gw1 no share, its items took gw0's results; every case ran
    # ahead of its item
    assert "crashmatrix: jobs=4 cases in flight, run by 1 of 2 xdist workers (4 each, a share of each matrix by " \
        "crash state, the other workers' items take their results)" in xdist.stdout, xdist.stdout[:3000]
    # (gw1 opens a session only when it computed the golden trace at collection: the
    # cache is cold and either worker may take its lock)
    assert re.search(r"crashmatrix: xdist workers ran gw0: share 1/1 of each matrix by crash state in one case loop, "
                     r"4 cases in flight, gw1: no share, its items took the results of the 1 share\(s\), "
                     r"(no harness session of its own|harness sessions of its own: 1 to compute golden traces at "
                     r"collection);", xdist.stdout), xdist.stdout[-2000:]
    assert _ran_ahead(matrix_project / "xdist.json") == expected
    # the runtime under test, as the workers' environment has it installed (the
    # reference runtime ships in crashmatrix's own distribution)
    version = importlib.metadata.version("crashmatrix")
    assert f"crashmatrix: runtime under test: crashmatrix {version}" in xdist.stdout, xdist.stdout[-2000:]
    assert [m["releases"] for m in json.loads((matrix_project / "xdist.json").read_text())["matrices"]] == \
        [{"reference": {"crashmatrix": version}}]

    serial = run_pytest(matrix_project, "-rA", "--crashmatrix-report=serial.json", "--junitxml=serial.xml")
    assert serial.returncode == 0, serial.output[-3000:]
    assert _verdicts(matrix_project / "serial.json") == verdicts
    assert "crashmatrix: seed=" in serial.stdout and f"{expected} passed" in serial.stdout
    # serially, the matrix's cases all run in one case loop, ahead of their items
    assert "crashmatrix: jobs=" in serial.stdout and _ran_ahead(matrix_project / "serial.json") == expected
    # warm cache: the serial run did not recompute the golden trace
    again = json.loads(cache_files[0].read_text())
    assert again["conversations"]["conv1"]["computed_at"] == computed_at

    # JUnit: the case id is the test id; properties carry the replay command
    suite = ET.parse(matrix_project / "serial.xml").getroot()
    cases = suite.findall(".//testcase")
    assert sorted(c.get("name") for c in cases) == sorted(f"test_checkout[{cid.split('/', 1)[1]}]" for cid in verdicts)
    props = {p.get("name"): p.get("value") for p in cases[0].findall("./properties/property")}
    assert props["crashmatrix_outcome"] == "pass"
    assert props["crashmatrix_replay"].startswith("crashmatrix replay 'checkout/conv1/")
    # nothing left behind: no shared-PostgreSQL directory, no data directory, no session
    # directory in the runs' temporary directory
    assert sorted(p.name for p in (matrix_project.parent / "tmp").iterdir() if p.name.startswith("crashmatrix")) == []


def _marked_project(tmp_path: Path, name: str, marker: str) -> Path:
    """A user's project ``tmp_path/name`` with one test, ``test_NAME``, marked
    ``crashmatrix('checkout', MARKER, conversations=['conv1'], kinds=['kill'],
    sources=['label'])``, that checks its case."""
    project = tmp_path / name
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / f"test_{name}.py").write_text(
        "import pytest\n\n\n"
        f"@pytest.mark.crashmatrix('checkout', {marker},\n"
        "                         conversations=['conv1'], kinds=['kill'], sources=['label'])\n"
        f"def test_{name}(crashmatrix_case):\n"
        "    crashmatrix_case.check()\n")
    return project


def test_a_serial_run_prunes_kill_cases_by_crash_state_as_the_cli_does(tmp_path: Path) -> None:
    """Serially, a matrix's cases run in ``crashmatrix run``'s case loop: kill cases whose
    crash state equals an earlier one's are judged on it (their items pass with the
    representative named in the JSON report and JUnit), the summary says how many, and
    a defective subject's verdicts are the CLI's case for case (a derived failure runs
    whole: it is shown by a run of its own)."""
    from _plugin_support import crashmatrix_cli

    project = _marked_project(tmp_path, "pruned", "subject='reference'")
    run = run_pytest(project, "-q", "--crashmatrix-report=p.json", "--junitxml=p.xml")
    assert run.returncode == 0, run.output[-3000:]
    assert re.search(r"crashmatrix: kill: (\d+) points -> (\d+) crash states, all pass; sample \d+/\d+ agree",
                     run.stdout), run.stdout[-2000:]
    [matrix] = json.loads((project / "p.json").read_text())["matrices"]
    derived = {c["id"]: c["representative"] for c in matrix["cases"] if c.get("representative")}
    assert derived and all(not c["workers"] for c in matrix["cases"] if c["id"] in derived)
    assert {c["outcome"] for c in matrix["cases"]} == {"pass"}
    props = [{p.get("name"): p.get("value") for p in case.findall("./properties/property")}
             for case in ET.parse(project / "p.xml").getroot().iter("testcase")]
    assert sorted(p["crashmatrix_representative"] for p in props if "crashmatrix_representative" in p) == \
        sorted(derived.values())

    defect = _marked_project(tmp_path, "defect", "subject='defect:replays-model-call'")
    run = run_pytest(defect, "-q", "--crashmatrix-report=d.json")
    assert run.returncode == 1, run.output[-3000:]
    cli = crashmatrix_cli(defect, "run", "checkout", "--subject", "defect:replays-model-call", "--conversation",
                          "conv1", "--kinds", "kill", "--sources", "label", "--report", "cli.json")
    assert cli.returncode == 1, cli.output[-3000:]
    mine = _verdicts(defect / "d.json")
    cli_cases = json.loads((defect / "cli.json").read_text())["cases"]
    assert mine == {c["id"]: c["outcome"] for c in cli_cases} and "fail" in mine.values()
    assert "crash states, " in run.stdout and " fail, " in run.stdout


def test_a_marked_matrix_of_a_build_pair_crashes_under_one_and_resumes_under_the_other(tmp_path: Path) -> None:
    """``resume_with=`` (docs/plugin.md, "Upgrade check"): the items' ids name both builds,
    every case passes ``upgrade.migrated``, and the replay line gives both builds."""
    project = _marked_project(tmp_path, "pair", "subject='reference', resume_with='reference-next', shard='1/40'")
    run = run_pytest(project, "-q", "--crashmatrix-report=pair.json")
    assert run.returncode == 0, run.output[-3000:]
    [matrix] = json.loads((project / "pair.json").read_text())["matrices"]
    assert matrix["subject"] == "reference>>reference-next" and len(matrix["cases"]) >= 2
    for case in matrix["cases"]:
        assert case["id"].endswith("/upgrade:reference>reference-next") and case["outcome"] == "pass", case
        assert {v["check"]: v["verdict"] for v in case["verdicts"]}["upgrade.migrated"] == "valid"
        assert case["replay"].endswith("--subject reference --resume-with reference-next")


def test_a_case_that_tested_nothing_is_a_skip_with_its_reason(tmp_path: Path) -> None:
    """A policy the adapter cannot serve (``discovery`` on an adapter with no
    ``recover()``, tests/subjects/misbehaving): every item is skipped with the reason,
    in the terminal, the JUnit file and the JSON report, never failed nor passed; the
    run exits 0."""
    from _plugin_support import SUBJECTS

    project = _marked_project(tmp_path, "na", "subject='misbehaving.adapter:NoRecovery', resume='discovery', shard='1/20'")
    run = run_pytest(project, "-rs", "--crashmatrix-report=na.json", "--junitxml=na.xml",
                     env={"PYTHONPATH": str(SUBJECTS)})
    assert run.returncode == 0, run.output[-3000:]
    [matrix] = json.loads((project / "na.json").read_text())["matrices"]
    n = len(matrix["cases"])
    assert n >= 2 and matrix["summary"]["not-applicable"] == n and matrix["summary"]["fail"] == 0
    assert f"{n} skipped" in run.stdout and "failed" not in run.stdout.splitlines()[-1]
    assert "crashmatrix: not applicable: not applicable: " not in run.stdout  # the reason said once
    assert "crashmatrix: not applicable: discovery needs the runtime's own recovery" in run.stdout
    suite = ET.parse(project / "na.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("skipped") == str(n) and suite.get("failures") == "0"


def test_xdist_workers_run_a_share_each_and_exchange_results(tmp_path: Path) -> None:
    """Under ``-n 2`` with two share workers each runs its share of the matrix by crash state, whatever
    items xdist sends it, kill cases pruned within it, and the items whose case is the
    other worker's take that worker's result: a defective subject's verdicts are the
    serial run's case for case, every case ran ahead of its item, each worker's pruning
    is in the summary, and the run's results directory is gone afterwards."""
    project = _marked_project(tmp_path, "shares", "subject='defect:replays-model-call'")
    xdist = run_pytest(project, "-q", "-n", "2", "--crashmatrix-jobs=4", "--crashmatrix-share-workers=2",
                       "--crashmatrix-report=x.json")
    assert xdist.returncode == 1, xdist.output[-3000:]
    serial = run_pytest(project, "-q", "--crashmatrix-report=s.json")
    assert serial.returncode == 1, serial.output[-3000:]
    verdicts = _verdicts(project / "x.json")
    assert verdicts == _verdicts(project / "s.json") and "fail" in verdicts.values()
    assert _ran_ahead(project / "x.json") == len(verdicts)
    assert "crashmatrix: xdist workers ran gw0: share 1/2 of each matrix by crash state" in xdist.stdout
    for worker in ("gw0", "gw1"):
        assert re.search(rf"crashmatrix: {worker}: kill: \d+ points -> \d+ crash states", xdist.stdout), \
            xdist.stdout[-2000:]
    assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("crashmatrix-xdist-")]