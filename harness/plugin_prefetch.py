"""Cases run ahead of pytest: a pytest run, serial or under xdist, with the CLI's parallelism.

pytest runs one item at a time per process; :class:`Prefetcher` keeps the cases of the
item running now and of the items this process runs next in flight, at most ``jobs``
at once, on the harness sessions' event loops. Which items come next is asked at each
item (``upcoming``): in a serial run, the items after it in ``session.items``; in a
pytest-xdist worker, the items xdist has scheduled to that worker and not yet started
(:func:`xdist_upcoming`), which grow as the controller sends more and shrink when
another worker steals some. Each item takes its own result when it runs
(:meth:`Prefetcher.take`), so output, ``-x``, ``-k`` and the reports are as without it.

The run's ``jobs`` (default twice the cores) is the machine's budget: xdist workers
share it (:func:`worker_jobs`), so ``-n N`` keeps as many cases in flight as a serial
run (docs/plugin.md; ``benchmarks/bench_plugin.py jobs``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:
    from .case import CaseResult

P = TypeVar("P")

LOOKAHEAD = 16
"""Coming items looked at per item beyond the cases in flight and twice ``jobs`` (items
whose case ``start`` declined are passed over there)."""
WAITING_LOOKAHEAD = 64
"""Coming items the waiting lanes look at for cases that mostly wait."""

#: ``upcoming(nodeid)``: ``(nodeid, param)`` of the items this process runs after the
#: item ``nodeid``, in the order it runs them
Upcoming = Callable[[str], Iterable[tuple[str, P]]]


class Pace(NamedTuple):
    """How a case uses the machine, from its fault kinds (:class:`.faults.FaultKind`):
    ``waits``: it spends most of its wall time waiting (``mostly_waits``: a server's
    restart, a toxic's delay); ``alone``: no two such cases run at once
    (``one_at_a_time``: ``db-restart``'s PostgreSQL)."""

    waits: bool = False
    alone: bool = False


class Prefetcher(Generic[P]):
    """Runs the cases of the coming items ahead of them, in lanes as the CLI's case
    loop does (:class:`.runner.CaseLanes`): ``jobs`` slots take the coming items' cases
    in order; up to ``waiting_lanes`` more (the plugin gives
    :data:`.runner.WAITING_LANES`; none when ``jobs`` is 1) take only cases that mostly wait (``pace``),
    from further ahead (:data:`WAITING_LOOKAHEAD` items), so their waits overlap the
    other cases instead of filling the slots; a case that must run alone is not started
    while another such is in flight (its item starts it when its turn comes). A slot
    freed while an item waits for its own case goes to the next coming case at once.

    ``upcoming(nodeid)`` gives the ``(nodeid, param)`` of the items still to run after
    ``nodeid``, in order; it is asked again at every :meth:`take`, so it may change
    between items. ``start(param)`` submits one case and returns its future, or None
    when the case is better left to its item (its services cannot start, its golden
    trace does not match the cache: the item then fails with the reason itself). Each
    item's case is started once at most; a started case whose item is no longer to run
    here (stolen by another xdist worker) is cancelled at the next :meth:`take`.
    ``pace(param)``: the case's :class:`Pace` (default: neither waits nor runs alone).
    ``ahead``: node ids whose case was started before their item ran."""

    def __init__(self, upcoming: Upcoming[P], jobs: int,
                 start: Callable[[P], concurrent.futures.Future[CaseResult] | None],
                 pace: Callable[[P], Pace] | None = None, waiting_lanes: int = 0) -> None:
        self._upcoming = upcoming
        self._start = start
        self._pace = pace or (lambda _: Pace())
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._lane: dict[str, tuple[bool, Pace]] = {}  # node id -> (started by a waiting lane, its pace)
        self._started: set[str] = set()  # node ids started or declined by ``start``: never started again
        self._dropped: list[concurrent.futures.Future[Any]] = []  # cancelled, awaited by :meth:`cancel`
        self.ahead: set[str] = set()
        self.jobs = jobs
        self.waiting_lanes = waiting_lanes if jobs > 1 else 0

    def in_flight(self) -> int:
        """Cases started and not finished (the item being taken's own included)."""
        return sum(not f.done() for f in self._futures.values())

    def take(self, nodeid: str, param: P) -> CaseResult | None:
        """The result of item ``nodeid``'s case (waiting for it), or None when it was
        not started here (declined by ``start``, already taken once, or ``jobs``
        cases of other items in flight: the caller runs it). Starts the item's case if
        not yet, then the coming items' cases (class docstring), again each time one
        finishes while this item waits; cancels cases of items no longer to run here.
        A Ctrl-C while waiting cancels the item's case."""
        # the cases in flight are those of the next items (started in their order): a
        # window past them bounds the work per item; a started case that falls outside
        # it is cancelled, and its item then runs its own case
        size = 2 * self.jobs + len(self._futures) + LOOKAHEAD
        coming = list(itertools.islice(self._upcoming(nodeid), max(size, WAITING_LOOKAHEAD * bool(self.waiting_lanes))))
        window = coming[:size]
        pending = [(nodeid, param), *((n, p) for n, p in window if n != nodeid)]
        keep = {nodeid} | {n for n, _ in coming}
        for n in [n for n in self._futures if n not in keep]:
            future = self._futures.pop(n)
            future.cancel()
            self._dropped.append(future)
        waiting = [(n, p) for n, p in coming if n != nodeid]
        self._fill(pending, waiting, nodeid)
        self._started.add(nodeid)
        future = self._futures.get(nodeid)
        if future is None:
            return None
        try:
            while not future.done():
                others = [f for f in self._futures.values() if not f.done()]
                concurrent.futures.wait(others, return_when=concurrent.futures.FIRST_COMPLETED)
                if not future.done():
                    self._fill(pending, waiting, nodeid)
        except BaseException:
            future.cancel()
            raise
        finally:
            self._futures.pop(nodeid, None)
            self._lane.pop(nodeid, None)
        return future.result()

    def _fill(self, pending: list[tuple[str, P]], waiting: list[tuple[str, P]], nodeid: str) -> None:
        """Start cases until the lanes are full: ``pending`` (the item's own first, then
        the window) in the ``jobs`` slots, cases that wait among ``waiting`` in the
        waiting lanes."""
        live = [self._lane[n] for n, f in self._futures.items() if not f.done()]
        slots = sum(not by_waiting for by_waiting, _ in live)
        lanes = len(live) - slots
        alone = any(pace.alone for _, pace in live)
        for n, p in pending:
            if slots >= self.jobs:
                break
            if n not in self._started and self._begin(n, p, nodeid, False, alone):
                slots += 1
                alone |= self._lane[n][1].alone
        for n, p in waiting:
            if lanes >= self.waiting_lanes:
                break
            if n not in self._started and self._pace(p).waits and self._begin(n, p, nodeid, True, alone):
                lanes += 1
                alone |= self._lane[n][1].alone

    def _begin(self, n: str, p: P, nodeid: str, by_waiting: bool, alone: bool) -> bool:
        """Start ``n``'s case unless it must run alone and another such is in flight
        (the item's own case always starts); True when it runs now."""
        pace = self._pace(p)
        if pace.alone and alone and n != nodeid:
            return False
        self._started.add(n)
        future = self._start(p)
        if future is None:
            return False
        self._futures[n] = future
        self._lane[n] = (by_waiting, pace)
        if n != nodeid:
            self.ahead.add(n)
        return not future.done()

    def cancel(self) -> None:
        """Cancel every case not taken; wait (up to 30 s) for them to unwind."""
        pending = [*self._futures.values(), *self._dropped]
        for f in pending:
            f.cancel()
        concurrent.futures.wait(pending, timeout=30)
        self._futures.clear()
        self._dropped.clear()


class Batch:
    """The cases of one matrix's items in a serial run, run by one case loop (the CLI's,
    :func:`.runner.run_loop`, with its crash-state pruning), each item taking its case's
    final result when it runs.

    ``ids``: the case ids the loop runs. The loop reports each final result with
    :meth:`emit` (from any thread) and its end with :meth:`ended` (a loop that raised or
    was cancelled ends too: the items still to come then run their own cases).
    :meth:`take` gives a case's result once (None: not in this batch, taken already, or
    the loop ended without it)."""

    def __init__(self, ids: Iterable[str]) -> None:
        self._results: dict[str, concurrent.futures.Future[Any]] = {i: concurrent.futures.Future() for i in ids}
        self._taken: set[str] = set()
        #: the loop's own future (:meth:`attach`), cancelled by :meth:`cancel`
        self.loop: concurrent.futures.Future[Any] | None = None

    def __contains__(self, case_id: str) -> bool:
        return case_id in self._results and case_id not in self._taken

    def attach(self, loop: concurrent.futures.Future[Any]) -> None:
        """``loop`` runs this batch's cases; its end, however it ends, is :meth:`ended`."""
        self.loop = loop
        loop.add_done_callback(lambda _: self.ended())

    def emit(self, case_id: str, result: Any) -> None:
        """``case_id``'s final result (the first one given counts)."""
        future = self._results.get(case_id)
        if future is not None and not future.done():
            future.set_result(result)

    def ended(self) -> None:
        """The loop is over: a case it gave no result is its item's to run."""
        for future in self._results.values():
            if not future.done():
                future.set_result(None)

    def take(self, case_id: str) -> Any:
        """``case_id``'s result, waiting for it (a Ctrl-C while waiting propagates)."""
        if case_id not in self:
            return None
        self._taken.add(case_id)
        return self._results[case_id].result()

    def summary_lines(self) -> list[str]:
        """What the loop's pruning says (:meth:`.pruning.PruneSummary.lines`), once it
        ended by itself; empty before, or when it was cancelled or raised."""
        loop = self.loop
        if loop is None or not loop.done() or loop.cancelled() or loop.exception() is not None:
            return []
        _, summary = loop.result()
        return list(summary.lines())

    def close(self) -> None:
        """At the session's end: a loop that gave every result is let finish (its
        summary), one that did not (``-x``, Ctrl-C) is cancelled (its cases in flight
        unwind); either is waited for up to 30 s."""
        if self.loop is not None:
            if not all(f.done() for f in self._results.values()):
                self.loop.cancel()
            concurrent.futures.wait([self.loop], timeout=30)
        self.ended()


def wait(future: concurrent.futures.Future[Any]) -> Any:
    """``future.result()``; on any exception while waiting (a Ctrl-C included) the
    case's coroutine is cancelled first."""
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def worker_jobs(jobs: int, workercount: int, workerid: str) -> int:
    """The share of the run's ``jobs`` (cases in flight) of xdist worker ``workerid``
    (``gw0``, ``gw1``...) of ``workercount``: ``jobs // workercount``, one more for the
    first ``jobs % workercount`` workers, so the shares add up to ``jobs``; at least 1
    (more workers than jobs: one case at a time each). An id without a number gets the
    smaller share."""
    n = max(1, workercount)
    m = re.fullmatch(r"\D*(\d+)", workerid)
    index = int(m.group(1)) if m else n
    return max(1, jobs // n + (index < jobs % n))


def xdist_upcoming(plugins: Iterable[object]) -> tuple[Callable[[], list[int]] | None, str]:
    """Find the pytest-xdist worker's queue among ``plugins`` (the pluginmanager's):
    the interactor that registers itself as a plugin (``WorkerInteractor`` looked at
    first), with ``torun`` (a queue whose ``lock()`` yields the deque of indices into
    ``session.items`` scheduled to this worker and not yet started, and the shutdown
    marker) and ``nextitem_index`` (the index it has taken from the queue to run next,
    or not an int). Returns ``(indices, what)``: ``indices()`` reads both (the queue
    under its lock, read only) and gives the indices in the order the worker runs
    them; or ``(None, why)`` when no plugin has that shape (another pytest-xdist
    version), ``why`` saying what was looked for or what failed."""
    why = "pytest-xdist's worker queue (a plugin with torun.lock() and nextitem_index) not found"
    for plugin in sorted(plugins, key=lambda p: type(p).__name__ != "WorkerInteractor"):
        try:
            lock = getattr(getattr(plugin, "torun", None), "lock", None)
            if not callable(lock) or not hasattr(plugin, "nextitem_index"):
                continue
            with lock() as queue:
                list(queue)
        except Exception as exc:  # noqa: BLE001  (a queue of another shape: look further, else one case at a time)
            why = f"pytest-xdist's worker queue (torun.lock()) could not be read: {exc!r}"
            continue

        def indices(plugin: Any = plugin, lock: Callable[[], Any] = lock) -> list[int]:
            with lock() as queue:
                queued = list(queue)
            nxt = plugin.nextitem_index
            return [i for i in ([nxt] if isinstance(nxt, int) else []) + queued if isinstance(i, int)]

        return indices, "pytest-xdist's worker queue"
    return None, why


def indexed_upcoming(entries: Sequence[tuple[int, str, P]], indices: Callable[[], Iterable[int]]) -> Upcoming[P]:
    """``upcoming`` of an xdist worker: the matrix items among ``indices()`` (indices
    into ``session.items``; ``entries``: ``(index, nodeid, param)`` of the matrix
    items), in order; other tests in the queue are skipped. A queue that cannot be read
    gives no coming items (each item then runs its own case only)."""
    by_index = {i: (nodeid, param) for i, nodeid, param in entries}

    def upcoming(nodeid: str) -> list[tuple[str, P]]:
        try:
            queued = list(indices())
        except Exception:  # noqa: BLE001
            return []
        return [by_index[i] for i in queued if i in by_index]

    return upcoming


def ordered_upcoming(entries: Sequence[tuple[str, P]]) -> Upcoming[P]:
    """``upcoming`` of a serial run: the entries (``(nodeid, param)`` in
    ``session.items`` order) after ``nodeid``; all of them for a node id not among
    them."""
    position = {nodeid: k for k, (nodeid, _) in enumerate(entries)}

    def upcoming(nodeid: str) -> Iterable[tuple[str, P]]:
        return (entries[k] for k in range(position.get(nodeid, -1) + 1, len(entries)))

    return upcoming
