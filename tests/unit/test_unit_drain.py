"""reference_runtime.drain.WorkerDrain with real SIGTERMs sent to this process."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from crashmatrix.harness import crashpoint
from crashmatrix.reference_runtime.drain import WorkerDrain


@pytest.fixture
def points() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    crashpoint.arm(lambda name, task: seen.append((name, task)))
    try:
        yield seen
    finally:
        crashpoint.disarm()


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_the_flag_is_set_before_the_loop_runs_anything_and_drain_begin_once(points: list[tuple[str, str]]) -> None:
    async def scenario() -> None:
        calls: list[str] = []
        with WorkerDrain.installed_here() as drain:
            drain.subscribe(lambda: calls.append("a"))
            sigterm()
            # os.kill runs the Python-level handler before it returns: a scheduler's next
            # launch decision already sees it, no loop iteration needed
            assert drain.requested and calls == [] and points == []
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert calls == ["a"] and points == [("drain.begin", "run")]
            sigterm()  # a second SIGTERM changes nothing
            await asyncio.sleep(0.01)
            assert calls == ["a"] and points == [("drain.begin", "run")]
            late: list[str] = []
            drain.subscribe(lambda: late.append("b"))  # subscribing after the SIGTERM: called at once
            assert late == ["b"]

    asyncio.run(scenario())


def test_a_raising_subscriber_neither_stops_the_others_nor_the_crash_point(points: list[tuple[str, str]]) -> None:
    async def scenario() -> None:
        calls: list[str] = []

        def bad() -> None:
            raise ValueError("subscriber failed")

        loop = asyncio.get_running_loop()
        errors: list[Any] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
        with WorkerDrain.installed_here() as drain:
            drain.subscribe(bad)
            drain.subscribe(lambda: calls.append("after"))
            sigterm()
            await asyncio.sleep(0.01)
        assert calls == ["after"] and points == [("drain.begin", "run")]
        assert [type(e) for e in errors] == [ValueError]  # reported by the loop, not swallowed

    asyncio.run(scenario())


def test_remove_restores_the_previous_handler_and_a_second_drain_on_one_loop_is_refused() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        async def scenario() -> None:
            drain = WorkerDrain().install()
            assert WorkerDrain.on_running_loop() is drain
            with pytest.raises(RuntimeError, match="already installed"):
                WorkerDrain().install()
            drain.remove()
            drain.remove()  # idempotent
            assert WorkerDrain.on_running_loop() is None and not drain.installed
            sigterm()
            assert got == [signal.SIGTERM] and not drain.requested

        asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_nothing_is_installed() -> None:
    out: list[bool] = []

    async def scenario() -> None:
        drain = WorkerDrain().install()
        out.append(drain.installed)
        drain.remove()

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=lambda: asyncio.run(scenario()))
    thread.start()
    thread.join()
    assert out == [False]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_drain_requested_from_another_handler_installs_nothing(points: list[tuple[str, str]]) -> None:
    """``request(loop)``, as a server's own SIGTERM handler calls it: the flag at once,
    then the subscribers and ``drain.begin`` in the loop; SIGTERM's disposition untouched."""
    async def scenario() -> None:
        before = signal.getsignal(signal.SIGTERM)
        calls: list[str] = []
        drain = WorkerDrain()
        drain.subscribe(lambda: calls.append("a"))
        drain.request(asyncio.get_running_loop())
        assert drain.requested and not drain.installed and calls == []
        assert signal.getsignal(signal.SIGTERM) is before
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert calls == ["a"] and points == [("drain.begin", "run")]
        drain.request(asyncio.get_running_loop())  # again: nothing more
        await asyncio.sleep(0.01)
        assert calls == ["a"] and points == [("drain.begin", "run")]

    asyncio.run(scenario())
