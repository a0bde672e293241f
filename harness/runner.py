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
import time
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
IDLE_SHARE = 0.15
"""The machine's idle CPU share (over the last :data:`IDLE_SAMPLE_S`) above which a spare
lane starts taking cases (:class:`CpuIdle`)."""
BUSY_SHARE = 0.05
"""The idle share below which a spare lane that takes cases stops taking them."""
IDLE_SAMPLE_S = 0.25
"""Seconds between two readings of the machine's CPU times; at most one spare lane starts
(or stops) taking cases per reading, so the loop grows and shrinks one lane at a time."""


class CpuIdle:
    """Whether the machine's cores idled lately: the share of CPU time spent idle between
    two readings of ``/proc/stat`` (Linux; every process on the machine counts, so a
    loaded machine never looks idle). Per reading, :meth:`grant` is True once when that
    share is above ``idle`` and :meth:`retire` once when it is below ``busy``; on a
    system without ``/proc/stat`` grant is never True."""

    def __init__(self, idle: float = IDLE_SHARE, busy: float = BUSY_SHARE, stat: str = "/proc/stat") -> None:
        self.idle, self.busy, self.stat = idle, busy, stat
        self._last: tuple[float, int, int] | None = None  # (monotonic s, idle ticks, all ticks)
        self._tokens: set[str] = set()  # what the last reading allows, not yet given

    def _ticks(self) -> tuple[int, int] | None:
        """(idle + iowait, all) CPU ticks since boot from the aggregate ``cpu`` line, or None."""
        try:
            with open(self.stat) as f:
                fields = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        return (fields[3] + fields[4], sum(fields)) if len(fields) >= 5 else None

    def _take(self, token: str) -> bool:
        now = time.monotonic()
        if self._last is None or now - self._last[0] >= IDLE_SAMPLE_S:
            ticks = self._ticks()
            if ticks is None:
                return False
            before, self._last = self._last, (now, *ticks)
            self._tokens = set()
            if before is not None and ticks[1] > before[2]:
                share = (ticks[0] - before[1]) / (ticks[1] - before[2])
                self._tokens = {"grant"} if share > self.idle else {"retire"} if share < self.busy else set()
        if token in self._tokens:
            self._tokens.discard(token)
            return True
        return False

    def grant(self) -> bool:
        """Whether a spare lane may start taking cases now (class docstring)."""
        return self._take("grant")

    def retire(self) -> bool:
        """Whether a spare lane taking cases should stop now (class docstring)."""
        return self._take("retire")


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

    def pending(self) -> bool:
        """Whether a case of the order is not taken yet."""
        return any(id(c) not in self._taken for c in itertools.islice(self._seqs[0], self._heads[0], None))


class CaseLoop:
    """Runs ``cases`` on ``explorer``'s session, ``jobs`` at a time, each against the
    golden run of its conversation, with ``pruner``'s strategy (module docstring).
    ``on_result`` sees each result once it is final; once ``stop(result)`` is True no
    further case starts (those in flight finish). ``replay_failures``: replays of each
    failing case. ``spare``: lanes beside the ``jobs`` slots that start a case only while
    the machine's cores idle (:class:`CpuIdle`: cases that wait on a provider's hold or
    a server leave the cores idle at ``jobs`` in flight); :attr:`peak` is the most spare
    lanes that took cases at once. Results are kept in case order (:attr:`results`)."""

    def __init__(self, explorer: Explorer, cases: list[Case], goldens: dict[str, GoldenRun], jobs: int,
                 pruner: Pruner, on_result: Callable[[CaseResult], None] | None = None, *,
                 stop: Callable[[CaseResult], bool] | None = None, replay_failures: int = 0,
                 spare: int = 0) -> None:
        self.explorer, self.cases, self.goldens, self.jobs = explorer, cases, goldens, jobs
        self.pruner, self.on_result, self.stop, self.replay_failures = pruner, on_result, stop, replay_failures
        self.spare = spare if jobs > 1 else 0
        self.index = {c.id: i for i, c in enumerate(cases)}
        self.slots: list[CaseResult | None] = [None] * len(cases)
        self.stopped = False
        self.taking = self.peak = 0  # spare lanes taking cases: now, at most

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
        """Run ``todo`` in :class:`CaseLanes` order: ``jobs`` slots, the waiting lanes and
        the spare lanes."""
        lanes, idle = CaseLanes(todo, self.jobs), CpuIdle()
        await asyncio.gather(*(self._lane(lanes, False) for _ in range(lanes.slots)),
                             *(self._lane(lanes, True) for _ in range(lanes.waiting_lanes)),
                             *(self._lane(lanes, False, idle) for _ in range(min(self.spare, len(todo)))))

    async def _lane(self, lanes: CaseLanes, waiting_lane: bool, idle: CpuIdle | None = None) -> None:
        """One lane: takes the next case it may start until none is left or the loop
        stops; a spare lane (``idle`` given) from a grant of ``idle`` until it retires."""
        taking = False
        while not self.stopped:
            # asked to stop (Ctrl-C, SIGTERM) but still here: a library swallowed the
            # CancelledError (Python 3.11's asyncio.wait_for, CPython gh-86296); the
            # request still stands (Task.cancelling), so no further case starts
            if (me := asyncio.current_task()) is not None and me.cancelling():
                raise asyncio.CancelledError
            if idle is not None:
                was, taking = taking, idle.grant() if not taking else not idle.retire()
                self.taking += taking - was
                self.peak = max(self.peak, self.taking)
                if not taking:
                    if not lanes.pending():
                        return
                    await asyncio.sleep(IDLE_SAMPLE_S)
                    continue
            case = lanes.take(waiting_lane)
            if case is None:
                self.taking -= taking
                return
            await self._run(lanes, case)

    async def _run(self, lanes: CaseLanes, case: Case) -> None:
        from .matrix import run_case_replayed

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
    options: PruneOptions | None = None, replay_failures: int = 0, spare: int = 0,
    peak: Callable[[int], None] | None = None,
) -> tuple[list[CaseResult], PruneSummary]:
    """Run ``cases`` ``jobs`` at a time (:class:`CaseLoop`), pruned as ``options`` say
    (default: the explorer's ``Options.prune``, else :class:`.pruning.PruneOptions`'
    defaults; :data:`.pruning.OFF`: every case runs whole). Results in case order,
    derived ones included; ``on_result`` sees each once it is final (a derived one when
    its representative ended, a sampled one once compared); once ``stop(result)`` is
    True no further case starts. A case that runs and fails is replayed up to
    ``replay_failures`` times (:func:`.matrix.run_case_replayed`); a member whose derived
    result fails runs whole instead (a failure is always shown by a run of its own, and
    a racy subject's is told flaky by its replays). ``spare``: lanes that start a case
    only while the cores idle (:class:`CaseLoop`); ``peak`` is told the most spare lanes
    that took cases at once, when the loop ends."""
    opts = options or explorer.options.prune or PruneOptions()
    pruner = Pruner(opts, cases, goldens)
    loop = CaseLoop(explorer, cases, goldens, jobs, pruner, on_result, stop=stop, replay_failures=replay_failures,
                    spare=spare)
    try:
        return await loop.run()
    finally:
        if peak is not None:
            peak(loop.peak)
