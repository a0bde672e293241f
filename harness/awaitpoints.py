"""Await points: every place a task of the subject suspends, found without labels.

A task factory installed in the worker's event loop wraps each new task's coroutine in
:class:`TracedCoroutine`. Each time the task suspends, the wrapper walks the task's await
chain (``cr_await`` / ``gi_yieldfrom``) and names the point after the innermost frame that
lies in the subject's own packages (docs/design.md, "Crash points"):

    ``module:Qualname@N``, N = the ordinal of the await expression in that function

(its position among the function's suspension instructions, never a line number, so
names survive edits elsewhere in the file). Occurrences are counted per logical task by
the recorder. An await that suspends several times in one execution (a lock that is
contended, a streamed read) counts once: the wrapper remembers the awaitable object the
subject frame was waiting on, and only a new one is a new point.

The hook runs right after the suspension, so a ``kill`` fires while the request is on
the wire and its answer unprocessed, and a ``cancel`` (anyio delivers it on the next
loop iteration) raises ``CancelledError`` at that very await.
"""

from __future__ import annotations

import asyncio
import collections.abc
import dis
import types
from collections.abc import Callable
from functools import cache
from typing import Any

from .crashpoint import logical_task

AwaitHook = Callable[[str, str], None]
"""``hook(point_name, logical_task)``."""


@cache
def _suspension_offsets(code: types.CodeType) -> tuple[int, ...]:
    return tuple(i.offset for i in dis.get_instructions(code) if i.opname == "YIELD_VALUE")


def await_ordinal(frame: types.FrameType) -> int:
    """1-based ordinal of the await expression ``frame`` is suspended at."""
    offsets = _suspension_offsets(frame.f_code)
    lasti = frame.f_lasti
    n = 0
    for off in offsets:
        if off <= lasti:
            n += 1
    return max(n, 1)


def point_name(frame: types.FrameType) -> str:
    module = frame.f_globals.get("__name__", "?")
    return f"{module}:{frame.f_code.co_qualname}@{await_ordinal(frame)}"


def innermost_subject_frame(coro: Any, packages: tuple[str, ...]) -> tuple[types.FrameType, Any] | None:
    """The innermost frame of ``coro``'s await chain inside ``packages``, with the
    object that frame awaits; None when no frame of the chain is the subject's."""
    found = None
    obj = coro
    while obj is not None:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        awaited = getattr(obj, "cr_await", None)
        if awaited is None:
            awaited = getattr(obj, "gi_yieldfrom", None)
        if frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.startswith(packages):
                found = (frame, awaited)
        obj = awaited
    return found


class TracedCoroutine(collections.abc.Coroutine):  # type: ignore[type-arg]
    """Drives a coroutine for asyncio, reporting each new suspension to ``hook``."""

    __slots__ = ("_coro", "_hook", "_packages", "_last")

    def __init__(self, coro: Any, hook: AwaitHook, packages: tuple[str, ...]) -> None:
        self._coro = coro
        self._hook = hook
        self._packages = packages
        self._last: tuple[Any, Any] | None = None

    def _suspended(self) -> None:
        found = innermost_subject_frame(self._coro, self._packages)
        if found is None:
            self._last = None
            return
        frame, awaited = found
        key = (frame, awaited)
        if self._last is not None and self._last[0] is frame and self._last[1] is awaited:
            return  # the same await expression suspending again
        self._last = key
        self._hook(point_name(frame), logical_task())

    def send(self, value: Any) -> Any:
        out = self._coro.send(value)
        self._suspended()
        return out

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:  # noqa: D401
        out = self._coro.throw(typ, val, tb) if val is not None or tb is not None else self._coro.throw(typ)
        self._suspended()
        return out

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Any:  # pragma: no cover - asyncio drives send/throw directly
        return self._coro.__await__()

    def __getattr__(self, name: str) -> Any:
        # cr_frame, cr_running, cr_await, cr_code...: libraries (anyio's "has this task
        # started", asyncio's repr) inspect the task's coroutine; answer for the inner one
        if name.startswith(("cr_", "gi_")):
            return getattr(self._coro, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<traced {self._coro!r}>"


def install(hook: AwaitHook, packages: tuple[str, ...]) -> None:
    """Install the tracing task factory on the running loop: every task created from
    now on reports its suspensions in ``packages`` to ``hook``."""
    loop = asyncio.get_running_loop()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        return asyncio.Task(TracedCoroutine(coro, hook, packages), loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
