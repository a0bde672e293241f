"""The PostgreSQL of a matrix, brought up and restarted in one place for the CLI and pytest.

A matrix needs a main server (its migrations, the goldens' and the cases' data) and, for
``db-restart`` cases, a second server they may stop and start again
(:mod:`..faults.db_restart`). :class:`MatrixPostgres` knows where each comes from:

- the main server, in this order: the ``dsn`` given, else ``$CRASHMATRIX_PG_DSN``
  (:data:`.postgres.DSN_ENV`; used as is, never stopped); else, with a ``run_key``
  (pytest-xdist's ``testrunuid``), the one embedded server the run's workers share
  (:mod:`.sharedpg`); else an embedded server of its own;
- the restartable server, on request (:meth:`MatrixPostgres.start_restartable`): always
  embedded, a fresh one per call, and only when the main server is not the user's (a
  user who gives a DSN gets no embedded server; ``db-restart`` then says it is
  unavailable);
- the settings of every embedded server it starts: :data:`MATRIX_PG_SETTINGS` unless
  the caller gives others;
- with ``services="containers"`` (else ``$CRASHMATRIX_SERVICES``), both kinds of server
  come from a container of ``pg_image`` (:mod:`.containers`) instead of the embedded
  wheel: one per process for the main server (no sharing across xdist workers), a fresh
  one per :meth:`MatrixPostgres.start_restartable`, with the same settings. A DSN still
  comes first.

Both live under a :class:`Workdir`: a temporary directory and the watchdog that removes
it, and stops what is registered with it, if this process is SIGKILLed
(:mod:`.watchdog`). :func:`..session.open_session` makes its own when the caller passes
none (the CLI); the pytest plugin makes one per process and passes it to every session
it opens (:mod:`..plugin_services`), so the server outlives the sessions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .postgres import DSN_ENV, PostgresService, start_postgres
from .sharedpg import SharedPostgres
from .watchdog import Watchdog

__all__ = ["MATRIX_PG_SETTINGS", "MatrixPostgres", "Workdir"]

MATRIX_PG_SETTINGS: dict[str, str] = {"fsync": "off"}
"""The embedded PostgreSQL's settings for a matrix. ``fsync = off`` is sound for every
fault the harness injects: a commit still writes its WAL to the operating system before
it returns, and none of the faults (a worker's SIGKILL, SIGTERM, SIGSTOP, a cancel, a
toxic on a link, PostgreSQL stopped in immediate mode) loses the OS page cache; only a
machine crash would, and the harness never injects one. The runtime's own store
benchmarks and tests start their server with ``fsync = on`` (docs/benchmarks.md)."""


class Workdir:
    """A temporary directory (``path``, made with prefix ``prefix`` in ``$TMPDIR``) and a
    :class:`~.watchdog.Watchdog` (``watchdog``) watching it. :meth:`close` removes the
    directory, then stops the watchdog; idempotent. Raises
    :class:`~..errors.ServiceError` when the watchdog cannot start (nothing is left)."""

    def __init__(self, prefix: str) -> None:
        self.watchdog = Watchdog.start()
        try:
            self.path = Path(tempfile.mkdtemp(prefix=prefix))
            self.watchdog.watch_path(self.path)
        except BaseException:
            self.watchdog.close()
            raise
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            shutil.rmtree(self.path, ignore_errors=True)
            self.watchdog.forget_path(self.path)
        finally:
            self.watchdog.close()


class MatrixPostgres:
    """The main PostgreSQL of a matrix and its restartable servers (module docstring).

    ``workdir``: where embedded servers live (``pg/``, ``pg-restart/``) and whose
    watchdog registers them; ``dsn``: the user's server (else ``$CRASHMATRIX_PG_DSN``);
    ``settings``: the embedded servers' settings (default :data:`MATRIX_PG_SETTINGS`;
    ``{"fsync": "on"}`` to measure with durable commits); ``run_key``: share the main
    server with the other processes of this run (:mod:`.sharedpg`); ``services``:
    ``embedded`` or ``containers`` (None: ``$CRASHMATRIX_SERVICES``, else embedded;
    :class:`~..errors.InvalidArgument` for another name), ``pg_image``: the containers'
    image (None: ``$CRASHMATRIX_PG_IMAGE``, else :data:`.containers.DEFAULT_PG_IMAGE`).
    Nothing starts before :meth:`start`. Thread-safe."""

    def __init__(self, workdir: Workdir, *, dsn: str | None = None, settings: Mapping[str, str] | None = None,
                 run_key: str | None = None, services: str | None = None, pg_image: str | None = None) -> None:
        from .containers import resolve_services

        self.workdir = workdir
        self.services = resolve_services(services)
        self.pg_image = pg_image
        self.dsn = dsn
        self.settings = dict(MATRIX_PG_SETTINGS if settings is None else settings)
        self.run_key = run_key
        #: False when the main server is the user's (``dsn`` or ``$CRASHMATRIX_PG_DSN``):
        #: no embedded server is started, so no ``db-restart`` case can run
        self.restartable = dsn is None and not os.environ.get(DSN_ENV)
        self._lock = threading.RLock()
        self._main: PostgresService | None = None
        self._shared: SharedPostgres | None = None

    def start(self) -> PostgresService:
        """The main server (started on first call; later calls return it). Raises
        :class:`~..errors.ServiceError` (one line) as :func:`.postgres.start_postgres` does;
        a failed start is tried again on the next call."""
        with self._lock:
            if self._main is None:
                if self.restartable and self.services == "containers":
                    self._main = self._container()
                elif self.restartable and self.run_key:
                    self._shared = SharedPostgres(self.run_key, self.workdir.watchdog, self.settings)
                    self._main = self._shared.acquire()
                else:
                    self._main = start_postgres(self.workdir.path / "pg", dsn=self.dsn, watchdog=self.workdir.watchdog,
                                                settings=self.settings)
            return self._main

    def start_restartable(self) -> PostgresService:
        """A new embedded server that a ``db-restart`` case may stop and start (the caller
        closes it). Raises :class:`~..errors.ServiceError` as ``start_postgres`` does, and
        :class:`~..errors.HarnessError` when :attr:`restartable` is False."""
        from ..errors import HarnessError

        if not self.restartable:
            raise HarnessError("no restartable PostgreSQL: the matrix runs on the user's DSN")
        if self.services == "containers":
            return self._container()
        return start_postgres(self.workdir.path / "pg-restart", watchdog=self.workdir.watchdog, settings=self.settings)

    def _container(self) -> Any:
        from .containers import start_container_postgres

        return start_container_postgres(self.pg_image, settings=self.settings, watchdog=self.workdir.watchdog)

    def close(self) -> None:
        """Stop the main server (the shared one when its last user leaves; a user's DSN is
        left alone); idempotent."""
        with self._lock:
            main, shared = self._main, self._shared
            self._main = self._shared = None
            if shared is not None:
                shared.release()
            elif main is not None:
                main.close()
