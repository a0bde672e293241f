"""``cancel-edge``: asyncio's own cancellation, once: ``task.cancel()`` on the task that
runs the subject, at the point (docs/design.md, "Fault kinds, precisely").

Edge-triggered, unlike ``cancel``'s anyio scope: ``CancelledError`` is raised at the
next await of that task and never again, so a subject that catches it (to save
something, to clean up) goes on, and its own writes after the catch are not cancelled.
This is how a cancelled asyncio request handler or an ``asyncio.wait_for`` timeout
reaches a runtime. LangGraph's ``durability="exit"`` loses the cancelled node's record
only under this style (LangGraph issue 5672; under the anyio scope the exit-time save is
cancelled too, so the run looks killed). The worker takes the one ``CancelledError``
that reaches its top as the end of the run (``interrupted``, exit 0), as a server whose
request was cancelled goes on. A point reached on another thread hands the cancel to
the loop. Crash checks: ``cancel.left_unknown`` and ``cancel.step_recorded``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import FaultKind, register
from .cancel import on_loop_thread, cancel_checks

if TYPE_CHECKING:
    from ..oracle import CrashEvidence, Verdict
    from ..plan import Fault
    from ..worker import Recorder


@register
class CancelEdge(FaultKind):
    """``task.cancel()`` the task that runs the subject, once."""

    name = "cancel-edge"
    survives = True
    rank = 2
    listing_order = 7
    short = "cedg"
    why_not_run = ("the cancellation landed where the subject never awaits again, or on a caller whose work ran on "
                   "(a thread, a shielded task)")
    reads_ledgers = True  # cancel.step_recorded

    def act(self, recorder: Recorder, fault: Fault) -> None:
        task, loop = recorder.task, recorder.loop
        assert task is not None and loop is not None, "cancel-edge fault fired outside the subject's task"
        recorder.edge_cancelled = True
        if on_loop_thread(loop):
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return cancel_checks(ev)
