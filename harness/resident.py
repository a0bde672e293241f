"""Long-lived workers: one process runs many jobs, one at a time, as a production worker
resumes many runs (docs/design.md, "Long-lived workers").

A forked worker pays for its fork before it runs a step: the copy-on-write faults of a
preloaded interpreter touching its heap (~1,400-1,700 pages), the first use of its
caches, the exit. Measured on one resume of a completed checkout run (docs/benchmarks.md,
"Long-lived workers"): ~13 ms of CPU in a forked worker, ~2 ms as the next job of a
process that already ran one. So every job that need not die with its fault runs in a
*resident*: a worker forked once from the zygote (``op`` ``resident``,
:mod:`.zygote`) that connects to the controller's socket and runs the jobs it is handed,
each in the same event loop (an ``asyncio.Runner`` kept from job to job), through the same
:func:`.worker.run_job` a forked worker runs. Which jobs (:func:`eligible`): fault-free
starts and resumes, the runtime's own recovery, and faults the worker outlives (a
cancellation, a toxic: :attr:`.faults.FaultKind.survives`) or wakes from with its links
as they were (a pause, the runtime's cancel, a restore: :attr:`.faults.Stops.wakes_intact`;
the pool hands the stopped resident to the kind and wakes it, as it does a forked
worker), and each resumer of a concurrent round (its start gate and hold are files:
:func:`.worker.wait_at_gate`; the round's resumers run in residents of their own, or fork
when none is free). A kill, a SIGTERM, a freeze, a db-restart (its server restarts
under the process), a golden run (its I/O is measured per process) and an await-point
trace (a task factory on the loop) still fork a worker of their own.

A resident is a production worker's process: what a runtime keeps there on purpose (a
connection pool, a keep-alive HTTP session, a cache, a housekeeping thread) stays from
job to job, and the controller's wait for a job's database sessions to end counts only
the sessions that are not idle (:meth:`.explorer.Explorer.quiesce`: an idle pooled
connection has nothing in flight). What a job leaves *running* is ended as a forked
worker's exit would have ended it, so that it acts in no other case: tasks still pending
when the job returned are cancelled and run to their end (as ``asyncio.run`` does), and
timers it scheduled that have not fired are cancelled; both are named in the job's
answer (``left``, kept in the case's worker record). A runtime's state that changes what
the next run does is judged by the ``warm-worker`` resume policy (:mod:`.policies`).

Protocol: the resident connects to the controller's abstract Unix socket (its address in
the zygote's request); the controller knows it by its pid (``SO_PEERCRED``). Controller ->
resident: ``{"job": {...}, "log_path": str}`` per line; resident -> controller, when the
job ended: ``{"returncode": int, "cpu_ms": float, "left": [str, ...]}``. EOF on its
socket ends a resident (after :data:`JOBS_PER_RESIDENT` jobs, or when the pool closes); so does the zygote's
end (``PR_SET_PDEATHSIG``). A resident that dies in a job (the subject's ``os._exit``, a
crash) or outlives the job's deadline (then SIGKILLed) is reported as a forked worker
would be, from the zygote's exit event, and replaced by the next job's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the resident imports this module after its fork: the controller's types stay lazy
    from .pool import WorkerExit, WorkerPool
    from .worker import Job


class HeldRun(Protocol):
    """The runner of a resident held for one case (:meth:`Residents.dedicated`): runs
    ``job`` there, ``at_stop`` as :meth:`Residents.run`'s."""

    def __call__(self, job: Job, log: str, timeout: float,
                 at_stop: Callable[[int], Awaitable[None]] | None = None) -> Awaitable[WorkerExit]: ...


RESIDENTS_MAX = 16
"""Residents one pool keeps at most; a job that finds none free beyond that forks. Two a
lane of the most a matrix runs at once (the default lanes and as many spare ones,
:mod:`.runner`): a case may hold two at a time (a paused worker and its successor, a
concurrent round's resumers)."""
JOBS_PER_RESIDENT = 1000
"""Jobs after which a resident is retired and the next job gets a new one (as a worker
pool's max-tasks-per-child: whatever a runtime's process-wide state grows by, a long
matrix does not grow it without bound)."""


def eligible(job: Job, long_lived: bool | None = None) -> bool:
    """Whether ``job`` may run in a resident (module docstring): a start, resume or
    recovery with no I/O measure or await-point trace, whose faults (if any)
    the worker outlives (:func:`_outlives`), of a subject whose adapter declares it may
    (:attr:`.adapter.Adapter.long_lived_workers`; ``long_lived``: that declaration as a
    worker reported it, for a subject the controller does not import)."""
    from . import faults, registry

    if job.role not in ("start", "resume", "recover") or job.record_io or job.await_points:
        return False
    if long_lived is None:
        long_lived = bool(getattr(registry.subject(job.subject), "long_lived_workers", False))
    if not long_lived:
        return False
    return all(_outlives(faults.kind(f.kind)) for f in job.plan.faults)


def _outlives(kind: object) -> bool:
    """Whether a worker outlives a fault of ``kind`` with its process fit for the next
    job: it carries on (:attr:`.faults.FaultKind.survives`) or wakes from its stop with
    its links intact (:attr:`.faults.Stops.wakes_intact`)."""
    return bool(getattr(kind, "survives", False) or getattr(kind, "wakes_intact", False))


# -- the resident (worker side) -----------------------------------------------------------


def serve(address: str, *, lean: bool = False) -> int:
    """Run in a worker forked by the zygote (its logs and signals set up as any
    worker's): connect to the controller at ``address`` and run each job it sends
    (module docstring) until EOF or a reason to retire. ``lean``: forked from a lean
    zygote, it imports each job's workload and subject itself before the job
    (:func:`.zygote.import_after_fork`; once: the registry keeps them). Returns the exit
    code (0)."""
    from .worker import Job, run_job
    from .zygote import import_after_fork

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    requests = conn.makefile("rb")
    runner = asyncio.Runner()
    runner.get_loop()  # its selector and self-pipe exist before the first job's baseline
    resident_log = os.dup(1)
    while True:
        line = requests.readline()
        if not line:
            return 0
        request = json.loads(line)
        job = Job.from_dict(request["job"])
        _log_to(request["log_path"])
        if lean:  # before the job's CPU is counted
            import_after_fork(request["job"])
        timers, cpu0 = _timers(runner), _cpu_ms()
        returncode = run_job(job, runner)
        left = _end_what_runs(runner, timers)
        answer = {"returncode": returncode, "cpu_ms": round(_cpu_ms() - cpu0, 2), "left": left}
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(resident_log, 1)
        os.dup2(resident_log, 2)
        conn.sendall(json.dumps(answer).encode() + b"\n")


def _log_to(path: str) -> None:
    """Send stdout and stderr to the job's log (as a forked worker's go to its own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _timers(runner: asyncio.Runner) -> set[asyncio.TimerHandle]:
    """The loop's timers not yet fired (``loop.call_later``/``call_at``; CPython's
    ``BaseEventLoop._scheduled``: an empty set where a loop keeps them elsewhere)."""
    return {h for h in getattr(runner.get_loop(), "_scheduled", ()) if not h.cancelled()}


def _name(callback: object) -> str:
    """``module:qualname`` of a task's coroutine or a timer's callback."""
    target = getattr(callback, "__func__", callback)
    frame = getattr(target, "cr_frame", None)  # a coroutine: its module is its frame's
    module = frame.f_globals.get("__name__", "?") if frame is not None else getattr(target, "__module__", "?")
    return f"{module}:{getattr(target, '__qualname__', type(target).__name__)}"


def _end_what_runs(runner: asyncio.Runner, timers: set[asyncio.TimerHandle]) -> list[str]:
    """End what the job left running, as a forked worker's exit would have: cancel the
    tasks still pending and run them to their end (``asyncio.run``'s close does the
    same), and cancel the timers it scheduled (``timers``: the loop's before the job).
    Returns what was ended, ``task module:qualname`` / ``timer module:qualname``."""
    loop = runner.get_loop()
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    left = [f"task {_name(t.get_coro())}" for t in tasks]
    if tasks:
        for task in tasks:
            task.cancel()

        async def gather() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)

        runner.run(gather())
    for handle in _timers(runner) - timers:
        left.append(f"timer {_name(handle._callback)}")  # noqa: SLF001 - what the timer would call
        handle.cancel()
    return left


# -- the controller's side ----------------------------------------------------------------


@dataclass
class _Resident:
    pid: int
    subject: str
    exited: asyncio.Future[dict[str, Any]]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    jobs: int = 0
    #: the runs it has run a job of: it never runs another job of one of them
    runs: set[str] = field(default_factory=set)


class Residents:
    """The long-lived workers of one :class:`.pool.WorkerPool` (module docstring): started
    on demand through the pool's zygote, at most :data:`RESIDENTS_MAX`, one subject each
    (a resident never runs two subjects' jobs: one's leftovers must not reach another's
    verdicts), reused most recently freed first, never for a run it ran a job of before
    (a resume is another machine: a cancelled worker's process does not resume its run)."""

    def __init__(self, pool: WorkerPool, limit: int = RESIDENTS_MAX) -> None:
        self.pool = pool
        self.limit = limit
        self.address = f"\0crashmatrix-resident-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._server: asyncio.AbstractServer | None = None
        self._listening = asyncio.Lock()
        self._connected: dict[int, asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._free: list[_Resident] = []
        self._count = 0  # residents alive (free or busy)
        self.started = 0  # residents started so far (for reports and tests)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        from .services.process import proc_stat

        stat = proc_stat(pid)
        if stat is None or stat[1] != self.pool.zygote_pid:  # not a worker of this pool's zygote
            writer.close()
            return
        # it may connect before the zygote's "started" event told _start its pid
        waiter = self._connected.setdefault(pid, asyncio.get_running_loop().create_future())
        if waiter.done():
            writer.close()
            return
        waiter.set_result((reader, writer))

    async def _start(self, subject: str, log: str) -> _Resident:
        async with self._listening:  # two cases may start the first residents at once
            if self._server is None:
                self._server = await asyncio.start_unix_server(self._on_connect, self.address)
        pid, exited = await self.pool.spawn_resident(self.address, log)
        waiter = self._connected.setdefault(pid, asyncio.get_running_loop().create_future())
        try:
            done, _ = await asyncio.wait((waiter, exited), timeout=30, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._connected.pop(pid, None)
        if waiter not in done:
            from .errors import HarnessError
            from .services.process import sigkill_group

            sigkill_group(pid)
            await exited
            raise HarnessError(f"a long-lived worker (pid {pid}) did not connect to the controller; its log: {log}")
        reader, writer = waiter.result()
        self.started += 1
        return _Resident(pid, subject, exited, reader, writer)

    async def run(self, job: Job, log: str, *, timeout: float, log_dir: str,
                  stuck_after: float | None = None,
                  at_stop: Callable[[int], Awaitable[None]] | None = None) -> WorkerExit | None:
        """Run ``job`` in a resident for its subject (a free one, or one started now);
        None when :data:`RESIDENTS_MAX` are busy (the caller forks). ``timeout``: seconds
        before the resident is SIGKILLed and the job reported timed out. ``log_dir``:
        where a new resident's own log goes. ``stuck_after`` and ``at_stop``: as
        :meth:`.pool.WorkerPool.run`'s (a job silent that long after its fault fired is
        SIGKILLed and reported stuck; a job whose fault stops its process is handed to
        ``at_stop(pid)`` while it sleeps, then woken)."""
        # a resume is another machine (docs/adapters.md): never the process that ran the run
        # before (a cancelled worker's), where what the runtime kept in memory would stand
        # in for what its store holds
        resident = next((r for r in reversed(self._free) if r.subject == job.subject and job.run_id not in r.runs), None)
        if resident is not None:
            self._free.remove(resident)
        else:
            if self._count >= self.limit:
                if not self._free:  # every resident is busy
                    return None
                self._free.pop(0).writer.close()  # a free one of another subject makes room (EOF ends it)
                self._count -= 1
            resident = await self._new(job.subject, log_dir)
        try:
            exit_, ended = await self._run_on(resident, job, log, timeout, stuck_after, at_stop)
        except BaseException:
            self._end(resident)
            raise
        if ended is None:
            self._free.append(resident)
        else:
            self._end(resident)
        return exit_

    @contextlib.asynccontextmanager
    async def dedicated(self, subject: str, log_dir: str) -> AsyncIterator[HeldRun]:
        """A resident of its own for ``subject``, started now and ended on exit (never
        handed to another job): ``async with residents.dedicated(...) as run:`` then
        ``await run(job, log, timeout)`` for each job, one after another, all in the
        same process (the ``warm-worker`` resume policy, :mod:`.policies`;
        ``run(job, log, timeout, at_stop)`` takes :meth:`run`'s ``at_stop`` too). Raises
        :class:`.errors.HarnessError` from ``run`` once the resident is gone (it died or
        outlived a deadline: the reason is in the message)."""
        from .errors import HarnessError

        resident = await self._new(subject, log_dir)
        gone: list[str] = []

        async def run(job: Job, log: str, timeout: float,
                      at_stop: Callable[[int], Awaitable[None]] | None = None) -> WorkerExit:
            if gone:
                raise HarnessError(f"the long-lived worker (pid {resident.pid}) is gone: {gone[0]}")
            exit_, ended = await self._run_on(resident, job, log, timeout, at_stop=at_stop)
            if ended is not None:
                gone.append(ended)
            return exit_

        try:
            yield run
        finally:
            self._end(resident)

    async def _new(self, subject: str, log_dir: str) -> _Resident:
        self._count += 1
        try:
            return await self._start(subject, os.path.join(log_dir, f"resident-{self.started + 1}.log"))
        except BaseException:
            self._count -= 1
            raise

    def _end(self, resident: _Resident) -> None:
        """Let ``resident`` go: EOF on its socket ends it (if it is still there)."""
        self._count -= 1
        resident.writer.close()

    async def _run_on(self, resident: _Resident, job: Job, log: str, timeout: float,
                      stuck_after: float | None = None,
                      at_stop: Callable[[int], Awaitable[None]] | None = None) -> tuple[WorkerExit, str | None]:
        """Run ``job`` on ``resident``: its exit as a worker's, and why the resident may
        not run another job (it died or was killed for its deadline or as stuck; it ran
        :data:`JOBS_PER_RESIDENT`), None when it may. ``at_stop``: as :meth:`run`'s; the
        deadline starts again when the resident is woken, and so does the stuck watch.
        Raising (the caller's cancellation, ``at_stop``'s error) SIGKILLs it."""
        from .pool import JobWatch, WorkerExit
        from .services.process import sigkill_group

        t0 = time.monotonic()
        watch = JobWatch(job, timeout, at_stop=at_stop, stuck_after=stuck_after)
        try:
            resident.writer.write(json.dumps({"job": job.to_dict(), "log_path": log}).encode() + b"\n")
            await resident.writer.drain()
            answer = asyncio.ensure_future(resident.reader.readline())

            async def ended(wait: float) -> bool:
                done, _ = await asyncio.wait((answer, resident.exited), timeout=wait,
                                             return_when=asyncio.FIRST_COMPLETED)
                return bool(done)

            try:
                finished = await watch.follow(resident.pid, t0, ended)
            finally:
                if not answer.done():
                    answer.cancel()
            resident.jobs += 1
            resident.runs.add(job.run_id)
            line = answer.result() if finished and answer.done() and not answer.cancelled() else b""
            if line:
                reply = json.loads(line)
                retire = f"ran {resident.jobs} jobs" if resident.jobs >= JOBS_PER_RESIDENT else None
                return WorkerExit(resident.pid, int(reply["returncode"]), None, time.monotonic() - t0,
                                  cpu_ms=reply.get("cpu_ms"), resident=True, left=list(reply.get("left") or ()),
                                  jobs_before=resident.jobs - 1), retire
            if not finished:
                sigkill_group(resident.pid)
            event = await resident.exited  # it died in the job, or was killed for its deadline or as stuck
            exit_ = WorkerExit(resident.pid, event["returncode"], event["signal"], time.monotonic() - t0,
                               watch.timed_out, event.get("cpu_ms"), resident=True, jobs_before=resident.jobs - 1)
            watch.mark(exit_)
            return exit_, exit_.describe()
        except BaseException:
            sigkill_group(resident.pid)
            raise

    async def close(self, timeout: float = 5.0) -> None:
        """End every free resident (EOF on its socket) and wait up to ``timeout`` seconds
        for the zygote to reap them (then their CPU is counted among its children); stop
        listening. Busy ones end with their pool's zygote."""
        ending = [r.exited for r in self._free]
        for resident in self._free:
            resident.writer.close()
        self._free.clear()
        self._count -= len(ending)
        if ending:
            await asyncio.wait(ending, timeout=timeout)
        if self._server is not None:
            self._server.close()
            self._server = None
