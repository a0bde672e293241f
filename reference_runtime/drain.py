"""SIGTERM drain for a worker's whole life (wall: "SIGTERM drain", seed 000).

A deploy sends SIGTERM and waits a grace period before SIGKILL. The worker must then
launch no new node, let in-flight nodes finish and append, leave its run ``paused`` for
another worker, and exit 0 — whatever it was doing when the signal came.

Failures this module prevents:

- **A handler installed only while the scheduler runs.** The term matrix at await points
  (``crashmatrix run research --sources await --kinds term``, 2026-12-01) found both
  halves of it in this runtime: a SIGTERM while the worker connected, took the lease,
  stored the trace link or wrote the final status met the default disposition and killed
  the worker (signal 15, the run left ``running``); one that arrived as the scheduler's
  task group closed was taken by asyncio, but its handler was removed before the loop
  ran it, so the signal was lost and the worker went on as if none had come.
- **A SIGTERM seen late.** With ``loop.add_signal_handler`` the handler runs one or two
  loop iterations after the signal, so a scheduler deciding in between still launches
  (a SIGTERM sent during one launch let the other 40 of a fan-out start). Here the
  handler is a Python-level one (``signal.signal``): it runs at the next bytecode
  boundary of the main thread and only sets :attr:`WorkerDrain.requested`, which the
  scheduler reads before every launch; the rest (the ``drain.begin`` crash point,
  waking the subscribers) runs in the event loop, scheduled with
  ``call_soon_threadsafe`` (which also wakes a loop blocked in ``select``).

:class:`WorkerDrain` is installed once per event loop, first thing in the worker (before
it connects), and removed when the worker is done; :class:`~.executor.Runtime` uses the
installed one (or the one it is given) and installs one of its own for the length of
:meth:`~.executor.Runtime.run` when there is none.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from crashmatrix.harness.crashpoint import DRAIN_BEGIN, crashpoint

_INSTALLED: dict[asyncio.AbstractEventLoop, WorkerDrain] = {}


class WorkerDrain:
    """One process's SIGTERM drain. :attr:`requested` turns True at the first SIGTERM;
    then, in the event loop, the crash point ``drain.begin`` (once) and every subscriber.
    Later SIGTERMs change nothing (the drain is already on).

    Only the main thread can install a signal handler; off it, :meth:`install` does
    nothing and :attr:`installed` stays False (the caller's own process decides).
    Raises RuntimeError from :meth:`install` outside a running event loop, or when
    another drain is installed on it (use :meth:`on_running_loop`).
    """

    def __init__(self) -> None:
        self.requested = False
        self.installed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: Any = None
        self._notified = False
        self._subscribers: list[Callable[[], None]] = []

    @staticmethod
    def on_running_loop() -> WorkerDrain | None:
        """The drain installed on the running event loop, if any."""
        return _INSTALLED.get(asyncio.get_running_loop())

    @classmethod
    @contextmanager
    def installed_here(cls) -> Iterator[WorkerDrain]:
        """``with WorkerDrain.installed_here() as drain:`` install on the running loop,
        remove on exit."""
        drain = cls().install()
        try:
            yield drain
        finally:
            drain.remove()

    def install(self) -> WorkerDrain:
        """Handle SIGTERM from now on (until :meth:`remove`); returns ``self``."""
        loop = asyncio.get_running_loop()
        if threading.current_thread() is not threading.main_thread():
            return self
        if loop in _INSTALLED:
            raise RuntimeError("a WorkerDrain is already installed on this event loop (WorkerDrain.on_running_loop())")
        self._loop = loop
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        _INSTALLED[loop] = self
        self.installed = True
        return self

    def remove(self) -> None:
        """Give SIGTERM back the disposition it had before :meth:`install` (idempotent).
        A SIGTERM that arrived before this call is not lost: :attr:`requested` is set."""
        if not self.installed:
            return
        signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        if self._loop is not None:
            _INSTALLED.pop(self._loop, None)
        self.installed = False

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` at the SIGTERM, in the event loop (at once, if the drain
        was already requested)."""
        self._subscribers.append(callback)
        if self.requested:
            callback()

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def request(self, loop: asyncio.AbstractEventLoop) -> None:
        """Request the drain as a SIGTERM would, from a signal handler that is not this
        drain's (a server's own, e.g. uvicorn's ``Server.handle_exit``, which this drain
        is then not installed over): the same flag at once, then ``drain.begin`` and the
        subscribers in ``loop``. Safe to call from a Python-level signal handler."""
        if self._loop is None:
            self._loop = loop
        self._on_signal(signal.SIGTERM, None)

    def _on_signal(self, signum: int, frame: Any) -> None:
        """The Python-level handler: a flag and a callback for the loop, nothing else
        (it may run between any two bytecodes of the main thread)."""
        if self.requested:
            return
        self.requested = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._notify)

    def _notify(self) -> None:
        """In the loop: every subscriber, then ``drain.begin`` even if one raised."""
        if self._notified:
            return
        self._notified = True
        errors: list[BaseException] = []
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception as exc:  # the other subscribers still drain
                errors.append(exc)
        crashpoint(DRAIN_BEGIN)
        if errors:
            raise errors[0]
