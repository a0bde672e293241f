"""Cases run ahead of pytest: a serial pytest run with the CLI's parallelism.

pytest runs one item at a time; :class:`Prefetcher` keeps the cases of the coming
matrix items in flight, at most ``jobs`` at once, in the order pytest will run the
items (``session.items``), on the harness sessions' event loops. Each item takes its
own result when it runs (:meth:`Prefetcher.take`), so output, ``-x``, ``-k`` and the
reports are as without it (docs/plugin.md; ``benchmarks/bench_plugin.py jobs``).
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .case import CaseResult

P = TypeVar("P")


class Prefetcher(Generic[P]):
    """Runs the cases of ``queue`` (``(nodeid, param)`` in pytest's order) ahead of
    their items, at most ``jobs`` in flight. ``start(param)`` submits one case and
    returns its future, or None when the case is better left to its item (its services
    cannot start, its golden trace does not match the cache: the item then fails with
    the reason itself)."""

    def __init__(self, queue: list[tuple[str, P]], jobs: int,
                 start: Callable[[P], concurrent.futures.Future[CaseResult] | None]) -> None:
        self._queue = collections.deque(queue)
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._start = start
        self.jobs = jobs

    def _fill(self) -> None:
        while self._queue and sum(not f.done() for f in self._futures.values()) < self.jobs:
            nodeid, param = self._queue.popleft()
            future = self._start(param)
            if future is not None:
                self._futures[nodeid] = future

    def take(self, nodeid: str) -> CaseResult | None:
        """The result of ``nodeid``'s case (waiting for it), or None when it was not
        prefetched; launches more cases first. A Ctrl-C while waiting cancels it."""
        self._fill()
        future = self._futures.pop(nodeid, None)
        if future is None:
            return None
        return wait(future)

    def cancel(self) -> None:
        """Cancel every case not taken; wait (up to 30 s) for them to unwind."""
        self._queue.clear()
        pending = list(self._futures.values())
        for f in pending:
            f.cancel()
        concurrent.futures.wait(pending, timeout=30)
        self._futures.clear()


def wait(future: concurrent.futures.Future[Any]) -> Any:
    """``future.result()``; on any exception while waiting (a Ctrl-C included) the
    case's coroutine is cancelled first."""
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
