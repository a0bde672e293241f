"""How outcomes are classified, pure parts: which policies are not applicable to what an
adapter declares, ``cancel.honoured``, a faulted worker's silence (``worker.stuck``).
The same run for real through the command line: tests/integration/test_outcomes.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crashmatrix.harness.adapter import Adapter
from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.case import stuck_verdict
from crashmatrix.harness.explorer import Options
from crashmatrix.harness.faults.cancel_api import check_cancel_honoured, check_clean_stop, check_final
from crashmatrix.harness.history import Fired, Passed, Silence, TraceEntry, encode
from crashmatrix.harness.plan import Case, Resume
from crashmatrix.harness.policies import policy_of
from crashmatrix.harness.pool import WorkerExit
from crashmatrix.harness.checks import anomaly_of, property_of


class _Declares(Adapter):
    name = "team"

    async def prepare(self, env): ...  # type: ignore[no-untyped-def]
    async def start(self, ctx): ...  # type: ignore[no-untyped-def]
    async def resume(self, ctx): ...  # type: ignore[no-untyped-def]
    async def observe(self, env, run_id): ...  # type: ignore[no-untyped-def]


class _Recovers(_Declares):
    async def recover(self, ctx): ...  # type: ignore[no-untyped-def]


def _why(policy: str, adapter: Adapter, bound: int = 12) -> str | None:
    return policy_of(Resume(policy)).not_applicable(adapter, Options(recurring_bound=bound))


def test_discovery_needs_the_runtime_s_own_recovery() -> None:
    why = _why("discovery", _Declares())
    assert why is not None and "team declares no recover()" in why
    assert _why("discovery", _Recovers()) is None


def test_recurring_reads_the_declared_crash_loop_and_its_limit() -> None:
    adapter = _Declares()
    why = _why("recurring", adapter)
    assert why is not None and "declares no crash_loop_status" in why
    adapter.recovery_attempts_limit = 100
    assert "gives up after 100 recovery attempt(s)" in (_why("recurring", adapter) or "")
    adapter.crash_loop_status = "failed"
    why = _why("recurring", adapter)  # a limit the harness's bound cannot see the runtime reach
    assert why is not None and "100 recovery attempt(s)" in why and "bound of 12" in why
    assert _why("recurring", adapter, bound=101) is None
    adapter.recovery_attempts_limit = 5
    assert _why("recurring", adapter) is None
    adapter.recovery_attempts_limit = None  # a status and no limit: the harness's bound judges it
    assert _why("recurring", adapter) is None
    adapter.recovery_attempts_limit = 0
    with pytest.raises(InvalidArgument, match="team.recovery_attempts_limit must be a positive int"):
        _why("recurring", adapter)


def test_input_once_needs_a_runtime_that_keeps_the_input() -> None:
    adapter = _Declares()
    assert "declares expects_redelivery" in (_why("input-once", adapter) or "")
    adapter.expects_redelivery = False
    assert _why("input-once", adapter) is None
    for policy in ("default", "concurrent", "redelivery"):
        assert _why(policy, _Declares()) is None, policy


def test_a_resume_in_a_process_that_ran_other_jobs_needs_long_lived_workers() -> None:
    adapter = _Declares()
    for policy in ("warm-worker", "same-worker"):
        assert "team does not declare long_lived_workers" in (_why(policy, adapter) or "")
    adapter.long_lived_workers = True
    for policy in ("warm-worker", "same-worker"):
        assert _why(policy, adapter) is None
        why = policy_of(Resume(policy)).not_applicable(adapter, Options(long_lived=False))
        assert why is not None and "--fresh-workers forks every job" in why


def test_the_reference_and_dbos_adapters_declare_their_runtimes_own_limits() -> None:
    from crashmatrix.harness.adapters.reference import ReferenceAdapter
    from crashmatrix.reference_runtime.attempts import MAX_ATTEMPTS_WITHOUT_PROGRESS

    ref = ReferenceAdapter()
    assert ref.recovery_attempts_limit == MAX_ATTEMPTS_WITHOUT_PROGRESS
    assert all(_why(p, ref) is None for p in ("recurring", "discovery", "input-once"))
    dbos = pytest.importorskip("dbos")
    from crashmatrix.harness.adapters.dbos import DBOSAdapter

    import inspect

    adapter = DBOSAdapter()
    default = inspect.signature(dbos.DBOS.workflow).parameters["max_recovery_attempts"].default
    assert adapter.recovery_attempts_limit == default and adapter.crash_loop_status == "needs_human"
    why = _why("recurring", adapter)
    assert why is not None and f"after {default} recovery attempt(s)" in why


def test_cancel_honoured_fails_a_cancel_acknowledged_then_ignored() -> None:
    terminal = ("completed", "failed", "needs_human", "limit_exceeded")
    at = "log.append.after[turn-2]#1"
    ignored = check_cancel_honoured("running", terminal, "completed", 0, "completed", at)
    assert ignored.valid is False and "acknowledged and ignored" in ignored.details
    assert property_of(ignored.check) == "cancellation" and anomaly_of(ignored.check) == "cancel acknowledged and ignored"
    assert check_cancel_honoured("running", terminal, "completed", 0, "cancelled", at).valid is True
    assert check_cancel_honoured("running", terminal, "completed", None, None, at).valid is True  # it died: stopped
    late = check_cancel_honoured("completed", terminal, "completed", 0, "completed", at)
    assert late.valid is True and late.details.startswith("not applicable: the run was already 'completed'")


def test_clean_stop_fails_a_cancel_raised_out_of_the_worker() -> None:
    terminal = ("completed", "failed")
    at = "log.append.after[model-6]#1"
    raised = check_clean_stop("pending", terminal, "error", "DatabaseError: Task has been cancelled\n  more", at)
    assert raised.valid is False and raised.details.endswith("raised out of the runtime: DatabaseError: Task has been "
                                                             "cancelled")
    assert anomaly_of(raised.check) == "cancel raised out of the worker"
    assert check_clean_stop("pending", terminal, "failed", "", at).valid is True
    assert check_clean_stop("pending", terminal, None, "", at).valid is True  # killed: no report to judge
    assert check_clean_stop("completed", terminal, "error", "x", at).details.startswith("not applicable")


def test_a_final_cancel_wants_the_run_terminal() -> None:
    terminal = ("completed", "failed")
    assert check_final("failed", terminal, "step.after[tool-4.0]#1").valid is True
    stuck = check_final("pending", terminal, "step.after[tool-4.0]#1")
    assert stuck.valid is False and "nothing will end it" in stuck.details
    assert anomaly_of(stuck.check) == "final cancel left the run open"


def _write(path: Path, *events: object) -> None:
    with open(path, "ab") as f:
        for e in events:
            f.write(encode(e))  # type: ignore[arg-type]


def test_silence_counts_from_the_last_line_and_names_the_last_point(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    fault_at = TraceEntry("label", "log.append.after", "turn-2", 1)
    _write(path, Fired({"kind": "term"}, [fault_at], 0.0))
    watch = Silence(str(path), after=5.0)
    watch.start(100.0)
    assert not watch.check(104.9) and watch.check(105.0) and not watch.progressed
    assert watch.last_point() == "log.append.after[turn-2]#1"
    _write(path, Passed(TraceEntry("label", "drain.begin", "run", 1)))
    assert not watch.check(106.0) and watch.progressed  # a new point: silence counts again from here
    assert not watch.check(110.9) and watch.check(111.0) and watch.silent_s(111.5) == 5.5
    assert watch.last_point() == "drain.begin[run]#1"
    assert Silence(str(tmp_path / "none.jsonl"), 1.0).last_point() is None
    assert os.path.getsize(path) == watch.size


def test_stuck_verdict_names_the_bound_the_last_point_and_the_silence() -> None:
    exit_ = WorkerExit(1, None, 9, 41.0, stuck_s=40.04, last_point="tool.request.before[turn-4.tool-0]#1")
    fault = Case.parse("checkout/conv1/cancel@tool.request.before[turn-4.tool-0]#1").plan.faults[0]
    v = stuck_verdict(fault, exit_, Options())
    assert v.check == "worker.stuck" and v.valid is False and v.phase == "crash"
    assert "for 40.0 s (Options.stuck_after=40 s)" in v.details and "tool.request.before[turn-4.tool-0]#1" in v.details
    term = Case.parse("checkout/conv1/term@log.append.after[turn-2]#1").plan.faults[0]
    assert "its whole grace (Options.term_grace=10 s)" in stuck_verdict(term, exit_, Options()).details
    assert exit_.to_dict()["stuck_s"] == 40.04 and "stuck, silent 40.0 s after tool.request" in exit_.describe()
    assert property_of("worker.stuck") == "resumability"


def test_a_case_run_one_by_one_whose_fault_changed_nothing_is_not_run() -> None:
    """The pytest plugin runs each case through ``run_case_replayed`` (no pruning): a
    passing case whose first worker's fault took no effect is ``not-run`` there too, and
    a plugin item of it a skip, never a pass."""
    import asyncio

    from crashmatrix.harness.case import CaseResult
    from crashmatrix.harness.matrix import run_case_replayed
    from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan

    case = Case("checkout", "conv1", FaultPlan((Fault("db-restart", CrashPoint("step", "step.after", "turn-1", 1)),)))

    class Ran:  # the explorer's one method the function calls, as a case that passed
        def __init__(self, took_effect: bool) -> None:
            self.took_effect = took_effect

        async def run_case(self, case: Case, golden: object, hook: object = None) -> CaseResult:
            return CaseResult(case, "run-1", "pass", workers=[{"took_effect": self.took_effect}])

    nothing = asyncio.run(run_case_replayed(Ran(False), case, None))  # type: ignore[arg-type]
    assert nothing.outcome == "not-run" and "could not take effect" in (nothing.error or "")
    assert asyncio.run(run_case_replayed(Ran(True), case, None)).outcome == "pass"  # type: ignore[arg-type]


def test_a_fault_kind_the_adapter_cannot_serve_is_not_applicable() -> None:
    """``cancel-api`` needs the runtime's own cancel: an adapter without one makes the
    case not applicable, with the reason (it was a harness error at the stop)."""
    from crashmatrix.harness import faults
    from crashmatrix.harness.adapters.reference import ReferenceAdapter

    kind = faults.kind("cancel-api")
    why = kind.not_applicable(_Declares())
    assert why is not None and "declares no cancel API" in why and "cancel_run" in why
    assert kind.not_applicable(ReferenceAdapter()) is None
    assert all(faults.kind(k).not_applicable(_Declares()) is None for k in ("kill", "term", "cancel", "pause"))
