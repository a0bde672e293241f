"""The case loop: a list of cases run ``jobs`` at a time on one session, every matrix's.

:class:`CaseLoop` runs the cases in the order :class:`CaseLanes` takes them, each
through :func:`.matrix.run_case_replayed` (a failing case replayed), and hands each
result to the caller's ``on_result`` once it is final. What is pruned is the strategy's
(:class:`.pruning.Pruner`: which cases run, which results are derived, which run whole
after all); with pruning off the strategy runs every case and derives nothing.
:func:`run_loop` is the loop in one call: results in case order and the pruning
summary.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import coverage, faults
from .plan import Case
from .pruning import Pruner, PruneOptions, PruneSummary

if TYPE_CHECKING:
    from .case import CaseResult
    from .explorer import Explorer
    from .golden import GoldenRun

WAITING_LANES = 2
"""How many cases of a kind that mostly waits (``FaultKind.mostly_waits``: ``db-restart``,
``net``) run beside the ``jobs`` slots when ``jobs`` is more than 1."""


def _kind_flag(case: Case, flag: str) -> bool:
    return any(getattr(faults.KINDS.get(f.kind), flag, False) for f in case.plan.faults)


class CaseLanes:
    """The order a case loop takes ``cases`` in, and how many run at once.

    ``jobs`` slots take the cases in the order given; up to :data:`WAITING_LANES` more
    lanes (none when ``jobs`` is 1) take, in that order too, only the cases of a kind
    that mostly waits, so their waits overlap the other cases instead of trailing them
    (checkout's default matrix puts its sampled kinds last, and its last 13 s ran with
    the 2 cores half idle: docs/benchmarks.md); an order that puts them first
    (``selftest --fast``'s likely catchers) still has every slot on them. A case of a
    ``one_at_a_time`` kind never starts while another is in flight. ``take(waiting_lane)``
    returns the next case or None (nothing a worker of that sort may start now: it
    ends); ``done(case)`` after each."""

    def __init__(self, cases: list[Case], jobs: int) -> None:
        self._seqs = (list(cases), [c for c in cases if _kind_flag(c, "mostly_waits")])
        self._heads = [0, 0]
        self._serial = {id(c) for c in cases if _kind_flag(c, "one_at_a_time")}
        self._taken: set[int] = set()
        self._serial_busy = False
        self.slots = min(jobs, max(1, len(cases)))
        self.waiting_lanes = min(WAITING_LANES if jobs > 1 else 0, len(self._seqs[1]))

    def take(self, waiting_lane: bool) -> Case | None:
        which = int(waiting_lane)
        seq, taken = self._seqs[which], self._taken
        head = self._heads[which]
        while head < len(seq) and id(seq[head]) in taken:
            head += 1
        self._heads[which] = head
        for case in itertools.islice(seq, head, None):
            key = id(case)
            if key in taken or (key in self._serial and self._serial_busy):
                continue
            taken.add(key)
            if key in self._serial:
                self._serial_busy = True
            return case
        return None

    def done(self, case: Case) -> None:
        if id(case) in self._serial:
            self._serial_busy = False


class CaseLoop:
    """Runs ``cases`` on ``explorer``'s session, ``jobs`` at a time, each against the
    golden run of its conversation, with ``pruner``'s strategy (module docstring).
    ``on_result`` sees each result once it is final; once ``stop(result)`` is True no
    further case starts (those in flight finish). ``replay_failures``: replays of each
    failing case. Results are kept in case order (:attr:`results`)."""

    def __init__(self, explorer: Explorer, cases: list[Case], goldens: dict[str, GoldenRun], jobs: int,
                 pruner: Pruner, on_result: Callable[[CaseResult], None] | None = None, *,
                 stop: Callable[[CaseResult], bool] | None = None, replay_failures: int = 0) -> None:
        self.explorer, self.cases, self.goldens, self.jobs = explorer, cases, goldens, jobs
        self.pruner, self.on_result, self.stop, self.replay_failures = pruner, on_result, stop, replay_failures
        self.index = {c.id: i for i, c in enumerate(cases)}
        self.slots: list[CaseResult | None] = [None] * len(cases)
        self.stopped = False

    def emit(self, result: CaseResult) -> None:
        """``result`` is final: kept in its case's place, given to ``on_result``; the
        loop stops starting cases once ``stop`` says so."""
        self.slots[self.index[result.case.id]] = result
        if self.on_result:
            self.on_result(result)
        if self.stop is not None and self.stop(result):
            self.stopped = True

    def has(self, case_id: str) -> bool:
        """Whether ``case_id``'s result is final."""
        return self.slots[self.index[case_id]] is not None

    @property
    def results(self) -> list[CaseResult]:
        """The final results so far, in case order."""
        return [r for r in self.slots if r is not None]

    async def run(self) -> tuple[list[CaseResult], PruneSummary]:
        """The rounds: the cases the strategy runs; then the members it runs whole after
        all; then, after an unsound shared resume, the cases judged on one. Returns the
        results in case order and the strategy's summary. Cancelled (Ctrl-C, SIGTERM),
        raises ``CancelledError`` once the cases in flight have unwound."""
        await self.round([c for c in self.cases if self.pruner.runs(c)])
        whole = self.pruner.left_over(self)
        if whole and not self.stopped:
            await self.round(whole)
        again = self.pruner.reruns(self.cases, lambda case_id: self.slots[self.index[case_id]])
        if again is not None and not self.stopped:
            await self.round(again)
        results = self.results
        return results, self.pruner.finish(results)

    async def round(self, todo: list[Case]) -> None:
        """Run ``todo`` in :class:`CaseLanes` order: ``jobs`` slots and the waiting lanes."""
        lanes = CaseLanes(todo, self.jobs)
        await asyncio.gather(*(self._lane(lanes, False) for _ in range(lanes.slots)),
                             *(self._lane(lanes, True) for _ in range(lanes.waiting_lanes)))

    async def _lane(self, lanes: CaseLanes, waiting_lane: bool) -> None:
        """One slot: takes the next case it may start until none is left or the loop stops."""
        from .matrix import run_case_replayed

        while not self.stopped:
            # asked to stop (Ctrl-C, SIGTERM) but still here: a library swallowed the
            # CancelledError (Python 3.11's asyncio.wait_for, CPython gh-86296); the
            # request still stands (Task.cancelling), so no further case starts
            if (me := asyncio.current_task()) is not None and me.cancelling():
                raise asyncio.CancelledError
            case = lanes.take(waiting_lane)
            if case is None:
                return
            try:
                result = await run_case_replayed(self.explorer, case, self.goldens[case.conversation],
                                                 self.replay_failures, self.pruner.hook)
            finally:
                lanes.done(case)
            coverage.mark_not_run(result)
            self.pruner.over(result, self)


async def run_loop(
    explorer: Explorer, cases: list[Case], goldens: dict[str, GoldenRun], jobs: int,
    on_result: Callable[[CaseResult], None] | None = None, *, stop: Callable[[CaseResult], bool] | None = None,
    options: PruneOptions | None = None, replay_failures: int = 0,
) -> tuple[list[CaseResult], PruneSummary]:
    """Run ``cases`` ``jobs`` at a time (:class:`CaseLoop`), pruned as ``options`` say
    (default: the explorer's ``Options.prune``, else :class:`.pruning.PruneOptions`'
    defaults; :data:`.pruning.OFF`: every case runs whole). Results in case order,
    derived ones included; ``on_result`` sees each once it is final (a derived one when
    its representative ended, a sampled one once compared); once ``stop(result)`` is
    True no further case starts. A case that runs and fails is replayed up to
    ``replay_failures`` times (:func:`.matrix.run_case_replayed`); a member whose derived
    result fails runs whole instead (a failure is always shown by a run of its own, and
    a racy subject's is told flaky by its replays)."""
    opts = options or explorer.options.prune or PruneOptions()
    pruner = Pruner(opts, cases, goldens)
    return await CaseLoop(explorer, cases, goldens, jobs, pruner, on_result, stop=stop,
                          replay_failures=replay_failures).run()
