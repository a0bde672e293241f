"""reference_runtime.turns.Turns: FIFO, and taking a turn suspends exactly once whether it
is free or not (the await points of an append or a round trip must not depend on timing)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Generator
from typing import Any

import pytest

from crashmatrix.reference_runtime.turns import Turns


@types.coroutine
def counting(awaitable: Awaitable[Any], suspensions: list[int]) -> Generator[Any, Any, Any]:
    """Await ``awaitable``, appending 1 to ``suspensions`` at each suspension."""
    it = awaitable.__await__()
    try:
        value = next(it)
        while True:
            suspensions.append(1)
            value = it.send((yield value))
    except StopIteration as stop:
        return stop.value


async def hold(turns: Turns, name: str, log: list[str], release: asyncio.Event, suspensions: list[int]) -> None:
    turn = turns.take()
    try:
        await counting(turn, suspensions)
    except BaseException:
        turns.leave(turn)
        raise
    try:
        log.append(f"{name} holds")
        await release.wait()
    finally:
        log.append(f"{name} ends")
        turns.end()


def test_a_free_turn_and_a_queued_turn_each_suspend_exactly_once_and_queue_in_order() -> None:
    async def main() -> tuple[list[str], dict[str, list[int]]]:
        turns, log = Turns(), []
        releases = {name: asyncio.Event() for name in "abc"}
        counts: dict[str, list[int]] = {name: [] for name in "abc"}
        tasks = {name: asyncio.create_task(hold(turns, name, log, releases[name], counts[name])) for name in "abc"}
        for _ in range(5):
            await asyncio.sleep(0)
        assert log == ["a holds"] and turns.held
        releases["c"].set()  # c waits behind b: releasing it early changes nothing
        releases["a"].set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert log == ["a holds", "a ends", "b holds"]
        releases["b"].set()
        await asyncio.gather(*tasks.values())
        assert not turns.held
        return log, counts

    log, counts = asyncio.run(main())
    assert log == ["a holds", "a ends", "b holds", "b ends", "c holds", "c ends"]
    assert counts == {"a": [1], "b": [1], "c": [1]}


@pytest.mark.parametrize("holding", [False, True], ids=["cancelled-while-queued", "cancelled-while-holding"])
def test_a_cancelled_taker_leaves_the_queue_or_gives_the_turn_back(holding: bool) -> None:
    async def main() -> list[str]:
        turns, log = Turns(), []
        first, never, last = asyncio.Event(), asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(hold(turns, "a", log, first, []))
        b = asyncio.create_task(hold(turns, "b", log, never, []))
        c = asyncio.create_task(hold(turns, "c", log, last, []))
        for _ in range(3):
            await asyncio.sleep(0)
        if holding:
            first.set()
            for _ in range(3):
                await asyncio.sleep(0)
            assert log[-1] == "b holds"
        b.cancel()
        if not holding:
            first.set()
        last.set()
        await asyncio.gather(a, c)
        with pytest.raises(asyncio.CancelledError):
            await b
        assert not turns.held
        return log

    log = asyncio.run(main())
    expected = ["a holds", "a ends", "b holds", "b ends", "c holds", "c ends"] if holding else \
        ["a holds", "a ends", "c holds", "c ends"]
    assert log == expected


def test_a_taker_cancelled_on_its_free_turn_frees_it() -> None:
    async def main() -> bool:
        turns = Turns()
        started = asyncio.Event()

        async def taker() -> None:
            turn = turns.take()
            started.set()
            try:
                await turn
                await asyncio.Event().wait()
            except BaseException:
                turns.leave(turn)
                raise

        task = asyncio.create_task(taker())
        await started.wait()  # the taker holds the turn and is at its one suspension
        assert turns.held
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return turns.held

    assert asyncio.run(main()) is False
