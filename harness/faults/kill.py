"""``kill``: SIGKILL at the point (docs/design.md, "Fault kinds, precisely").

The worker sends SIGKILL to itself while it holds the recorder's lock, so no other
thread of the subject acts between the ``fired`` report and the death. The runtime gets
no chance to react: its resume must continue from the durable store alone. No crash
check of its own (the generic ones apply).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import HarnessError
from ._base import FaultKind, UnderLock, die_now, register

if TYPE_CHECKING:
    from ..case import CaseRun, WorkerRun
    from ..plan import Fault
    from ..worker import Recorder


@register
class Kill(UnderLock, FaultKind):
    """SIGKILL the worker at the point."""

    name = "kill"
    rank = 0
    listing_order = 0

    def act(self, recorder: Recorder, fault: Fault) -> None:
        die_now()

    async def after_worker(self, cx: CaseRun, w: WorkerRun) -> None:
        assert w.exit is not None
        if w.report.fired is not None and w.exit.signal != 9:
            raise HarnessError(f"kill fault fired but the worker ended otherwise ({w.exit.describe()})")
