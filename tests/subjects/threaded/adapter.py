"""The reference runtime's adapter, in a module whose import starts a named daemon
thread (an event bus's dispatcher: it waits on a queue for the life of the process)."""

from __future__ import annotations

import queue
import threading

from crashmatrix.harness.adapters.reference import ReferenceAdapter

THREAD_NAME = "threaded-event-bus"
EVENTS: queue.Queue[object] = queue.Queue()


def _dispatch() -> None:
    while True:
        EVENTS.get()


threading.Thread(target=_dispatch, name=THREAD_NAME, daemon=True).start()


class ThreadedAdapter(ReferenceAdapter):
    """The reference runtime, imported with a thread started."""

    name = "threaded"

    def __init__(self) -> None:
        super().__init__()
        if not any(t.name == THREAD_NAME for t in threading.enumerate()):
            raise RuntimeError(f"the {THREAD_NAME} thread is not running in this process")
