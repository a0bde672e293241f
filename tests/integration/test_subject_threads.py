"""A subject whose import starts a thread (CrewAI's event bus, an SDK's telemetry) runs:
the zygote finds the thread, re-executes itself without the subject, and each worker
imports it after its fork; the summary's note names the thread."""

from __future__ import annotations

import asyncio

import pytest

from crashmatrix.harness.explorer import Options
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import SAMPLED_KINDS

SUBJECT = "threaded.adapter:ThreadedAdapter"

pytestmark = pytest.mark.usefixtures("subjects_on_path")


def test_a_subject_that_starts_a_thread_on_import_runs_its_default_matrix() -> None:
    report = asyncio.run(run_matrix("checkout", SUBJECT, conversations=("conv1",)))
    failed = [(r.case.id, r.outcome, r.error) for r in report.results if r.outcome != "pass"]
    assert failed == [] and report.golden_results == [], failed[:4]
    kinds = {r.case.plan.faults[0].kind for r in report.results}
    assert kinds == {"kill", "term", "cancel", *SAMPLED_KINDS} and len(report.results) > 60, kinds
    said = [n for n in report.notes if "after their fork" in n]
    assert len(said) == 1 and "'threaded-event-bus'" in said[0], report.notes
    # forked workers (kill cases) and long-lived ones (cancel cases) both ran the subject
    workers = [w for r in report.results for w in r.workers]
    assert any(w.get("resident") for w in workers) and any(not w.get("resident") for w in workers)


def test_fresh_workers_import_it_too() -> None:
    report = asyncio.run(run_matrix("checkout", SUBJECT, conversations=("conv1",), kinds=("cancel",),
                                    options=Options(long_lived=False)))
    assert report.results and all(r.outcome == "pass" for r in report.results)
    assert not any(w.get("resident") for r in report.results for w in r.workers)
    assert any("'threaded-event-bus'" in n for n in report.notes)


def test_a_thread_free_subject_is_preloaded_and_says_nothing() -> None:
    report = asyncio.run(run_matrix("checkout", "reference", conversations=("conv1",), kinds=("kill",),
                                    sources=("label",)))
    assert report.results and not any("after their fork" in n for n in report.notes)
