"""The worker's cancel fault when the crash point is reached on another thread.

Subjects reach points from their own threads (DBOS records step outputs in
``asyncio.to_thread``; LangGraph's sync savers run in a pool). ``anyio.CancelScope`` is
not thread-safe, so the recorder hands the cancel to the scope's event loop. Measured
before the fix: a cancel fired at DBOS's step-commit trigger (on its recording thread)
made the workflow end ``failed`` in 11 of 55 cases.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import anyio

from crashmatrix.harness.plan import CrashPoint, Fault, FaultPlan
from crashmatrix.harness.history import WorkerReport
from crashmatrix.harness.worker import Recorder


def test_a_cancel_fired_on_another_thread_reaches_the_scope_through_its_loop(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    recorder = Recorder(FaultPlan((Fault("cancel", CrashPoint("label", "log.append.after", "tool-8", 1)),)), fd)
    fired_on: list[str] = []

    def in_thread() -> None:
        fired_on.append(threading.current_thread().name)
        recorder.label_hook("log.append.after", "tool-8")

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            recorder.scope, recorder.loop = scope, asyncio.get_running_loop()
            await anyio.to_thread.run_sync(in_thread)
            await anyio.sleep(30)  # the cancel must end this at once
        return scope.cancelled_caught

    try:
        # asyncio's debug mode raises on a loop call from a foreign thread: the old
        # direct scope.cancel() from the thread fails here
        assert anyio.run(main, backend_options={"debug": True}) is True
    finally:
        os.close(fd)
    assert fired_on and fired_on[0] != threading.main_thread().name
    assert WorkerReport.from_file(str(path)).names() == ["fired"]
