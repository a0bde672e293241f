"""``cancel``: the anyio ``CancelScope`` the worker runs the subject in is cancelled at
the point (docs/design.md, "Fault kinds, precisely").

Cancellation is level-triggered: ``CancelledError`` arrives at the next await and every
later one until a shield. A point reached on another thread (a subject's background
thread) hands the cancel to the scope's event loop: ``CancelScope`` is not thread-safe.
Crash checks: ``cancel.left_unknown``, ``cancel.step_recorded`` (:mod:`._cancelled`).
The other styles of cancellation are kinds of their own: ``cancel-edge`` (asyncio's
``task.cancel()``, once: :mod:`.cancel_edge`) and ``cancel-api`` (the runtime's own
cancel API: :mod:`.cancel_api`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..oracle import Verdict, run_check
from ._base import FaultKind, register
from ._cancelled import NAME as STEP_RECORDED, check_step_recorded
from ..crashpoint import TOOL_REQUEST_BEFORE

if TYPE_CHECKING:
    from ..oracle import CrashEvidence
    from ..plan import Fault
    from ..worker import Recorder


@register
class Cancel(FaultKind):
    """Cancel the worker's run scope at the point."""

    name = "cancel"
    survives = True
    rank = 2
    reads_ledgers = True  # cancel.step_recorded

    def act(self, recorder: Recorder, fault: Fault) -> None:
        assert recorder.scope is not None, "cancel fault fired outside the run's scope"
        if recorder.loop is not None and not _on_loop_thread(recorder.loop):
            recorder.loop.call_soon_threadsafe(recorder.scope.cancel)
        else:
            recorder.scope.cancel()

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return cancel_checks(ev)


def cancel_checks(ev: CrashEvidence) -> list[Verdict]:
    """The crash checks of a cancelled worker (every cancellation style's)."""
    return [run_check("cancel.left_unknown", "crash", lambda: check_cancel_left_unknown(ev)),
            run_check(STEP_RECORDED, "crash", lambda: check_step_recorded(ev))]


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop running in this thread
        return False


def check_cancel_left_unknown(ev: CrashEvidence) -> Verdict:
    """``cancel.left_unknown``: a cancel that landed during a tool request (at
    ``tool.request.before``) left that request's effect ``unknown``: the live process
    knows its request was interrupted and records it so, shielded from the cancellation
    it records. A cancel elsewhere (the provider had answered, the outcome was being
    recorded) may leave an effect ``started``: a resume resolves it by its probe, as
    after a kill, and the end checks judge the outcome."""
    name = "cancel.left_unknown"
    if ev.observation.effects is None:
        return Verdict(name, "crash", True, "not applicable: the adapter exposes no effects ledger")
    point = ev.fault.point
    if point.name != TOOL_REQUEST_BEFORE:
        return Verdict(name, "crash", True, f"not applicable: the cancel landed at {point.name}, not during a tool request")
    mine = [e for e in ev.observation.effects if e.node_id == point.task]
    problems = [f"cancel landed during the request of {e.tool} ({e.node_id}) but its effect is {e.status}, not unknown"
                for e in mine if e.status != "unknown"]
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    return Verdict(name, "crash", True, f"the interrupted request's effect is unknown ({len(mine)} effect(s) of {point.task})")
