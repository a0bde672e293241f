"""The worker pool's wait on a worker's exit keeps a cancellation (Ctrl-C, SIGTERM) that
arrives in the loop iteration the worker exited in (CPython gh-86296)."""
import asyncio
import sys

from crashmatrix.harness.pool import wait_done


def _cancel_as_it_finishes(wait) -> str:
    async def main() -> str:
        exited: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        async def waiting() -> str:
            await wait(exited, 10.0)
            return "returned"

        task = asyncio.create_task(waiting())
        await asyncio.sleep(0)  # the task is now waiting on ``exited``
        exited.set_result({"returncode": 0})
        task.cancel()  # the same loop iteration
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    return asyncio.run(main())


def test_a_cancel_in_the_iteration_the_worker_exits_is_not_lost() -> None:
    assert _cancel_as_it_finishes(wait_done) == "cancelled"


def test_wait_for_of_a_shield_loses_it_on_this_python_which_is_why_wait_done_exists() -> None:
    """The pattern ``wait_done`` replaced; if this starts failing, the interpreter fixed
    the race (3.12 did) and ``wait_done`` is a plain ``asyncio.wait``."""
    async def old(fut: asyncio.Future[object], timeout: float) -> None:
        await asyncio.wait_for(asyncio.shield(fut), timeout)

    expected = "returned" if sys.version_info < (3, 12) else "cancelled"
    assert _cancel_as_it_finishes(old) == expected


async def _timeout_leaves_it_running() -> bool:
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    await wait_done(fut, 0.01)
    return not fut.done()


def test_a_timeout_leaves_the_future_pending() -> None:
    assert asyncio.run(_timeout_leaves_it_running())

