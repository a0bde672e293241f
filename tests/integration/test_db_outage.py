"""``db-outage``: PostgreSQL unreachable for a window while the worker runs (real
PostgreSQL, the embedded fault proxy, real worker processes): the reference runtime rides
it out, also inside a recovery; a runtime that gives a run up for it is caught; a window
the case deadline cannot hold is refused in one line before anything starts."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.explorer import Options
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def test_reference_rides_out_outages_also_during_recovery() -> None:
    cases = [Case.parse(c) for c in (
        "checkout/conv1/db-outage@log.append.before[turn-4]#1",
        "checkout/conv1/db-outage(2500ms)@effect.started.before[turn-4.tool-0]#1",
        # the outage lands in the resume of a kill: the plan's later faults go to later workers
        "checkout/conv1/kill@log.append.after[turn-3]#1+db-outage(1500ms)@log.append.before[turn-5]#1",
    )]
    report = asyncio.run(run_matrix("checkout", "reference", cases=cases))
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad
    for r in report.results:
        fault = r.case.plan.faults[-1]
        outaged = [w for w in r.workers if "outage" in w]
        assert len(outaged) == 1 and "healed after" in outaged[0]["outage"], r.workers
        # the worker lived through the window (it did not give up or die): it rode it out
        assert outaged[0]["returncode"] == 0 and outaged[0]["seconds"] >= fault.window_ms / 1000, outaged[0]
        assert any(v.check == "db-outage.resumable" and v.valid for v in r.verdicts)


def test_a_runtime_that_gives_a_run_up_for_a_brief_outage_is_caught() -> None:
    case = Case.parse("checkout/conv1/db-outage@log.append.before[turn-4]#1")
    report = asyncio.run(run_matrix("checkout", "defect:gives-up-on-outage", cases=[case], replay_failures=0))
    (r,) = report.results
    failed = {v.check for v in r.failed}
    assert r.outcome == "fail" and {"db-outage.resumable", "run.status"} <= failed, (r.error, failed)
    # the same case on the clean runtime passes: the check is the defect's, not the fault's
    clean = asyncio.run(run_matrix("checkout", "reference", cases=[case]))
    assert clean.results[0].outcome == "pass"


def test_window_longer_than_the_case_deadline_is_refused_before_anything_starts() -> None:
    case = Case.parse("checkout/conv1/db-outage(5000ms)@log.append.before[turn-4]#1")
    with pytest.raises(InvalidArgument, match="db-outage window 5000 ms .* case deadline"):
        asyncio.run(run_matrix("checkout", "reference", cases=[case], options=Options(worker_timeout=3.0)))
    proc = subprocess.run([*CLI, "replay", "checkout/conv1/db-outage(90000ms)@log.append.before[turn-4]#1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout[-800:] + proc.stderr[-800:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "90000 ms" in lines[0] and "--worker-timeout 60 s" in lines[0], proc.stderr
    for extra, says in ((["--worker-timeout", "0.5"], "not shorter than the case deadline"),
                        (["--outage-window", "70000"], "70000 ms of the matrix's db-outage cases"),
                        (["--outage-window", "0"], "--outage-window: fault.window_ms=0")):
        proc = subprocess.run([*CLI, "run", "checkout", "--conversation", "conv1", "--kinds", "db-outage", *extra],
                              capture_output=True, text=True, timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (extra, proc.stderr[-800:])


def test_the_matrix_enumerates_db_outage_at_every_step_with_the_window_asked() -> None:
    report = asyncio.run(run_matrix("checkout", "reference", kinds=("db-outage",), sources=("step",),
                                    conversations=("conv1",), options=Options(outage_window_ms=1200)))
    assert len(report.results) == 22
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]
    assert not bad, bad
    assert all(r.case.id.split("/")[2].startswith("db-outage(1200ms)@step.") for r in report.results)
