"""The controller's side of the workers: one zygote, many forked workers in flight.

:class:`WorkerPool` starts the zygote (:mod:`.zygote`) as a child in its own session,
sends it fork requests and turns its ``started``/``exit`` events into awaitables.
A worker that outlives its deadline is SIGKILLed and reported as timed out. A worker
whose fault stops it (SIGSTOP: pause, db-restart) is handed to the controller while it
sleeps, then woken (:meth:`WorkerPool.run`'s ``at_stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import HarnessError
from .history import Silence, has_fired
from .resident import Residents, eligible
from .services.process import proc_stat, sigkill_group
from .worker import Job

STOP_POLL_S = 0.005
"""How often a worker armed with a stopping fault is checked for having stopped (s)."""
STUCK_AFTER_S = 40.0
"""Seconds a worker may stay silent after its fault fired (no crash point passed, no
exit) before it is stuck: SIGKILLed and judged ``worker.stuck``, a failure of the
subject (``Options.stuck_after``). Above the longest wait a correct runtime's worker
makes here without a crash point (the DBOS adapter's 30 s for a cancelled workflow to
end by itself, a probe's 10 s bound, a reconnect's 5 s deadline), below the worker's
deadline (``Options.worker_timeout``, 60 s), which stays the harness's own bound. A
``term`` fault's worker is judged sooner: silent for its whole grace
(``Options.term_grace``, 10 s)."""
WATCH_POLL_S = 0.1
"""How often a faulted worker's progress is looked at (s)."""

_FORK_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("crashmatrix_fork_only", default=False)


@contextlib.contextmanager
def fork_only() -> Iterator[None]:
    """Within this block (and the tasks it starts), every job :meth:`WorkerPool.run`
    runs forks a worker of its own, as ``--fresh-workers`` would: a failing case's replay
    runs so, and then tells a failure of the subject from state other jobs left in a
    long-lived worker (:func:`.report.warm_process_note`)."""
    token = _FORK_ONLY.set(True)
    try:
        yield
    finally:
        _FORK_ONLY.reset(token)


@dataclass
class WorkerExit:
    """How one worker ended: ``returncode`` (exit) or ``signal`` (killed), wall seconds,
    whether the pool killed it for outliving ``timeout``, and its CPU time in ms."""

    pid: int
    returncode: int | None
    signal: int | None
    seconds: float
    timed_out: bool = False
    cpu_ms: float | None = None
    #: the job ran in a long-lived worker (:mod:`.resident`), not a process of its own
    resident: bool = False
    #: a long-lived worker's: what the job left running, ended after it (tasks, timers:
    #: :func:`.resident.serve`), and how many jobs that process had run before it
    left: list[str] = field(default_factory=list)
    jobs_before: int = 0
    #: seconds the worker was silent after its fault before it was SIGKILLed as stuck
    #: (:class:`.history.Silence`), and the last crash point it passed; None: not stuck
    stuck_s: float | None = None
    last_point: str | None = None

    @property
    def live(self) -> bool:
        """The job ended and its process lives on (a long-lived worker's, not killed):
        its idle database sessions may stay (:meth:`.explorer.Explorer.quiesce`)."""
        return self.resident and self.signal is None and not self.timed_out

    def describe(self) -> str:
        if self.stuck_s is not None:
            return f"pid {self.pid}: stuck, silent {self.stuck_s:.1f} s after {self.last_point or 'its fault'}"
        if self.timed_out:
            return f"pid {self.pid}: killed after its deadline ({self.seconds:.1f} s)"
        if self.signal is not None:
            return f"pid {self.pid}: {signal.Signals(self.signal).name}"
        return f"pid {self.pid}: exit {self.returncode}"

    def to_dict(self) -> dict[str, Any]:
        out = {"pid": self.pid, "returncode": self.returncode, "signal": self.signal,
               "seconds": round(self.seconds, 4), "timed_out": self.timed_out, "cpu_ms": self.cpu_ms}
        if self.resident:
            out["resident"] = True
            out["jobs_before"] = self.jobs_before
        if self.left:
            out["left"] = self.left
        if self.stuck_s is not None:
            out["stuck_s"] = round(self.stuck_s, 2)
            out["last_point"] = self.last_point
        return out


class WorkerPool:
    """Forks workers through a preloaded zygote. Use as ``async with``."""

    def __init__(self, subject: str, workload: str, *, register_pgid: Any = None, preload: tuple[str, ...] = (),
                 python: str | None = None, pythonpath: tuple[str, ...] = (), residents_dir: str | None = None) -> None:
        self.subject = subject
        self.workload = workload
        self.preload = preload  # further subjects the zygote imports (one session, several subjects)
        #: the zygote's interpreter (a build's virtual environment: builds.py) and the
        #: directories put first on its PYTHONPATH (a build's source tree); default: ours
        self.python = python or sys.executable
        self.pythonpath = pythonpath
        self.register_pgid = register_pgid
        self.proc: asyncio.subprocess.Process | None = None
        self._token = 0
        self._started: dict[int, asyncio.Future[int]] = {}
        self._exited: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.zygote_pid: int | None = None
        self.pid: int | None = None  # the zygote's pid (= its process group), once started
        self.closed_cleanly = False  # the zygote exited after close(): nothing to clean
        #: the zygote re-executed itself lean (:func:`.zygote.serve`): the threads the
        #: subject's import started (``{"threads": [...], "stage": ...}``); None: preloaded
        self.lean: dict[str, Any] | None = None
        #: the subject's :attr:`~.adapter.Adapter.long_lived_workers` when the controller
        #: cannot import it (a subject in its own environment: its declarations come from
        #: a worker, :class:`.builds.EnvAdapter`); None: the registry's adapter says
        self.declared_long_lived: bool | None = None
        #: lines for the run's summary (a matrix's notes): how workers start, when unusual
        self.notes: list[str] = []
        #: long-lived workers for the jobs that may run in one (:mod:`.resident`), their
        #: own logs in ``residents_dir``; None: every job forks a worker of its own
        self.residents: Residents | None = None
        self.residents_dir = residents_dir
        if residents_dir is not None:
            self.residents = Residents(self)

    async def __aenter__(self) -> WorkerPool:
        env = zygote_env(self.python, self.pythonpath)
        self.proc = await asyncio.create_subprocess_exec(
            self.python, "-P", "-m", "crashmatrix.harness.zygote", self.subject, self.workload, *self.preload,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            start_new_session=True, limit=1 << 24,
        )
        self.pid = self.proc.pid
        if self.register_pgid is not None:
            self.register_pgid(self.proc.pid)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if not line:
            await self.proc.wait()
            where = "" if self.python == sys.executable else f", interpreter {self.python}"
            raise HarnessError(f"worker zygote exited with {self.proc.returncode} before it was ready (subject={self.subject!r}, "
                               f"workload={self.workload!r}{where}{', path ' + os.pathsep.join(self.pythonpath) if self.pythonpath else ''})")
        ready = json.loads(line)
        self.zygote_pid = ready["pid"]
        self.lean = ready.get("lean")
        if self.lean:
            self.notes.append(lean_note(self.subject, self.lean))
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.proc is None:
            return
        if self.residents is not None:
            await self.residents.close()
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
        self.proc = None
        self.closed_cleanly = True

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            token = event.get("token")
            if event["event"] == "started" and token in self._started:
                self._started.pop(token).set_result(event["pid"])
            elif event["event"] == "exit" and token in self._exited:
                self._exited.pop(token).set_result(event)
        err = HarnessError("worker zygote exited unexpectedly")
        for fut in [*self._started.values(), *self._exited.values()]:
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # retrieved here: an awaiting case still gets it

    async def spawn(self, job: Job, log_path: str) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        """Fork a worker for ``job``; return its pid and a future of its exit event."""
        return await self._fork({"op": "fork", "job": job.to_dict(), "log_path": log_path})

    async def spawn_resident(self, address: str, log_path: str) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        """Fork a long-lived worker that connects to ``address`` (:mod:`.resident`);
        return its pid and a future of its exit event."""
        return await self._fork({"op": "resident", "socket": address, "log_path": log_path})

    async def _fork(self, request: dict[str, Any]) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        assert self.proc is not None and self.proc.stdin is not None
        if self._reader is None or self._reader.done():
            raise HarnessError("worker zygote is gone; cannot fork more workers")
        self._token += 1
        token = self._token
        loop = asyncio.get_running_loop()
        self._started[token] = loop.create_future()
        self._exited[token] = loop.create_future()
        request["token"] = token
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        await self.proc.stdin.drain()
        exited = self._exited[token]
        pid = await self._started[token]
        return pid, exited

    async def run(self, job: Job, log_path: str, *, timeout: float, term_grace: float | None = None,
                  at_stop: Callable[[int], Awaitable[None]] | None = None,
                  stuck_after: float | None = None) -> WorkerExit:
        """Run ``job`` to its end. ``timeout``: seconds before the worker is SIGKILLed.
        ``term_grace``: after the worker reported firing a ``term`` fault, seconds it may
        take to drain before it is SIGKILLed (docs/design.md: ``term``). ``at_stop(pid)``:
        for a fault that stops the worker (SIGSTOP), awaited once the worker reported
        firing and is stopped; then the worker gets SIGCONT and ``timeout`` seconds
        afresh. If ``at_stop`` raises, the worker is SIGKILLed and reaped and the error
        propagates. ``seconds`` counts from the fork, the stop included. A job that may
        run in a long-lived worker (:func:`.resident.eligible`, without ``term_grace``)
        runs in one when the pool has them and one is free (and not inside :func:`fork_only`),
        stopped and woken there alike.

        ``stuck_after``: once the fault fired (and a stopped worker was woken), a worker
        silent that long (:class:`.history.Silence`: no crash point passed, no exit) is
        SIGKILLed and reported stuck (``stuck_s``, ``last_point``); so is a ``term_grace``
        worker silent for its whole grace. None: not watched (the deadline only)."""
        if (self.residents is not None and term_grace is None and not _FORK_ONLY.get()
                and eligible(job, self.declared_long_lived)):
            assert self.residents_dir is not None
            done = await self.residents.run(job, log_path, timeout=timeout, log_dir=self.residents_dir,
                                            stuck_after=stuck_after, at_stop=at_stop)
            if done is not None:
                return done
        t0 = time.monotonic()
        pid, exited = await self.spawn(job, log_path)
        watch = JobWatch(job, timeout, term_grace=term_grace, at_stop=at_stop, stuck_after=stuck_after)

        async def ended(wait: float) -> bool:
            await wait_done(exited, wait)
            return exited.done()

        try:
            if not await watch.follow(pid, t0, ended):
                sigkill_group(pid)
        except BaseException:
            if watch.killed:  # at_stop raised: the worker is reaped before the error goes on
                await exited
            raise
        event = await exited
        out = WorkerExit(pid, event["returncode"], event["signal"], time.monotonic() - t0, watch.timed_out,
                         event.get("cpu_ms"))
        watch.mark(out)
        return out


class JobWatch:
    """The controller's watch over one job's worker, forked (:meth:`WorkerPool.run`) or
    long-lived (:meth:`.resident.Residents.run`): its deadline (``timeout`` seconds), the
    hand-over of a worker a stopping fault stopped (``at_stop``), the drain of a ``term``
    fault (``term_grace`` seconds) and the stuck watch (``stuck_after`` seconds), as
    :meth:`WorkerPool.run` documents them. :meth:`follow` polls; the caller kills and
    reaps, since only it knows how its worker ends."""

    def __init__(self, job: Job, timeout: float, *, term_grace: float | None = None,
                 at_stop: Callable[[int], Awaitable[None]] | None = None,
                 stuck_after: float | None = None) -> None:
        self.result_path = job.result_path
        self.timeout = timeout
        self.term_grace = term_grace
        self.at_stop = at_stop
        self.silence = Silence(job.result_path, stuck_after) if stuck_after is not None else None
        #: it outlived its deadline
        self.timed_out = False
        #: seconds it was silent when found stuck; None: not stuck
        self.stuck_s: float | None = None
        #: ``at_stop`` raised and the worker was SIGKILLed
        self.killed = False

    async def follow(self, pid: int, t0: float, ended: Callable[[float], Awaitable[bool]]) -> bool:
        """Watch worker ``pid`` (started at ``t0``, monotonic seconds) until its job ends:
        True; or until it must be SIGKILLed, past its deadline (:attr:`timed_out`) or
        silent (:attr:`stuck_s`): False, the worker not yet killed. ``ended(wait)``
        waits up to ``wait`` seconds for the job's end and says whether it ended. When
        ``at_stop`` raises, the worker is SIGKILLed (:attr:`killed`) and the error
        propagates."""
        deadline = t0 + self.timeout
        fired_at: float | None = None
        watch = self.silence
        while True:
            now = time.monotonic()
            if self.at_stop is not None and has_fired(self.result_path) and stopped(pid):
                try:
                    await self.at_stop(pid)
                except BaseException:
                    sigkill_group(pid)
                    self.killed = True
                    raise
                self.at_stop = None
                wake(pid)
                deadline = time.monotonic() + self.timeout
                if watch is not None:  # its silence counts from the wake, not from the stop
                    watch.start(time.monotonic())
                continue
            if self.term_grace is not None and fired_at is None and has_fired(self.result_path):
                fired_at = now
            if (watch is not None and watch.since is None and self.at_stop is None
                    and (fired_at is not None or has_fired(self.result_path))):
                watch.start(now)
            if watch is not None and watch.since is not None and watch.check(now):
                self.stuck_s = watch.silent_s(now)
                return False
            limit = deadline if fired_at is None or self.term_grace is None else min(deadline, fired_at + self.term_grace)
            if now >= limit:
                if fired_at is not None and watch is not None and watch.since is not None and not watch.progressed:
                    self.stuck_s = watch.silent_s(now)  # silent for the whole grace: stuck, not a slow drain
                else:
                    self.timed_out = True
                return False
            poll = (STOP_POLL_S if self.at_stop is not None else 0.05 if self.term_grace is not None
                    else WATCH_POLL_S if watch is not None else limit - now)
            if await ended(max(0.0, min(limit - now, poll))):
                return True

    def mark(self, out: WorkerExit) -> None:
        """Note on ``out`` that its worker was stuck, and the last point it passed."""
        if self.stuck_s is not None and self.silence is not None:
            out.stuck_s, out.last_point = self.stuck_s, self.silence.last_point()


def zygote_env(python: str, pythonpath: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment a zygote (or a probe of its interpreter) starts with: ours, with
    ``PYTHONHASHSEED=0``, without our ``PYTHONPATH`` when ``python`` is another
    interpreter (its environment is what it holds), and ``pythonpath`` first."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if python != sys.executable:
        env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    return env


def lean_note(subject: str, lean: dict[str, Any]) -> str:
    """The summary's line for a lean zygote: which import started which threads, and
    how workers start instead."""
    threads = ", ".join(repr(t) for t in lean.get("threads", ())) or "?"
    return (f"workers import the {lean.get('stage') or 'subject ' + subject} after their fork: its import starts "
            f"threads ({threads}), and a process with threads is not forked from; each worker (a long-lived one "
            f"once) imports it itself")


async def wait_done(fut: asyncio.Future[object], timeout: float) -> None:
    """Wait until ``fut`` is done or ``timeout`` seconds passed, whichever is first; ``fut``
    is left as it is (not cancelled on timeout). Cancelling the caller raises
    ``CancelledError`` here even when ``fut`` finished in the same loop iteration:
    ``asyncio.wait_for(asyncio.shield(fut), timeout)`` returns the result then, and the
    cancellation (Ctrl-C, SIGTERM) is lost, in Python 3.11 (CPython gh-86296, fixed by
    3.12's rewrite); a controller that lost it ran on and never stopped."""
    await asyncio.wait((fut,), timeout=timeout)


def stopped(pid: int) -> bool:
    """True when ``pid`` is stopped (SIGSTOP): state ``T`` (or ``t``) in /proc/PID/stat."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] in (b"T", b"t")


def wake(pid: int) -> None:
    """SIGCONT ``pid``, a worker a stopping fault stopped (gone already: nothing)."""
    _signal(pid, signal.SIGCONT)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
