"""The prefetcher's pure logic (harness/plugin_prefetch.py): which cases start, at most
``jobs`` in flight, a stolen item's case cancelled, the jobs shared among xdist
workers, and pytest-xdist's worker queue read as xdist 3.8 keeps it (its own
``TestQueue`` and ``steal``; futures stand in for the cases). The real runs, serial and
``-n 2``, are tests/plugin/test_plugin_matrix.py's."""

from __future__ import annotations

import collections
import concurrent.futures
from types import SimpleNamespace
from typing import Any

import execnet
import pytest
import xdist.remote as xdist_remote

from crashmatrix.harness.plugin_prefetch import (Prefetcher, indexed_upcoming, ordered_upcoming, worker_jobs,
                                                 xdist_upcoming)


class Cases:
    """``start``: each case a future, left running unless its name is in ``instant``."""

    def __init__(self, instant: set[str] | None = None, decline: set[str] | None = None) -> None:
        self.started: list[str] = []
        self.futures: dict[str, concurrent.futures.Future[Any]] = {}
        self.instant, self.decline = instant or set(), decline or set()

    def __call__(self, param: str) -> concurrent.futures.Future[Any] | None:
        self.started.append(param)
        if param in self.decline:
            return None
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        # cancelled, the case unwinds at once (as asyncio marks a cancelled
        # run_coroutine_threadsafe future once its task has ended)
        f.add_done_callback(lambda f: f.cancelled() and f.set_running_or_notify_cancel())
        if param in self.instant:
            f.set_result(f"result {param}")
        self.futures[param] = f
        return f

    def finish(self, param: str) -> None:
        self.futures[param].set_result(f"result {param}")


def entries(*names: str) -> list[tuple[str, str]]:
    return [(f"t[{n}]", n) for n in names]


def test_serial_starts_the_item_and_the_next_ones_never_more_than_jobs_in_flight() -> None:
    cases = Cases(instant={"a"})
    pf = Prefetcher(ordered_upcoming(entries(*"abcdef")), 2, cases)
    assert pf.take("t[a]", "a") == "result a"
    assert cases.started == ["a", "b", "c"] and pf.in_flight() == 2  # a finished at once; b, c in flight
    cases.finish("b")
    assert pf.take("t[b]", "b") == "result b"
    assert cases.started == ["a", "b", "c", "d"] and pf.in_flight() == 2
    assert pf.ahead == {"t[b]", "t[c]", "t[d]"}  # a was started by its own item
    cases.finish("c")
    cases.finish("d")
    assert pf.take("t[c]", "c") == "result c"
    assert cases.started == [*"abcdef"]  # c done, d done: e and f fill the two slots
    # -x after c: d's result and the running e, f are dropped at the end
    pf.cancel()
    assert cases.futures["e"].cancelled() and cases.futures["f"].cancelled()
    assert not cases.futures["d"].cancelled()


def test_a_declined_case_is_left_to_its_item_and_never_started_again() -> None:
    cases = Cases(instant={"a", "b", "c"}, decline={"b"})
    pf = Prefetcher(ordered_upcoming(entries(*"abc")), 3, cases)
    assert pf.take("t[a]", "a") == "result a"
    assert pf.take("t[b]", "b") is None  # the caller runs it (and fails it with the reason)
    assert pf.take("t[c]", "c") == "result c"
    assert cases.started == ["a", "b", "c"]
    assert pf.take("t[c]", "c") is None  # a rerun of the same item runs its own case


def test_full_slots_leave_the_item_to_run_its_own_case() -> None:
    """An item that was not among the coming ones while ``jobs`` cases of later items
    started is not added to them: take gives None, the item runs its case itself."""
    coming = entries("b", "c")
    cases = Cases(instant={"x"})
    pf = Prefetcher(lambda nodeid: coming, 2, cases)
    assert pf.take("t[x]", "x") == "result x"
    assert cases.started == ["x", "b", "c"] and pf.in_flight() == 2
    assert pf.take("t[a]", "a") is None
    assert cases.started == ["x", "b", "c"]


def test_xdist_worker_reads_its_queue_and_a_stolen_items_case_is_cancelled() -> None:
    """pytest-xdist 3.8's own queue and ``steal``: the worker's coming items are the
    index it took to run next and those still queued; another worker stealing queued
    indices cancels their cases at the next item."""
    items = entries(*"abcdefgh")
    interactor = SimpleNamespace(torun=xdist_remote.TestQueue(execnet.gateway_base.get_execmodel("thread")),
                                 nextitem_index=None, sent=[])
    interactor.sendevent = lambda name, **kw: interactor.sent.append((name, kw))
    indices, how = xdist_upcoming([object(), SimpleNamespace(torun=None), interactor])
    assert indices is not None and how == "pytest-xdist's worker queue"
    for i in (0, 1, 2, 3, 4):
        interactor.torun.put(i)
    interactor.nextitem_index = interactor.torun.get()  # what the worker does before its first item
    current = interactor.nextitem_index
    interactor.nextitem_index = interactor.torun.get()
    assert indices() == [1, 2, 3, 4]
    cases = Cases(instant={"a"})
    pf = Prefetcher(indexed_upcoming([(k, n, p) for k, (n, p) in enumerate(items)], indices), 4, cases)
    assert pf.take(*items[current]) == "result a"
    assert cases.started == ["a", "b", "c", "d", "e"] and pf.in_flight() == 4
    xdist_remote.WorkerInteractor.steal(interactor, [3, 4])  # another worker takes d and e
    assert interactor.sent == [("unscheduled", {"indices": [3, 4]})]
    interactor.torun.put(6)
    current, interactor.nextitem_index = interactor.nextitem_index, interactor.torun.get()
    assert indices() == [2, 6]
    cases.finish("b")
    assert pf.take(*items[current]) == "result b"
    assert cases.futures["d"].cancelled() and cases.futures["e"].cancelled()  # their items run elsewhere
    assert cases.started == ["a", "b", "c", "d", "e", "g"] and pf.in_flight() == 2
    interactor.torun.put(xdist_remote.Marker.SHUTDOWN)
    assert indices() == [2, 6]  # the shutdown marker is no item
    pf.cancel()
    assert cases.futures["c"].cancelled() and cases.futures["g"].cancelled()


def test_another_xdist_shape_falls_back_to_one_case_at_a_time() -> None:
    indices, why = xdist_upcoming([SimpleNamespace(torun=[1, 2], nextitem_index=0), object()])
    assert indices is None and "not found" in why

    class Broken:
        def lock(self) -> Any:
            raise TypeError("no")

    indices, why = xdist_upcoming([SimpleNamespace(torun=Broken(), nextitem_index=0)])
    assert indices is None and "could not be read" in why
    good = SimpleNamespace(torun=xdist_remote.TestQueue(execnet.gateway_base.get_execmodel("thread")),
                           nextitem_index=3)
    indices, _ = xdist_upcoming([SimpleNamespace(torun=Broken(), nextitem_index=0), good])
    assert indices is not None and indices() == [3]  # a look-alike that fails does not hide the real queue
    # a queue that breaks later gives no coming items: the item still runs its own case
    cases = Cases(instant={"a"})

    def broken() -> list[int]:
        raise RuntimeError("gone")

    pf = Prefetcher(indexed_upcoming([(0, "t[a]", "a"), (1, "t[b]", "b")], broken), 4, cases)
    assert pf.take("t[a]", "a") == "result a" and cases.started == ["a"]


@pytest.mark.parametrize("jobs, workers, shares", [
    (4, 2, [2, 2]), (5, 2, [3, 2]), (4, 3, [2, 1, 1]), (1, 2, [1, 1]), (8, 1, [8]), (16, 4, [4, 4, 4, 4]),
])
def test_jobs_are_shared_among_the_xdist_workers(jobs: int, workers: int, shares: list[int]) -> None:
    assert [worker_jobs(jobs, workers, f"gw{k}") for k in range(workers)] == shares
    assert worker_jobs(5, 2, "odd") == 2


def test_each_item_looks_at_a_bounded_window_of_the_coming_items() -> None:
    """A serial run of many items: each ``take`` reads the coming items only up to the
    cases in flight, twice ``jobs`` and ``LOOKAHEAD`` more (not the whole rest of the
    session: quadratic in the items), and still keeps ``jobs`` in flight."""
    from crashmatrix.harness.plugin_prefetch import LOOKAHEAD

    names = [str(k) for k in range(5000)]
    serial = ordered_upcoming(entries(*names))
    pulled: list[int] = []

    def counting(nodeid: str):
        n = 0
        for item in serial(nodeid):
            n += 1
            pulled.append(n)
            yield item

    cases = Cases()
    pf = Prefetcher(counting, 2, cases)
    for name in names[:100]:
        pulled.clear()
        cases.instant.add(name)  # its own case ends at once, the coming ones stay in flight
        if name in cases.futures and not cases.futures[name].done():
            cases.finish(name)
        assert pf.take(f"t[{name}]", name) == f"result {name}"
        assert max(pulled, default=0) <= 2 * 2 + 2 + 1 + LOOKAHEAD, max(pulled)  # jobs 2: 2 in flight, 1 done
    assert cases.started == names[:len(cases.started)] and len(cases.started) >= 100


def test_waiting_lanes_start_cases_that_wait_from_further_ahead() -> None:
    """Beside the ``jobs`` slots, the waiting lanes take only the cases that mostly wait,
    from up to WAITING_LOOKAHEAD items ahead; at most one case that must run alone is in
    flight (its item starts it when its turn comes)."""
    from crashmatrix.harness.plugin_prefetch import Pace

    names = [f"p{k}" for k in range(40)] + ["w1", "w2", "w3", "a1", "a2"]
    pace = {"w1": Pace(waits=True), "w2": Pace(waits=True), "w3": Pace(waits=True),
            "a1": Pace(waits=True, alone=True), "a2": Pace(waits=True, alone=True)}
    cases = Cases(instant={"p0"})
    pf = Prefetcher(ordered_upcoming(entries(*names)), 2, cases, lambda p: pace.get(p, Pace()), 2)
    assert pf.take("t[p0]", "p0") == "result p0"
    assert cases.started == ["p0", "p1", "p2", "w1", "w2"] and pf.in_flight() == 4  # 2 slots, 2 waiting lanes
    cases.finish("w1")
    cases.finish("w2")
    cases.finish("p1")
    assert pf.take("t[p1]", "p1") == "result p1"
    assert cases.started[5:] == ["p3", "w3", "a1"]  # a slot for p3; the lanes: w3, a1 (a2 must wait for a1)
    assert "a2" not in cases.started
    cases.finish("a1")
    cases.finish("p2")
    assert pf.take("t[p2]", "p2") == "result p2"
    assert cases.started[8:] == ["p4", "a2"]


def test_a_slot_freed_while_an_item_waits_goes_to_the_next_case_at_once() -> None:
    """The item's own case runs long; another case of the window finishes meanwhile: its
    slot takes the next coming case before the item's case ends."""
    import threading

    cases = Cases()
    pf = Prefetcher(ordered_upcoming(entries(*"abcde")), 2, cases)
    seen: list[list[str]] = []

    def later() -> None:
        cases.finish("b")  # frees a slot while a's item waits
        deadline = threading.Event()
        for _ in range(200):  # the prefetcher starts c from the waiting item's thread
            if "c" in cases.started:
                break
            deadline.wait(0.01)
        seen.append(list(cases.started))
        cases.finish("a")

    threading.Timer(0.05, later).start()
    assert pf.take("t[a]", "a") == "result a"
    assert seen == [["a", "b", "c"]]  # c started while a still ran


def test_a_batch_gives_each_case_its_loops_result_once() -> None:
    """A serial run's matrix: the loop emits results (the first counts), each item takes
    its case's once; a case the loop never gave a result by its end is its item's to run
    (None), and so is one not in the batch."""
    from crashmatrix.harness.plugin_prefetch import Batch

    batch = Batch(["a", "b", "c"])
    loop: concurrent.futures.Future[Any] = concurrent.futures.Future()
    batch.attach(loop)
    batch.emit("a", "result a")
    batch.emit("a", "again")
    assert "a" in batch and batch.take("a") == "result a"
    assert "a" not in batch and batch.take("a") is None  # taken once
    assert batch.take("x") is None
    batch.emit("b", "result b")
    loop.set_exception(RuntimeError("the loop raised"))  # its end, however it ends
    assert batch.take("b") == "result b" and batch.take("c") is None
    assert batch.summary_lines() == []


def test_closing_a_batch_lets_a_complete_loop_finish_and_cancels_an_unfinished_one() -> None:
    import threading

    from crashmatrix.harness.plugin_prefetch import Batch

    done = Batch(["a"])
    loop: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.attach(loop)
    done.emit("a", "result a")
    summary = SimpleNamespace(lines=lambda: ["kill: 1 points -> 1 crash states, all pass; sample 0/0 agree"])
    threading.Timer(0.05, lambda: loop.set_result(([], summary))).start()
    done.close()  # every result given: waits for the loop's own end
    assert not loop.cancelled() and done.summary_lines() == summary.lines()

    partial = Batch(["a", "b"])
    running: concurrent.futures.Future[Any] = concurrent.futures.Future()
    # cancelled, the loop unwinds at once (as a run_coroutine_threadsafe future is marked)
    running.add_done_callback(lambda f: f.cancelled() and f.set_running_or_notify_cancel())
    partial.attach(running)
    partial.emit("a", "result a")
    partial.close()  # -x after a: b's case never ends by itself
    assert running.cancelled() and partial.take("b") is None
