"""SIGTERM drain for a worker's whole life (wall: "SIGTERM drain", seed 000).

A deploy sends SIGTERM and waits a grace period before SIGKILL. The worker must then
launch no new node, let in-flight nodes finish and append, leave its run ``paused`` for
another worker, and exit 0 — whatever it was doing when the signal came.

Failure this module prevents: a handler installed only while the scheduler runs. The
term matrix at await points (``crashmatrix run research --sources await --kinds term``,
2026-12-01) found both halves of it in this runtime: a SIGTERM while the worker
connected, took the lease, stored the trace link or wrote the final status met the
default disposition and killed the worker (signal 15, the run left ``running``); one
that arrived as the scheduler's task group closed was taken by asyncio, but its handler
was removed before the loop ran it, so the signal was lost and the worker went on as if
none had come.

:class:`WorkerDrain` is installed once, first thing in the worker (before it connects),
and removed when the worker is done; :class:`~.executor.Runtime` subscribes to it for
each run (and installs one of its own for the length of :meth:`~.executor.Runtime.run`
when none is given). The handler runs in the event loop (``loop.add_signal_handler``),
never between two bytecodes of the scheduler.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from crashmatrix.harness.crashpoint import crashpoint


class WorkerDrain:
    """One process's SIGTERM drain: :attr:`requested` turns True at the first SIGTERM
    (crash point ``drain.begin``, once) and every subscriber is called; later SIGTERMs
    are ignored (the drain is already on).

    Only the main thread can install a signal handler; off it, :meth:`install` does
    nothing and :attr:`installed` stays False (the caller's own process decides).
    """

    def __init__(self) -> None:
        self.requested = False
        self.installed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: list[Callable[[], None]] = []

    @classmethod
    @contextmanager
    def installed_here(cls) -> Iterator[WorkerDrain]:
        """``with WorkerDrain.installed_here() as drain:`` install on the running loop
        (raises RuntimeError outside one), remove on exit."""
        drain = cls().install()
        try:
            yield drain
        finally:
            drain.remove()

    def install(self) -> WorkerDrain:
        """Handle SIGTERM on the running event loop from now on; returns ``self``."""
        if threading.current_thread() is threading.main_thread():
            self._loop = asyncio.get_running_loop()
            self._loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
            self.installed = True
        return self

    def remove(self) -> None:
        """Give SIGTERM back its default disposition (idempotent)."""
        if self.installed and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_signal_handler(signal.SIGTERM)
        self.installed = False

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` at the SIGTERM (at once, if it already came)."""
        self._subscribers.append(callback)
        if self.requested:
            callback()

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def _on_sigterm(self) -> None:
        if self.requested:
            return
        self.requested = True
        crashpoint("drain.begin")
        for callback in list(self._subscribers):
            callback()
