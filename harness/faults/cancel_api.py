"""``cancel-api``: the runtime's own cancel, through the adapter.

At the point the worker stops itself (SIGSTOP); while it sleeps the controller cancels
the run the way an operator or another service would, through the runtime's API
(:meth:`.adapter.Adapter.cancel_run`: DBOS ``cancel_workflow``, the reference runtime's
operator cancel), then wakes the worker, which must notice and stop as its runtime
promises. Once the crash state was read and checked, the controller undoes the cancel
through the same API (:meth:`.adapter.Adapter.resume_cancelled`: DBOS
``resume_workflow``) and the run is resumed as usual. A subject whose adapter declares
no cancel API cannot run these cases (a harness error saying so). Crash checks:
``cancel.step_recorded`` (what the step in flight left recorded; ``cancel.left_unknown``
does not apply: a runtime's own cancel need not mark the call in flight ``unknown``) and
``cancel.honoured`` (:func:`check_cancel_honoured`: a runtime whose API acknowledged the
cancel of a run that had not ended, and whose worker then finished the run as the golden
run did, ignored it: a failure, never "not run") and ``cancel.clean_stop``
(:func:`check_clean_stop`: the woken worker must not raise out of the runtime; a cancel
is control flow the runtime ends the run with, not a crash of the process that serves
other runs).
A runtime whose cancel is final (:attr:`.adapter.Adapter.cancel_is_final`: no API
resumes a cancelled run) is not resumed: the case ends at its crash state with
``cancel.final`` (the run is in a terminal status), and its end checks are the
invariants that hold of any run (no effect applied twice, a clean log) instead of the
comparison with the golden run, which a cancelled run is not meant to match
(:func:`ended_final`). A run the woken worker ended as the golden run did (the cancel
ignored) is not resumed either: nothing is left to resume, and the case fails on
``cancel.honoured``. (A run the cancel left in a terminal status, DBOS's ``CANCELLED``
reported ``needs_human``, is resumed as usual.)
A cancel that does not return within :data:`CANCEL_WAIT_S` while the worker is stopped
waits for what the stopped worker holds (with SQLite, the one write lock): the case is
``not-applicable`` saying so (:class:`.errors.CaseNotApplicable`), never a hang nor a
harness error.
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING

from ..checks import Check
from ..errors import CaseNotApplicable, HarnessError
from ..oracle import Verdict, run_check
from ._base import FaultKind, Stops, register, signal_self
from ._cancelled import STEP_RECORDED, check_step_recorded

if TYPE_CHECKING:
    from ..adapter import Observation
    from ..case import CaseRun, WorkerRun
    from ..oracle import CrashEvidence
    from ..plan import Fault
    from ..worker import Recorder


CANCEL_WAIT_S = 15.0
"""Seconds the controller waits for the runtime's cancel while the worker is stopped
(bounded by ``Options.worker_timeout`` too). A cancel that takes longer is most likely
blocked on what the stopped worker holds: a harness error, not a hang (seen: the OpenAI
Agents SDK on DBOS with SQLite, stopped at ``step.after[tool-6]``; the cancel had not
returned after minutes)."""


def _supports(adapter: object) -> bool:
    """Whether ``adapter``'s runtime has a cancel API, resumable or final."""
    from ..adapter import capabilities_of

    return bool({"cancel-api", "cancel-final"} & capabilities_of(adapter))


@register
class CancelApi(Stops, FaultKind):
    """Cancel the run through the runtime's own API while its worker is stopped at the
    point; resume it through the same API once the crash state was checked."""

    name = "cancel-api"
    rank = 3
    listing_order = 8
    short = "capi"
    why_not_run = "the run had already ended when the cancel went out"
    reads_ledgers = True  # cancel.step_recorded
    wakes_intact = True

    def not_applicable(self, adapter: object) -> str | None:
        if _supports(adapter):
            return None
        name = getattr(adapter, "name", None) or type(adapter).__name__
        return (f"cancel-api needs the runtime's own cancel: {name} declares no cancel API "
                f"(Adapter.cancel_run and resume_cancelled: docs/adapters.md)")

    def act(self, recorder: Recorder, fault: Fault) -> None:
        signal_self(signal.SIGSTOP)

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:
        ex = cx.explorer
        if not _supports(ex.adapter):  # run_case made such a case not applicable: a guard
            raise HarnessError(f"cancel-api: {ex.subject} declares no cancel API of its runtime "
                               f"(Adapter.cancel_run and resume_cancelled: docs/adapters.md)")
        bound = min(CANCEL_WAIT_S, ex.options.worker_timeout)
        try:  # the run's status read first, then the cancel: either may wait on the stopped worker
            before = (await asyncio.wait_for(cx.observe(), bound)).status
            await asyncio.wait_for(ex.adapter.cancel_run(ex.case_env, cx.run_id), bound)
        except asyncio.TimeoutError:
            raise CaseNotApplicable(
                f"cancel-api: {ex.subject}'s store did not answer the cancel within {bound:g} s while the worker was "
                "stopped at the point: it waits for something the stopped worker holds (with SQLite, the database's "
                "one write lock: no other process reads or commits until that worker goes on), so the fault cannot "
                "take effect here") from None
        # the runtime's API accepted the cancel of a run in this status (cancel.honoured)
        w.entry["cancel_acknowledged"] = before

    async def after_worker(self, cx: CaseRun, w: WorkerRun) -> None:
        """``cancel.honoured``: once the runtime's cancel API returned for a run that had
        not ended, the woken worker must not end the run as the golden run did (exit 0,
        the golden run's terminal status): that is the cancel acknowledged and ignored, a
        failure of the subject, not a fault that could not take effect."""
        before = w.entry.get("cancel_acknowledged")
        if before is None or w.report.fired is None or w.exit is None:
            return  # the cancel never went out (a harness error says why)
        end = w.report.end
        cx.result.verdicts.append(check_cancel_honoured(
            before, cx.explorer.terminal_statuses(), cx.golden.evidence.observation.status,
            w.exit.returncode, end.status if end is not None else None, w.fault.point.label()))
        cx.result.verdicts.append(check_clean_stop(
            before, cx.explorer.terminal_statuses(), end.status if end is not None else None,
            (end.error or "") if end is not None else "", w.fault.point.label()))

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return [STEP_RECORDED.run(lambda: check_step_recorded(ev))]

    def end_checks_only(self, cx: CaseRun) -> tuple[str, ...] | None:
        return ANY_RUN_INVARIANTS if ended_final(cx) else None

    async def settle(self, cx: CaseRun, w: WorkerRun, obs: Observation) -> str:
        ex = cx.explorer
        before = w.entry.get("cancel_acknowledged")
        if getattr(ex.adapter, "cancel_is_final", False) and before is not None:
            terminal = ex.terminal_statuses()
            if before not in terminal:  # the cancel struck a live run: it ends here
                cx.kind_state[self.name] = FINAL
                cx.result.verdicts.append(check_final(obs.status, terminal, w.fault.point.label()))
                cx.done = True
            return obs.status
        if _ignored(cx):  # the woken worker ended the run as the golden run did: nothing to resume
            return obs.status
        await ex.adapter.resume_cancelled(ex.case_env, cx.run_id)
        return (await cx.observe()).status


HONOURED_CHECK = Check("cancel.honoured", "cancellation", "cancel acknowledged and ignored", "crash",
                       "a run whose cancel the runtime's own API acknowledged does not run on to its golden end")
HONOURED = HONOURED_CHECK.name


def _ignored(cx: CaseRun) -> bool:
    """Whether the case's cancel was acknowledged and ignored (``cancel.honoured``
    failed): the woken worker ended the run as the golden run did, so no resume of the
    run through the runtime's API is left to make (its resume API may refuse an ended
    run, which is the subject's failure already judged, not the harness's)."""
    return any(v.check == HONOURED and v.valid is False for v in cx.result.verdicts)


def check_cancel_honoured(before: str, terminal: tuple[str, ...], golden_status: str, returncode: int | None,
                          end_status: str | None, at: str) -> Verdict:
    """``cancel.honoured``: the runtime's cancel API returned while the run was
    ``before`` (its status when the cancel went out); the woken worker then exited
    ``returncode`` reporting ``end_status`` (None: no end report). Invalid when the run
    had not ended (``before`` not in ``terminal``) and the worker ended it exit 0 in the
    golden run's status ``golden_status``, as if never cancelled; not applicable (valid,
    saying so) when the run had ended before the cancel."""
    if before in terminal:
        return Verdict(HONOURED, "crash", True, f"not applicable: the run was already {before!r} when the cancel "
                                                f"went out at {at}")
    if returncode == 0 and end_status == golden_status:
        return Verdict(HONOURED, "crash", False,
                       f"the runtime's cancel API returned at {at} (the run was {before!r}), then the woken worker "
                       f"ended the run {end_status!r}, exit 0, as the golden run did: the cancel was acknowledged "
                       f"and ignored")
    how = f"exit {returncode}" if returncode is not None else "killed"
    return Verdict(HONOURED, "crash", True, f"cancelled at {at} (the run was {before!r}); the worker stopped: "
                                            f"{how}, reported {end_status!r}")


CLEAN_STOP = Check("cancel.clean_stop", "cancellation", "cancel raised out of the worker", "crash",
                   "after the runtime's cancel API returned, the woken worker ends the run without raising out "
                   "of the runtime").name
FINAL_CHECK = Check("cancel.final", "cancellation", "final cancel left the run open", "crash",
                    "after a final cancel (Adapter.cancel_is_final) of a run that had not ended, the run is in a "
                    "terminal status").name
FINAL = "final"
"""``CaseRun.kind_state["cancel-api"]`` of a case a final cancel ended (:func:`ended_final`)."""
ANY_RUN_INVARIANTS = ("effects.applied_once", "log.clean_final")
"""The end invariants that hold of a cancelled run too (the others assume a run that ran
to its end: every effect resolved, every paid answer recorded)."""


def check_clean_stop(before: str, terminal: tuple[str, ...], end_status: str | None, error: str, at: str) -> Verdict:
    """``cancel.clean_stop``: after the runtime's cancel API returned for a run that was
    ``before`` (not in ``terminal``), the woken worker ended reporting ``end_status``
    (``"error"``: the adapter's call raised ``error``; None: no end report, e.g.
    killed). Invalid when it raised: the runtime let its cancel escape as an exception
    out of the code that serves runs (in production, the worker process)."""
    if before in terminal:
        return Verdict(CLEAN_STOP, "crash", True, f"not applicable: the run was already {before!r} when the cancel "
                                                  f"went out at {at}")
    if end_status == "error":
        first = (error.splitlines() or ["no error recorded"])[0][:300]
        return Verdict(CLEAN_STOP, "crash", False,
                       f"the runtime's cancel API returned at {at} (the run was {before!r}), then the woken worker "
                       f"raised out of the runtime: {first}")
    return Verdict(CLEAN_STOP, "crash", True, f"cancelled at {at}; the worker ended reporting {end_status!r}")


def check_final(status: str, terminal: tuple[str, ...], at: str) -> Verdict:
    """``cancel.final``: a runtime whose cancel is final left the run ``status`` after its
    cancel at ``at``; invalid unless terminal (a non-terminal run waits for a resume that
    no API of the runtime gives)."""
    if status in terminal:
        return Verdict(FINAL_CHECK, "crash", True, f"cancelled at {at}: the run ended {status!r}, the runtime's "
                                                   "cancel is final")
    return Verdict(FINAL_CHECK, "crash", False, f"cancelled at {at}: the run is {status!r}, not terminal, yet the "
                                                "runtime's cancel is final: nothing will end it")


def ended_final(cx: CaseRun) -> bool:
    """Whether a final cancel ended the case (its end checks are
    :data:`ANY_RUN_INVARIANTS`, not the comparison with the golden run)."""
    return cx.kind_state.get(CancelApi.name) == FINAL
