"""``freeze``: the worker stops itself (SIGSTOP) at the point and never wakes: the next
workers take its run over while it is stopped, alive, still holding its database
session, sockets and lease; then it is SIGKILLed (a supervisor's liveness probe ending
a frozen VM or a process stuck in a page fault).

Unlike ``kill``, the takeover happens while the old owner still exists (a lock or a
transaction it held is still held); unlike ``pause``, it never acts again. No crash
check of its own: the generic ones run on the state after it was killed.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from ..errors import HarnessError
from ..services.process import sigkill_group
from ._base import FaultKind, Stops, register, signal_self

if TYPE_CHECKING:
    from ..case import CaseRun, WorkerRun
    from ..plan import Fault
    from ..worker import Recorder


@register
class Freeze(Stops, FaultKind):
    """SIGSTOP the worker at the point; its run is taken over; then SIGKILL it."""

    name = "freeze"
    rank = 6
    listing_order = 6
    short = "frz"
    role = "frozen"

    def act(self, recorder: Recorder, fault: Fault) -> None:
        signal_self(signal.SIGSTOP)

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:
        await cx.drive(w.index + 1, "frozen")
        assert w.pid is not None
        sigkill_group(w.pid)  # its own process group: nothing of it survives

    async def after_worker(self, cx: CaseRun, w: WorkerRun) -> None:
        assert w.exit is not None
        if w.exit.signal != signal.SIGKILL:
            raise HarnessError(f"freeze fault: the frozen worker ended otherwise ({w.exit.describe()})")
