"""One PostgreSQL for the processes of one test run (pytest-xdist workers).

Measured against one PostgreSQL per worker (``benchmarks/bench_plugin.py services``,
docs/benchmarks.md): sharing saves one server start per additional worker (its CPU:
initdb and start) and costs nothing measurable per case, so xdist workers share.

Protocol, in a directory named after the run (``crashmatrix-xdist-<testrunuid>`` in the
temporary directory), under a file lock (``filelock``) on ``pg.lock``:

- the first worker to need PostgreSQL starts an embedded server there, registered
  with its own watchdog, and writes ``pg.json`` = ``{"dsn", "owner": pid, "users":
  [pid, ...]}``;
- every other worker adds its pid to ``users`` and connects with the DSN;
- leaving, a worker removes its pid; the owner waits (up to ``OWNER_WAIT_S``) until no
  live user is left, removes ``pg.json`` in the same locked step (a worker that comes
  later starts a server of its own), then stops the server and removes the directory.

If the owner dies, its watchdog stops the server under the others, whose cases then
fail (a dead worker already fails the run); nothing is left behind either way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from .postgres import PostgresService, start_postgres
from .process import pid_alive

OWNER_WAIT_S = 600.0


def run_dir(run_key: str) -> Path:
    """The directory the processes of test run ``run_key`` (xdist's ``testrunuid``)
    share: this server's, and the plugin's exchanged results
    (:func:`..plugin_prefetch.xdist_run_dir`)."""
    return Path(tempfile.gettempdir()) / f"crashmatrix-xdist-{run_key}"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class SharedPostgres:
    """This process's handle on the run's shared PostgreSQL (module docstring).

    ``run_key``: what names the run (xdist's ``testrunuid``); ``watchdog``: registers
    the server when this process starts it; ``settings``: its server settings over
    :data:`~.postgres.SERVER_SETTINGS` (the owner's apply to every user). :meth:`acquire` returns the
    :class:`~.services.postgres.PostgresService` (embedded here, or the owner's as an
    external DSN) and raises :class:`~.errors.ServiceError` as ``start_postgres``
    does; :meth:`release` leaves (and, for the owner, stops the server)."""

    def __init__(self, run_key: str, watchdog: Any, settings: Mapping[str, str] | None = None) -> None:
        self.base = run_dir(run_key)
        self.watchdog = watchdog
        self.settings = dict(settings) if settings is not None else None
        self.owner = False
        self.service: PostgresService | None = None

    @property
    def _lock(self) -> FileLock:
        return FileLock(str(self.base / "pg.lock"), timeout=OWNER_WAIT_S)

    def acquire(self) -> PostgresService:
        self.base.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        with self._lock:
            info = _read(self.base / "pg.json")
            if info is not None and pid_alive(info["owner"]):
                info["users"] = [p for p in info["users"] if pid_alive(p)] + [me]
                _write(self.base / "pg.json", info)
                self.service = start_postgres(dsn=info["dsn"])
                return self.service
            self.service = start_postgres(self.base / "pg", watchdog=self.watchdog, settings=self.settings)
            self.owner = True
            if self.watchdog is not None:  # a SIGKILLed owner leaves no directory either
                self.watchdog.watch_path(self.base)
            _write(self.base / "pg.json", {"dsn": self.service.dsn, "owner": me, "users": [me]})
            return self.service

    def release(self) -> None:
        if self.service is None:
            return
        me = os.getpid()
        with self._lock:
            info = _read(self.base / "pg.json") or {"users": []}
            info["users"] = [p for p in info["users"] if p != me]
            _write(self.base / "pg.json", info)
        if self.owner:
            deadline = time.monotonic() + OWNER_WAIT_S
            while True:
                with self._lock:
                    info = _read(self.base / "pg.json") or {"users": []}
                    users = [p for p in info["users"] if pid_alive(p)]
                    if not users or time.monotonic() > deadline:
                        # gone from the file in the same locked step: a latecomer
                        # starts a server of its own instead of joining this one
                        (self.base / "pg.json").unlink(missing_ok=True)
                        break
                time.sleep(0.1)
            self.service.close()
            if not (self.base / "pg.json").exists():
                shutil.rmtree(self.base, ignore_errors=True)
                if self.watchdog is not None:
                    self.watchdog.forget_path(self.base)
        self.service = None
