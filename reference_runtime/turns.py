"""A turn: one holder at a time, in FIFO order, taken by an await that suspends exactly
once whether the turn is free or not.

Why not ``asyncio.Lock`` or ``anyio.Lock``: the harness's await points are the suspensions
of each logical task (``harness/awaitpoints.py``), and the golden run's must be the same in
every run. A lock that does not suspend when it is free (``asyncio.Lock``,
``anyio.Lock(fast_acquire=True)``) suspends only when two holders meet, which is timing:
the await-point stream would differ between two golden runs of a correct workload.
``anyio.Lock`` suspends once either way, but its free path is a shielded checkpoint (a
cancel scope entered and left around ``sleep(0)``) and a scan of the cancel scopes: a
``Db`` round trip took 17.8-18.6 us of CPU with it against 11.6-11.9 with a turn, on a
stand-in connection (``benchmarks/bench_db_turn.py``, docs/benchmarks.md); a free turn
here is one ``sleep(0)``, one pass of the loop.

Used as::

    turn = turns.take()
    try:
        await turn        # the one suspension, at the caller's own await expression
    except BaseException:
        turns.leave(turn)
        raise
    try:
        ...               # the holder's work
    finally:
        turns.end()

The await is the caller's (``take`` is not a coroutine), so the await point is named by
the caller's frame, the same for the free and the queued path.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable


class Turns:
    """One holder at a time, FIFO (see the module docstring). Bound to no loop: a queued
    turn's future is made on the running loop when it is taken."""

    __slots__ = ("held", "_waiters")

    def __init__(self) -> None:
        self.held = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> Awaitable[None]:
        """What the taker awaits: ``asyncio.sleep(0)`` when the turn is free (taken now;
        one pass of the loop), else a future that :meth:`end` resolves in FIFO order."""
        if not self.held and not self._waiters:
            self.held = True
            return asyncio.sleep(0)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def leave(self, turn: Awaitable[None]) -> None:
        """The taker was cancelled while it awaited ``turn``: give the turn back if it had
        it (a free turn, or one handed over just before the cancellation), else leave the
        queue."""
        if not isinstance(turn, asyncio.Future):
            self.end()
        elif turn.done() and not turn.cancelled():
            self.end()
        else:
            turn.cancel()
            try:
                self._waiters.remove(turn)
            except ValueError:
                pass

    def end(self) -> None:
        """Hand the turn to the first waiter still waiting, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.held = False
