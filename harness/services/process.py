"""The process toolkit: how the harness starts, waits on and stops the processes it owns.

Every service process the harness starts (the providers, the embedded fault proxy, the
watchdog, PostgreSQL's binaries, the probe certifier's sandbox) goes through here, so
that each gets the same environment, its own process group, and the same way out:

- :func:`child_env`: ``os.environ`` plus extras, with every *relative* ``PYTHONPATH``
  entry made absolute against the directory the user ran from (without it, with
  ``PYTHONPATH=.`` the model provider, which runs in its own directory, cannot
  import the workload's script). Interpreters are started with ``-P``, so the current
  directory itself is never on their path; only what ``PYTHONPATH`` names is.
- :func:`spawn`: a child in a new session (process-group id == pid), stdin from
  /dev/null, stdout a pipe (for its one ready line), stderr appended to a file (or
  this process's), the pgid handed to ``register_pgid`` (a watchdog) as soon as it exists.
- :func:`first_lines`: wait with one selector for the first stdout line of several
  children at once; :class:`NotReady` says which did not print one and why.
- :func:`stop_process_groups`: SIGTERM each child's group, a shared grace period,
  SIGKILL the late ones and whatever is left in each group; reap every child.
  :func:`sigkill_group`: SIGKILL a group and its leader at once (a worker's end).
- :func:`stderr_tail`: the end of a child's stderr file, for a one-line error.
- :func:`run`: a short-lived program (``pg_ctl``, ``initdb``) to its end, output to a
  temporary file (a daemon it leaves behind must not inherit a pipe and hang the call).
- For processes the caller cannot reap (the watchdog's view, PostgreSQL's backends):
  :func:`pid_alive`, :func:`group_alive`, :func:`kill_group` (SIGTERM, poll, SIGKILL),
  :func:`wait_gone`, :func:`kill_processes`, :func:`signal_group`.

Standard library only: the watchdog imports it and starts in ~30 ms.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "STDERR_TAIL_BYTES",
    "NotReady",
    "absolute_pythonpath",
    "child_env",
    "first_lines",
    "group_alive",
    "kill_group",
    "kill_processes",
    "pid_alive",
    "proc_stat",
    "run",
    "sigkill_group",
    "signal_group",
    "spawn",
    "stderr_tail",
    "stop_process_groups",
    "wait_gone",
]

STDERR_TAIL_BYTES = 2000
"""How much of a child's stderr an error message quotes (its last bytes)."""


# -- starting ---------------------------------------------------------------------------


def absolute_pythonpath(value: str, origin: str | os.PathLike[str]) -> str:
    """``value`` (a ``PYTHONPATH``, entries joined by ``os.pathsep``) with every relative
    entry joined to ``origin``; absolute entries are kept as they are. An empty entry
    means the current directory to Python, so it becomes ``origin`` too."""
    entries = value.split(os.pathsep)
    return os.pathsep.join(e if os.path.isabs(e) else os.path.normpath(os.path.join(origin, e)) for e in entries)


def child_env(extra: Mapping[str, str] | None = None, *, origin: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The environment of a child the harness starts: ``os.environ`` updated with
    ``extra``, then every relative ``PYTHONPATH`` entry (from either) made absolute
    against ``origin`` (default: the current directory, the one the user ran from).
    A child may run in another directory (a provider runs in its ledger's) and still
    import what the user's ``PYTHONPATH=.`` put on the path."""
    env = dict(os.environ)
    if extra:
        env.update(extra)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = absolute_pythonpath(env["PYTHONPATH"], origin if origin is not None else os.getcwd())
    return env


def spawn(
    cmd: Sequence[str],
    *,
    stderr_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    register_pgid: Callable[[int], None] | None = None,
    merge_stdout: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session (its own process group, pgid == pid), with
    :func:`child_env` of ``env`` (relative ``PYTHONPATH`` entries resolved against the
    caller's directory, not ``cwd``), stdout a pipe (read its first line with
    :func:`first_lines`, then close it), stderr appended to ``stderr_path`` (None:
    this process's stderr, as the watchdog's log), file descriptors other than 0-2
    closed. ``register_pgid(pid)`` is
    called before this returns, so a watchdog can stop the group if the caller dies.
    ``stdin``: a :mod:`subprocess` constant or file (default /dev/null).
    ``merge_stdout``: stdout appended to ``stderr_path`` too, no pipe (a server that
    logs to stdout and prints no ready line: its readiness is asked another way).
    Raises ``OSError`` when the program cannot be executed, ``ValueError`` for
    ``merge_stdout`` without ``stderr_path``."""
    environment = child_env(env)
    if stderr_path is None:
        if merge_stdout:
            raise ValueError("spawn: merge_stdout needs a stderr_path")
        proc = subprocess.Popen(list(cmd), stdin=stdin, stdout=subprocess.PIPE, stderr=None,
                                env=environment, cwd=cwd, start_new_session=True, close_fds=True)
    else:
        with open(stderr_path, "ab") as err:
            proc = subprocess.Popen(list(cmd), stdin=stdin, stdout=err if merge_stdout else subprocess.PIPE,
                                    stderr=err, env=environment, cwd=cwd, start_new_session=True, close_fds=True)
    if register_pgid is not None:
        register_pgid(proc.pid)
    return proc


class NotReady(Exception):
    """A child did not print its first line: ``name`` (the first such child), ``why``
    (``"timeout"``, or ``"exited"`` with ``returncode``), ``pending``: every child still
    without a line when it was raised (``name`` first), ``lines``: the lines read so far."""

    def __init__(self, name: str, why: str, pending: list[str], lines: dict[str, str],
                 returncode: int | None = None) -> None:
        super().__init__(f"{name}: {why}" + (f" (exit code {returncode})" if why == "exited" else ""))
        self.name = name
        self.why = why
        self.pending = pending
        self.lines = lines
        self.returncode = returncode


def first_lines(procs: Mapping[str, subprocess.Popen[bytes]], timeout_s: float) -> dict[str, str]:
    """Read each child's stdout until its first newline, all at once on one selector;
    return name -> that line (decoded, stripped). Bytes after the newline are dropped.

    Raises :class:`NotReady` when a child closes its stdout (exits) before a newline
    (it is reaped, so ``returncode`` is set) or when ``timeout_s`` seconds pass first.
    The caller stops the children (:func:`stop_process_groups`)."""
    lines: dict[str, str] = {}
    buffers = {name: b"" for name in procs}
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for name, proc in procs.items():
            assert proc.stdout is not None, f"{name} was not started with stdout=PIPE"
            sel.register(proc.stdout, selectors.EVENT_READ, name)
        while len(lines) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pending = [n for n in procs if n not in lines]
                raise NotReady(pending[0], "timeout", pending, lines)
            for key, _ in sel.select(remaining):
                name = key.data
                chunk = os.read(key.fd, 4096)
                if not chunk:
                    sel.unregister(key.fileobj)
                    code = procs[name].wait()
                    pending = [name, *(n for n in procs if n not in lines and n != name)]
                    raise NotReady(name, "exited", pending, lines, code)
                buffers[name] += chunk
                if b"\n" in buffers[name]:
                    lines[name] = buffers[name].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
                    sel.unregister(key.fileobj)
    return lines


# -- stopping children --------------------------------------------------------------------


def signal_group(pid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pid`` (falling back to the process alone when it
    leads no group); False when neither exists. For a child, call it only while the
    child is not reaped: an unreaped leader keeps its pid, so its group id, from reuse."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, sig)
            return True
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
    return False


def sigkill_group(pid: int) -> None:
    """SIGKILL process group ``pid`` and then ``pid`` itself (so a leader that left its
    group is hit too), at once, with no grace; a group or process already gone is
    skipped. For a worker whose fault or deadline ends it (:mod:`..pool`, the zygote's
    last step); the caller reaps it."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_process_groups(procs: Mapping[str, subprocess.Popen[bytes]] | Iterable[subprocess.Popen[bytes]],
                        grace_s: float) -> None:
    """SIGTERM each child's process group, wait up to ``grace_s`` seconds (shared by
    all), SIGKILL the late ones, then SIGKILL whatever is left in each group (a child's
    own children) and close the children's stdout pipes. Every child is reaped.
    Idempotent: a child already reaped is skipped."""
    children = list(procs.values()) if isinstance(procs, Mapping) else list(procs)
    for proc in children:
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in children:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        try:  # the group outlives its reaped leader while members remain
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.stdout is not None:
            proc.stdout.close()


def stderr_tail(path: Path | str, limit: int = STDERR_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a child's stderr file, stripped, for an error
    message: ``"(stderr empty)"`` or ``"(stderr unreadable: ...)"`` when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            text = f.read().decode("utf-8", "replace").strip()
    except OSError as exc:
        return f"(stderr unreadable: {exc})"
    return text or "(stderr empty)"


def run(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
        user: str | None = None, cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a short-lived program to its end (stdin /dev/null, stdout and stderr together
    in ``.stdout``, through a temporary file: ``pg_ctl start`` leaves a daemon that would
    inherit a pipe and hang the call). Never raises on the exit code; after ``timeout``
    seconds the program is killed and ``returncode`` is -1 with ``stderr`` saying so.
    ``user``: the system user to run as (:func:`subprocess.run`'s ``user=``, root
    only). Raises ``OSError`` when the program cannot be executed."""
    kwargs: dict[str, Any] = {"user": user} if user is not None else {}
    with tempfile.TemporaryFile("w+") as out:
        try:
            result = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    text=True, timeout=timeout, check=False, env=child_env(env), cwd=cwd, **kwargs)
        except subprocess.TimeoutExpired as exc:
            out.seek(0)
            return subprocess.CompletedProcess(exc.cmd, -1, out.read(), f"timed out after {timeout} s")
        out.seek(0)
        result.stdout = out.read()
        return result


# -- processes the caller cannot reap -----------------------------------------------------


def proc_stat(pid: int) -> tuple[bytes, int, int] | None:
    """``(state, ppid, pgrp)`` of ``pid`` from /proc, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _exists(probe: Callable[[int, int], None], ident: int) -> bool:
    try:
        probe(ident, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (without /proc: while it exists)."""
    if not os.path.isdir("/proc/self"):
        return _exists(os.kill, pid)
    info = proc_stat(pid)
    return info is not None and info[0] not in (b"Z", b"X")


def group_alive(pgid: int) -> bool:
    """True while process group ``pgid`` has a member that is not a zombie (without
    /proc: while the group exists, zombies included)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return _exists(os.killpg, pgid)
    for entry in entries:
        if entry.isdigit():
            info = proc_stat(int(entry))
            if info is not None and info[2] == pgid and info[0] not in (b"Z", b"X"):
                return True
    return False


def kill_group(pgid: int, grace_s: float) -> None:
    """Stop a process group the caller did not start: SIGTERM, poll (20 ms) up to
    ``grace_s`` seconds until no live member is left, then SIGKILL. Not reaped (the
    members are someone else's children)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_gone(pids: Iterable[int], timeout: float) -> bool:
    """Poll (10 ms) until none of ``pids`` is alive; True if so within ``timeout`` s."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        if not any(pid_alive(p) for p in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def kill_processes(pids: Sequence[int], timeout: float = 5.0) -> bool:
    """SIGKILL ``pids`` in order and wait up to ``timeout`` s for them to be gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return wait_gone(pids, timeout)
