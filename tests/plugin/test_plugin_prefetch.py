"""The plugin's run-ahead logic (harness/plugin_prefetch.py): a matrix's case loop
giving each item its case's result once (futures stand in for the loop), the results
xdist workers exchange through files, and the jobs shared among xdist workers. The
real runs, serial and ``-n 2``, are tests/plugin/test_plugin_matrix.py's."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crashmatrix.harness.plugin_prefetch import Batch, Exchange, share_workers, worker_index, worker_jobs


@pytest.mark.parametrize("jobs, workers, sessions, shares", [
    (4, 2, None, 1),  # two cores' default: one harness session keeps them busy
    (16, 4, None, 2), (32, 8, None, 4), (32, 2, None, 2),  # one share per 8 jobs, at most the workers
    (4, 2, 2, 2), (4, 3, 3, 2),  # asked for: at most jobs // 2 (a share keeps 2 in flight or more)
    (2, 2, None, 1), (1, 2, None, 0), (1, 2, 2, 0),  # one job: no shares, each item runs its own case
])
def test_share_workers_one_per_eight_jobs(jobs: int, workers: int, sessions: int | None, shares: int) -> None:
    assert share_workers(jobs, workers, sessions) == shares


@pytest.mark.parametrize("jobs, shares, each", [
    (4, 2, [2, 2]), (5, 2, [3, 2]), (4, 3, [2, 1, 1]), (8, 1, [8]), (16, 4, [4, 4, 4, 4]),
])
def test_jobs_are_divided_among_the_shares(jobs: int, shares: int, each: list[int]) -> None:
    assert [worker_jobs(jobs, shares, k) for k in range(shares)] == each


def test_a_batch_gives_each_case_its_loops_result_once() -> None:
    """A serial run's matrix: the loop emits results (the first counts), each item takes
    its case's once; a case the loop never gave a result by its end is its item's to run
    (None), and so is one not in the batch."""
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
    done = Batch(["a"])
    loop: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.attach(loop)
    done.emit("a", "result a")
    summary = SimpleNamespace(lines=lambda: ["kill: 1 points -> 1 crash states, all pass; sample 0/0 agree"])
    threading.Timer(0.05, lambda: loop.set_result(([], summary))).start()
    done.close(cancel=False)  # the run went to its end: waits for the loop's own end
    assert not loop.cancelled() and done.summary_lines() == summary.lines()

    partial = Batch(["a", "b"])
    running: concurrent.futures.Future[Any] = concurrent.futures.Future()
    # cancelled, the loop unwinds at once (as a run_coroutine_threadsafe future is marked)
    running.add_done_callback(lambda f: f.cancelled() and f.set_running_or_notify_cancel())
    partial.attach(running)
    partial.emit("a", "result a")
    partial.close(cancel=True)  # -x after a: b's case is cancelled
    assert running.cancelled() and partial.take("b") is None


def test_exchange_gives_another_workers_result_or_none_once_it_cannot_come(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A result written by the share's worker is read whole (pickled); a case that share
    ended without is None at once; so is one whose worker died, and one of a share no
    worker claimed within UNCLAIMED_S."""
    mine, theirs = Exchange(tmp_path / "m"), Exchange(tmp_path / "m")
    theirs.claim(1)
    threading.Timer(0.1, lambda: theirs.put("checkout/conv1/kill@a#1", {"outcome": "pass"})).start()
    assert mine.wait("checkout/conv1/kill@a#1", [1]) == {"outcome": "pass"}
    theirs.ended(1)
    assert mine.wait("checkout/conv1/kill@b#1", [1]) is None
    assert not list((tmp_path / "m").glob("*.tmp"))  # written whole, then renamed

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "m" / "2.pid").write_text(dead.stdout.strip())  # a worker that died mid-share
    assert mine.wait("checkout/conv1/kill@c#1", [2]) is None

    monkeypatch.setattr(Exchange, "UNCLAIMED_S", 0.2)
    assert mine.wait("checkout/conv1/kill@d#1", [3]) is None
    (tmp_path / "m" / "4.pid").write_text(str(os.getpid()))  # claimed by a live worker: it waits
    threading.Timer(0.3, lambda: theirs.put("checkout/conv1/kill@e#1", "late")).start()
    assert mine.wait("checkout/conv1/kill@e#1", [4]) == "late"


def test_a_worker_without_a_share_waits_for_every_share(tmp_path: Path) -> None:
    """An item of a worker that runs no share waits on all of them: for its result from
    whichever share writes it, and until the last share has ended without it."""
    reader, share0, share1 = Exchange(tmp_path / "m"), Exchange(tmp_path / "m"), Exchange(tmp_path / "m")
    share0.claim(0)
    share1.claim(1)
    threading.Timer(0.1, lambda: share1.put("checkout/conv1/kill@a#1", "from share 1")).start()
    assert reader.wait("checkout/conv1/kill@a#1", range(2)) == "from share 1"
    share0.ended(0)
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(reader.wait, "checkout/conv1/kill@b#1", range(2))
    assert not concurrent.futures.wait([waiting], timeout=0.3).done  # share 1 still runs
    share1.ended(1)
    assert waiting.result(timeout=5) is None


def test_worker_index_is_the_gw_number_modulo_the_count() -> None:
    assert [worker_index(f"gw{k}", 3) for k in range(4)] == [0, 1, 2, 0]  # gw3: a restarted worker
    assert worker_index("odd", 2) == 1
