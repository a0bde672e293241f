"""A runtime's own server (restate-server, ``prefect server start``) as a child that owns
a directory, on the process toolkit (:mod:`.process`) and the watchdog.

What :mod:`.process` does not say and these servers share: the directory is registered
with the watchdog before the start and the process group as it is spawned
(:func:`.process.spawn`'s ``register_pgid``), so a SIGKILLed controller still has both
removed (the watchdog's ``pgid`` and ``path`` ops, docs/design.md "Processes"); the
server logs to stdout and prints no ready line, so its stdout and stderr go to
``server.log`` (``merge_stdout``) and readiness is its health URLs answering 200;
:meth:`ServerProcess.close` is :func:`.process.stop_process_groups` (SIGTERM,
:data:`STOP_GRACE` s, SIGKILL, reaped), then the directory removed and both
registrations dropped. Errors: :class:`~crashmatrix.harness.errors.ServiceError`, one
line with the log's tail (:func:`.process.stderr_tail`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashmatrix.harness.errors import ServiceError

from .process import spawn, stderr_tail, stop_process_groups

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of the group
LOG_TAIL_BYTES = 600  # of server.log quoted in an error


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout: float = 1.0) -> int:
    """The HTTP status of ``GET url``, 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return int(resp.status)
    except OSError:
        return 0


@dataclass
class ServerProcess:
    """A started server: its process (leader of its own group), directory and log."""

    name: str
    process: subprocess.Popen[bytes]
    base_dir: Path
    log_path: Path
    watchdog: Any = None
    _closed: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self) -> str:
        """The log's last :data:`LOG_TAIL_BYTES`, on one line (`` | `` between lines)."""
        return " | ".join(line.strip() for line in stderr_tail(self.log_path, LOG_TAIL_BYTES).splitlines()
                          if line.strip())

    def wait_healthy(self, urls: Sequence[str], timeout: float) -> None:
        """Poll (50 ms) until every URL answers 200. Raises ``ServiceError`` (with the
        log's tail) when the process exits or ``timeout`` s pass; closes it then."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    raise ServiceError(f"{self.name} exited {self.process.returncode} at start: {self.log_tail()}")
                if all(http_status(u) == 200 for u in urls):
                    return
                if time.monotonic() > deadline:
                    raise ServiceError(f"{self.name} not healthy at {urls[0]} within {timeout:g} s: {self.log_tail()}")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the group (:func:`.process.stop_process_groups`), remove the directory,
        unregister both from the watchdog. Idempotent."""
        if self._closed:
            return
        self._closed = True
        stop_process_groups([self.process], STOP_GRACE)
        shutil.rmtree(self.base_dir, ignore_errors=True)
        if self.watchdog is not None:
            self.watchdog.forget_pgid(self.process.pid)
            self.watchdog.forget_path(self.base_dir)


def start_server(name: str, argv: Sequence[str], base_dir: Path, *, env: Mapping[str, str] | None = None,
                 watchdog: Any = None) -> ServerProcess:
    """Start ``argv`` in ``base_dir`` (created) with :func:`.process.spawn`, stdout and
    stderr to ``base_dir/server.log``; with ``watchdog``, ``base_dir`` is registered
    before the start and the group as it is spawned. ``env``: the child's whole
    environment (:func:`.process.child_env` of it). Raises ``ServiceError`` when
    ``argv[0]`` cannot be executed (the directory is removed then)."""
    base_dir.mkdir(parents=True, exist_ok=True)
    if watchdog is not None:
        watchdog.watch_path(base_dir)
    log_path = base_dir / "server.log"
    try:
        process = spawn(argv, stderr_path=log_path, merge_stdout=True, env=env, cwd=base_dir,
                        register_pgid=watchdog.watch_pgid if watchdog is not None else None)
    except OSError as exc:
        shutil.rmtree(base_dir, ignore_errors=True)
        if watchdog is not None:
            watchdog.forget_path(base_dir)
        raise ServiceError(f"{name}: cannot start {argv[0]}: {exc}") from None
    return ServerProcess(name, process, base_dir, log_path, watchdog)
