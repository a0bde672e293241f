"""Cases run ahead of pytest: a matrix's items, serially or under xdist, in the CLI's case loop.

pytest runs one item at a time per process; the plugin runs a marked test's cases in
``crashmatrix run``'s case loop (:func:`.runner.run_loop`: its lanes, spare lanes and
crash-state pruning of kill cases) on the harness session's event loop, and each item
takes its case's final result when it runs (:class:`Batch`), so output, ``-x``, ``-k``
and the reports are as without it. Serially, one loop runs the matrix's selected items.
Under pytest-xdist no worker knows in advance which items it will run (the controller
sends more as they finish, and may take some back), so the first S workers each run a
fixed share of every matrix by crash state, whatever items they are sent, and every
worker's items take the final results through files (:class:`Exchange`).

The run's ``jobs`` (default twice the cores) is the machine's budget: the share workers
divide it (:func:`worker_jobs`), so ``-n N`` keeps as many cases in flight as a serial
run; S is one worker per :data:`JOBS_PER_SHARE` jobs (:func:`share_workers`), so a
machine that one harness session keeps busy runs one, and the other workers add no
harness session of their own (its start, golden runs and contention) (docs/plugin.md;
``benchmarks/bench_plugin.py jobs``).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pickle
import re
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

FINISH_S = 900.0
"""How long a session's end waits for a matrix's case loop to finish by itself."""

JOBS_PER_SHARE = 8
"""Cases in flight one xdist worker's share keeps by default (:func:`share_workers`):
one harness session's controller (its explorer and oracle, in the pytest process) is
about a fifth of a case's CPU (docs/benchmarks.md, "Where the CPU goes": 6.4 of 38.4
ms on checkout's default matrix), so one session keeps about four cores busy, two cases
in flight a core; another session on the same cores adds its start, its golden runs
and contention, not throughput."""


class Batch:
    """The cases of one matrix's items (in an xdist worker, its share of them), run by
    one case loop (the CLI's, :func:`.runner.run_loop`, with its crash-state pruning),
    each item taking its case's final result when it runs.

    ``ids``: the case ids the loop runs. The loop reports each final result with
    :meth:`emit` (from any thread) and its end with :meth:`ended` (a loop that raised or
    was cancelled ends too: the items still to come then run their own cases).
    :meth:`take` gives a case's result once (None: not in this batch, taken already, or
    the loop ended without it)."""

    def __init__(self, ids: Iterable[str]) -> None:
        self._results: dict[str, concurrent.futures.Future[Any]] = {i: concurrent.futures.Future() for i in ids}
        self._taken: set[str] = set()
        #: the loop's own future (:meth:`attach`), ended by :meth:`close`
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

    def close(self, cancel: bool) -> None:
        """At the session's end: ``cancel`` (the run stopped early: ``-x``, Ctrl-C) the
        loop's cases in flight unwind, waited for up to 30 s; else the loop is let
        finish (its summary; in an xdist worker, the share other workers' items wait
        for), waited for up to :data:`FINISH_S`, then cancelled."""
        if self.loop is not None:
            if not cancel:
                concurrent.futures.wait([self.loop], timeout=FINISH_S)
            self.loop.cancel()
            concurrent.futures.wait([self.loop], timeout=30)
        self.ended()


class Exchange:
    """The final results of one matrix's cases in an xdist run, shared between the
    workers through files: share worker K of N (:func:`share_workers`) runs the K-th
    share of the matrix by crash state (:func:`.pruning.shard_by_crash_state`) in a
    :class:`Batch` of its own, whatever items xdist sends it, and :meth:`put` writes
    each result; an item whose case is another share's, or any item of a worker without
    a share, waits for it there (:meth:`wait`).

    ``base``: this matrix's directory (in the run's, ``crashmatrix-xdist-<testrunuid>``,
    removed by the xdist controller when the run ends). Files: ``<share>.pid`` (the
    worker running that share, :meth:`claim`), ``<share>.done`` (its loop ended,
    :meth:`ended`), ``<sha1 of the case id>.pickle`` (a result, written whole then
    renamed)."""

    #: how long an item waits for a share no worker has claimed (a worker that died
    #: before its first item) before running its case itself
    UNCLAIMED_S = 120.0
    POLL_S = 0.05

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)

    def _path(self, case_id: str) -> Path:
        return self.base / f"{hashlib.sha1(case_id.encode()).hexdigest()}.pickle"

    def claim(self, share: int) -> None:
        """This process runs ``share``."""
        (self.base / f"{share}.pid").write_text(str(os.getpid()))

    def put(self, case_id: str, result: Any) -> None:
        """``case_id``'s final result, pickled (the plugin's: a
        :class:`~.case.CaseResult` with what the report needs of the session that ran
        it)."""
        path = self._path(case_id)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(result))
        os.replace(tmp, path)

    def ended(self, share: int) -> None:
        """``share``'s loop is over: a case it wrote no result of is its item's to run."""
        (self.base / f"{share}.done").touch()

    def wait(self, case_id: str, shares: Collection[int]) -> Any:
        """``case_id``'s result from the worker running one of ``shares`` (its own
        share when known, else every share of the run), waiting for it; None when
        those shares' loops all ended without it, a worker of one of them died, or one
        of them was not claimed within :data:`UNCLAIMED_S` (the item then runs its case
        itself)."""
        from .services.process import pid_alive

        path, since = self._path(case_id), time.monotonic()
        while True:
            if path.exists():
                return pickle.loads(path.read_bytes())
            running = [k for k in shares if not (self.base / f"{k}.done").exists()]
            if not running:
                return pickle.loads(path.read_bytes()) if path.exists() else None
            for k in running:
                try:
                    owner = int((self.base / f"{k}.pid").read_text())
                except (OSError, ValueError):
                    owner = None
                if owner is None and time.monotonic() - since > self.UNCLAIMED_S:
                    return None
                if owner is not None and not pid_alive(owner):
                    return None
            time.sleep(self.POLL_S)


def wait(future: concurrent.futures.Future[Any]) -> Any:
    """``future.result()``; on any exception while waiting (a Ctrl-C included) the
    case's coroutine is cancelled first."""
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def share_workers(jobs: int, workercount: int, sessions: int | None = None) -> int:
    """How many of ``workercount`` xdist workers run a share of each matrix (a harness
    session each) with the run's ``jobs``: ``sessions`` when set, else one per
    :data:`JOBS_PER_SHARE` jobs, at least one; at most the workers, and at most
    ``jobs // 2`` (a share keeps two cases in flight or more). 0 with fewer than two
    jobs: every worker's items then run their own cases, one at a time."""
    if jobs < 2:
        return 0
    wanted = sessions if sessions else jobs // JOBS_PER_SHARE
    return max(1, min(wanted, max(1, workercount), jobs // 2))


def worker_jobs(jobs: int, shares: int, index: int) -> int:
    """The cases in flight of share ``index`` (0-based) of ``shares``: ``jobs //
    shares``, one more for the first ``jobs % shares`` shares, so they add up to
    ``jobs``; at least 1."""
    n = max(1, shares)
    return max(1, jobs // n + (index < jobs % n))


def worker_index(workerid: str, workercount: int) -> int:
    """The 0-based index of xdist worker ``workerid`` (``gw0``, ``gw1``...) among
    ``workercount`` (a restarted worker's higher number taken modulo the count; an id
    without a number: the last)."""
    n = max(1, workercount)
    m = re.fullmatch(r"\D*(\d+)", workerid)
    return int(m.group(1)) % n if m else n - 1


def xdist_run_dir(testrunuid: str) -> Path:
    """The directory the workers of xdist run ``testrunuid`` share results in
    (:class:`Exchange`), beside their shared PostgreSQL's (:mod:`.services.sharedpg`)."""
    from .services.sharedpg import run_dir

    return run_dir(testrunuid) / "results"
