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

from ..checks import Check, compose
from ..oracle import Verdict
from ._base import FaultKind, register
from ._cancelled import STEP_RECORDED, check_step_recorded
from ..crashpoint import TOOL_REQUEST_AFTER, TOOL_REQUEST_BEFORE

if TYPE_CHECKING:
    from ..oracle import CrashEvidence
    from ..plan import Fault
    from ..worker import Recorder


LEFT_UNKNOWN = Check("cancel.left_unknown", "effect resolution", "effect left started", "crash",
                     "a request the cancellation interrupted left its effect unknown, never started")


@register
class Cancel(FaultKind):
    """Cancel the worker's run scope at the point."""

    name = "cancel"
    survives = True
    rank = 2
    listing_order = 2
    short = "cncl"
    why_not_run = ("the cancellation landed where the subject never awaits again, or on a caller whose work ran on "
                   "(a thread, a shielded task)")
    reads_ledgers = True  # cancel.step_recorded

    def act(self, recorder: Recorder, fault: Fault) -> None:
        assert recorder.scope is not None, "cancel fault fired outside the run's scope"
        if recorder.loop is not None and not on_loop_thread(recorder.loop):
            recorder.loop.call_soon_threadsafe(recorder.scope.cancel)
        else:
            recorder.scope.cancel()

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return cancel_checks(ev)


def cancel_checks(ev: CrashEvidence) -> list[Verdict]:
    """The crash checks of a cancelled worker (every cancellation style's)."""
    return compose([(LEFT_UNKNOWN, lambda: check_cancel_left_unknown(ev)),
                    (STEP_RECORDED, lambda: check_step_recorded(ev))])


def on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop running in this thread
        return False


def check_cancel_left_unknown(ev: CrashEvidence) -> Verdict:
    """``cancel.left_unknown``: a request the cancellation interrupted left its effect
    ``unknown``, written shielded from the cancellation it records: the live process
    knows its request was cut. An effect left ``started`` fails unless its request had
    been answered before the cancel landed (the trace up to the fault shows the node's
    ``tool.request.after``: the outcome was being recorded, and a resume resolves it by
    its probe, as after a kill); a subject that labels no requests cannot tell, so any
    ``started`` effect fails. A cancel at ``tool.request.before`` left that node's
    effects ``unknown``, not ``succeeded`` or ``failed``."""
    name = LEFT_UNKNOWN.name
    if ev.observation.effects is None:
        return Verdict(name, "crash", True, "not applicable: the adapter exposes no effects ledger")
    effects = ev.observation.effects
    answered = {e.task for e in ev.trace_at_fault if e.source == "label" and e.name == TOOL_REQUEST_AFTER}
    problems = [f"effect {e.tool} of {e.node_id} left started after the cancellation (its request was not answered "
                f"before the cancel: unknown expected)" for e in effects if e.status == "started" and e.node_id not in answered]
    point = ev.fault.point
    if point.name == TOOL_REQUEST_BEFORE:
        problems += [f"cancel landed during the request of {e.tool} ({e.node_id}) but its effect is {e.status}, not unknown"
                     for e in effects if e.node_id == point.task and e.status not in ("unknown", "started")]
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    left = sum(1 for e in effects if e.status == "started")
    return Verdict(name, "crash", True, "no interrupted request left started" + (
        f" ({left} effect(s) answered before the cancel left started for the probe)" if left else ""))
