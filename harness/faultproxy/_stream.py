"""Chunks, channels and stubs: the plumbing one toxic stage runs on.

This mirrors Toxiproxy's ``stream.StreamChunk`` and ``toxics.ToxicStub`` (spec §2.1):

* a :class:`Chunk` is one socket read (at most 32 KiB) with the loop time it was read at;
* a :class:`Channel` is the bounded FIFO between two stages; ``None`` read from it means
  end of stream (a closed Go channel), and keeps meaning it on every later read;
* a :class:`ToxicStub` is one stage of one link: its input and output channel, the
  per-connection ``state`` of a stateful toxic, and the *interrupt* that add, update and
  remove use to stop the toxic so the chain can be rewired.

The interrupt differs from Go's in one deliberate way: a stage blocked *sending* to a full
output is never deadlocked by an interrupt. Go makes the API call wait until the consumer
drains (Toxiproxy issues #558, #500: the 25 s 503); here the interrupt lets the pending chunk into
the full channel (one chunk over capacity, never dropped, never reordered) and the stage
stops at its next receive or sleep. Bytes are never lost either way.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ._link import ToxicLink, ToxicWrapper

__all__ = ["Chunk", "Channel", "Interrupted", "ToxicStub", "READ_SIZE"]

log = logging.getLogger("crashmatrix.harness.faultproxy")

#: Bytes per socket read (Go's ``io.Copy`` buffer): one chunk carries at most this much.
READ_SIZE = 32 * 1024


class Interrupted(Exception):
    """Raised inside a toxic's ``pipe`` when its stage is interrupted.

    A pipe that holds a chunk when it catches this must send the chunk on before
    re-raising (Go: "don't drop any data on the floor").
    """


class Chunk:
    """One read from a socket: ``data`` and the loop time ``ts`` it was read at."""

    __slots__ = ("data", "ts")

    def __init__(self, data: bytes, ts: float) -> None:
        self.data = data
        self.ts = ts

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Chunk({len(self.data)} bytes @ {self.ts:.6f})"


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    if waiters:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        waiters.clear()


class Channel:
    """A bounded FIFO of chunks between two stages (a Go channel of ``*StreamChunk``).

    ``capacity`` is the toxic's buffer size (at least 1; Go's unbuffered channels hold
    one chunk in flight here). :meth:`close` marks end of stream: readers get the
    remaining chunks, then ``None`` forever.
    """

    __slots__ = ("_items", "capacity", "closed", "_getters", "_putters")

    def __init__(self, capacity: int = 1) -> None:
        self._items: deque[Chunk] = deque()
        self.capacity = max(1, capacity)
        self.closed = False
        self._getters: list[asyncio.Future[None]] = []
        self._putters: list[asyncio.Future[None]] = []

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return len(self._items) >= self.capacity

    def push(self, chunk: Chunk) -> None:
        """Append without waiting (may exceed capacity; used for flushes)."""
        self._items.append(chunk)
        _wake(self._getters)

    def pop(self) -> Chunk:
        chunk = self._items.popleft()
        _wake(self._putters)
        return chunk

    def close(self) -> None:
        self.closed = True
        _wake(self._getters)
        _wake(self._putters)

    async def put(self, chunk: Chunk) -> None:
        """Append, waiting while the channel is full (the socket reader's send)."""
        while len(self._items) >= self.capacity and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            try:
                await fut
            finally:
                if fut in self._putters:
                    self._putters.remove(fut)
        self.push(chunk)

    async def get(self) -> Chunk | None:
        """Next chunk, or ``None`` at end of stream (the socket writer's receive)."""
        while not self._items:
            if self.closed:
                return None
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            finally:
                if fut in self._getters:
                    self._getters.remove(fut)
        return self.pop()


_TIMEOUT = object()


class ToxicStub:
    """One stage of one link: what a toxic's ``pipe`` reads from and writes to.

    A pipe uses only :meth:`recv`, :meth:`send`, :meth:`sleep`, :meth:`close`, ``state``,
    ``rng`` and :meth:`now`. Interruptible points are :meth:`recv` and :meth:`sleep`;
    they raise :class:`Interrupted`.
    """

    __slots__ = ("input", "output", "state", "closed", "committed", "wrapper", "link",
                 "rng", "task", "_interrupt", "_waiter", "_loop")

    def __init__(self, input: Channel, output: Channel, *, rng: random.Random,
                 link: "ToxicLink | None" = None) -> None:
        self.input = input
        self.output = output
        self.state: Any = None
        self.closed = False
        #: Set by a stage that has started an uninterruptible wind-down (reset_peer's
        #: wait): an interrupt then reports "closed" at once instead of waiting.
        self.committed = False
        self.wrapper: ToxicWrapper | None = None
        self.link = link
        self.rng = rng
        self.task: asyncio.Task[None] | None = None
        self._interrupt = False
        self._waiter: asyncio.Future[Any] | None = None
        self._loop = asyncio.get_running_loop()

    # -- used by pipes -------------------------------------------------------------

    def now(self) -> float:
        return self._loop.time()

    async def recv(self, timeout: float | None = None) -> Any:
        """Next chunk; ``None`` at end of stream; a sentinel after ``timeout`` seconds.

        Raises :class:`Interrupted` when the stage is interrupted.
        """
        deadline = None if timeout is None else self._loop.time() + timeout
        ch = self.input
        while True:
            if self._interrupt:
                raise Interrupted
            if ch._items:
                return ch.pop()
            if ch.closed:
                return None
            if deadline is not None and self._loop.time() >= deadline:
                return _TIMEOUT
            fut = self._loop.create_future()
            ch._getters.append(fut)
            handle = None
            if deadline is not None:
                handle = self._loop.call_at(deadline, _resolve, fut)
            self._waiter = fut
            try:
                await fut
            finally:
                self._waiter = None
                if handle is not None:
                    handle.cancel()
                if fut in ch._getters:
                    ch._getters.remove(fut)

    TIMEOUT = _TIMEOUT

    async def send(self, chunk: Chunk) -> None:
        """Forward ``chunk``; waits while the output is full, unless interrupted."""
        ch = self.output
        while len(ch._items) >= ch.capacity and not self._interrupt and not ch.closed:
            fut = self._loop.create_future()
            ch._putters.append(fut)
            self._waiter = fut
            try:
                await fut
            finally:
                self._waiter = None
                if fut in ch._putters:
                    ch._putters.remove(fut)
        ch.push(chunk)

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (≤ 0: not at all); raises :class:`Interrupted`."""
        if self._interrupt:
            raise Interrupted
        if seconds > 0:
            fut = self._loop.create_future()
            handle = self._loop.call_later(seconds, _resolve, fut)
            self._waiter = fut
            try:
                await fut
            finally:
                self._waiter = None
                handle.cancel()
            if self._interrupt:
                raise Interrupted

    async def wait_interrupt(self) -> None:
        """Block until interrupted (then raise :class:`Interrupted`)."""
        while True:
            await self.sleep(3600.0)

    def close(self) -> None:
        """End of stream downstream of this stage (Go: ``stub.Close()``)."""
        if not self.closed:
            self.closed = True
            self.output.close()

    # -- used by links ---------------------------------------------------------------

    def run(self, wrapper: "ToxicWrapper") -> None:
        """Start ``wrapper``'s toxic on this stub, rolling its toxicity afresh."""
        self.wrapper = wrapper
        self.task = self._loop.create_task(self._run(wrapper))

    async def _run(self, wrapper: "ToxicWrapper") -> None:
        from ._toxics import NOOP

        toxic = wrapper.toxic
        if not wrapper.hidden and not self.rng.random() < wrapper.toxicity:
            toxic = NOOP
        try:
            await toxic.pipe(self)
        except Interrupted:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:  # a toxic bug must not wedge the link
            log.exception("toxic %s failed; closing its link", wrapper.name)
            self.close()

    async def interrupt(self) -> bool:
        """Stop the running toxic so the stage can be rewired or restarted.

        Returns True once the toxic has stopped, False if the stage is (or is bound to
        be) closed, like Go's ``InterruptToxic``.
        """
        if self.closed or self.committed:
            return False
        task = self.task
        if task is None or task.done():
            return not self.closed
        self._interrupt = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        try:
            await asyncio.wait([task])
        finally:
            self._interrupt = False
        return not self.closed

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _resolve(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
