"""The reference runtime with a SIGTERM handler that runs late, and one that records
late (``term.drained`` judges launches from the signal's delivery, not the labels).

``LoopHandlerAdapter`` (defective): the drain's handler is installed with asyncio's
``loop.add_signal_handler``, so the flag the scheduler reads before each launch is set
only once the event loop runs the callback: a SIGTERM at a step's end lets the
scheduler launch the next node first, and ``drain.begin`` is recorded after that launch.

``LateLabelAdapter`` (correct): the handler is the reference runtime's own (the flag is
set at once, nothing launches after it), but ``drain.begin`` is recorded only as the
worker ends (when the drain is removed), after the node in flight finished.

Lives with the tests (``tests/subjects`` on ``PYTHONPATH``); one job a worker process
(the loop's handler is not removed between jobs).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.adapters.reference import ReferenceAdapter
from crashmatrix.reference_runtime import Runtime
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.drain import WorkerDrain


class LoopHandlerAdapter(ReferenceAdapter):
    """The drain's flag set by a ``loop.add_signal_handler`` callback (late)."""

    name = "loop-handler-drain"
    long_lived_workers = False

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        drain = WorkerDrain.on_running_loop()
        if drain is not None and drain.installed:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, drain._on_signal, signal.SIGTERM, None)
        return super().make_runtime(db, agent, ctx)


class LateLabelAdapter(ReferenceAdapter):
    """The reference drain, its ``drain.begin`` (and subscribers) when it is removed."""

    name = "late-label-drain"
    long_lived_workers = False

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        drain = WorkerDrain.on_running_loop()
        if drain is not None:
            drain._notify = lambda: None  # type: ignore[method-assign]
            remove = drain.remove

            def remove_late() -> None:
                if drain.requested:
                    WorkerDrain._notify(drain)
                remove()

            drain.remove = remove_late  # type: ignore[method-assign]
        return super().make_runtime(db, agent, ctx)
