"""Flaky verdicts said as such, on a real subject with a race
(tests/subjects/racyretry: a resumed call re-sent under a fresh key when a coin from
``os.urandom`` says so): a failing case is replayed on the same session, and one whose
replay passes is reported ``flaky`` with every run's outcome, in the terminal summary,
the JSON and HTML reports (opened in headless Chromium) and the plugin's JUnit, and
fails the run (exit 1). The deterministic mutant's replays agree
(tests/integration/test_cli.py, ``defect:unkeyed-retry``).

The race is real, so a run may by chance show no flaky case: each racy case's first
run fails with probability 1/2 and, with 6 replays, a failing case is found flaky with
probability 1/2 x (1 - 1/64); with 8 racy cases a run shows none with probability
under 0.5 %. A test runs the matrix again (at most 3 runs) until one is seen; every
run's report is checked in full either way.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from _plugin_support import CHROMIUM_ARGS, SUBJECTS, crashmatrix_cli, run_pytest, user_project

RACY = "racyretry.adapter:CoinRetryAdapter"
ENV = {"PYTHONPATH": str(SUBJECTS)}
REPLAYS = 6
# the cases a resume re-executes an interrupted effect in (those defect:unkeyed-retry
# fails): the only ones where the coin is tossed
RACY_CASES = {f"checkout/conv1/kill@{point}[turn-{turn}.tool-0]#1" for turn in (4, 5)
              for point in ("effect.started.after", "tool.request.before", "tool.request.after", "log.append.before")}
CAUGHT_BY = {"provider.payment.ledger_equal", "provider.mail.ledger_equal", "effects.ledger_equal"}


def _check_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check every case of a racy run's report; return the flaky ones."""
    bad = [c for c in cases if c["outcome"] != "pass"]
    assert {c["id"] for c in bad} <= RACY_CASES, sorted(c["id"] for c in bad)
    for c in cases:
        outcomes = c["outcomes"]
        assert len(c["replays"]) == len(outcomes) - 1 and [r["outcome"] for r in c["replays"]] == outcomes[1:]
        if c["outcome"] == "pass":
            assert outcomes == ["pass"]
        elif c["outcome"] == "fail":  # reproduced on every replay
            assert outcomes == ["fail"] * (REPLAYS + 1) and c["failed_check"] in CAUGHT_BY, (c["id"], outcomes)
        else:  # flaky: failed, then failed again until a replay passed
            assert c["outcome"] == "flaky", c["outcome"]
            assert outcomes[0] == "fail" and outcomes[-1] == "pass" and set(outcomes[1:-1]) <= {"fail"}, outcomes
            assert c["failed_check"] in CAUGHT_BY and len(outcomes) <= REPLAYS + 1
            assert all(r["run_id"] != c["run_id"] for r in c["replays"])
    return [c for c in cases if c["outcome"] == "flaky"]


def test_cli_reports_a_racy_case_flaky_in_summary_json_and_html(tmp_path: Path, chromium: Path) -> None:
    from playwright.sync_api import sync_playwright

    for attempt in range(3):
        work = tmp_path / f"run-{attempt}"
        work.mkdir()
        # --no-prune: every case tosses its own coin (pruning shares one resume among
        # equal crash states, which a racy resume does not deserve; docs/adapters.md)
        run = crashmatrix_cli(work, "run", "checkout", "--subject", RACY, "--conversation", "conv1", "--kinds", "kill",
                              "--sources", "label", "--replay-failures", str(REPLAYS), "--no-prune", "--report", "r.json",
                              "--html", "r.html", env=ENV, timeout=600)
        data = json.loads((work / "r.json").read_text())
        flaky = _check_cases(data["cases"])
        s = data["summary"]
        assert (s["flaky"], s["fail"]) == (len(flaky), sum(c["outcome"] == "fail" for c in data["cases"]))
        assert data["replay_failures"] == REPLAYS and data["complete"] is True
        assert run.returncode == (1 if s["fail"] or s["flaky"] else 0), run.output[-3000:]
        if flaky:
            break
    assert flaky, "no flaky case in 3 runs of a subject whose verdict is a coin toss"
    one = flaky[0]
    runs = ", ".join(["failed on the first run"] + [f"failed on replay {i}" for i in range(1, len(one["outcomes"]) - 1)]
                     + [f"passed on replay {len(one['outcomes']) - 1}"])
    # terminal: the case as FLAKY (not FAIL) with every run's outcome, and the count
    assert f"FLAKY {one['id']}" in run.stdout and f"FAIL {one['id']}" not in run.stdout, run.stdout[-3000:]
    assert f"  flaky: {runs}: the verdict differs between runs of the same case" in run.stdout
    assert f"{s['flaky']} flaky" in run.stdout and "flaky case(s)" in run.stdout

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((work / "r.html").as_uri() + "#" + one["id"])  # the link to one case opens it
            details = page.locator("#details")
            assert details.locator(".case-id").inner_text() == one["id"]
            text = details.inner_text()
            assert f"outcome: flaky ({one['failed_check']})" in text
            assert f"runs: {runs}: the verdict differs between runs of the same case" in text, text
            assert f"replay {len(one['outcomes']) - 1}: pass" in text
            assert page.locator("td.cell.flaky").count() == s["flaky"]
            cell = page.locator(f'td.cell.flaky[id="{one["id"]}"]')
            assert cell.count() == 1 and "selected" in (cell.get_attribute("class") or "")
            assert not errors, errors
        finally:
            browser.close()


def test_plugin_fails_a_racy_item_as_flaky_in_junit_and_json(tmp_path: Path) -> None:
    project = user_project(tmp_path, "user_project")
    (project / "test_racy.py").write_text(
        "import pytest\n\n\n"
        f"@pytest.mark.crashmatrix('checkout', subject={RACY!r}, conversations=['conv1'], kinds=['kill'],\n"
        "                         sources=['label'], shard='1/1')\n"
        "def test_racy(crashmatrix_case):\n"
        "    crashmatrix_case.check()\n")
    for attempt in range(3):
        run = run_pytest(project, "test_racy.py", "-q", "-k", "turn-4.tool-0 or turn-5.tool-0",
                         f"--crashmatrix-replay-failures={REPLAYS}", f"--crashmatrix-report=r{attempt}.json",
                         f"--junitxml=j{attempt}.xml", env=ENV, timeout=600)
        data = json.loads((project / f"r{attempt}.json").read_text())
        assert data["complete"] is True and len(data["matrices"]) == 1
        cases = data["matrices"][0]["cases"]
        assert {c["id"] for c in cases} >= RACY_CASES
        flaky = _check_cases(cases)
        failing = [c for c in cases if c["outcome"] != "pass"]
        assert run.returncode == (1 if failing else 0), run.output[-3000:]
        if flaky:
            break
    assert flaky, "no flaky case in 3 runs of a subject whose verdict is a coin toss"
    s = data["matrices"][0]["summary"]
    assert (f"crashmatrix: {len(cases)} cases: {s['pass']} passed, {s['fail']} failed, {s['flaky']} flaky, "
            "0 harness errors") in run.stdout, run.stdout[-2000:]
    # JUnit: the flaky item failed; its message says flaky and gives every run's outcome
    suite = ET.parse(project / f"j{attempt}.xml").getroot()
    by_name = {tc.get("name"): tc for tc in suite.iter("testcase")}
    one = flaky[0]
    tc = by_name[f"test_racy[{one['id'].split('/', 1)[1]}]"]
    failure = tc.find("failure")
    assert failure is not None, ET.tostring(tc)[:2000]
    assert f"{one['id']} FLAKY: failed {one['failed_check']}" in failure.get("message", ""), failure.get("message")
    assert "passed on replay" in failure.get("message", "")
    props = {p.get("name"): p.get("value") for p in tc.iter("property")}
    assert props["crashmatrix_outcome"] == "flaky" and props["crashmatrix_outcomes"] == ",".join(one["outcomes"])
    for c in cases:  # a deterministic failure stays a failure, a pass passes
        node = by_name[f"test_racy[{c['id'].split('/', 1)[1]}]"]
        assert (node.find("failure") is not None) == (c["outcome"] != "pass"), c["id"]
