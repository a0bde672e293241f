"""The preloaded parent that forks workers (docs/design.md, "Processes").

A fresh interpreter costs ~0.3 s of imports; a fork of a preloaded one ~1 ms. The
controller starts this module once (``python -m crashmatrix.harness.zygote SUBJECT
WORKLOAD [SUBJECT ...]``); it imports the subject (and any further subjects one session
serves, as ``crashmatrix selftest`` does), the workload and their dependencies, then
serves fork requests. It has one thread, no event loop and no open sockets when it forks.

Protocol, JSON lines. Controller -> zygote on stdin:
``{"op": "fork", "token": int, "job": {...}, "log_path": str}`` (a worker that runs one
job and exits) or ``{"op": "resident", "token": int, "socket": str, "log_path": str}`` (a
long-lived worker that connects to the controller's Unix socket ``socket`` and runs the
jobs it is handed there, one at a time: :mod:`.resident`). Zygote -> controller on
stdout: ``{"event": "ready", "pid": int}`` once, then ``{"event": "started", "token",
"pid"}`` and ``{"event": "exit", "token", "pid", "returncode", "signal", "cpu_ms"}`` per worker
(``signal`` is the number that ended it, else null; ``cpu_ms`` its user + system CPU). EOF on stdin (the controller ended,
however it ended) makes the zygote SIGKILL every worker still alive, reap them and exit.

Each worker: its own process group; ``PR_SET_PDEATHSIG`` = SIGKILL so it cannot outlive
the zygote; default signal handlers; stdin on /dev/null, stdout and stderr to its log
file; inherited descriptors closed; leaves with ``os._exit`` so no atexit handler of the
parent runs in it. The zygote reaps every worker (``waitpid`` on a pidfd).
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
WORKER_COMM = b"cm-worker"
"""The worker's process name (``comm``: what ps, top and perf show) after the fork."""


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # opened once, in the zygote, before any fork


def _set_pdeathsig() -> None:
    """Die with the zygote (``PR_SET_PDEATHSIG``) and take the name :data:`WORKER_COMM`."""
    try:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # type: ignore[union-attr]
        _LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(WORKER_COMM), 0, 0, 0)  # type: ignore[union-attr]
    except AttributeError:  # not Linux: the zygote's EOF handling still reaps
        pass


def _child(request: dict[str, Any], log_path: str, parent: int) -> None:
    """The forked process: set itself up as a worker (module docstring), then run the
    request's job (``op`` ``fork``) or serve jobs on its socket (``op`` ``resident``),
    and leave with ``os._exit``."""
    code = 70
    try:
        os.setpgid(0, 0)
        _set_pdeathsig()
        if os.getppid() != parent:  # the zygote died between fork and prctl
            os._exit(code)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 16)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        if request.get("op") == "resident":
            from .resident import serve

            code = serve(request["socket"], lean=_LEAN)
            return
        from .worker import Job, run_job

        job = request["job"]
        if _LEAN:
            import_after_fork(job)
        profile_dir = os.environ.get("CRASHMATRIX_WORKER_PROFILE")
        if profile_dir:  # a developer's switch: cProfile stats per worker (SIGKILLed ones write none)
            import cProfile

            profiler = cProfile.Profile(time.process_time)  # CPU, not wall: the figure a 2-core matrix is bound by
            try:
                code = profiler.runcall(run_job, Job.from_dict(job))
            finally:
                profiler.dump_stats(os.path.join(profile_dir, f"worker-{os.getpid()}.prof"))
        else:
            code = run_job(Job.from_dict(job))
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


_LEAN = False
"""Set in a lean zygote (:func:`serve`): its workers import the subject after the fork.
(This module runs as ``__main__``: a module that imports ``.zygote`` sees another copy,
so a resident is told, :func:`.resident.serve`'s ``lean``.)"""


def import_after_fork(job: dict[str, Any]) -> None:
    """In a lean zygote's worker, before its job (``job``: the job's JSON data): import
    the job's workload and subject (and the modules the adapter
    :attr:`~.adapter.Adapter.requires`), as the zygote would have before the fork; once
    per process (the registry keeps them)."""
    import importlib

    from . import registry


    registry.workload(job["workload"])
    for module in getattr(registry.subject(job["subject"]), "requires", ()):
        importlib.import_module(module)


_OPS = {"fork": "job", "resident": "socket"}
"""Request ops and the field each one needs besides ``token`` and ``log_path``."""


def _check(request: dict[str, Any]) -> None:
    """Raise ``KeyError`` or ``ValueError`` for a request the zygote cannot serve."""
    op = request.setdefault("op", "fork")
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}")
    if _OPS[op] not in request:
        raise KeyError(_OPS[op])


LEAN_FLAG = "--lean"
"""The zygote's first argument when it was re-executed without the subject (``--lean
THREADS_JSON SUBJECT WORKLOAD ...``): the threads the subject's import started, as JSON."""


def _threads() -> list[str]:
    """The names of this process's Python threads other than the main one
    (``threading.enumerate()``), sorted."""
    main = threading.main_thread()
    return sorted(t.name for t in threading.enumerate() if t is not main)


def _preload_harness() -> None:
    """Import what a worker runs of the harness, whatever the subject (fork-safe: it
    starts no thread), and warm up anyio's backend and, where installed, aiohttp's
    client (their lazy imports)."""
    import anyio

    from . import faults, registry, worker  # noqa: F401  (faults: the kinds a worker fires)

    async def warm_up() -> None:  # lazy imports of anyio's backend and aiohttp's client
        try:
            import aiohttp
        except ImportError:  # a subject's environment without it: its workload does not use it
            aiohttp = None
        if aiohttp is not None:
            async with aiohttp.ClientSession():
                pass
        with anyio.CancelScope():
            await anyio.sleep(0)

    anyio.run(warm_up)
    # what a worker imports lazily on every job (worker.run_job: builds' roles; every
    # RunContext: determinism's seed): measured 2 imports per worker before, ~6 ms of CPU
    # each without bytecode caches (CRASHMATRIX_WORKER_PROFILE: importlib under run_job)
    for name in ("asyncpg.connect_utils", "asyncpg.pool", "asyncpg.transaction", "json.decoder",
                 "crashmatrix.harness.iostate", "crashmatrix.harness.builds", "crashmatrix.harness.determinism"):
        try:
            __import__(name)
        except ImportError:
            pass


def _preload_subjects(subjects: tuple[str, ...], workload: str) -> tuple[list[str], str]:
    """Import the workload, then each subject (its adapter made, and the modules it
    :attr:`~.adapter.Adapter.requires` imported); stop at the first stage after which
    threads run. Returns those threads' names (empty: none started) and the stage
    (``"workload W"`` or ``"subject S"``). Raises what the registry raises
    (:class:`~.errors.RegistryError`) for a name that cannot be imported."""
    import importlib

    from . import registry

    registry.workload(workload)
    if _threads():
        return _threads(), f"workload {workload}"
    for name in subjects:
        adapter = registry.subject(name)
        for module in getattr(adapter, "requires", ()):
            importlib.import_module(module)
        if _threads():
            return _threads(), f"subject {name}"
    return [], ""


def _freeze() -> None:
    """Freeze the heap for the collector, so a forked worker does not copy pages on its
    first collection (measured: docs/benchmarks.md)."""
    import gc

    gc.collect()
    gc.freeze()


def _preload(subject: str, workload: str, more: tuple[str, ...] = ()) -> None:
    """Import the harness's worker side, the subject and the workload, then freeze the
    heap, so a forked worker imports nothing (the thread probe: :func:`serve`)."""
    _preload_harness()
    _preload_subjects((subject, *more), workload)
    _freeze()


def _preload_serving(subject: str, workload: str, more: tuple[str, ...], lean: dict[str, Any] | None
                     ) -> dict[str, Any] | None:
    """:func:`serve`'s preload, then the heap frozen: the harness's worker side, the
    workload and the subjects; when one of these starts a thread, re-execute this
    process lean (``os.execv``, not returning). With ``lean`` (the re-executed
    process), the harness's worker side and the workload when its import was not the
    threaded stage. Returns the ready event's ``lean`` note (None when not lean)."""
    if lean is None:
        _preload_harness()
        threads, stage = _preload_subjects((subject, *more), workload)
        if threads:  # a fresh interpreter, and this time without the subject's import
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, "-P", "-m", "crashmatrix.harness.zygote", LEAN_FLAG,
                                      json.dumps({"threads": threads, "stage": stage}), subject, workload, *more])
        _freeze()
        return None
    else:
        _preload_harness()
        if not str(lean.get("stage", "")).startswith("workload"):
            from . import registry

            registry.workload(workload)  # it started no thread: preloaded still
        global _LEAN
        _LEAN = True
        _freeze()
    return lean


def _fork_worker(line: bytes, sel: selectors.BaseSelector, children: dict[int, tuple[int, int]],
                 send: Callable[[dict[str, Any]], None], me: int) -> None:
    """One request ``line`` of :func:`serve`: fork a worker for it (the child runs
    :func:`_child` and never returns here), watch it through a pidfd registered in
    ``sel`` and ``children`` (pidfd -> (token, pid)) and send its ``started`` event;
    a bad request is one line on stderr and no fork."""
    try:
        request = json.loads(line)
        token, log_path = request["token"], request["log_path"]
        _check(request)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"zygote: bad request {line[:200]!r}: {exc}", file=sys.stderr)
        return
    pid = os.fork()
    if pid == 0:
        sel.close()
        _child(request, log_path, me)
    pidfd = os.pidfd_open(pid)
    children[pidfd] = (token, pid)
    sel.register(pidfd, selectors.EVENT_READ, "child")
    send({"event": "started", "token": token, "pid": pid})


def _reap_worker(pidfd: int, sel: selectors.BaseSelector, children: dict[int, tuple[int, int]],
                 send: Callable[[dict[str, Any]], None]) -> None:
    """A worker of :func:`serve` exited (its ``pidfd`` is readable): stop watching it,
    reap it and send its ``exit`` event (``returncode`` or ``signal``, and ``cpu_ms``,
    its user + system CPU time in ms)."""
    token, pid = children.pop(pidfd)
    sel.unregister(pidfd)
    os.close(pidfd)
    _, status, usage = os.wait4(pid, 0)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    cpu_ms = round((usage.ru_utime + usage.ru_stime) * 1000, 2)
    send({"event": "exit", "token": token, "pid": pid, "returncode": rc, "signal": sig, "cpu_ms": cpu_ms})


def serve(subject: str, workload: str, more: tuple[str, ...] = (), *, lean: dict[str, Any] | None = None) -> int:
    """Preload (``more``: further subjects to import), then serve fork requests until
    EOF on stdin.

    A subject (or workload) whose import starts a thread cannot be forked from: a child
    has only the forking thread, and whatever the others held (a lock, a queue, an event
    loop) stays held. So the zygote imports the workload, then each subject, and looks
    at its threads after each (:func:`_preload_subjects`); when one runs, it re-executes
    itself *lean* (``lean``: ``{"threads": names, "stage": what started them}``): the harness's worker side
    preloaded, the workload and the subjects not (the stages before the threaded one
    are, if they started none), and each worker imports them after its fork (a
    long-lived worker once: :mod:`.resident`). The ready event says so (``lean``)."""
    note = _preload_serving(subject, workload, more, lean)
    if threading.active_count() != 1:
        print(f"zygote: threads after the harness's own preload: {', '.join(_threads())}; forking needs one",
              file=sys.stderr)
        return 2
    out = sys.stdout
    me = os.getpid()

    def send(event: dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    sel = selectors.DefaultSelector()
    stdin = sys.stdin.fileno()
    sel.register(stdin, selectors.EVENT_READ, None)
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (token, pid)
    buffer = b""
    send({"event": "ready", "pid": me, "lean": note})
    eof = False
    while not eof:
        for key, _ in sel.select():
            if key.data is None:
                chunk = os.read(stdin, 1 << 16)
                if not chunk:
                    eof = True
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    _fork_worker(line, sel, children, send, me)
            else:
                _reap_worker(key.fd, sel, children, send)
    from .services.process import sigkill_group  # stdlib only, like this module's top

    for pidfd, (_, pid) in children.items():
        sigkill_group(pid)
        os.waitpid(pid, 0)
        os.close(pidfd)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lean = None
    if argv[:1] == [LEAN_FLAG] and len(argv) >= 2:
        lean = json.loads(argv[1])
        argv = argv[2:]
    if len(argv) < 2:
        print("usage: python -m crashmatrix.harness.zygote SUBJECT WORKLOAD [SUBJECT ...]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the controller; EOF ends us
    return serve(argv[0], argv[1], tuple(argv[2:]), lean=lean)


if __name__ == "__main__":
    sys.exit(main())
