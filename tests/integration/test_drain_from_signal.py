"""term.drained judges what was launched after the SIGTERM was delivered to the worker
(its own report), whatever the subject's ``drain.begin`` says: a runtime whose handler
asyncio runs late launches a node after the signal and is caught; one whose handler
records its drain late but launches nothing passes."""

from __future__ import annotations

import asyncio

import pytest

from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case

pytestmark = pytest.mark.usefixtures("subjects_on_path")

CASES = ["checkout/conv1/term@step.after[turn-1]#1", "checkout/conv1/term@step.after[turn-2]#1"]


def run(subject: str) -> list:
    report = asyncio.run(run_matrix("checkout", f"latedrain.adapter:{subject}", cases=[Case.parse(c) for c in CASES],
                                    replay_failures=0))
    return report.results


def test_a_handler_asyncio_runs_late_launches_after_the_signal_and_is_caught() -> None:
    results = run("LoopHandlerAdapter")
    assert [r.outcome for r in results] == ["fail", "fail"], [(r.case.id, r.error) for r in results]
    for r in results:
        assert [v.check for v in r.failed] == ["term.drained"], [v.to_dict() for v in r.failed]
        assert "launched after SIGTERM was delivered" in r.failed[0].details
        assert r.failed[0].details.split("delivered: ")[1].startswith("turn-"), r.failed[0].details


def test_a_drain_recorded_late_that_launches_nothing_passes() -> None:
    results = run("LateLabelAdapter")
    failed = [(r.case.id, [(v.check, v.details) for v in r.failed], r.error) for r in results if r.outcome != "pass"]
    assert failed == [] and len(results) == 2, failed
