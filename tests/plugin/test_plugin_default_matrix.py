"""The pytest plugin's default matrix is ``crashmatrix run``'s: a marked test with no
kinds set collects exactly the case ids the command line runs for the same workload,
conversation and seed (the sampled kinds and resume policies included), on real
services: the plugin's golden trace, crash states and network section come from its
cache, the command's from its own golden runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from _plugin_support import crashmatrix_cli, run_pytest

from crashmatrix.harness.plan import SAMPLED_KINDS, SAMPLED_POLICIES

TEST_FILE = ("import pytest\n\n\n"
             "@pytest.mark.crashmatrix('checkout', subject='reference', conversations=['conv1'])\n"
             "def test_default(crashmatrix_case):\n"
             "    crashmatrix_case.check()\n")


def _collected(project: Path, *args: str) -> set[str]:
    run = run_pytest(project, "--collect-only", "-q", *args)
    assert run.returncode == 0, run.output[-3000:]
    ids = re.findall(r"^test_default\.py::test_default\[(.+)\]$", run.stdout, re.M)
    assert ids, run.stdout[-2000:]
    return {f"checkout/{i}" for i in ids}


def test_the_plugin_collects_the_cases_crashmatrix_run_runs(tmp_path: Path) -> None:
    project = tmp_path / "default"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_default.py").write_text(TEST_FILE)
    collected = _collected(project)  # the seed drawn: samples drawn with crashmatrix run's seed, 0

    cli = crashmatrix_cli(project, "run", "checkout", "--conversation", "conv1", "--report", "r.json", timeout=900)
    report = json.loads((project / "r.json").read_text())
    # the ids are the point here: harness errors (a case slower than its timeout on a
    # loaded machine) leave them as they are; an oracle failure or bad input does not pass
    assert cli.returncode in (0, 3) and report["complete"], (
        cli.output[-3000:], [(c["id"], c.get("error")) for c in report["cases"] if c["outcome"] != "pass"][:5])
    ran = {c["id"] for c in report["cases"]}
    assert collected == ran, (sorted(collected - ran)[:5], sorted(ran - collected)[:5])

    # every part of the default is there: the sampled kinds and the resume policies
    kinds = {cid.split("/")[2].split("@")[0].split(":")[0] for cid in ran}
    assert kinds == {"kill", "term", "cancel", *SAMPLED_KINDS}
    policies = {cid.split("/")[3] for cid in ran if cid.count("/") == 3}
    assert policies == set(SAMPLED_POLICIES)
    assert sum(1 for cid in ran if cid.endswith("/concurrent")) == 24

    # another seed draws other samples; the kinds at every point stay
    other = _collected(project, "--crashmatrix-seed=7")
    assert other != collected and _every_point(other) == _every_point(collected)

    # the plugin runs what it collects: the first item of each sampled kind and policy passes
    firsts: dict[str, str] = {}
    for cid in sorted(ran - _every_point(ran)):
        firsts.setdefault(cid.split("/")[3] if cid.count("/") == 3 else cid.split("/")[2].split("@")[0].split(":")[0],
                          cid)
    assert len(firsts) == len(SAMPLED_KINDS) + len(SAMPLED_POLICIES), firsts
    nodes = [f"test_default.py::test_default[{cid.split('/', 1)[1]}]" for cid in firsts.values()]
    run = run_pytest(project, "-q", *nodes, "--crashmatrix-report=items.json", timeout=600)
    assert run.returncode == 0, run.output[-3000:]
    outcomes = {c["id"]: c["outcome"] for m in json.loads((project / "items.json").read_text())["matrices"]
                for c in m["cases"]}
    assert outcomes == dict.fromkeys(firsts.values(), "pass"), outcomes


def _every_point(ids: set[str]) -> set[str]:
    """The cases of kill, term and cancel under the default resume policy."""
    return {c for c in ids if c.count("/") == 2 and c.split("/")[2].split("@")[0] in ("kill", "term", "cancel")}
