"""The pytest plugin's live services, per process (one pytest process or one xdist
worker), and the handle the ``crashmatrix_harness`` fixture gives to tests.

:class:`Services` holds one PostgreSQL for the process (shared by the run's xdist
workers: :mod:`.services.sharedpg`), one :class:`~.live.LiveHarness` per subject and workload
(each a :func:`.session.open_session`, the session the CLI's ``run_matrix`` opens too:
providers, worker zygote, migrations), and, on request, the embedded fault proxy.
:class:`Harnesses` is the documented face of it for tests (docs/plugin.md,
"Fixtures").

PostgreSQL is brought up the way the CLI's session brings it up, by the same code
(:class:`.services.matrixpg.MatrixPostgres`: the user's DSN, else embedded, shared by
the run's xdist workers; the restartable servers of ``db-restart`` cases; the matrix's
server settings). What differs is the owner: a pytest process runs several sessions (one
per subject and workload) and xdist workers share one server, so :class:`Services` owns
the server (and the working directory and watchdog it lives under) and passes it to each
session, which leaves it running.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from .errors import CrashmatrixError
from .plan import Case

if TYPE_CHECKING:
    from .case import CaseResult
    from .golden import GoldenRun
    from .live import LiveHarness
    from .services.matrixpg import MatrixPostgres, Workdir
    from .services.postgres import PostgresService


class Services:
    """The live services of this process (one pytest process or one xdist worker):
    one PostgreSQL (:class:`~.services.matrixpg.MatrixPostgres`: ``$CRASHMATRIX_PG_DSN``
    if set; else embedded, under a working directory and watchdog of this object's; in
    xdist workers one embedded server shared by the run's workers), one
    :class:`~.live.LiveHarness` per subject and workload, and, on request, the embedded
    fault proxy. Everything starts on first use. ``close()`` stops the harnesses, then
    the fault proxy, PostgreSQL (the shared one when its last user leaves), the working
    directory and the watchdog."""

    def __init__(self, seed: int, run_key: str | None = None, *, pg_services: str | None = None,
                 pg_image: str | None = None) -> None:
        self.seed = seed
        #: where PostgreSQL comes from (``embedded``, ``containers``) and the image
        #: (:class:`~.services.matrixpg.MatrixPostgres`'s ``services`` and ``pg_image``)
        self.pg_services = pg_services
        self.pg_image = pg_image
        #: set in xdist workers (the run's ``testrunuid``): their PostgreSQL is shared
        self.run_key = run_key
        self._lock = threading.RLock()
        self._workdir: Workdir | None = None
        self._postgres: MatrixPostgres | None = None
        self._harnesses: dict[tuple[str, str], LiveHarness] = {}
        self._failed: dict[tuple[str, str], CrashmatrixError] = {}
        self._faultproxy: Any = None

    def _matrix_pg(self) -> MatrixPostgres:
        from .services.matrixpg import MatrixPostgres, Workdir

        with self._lock:
            if self._postgres is None:
                if self._workdir is None:
                    self._workdir = Workdir("crashmatrix-pytest-")
                self._postgres = MatrixPostgres(self._workdir, run_key=self.run_key, services=self.pg_services,
                                                pg_image=self.pg_image)
            return self._postgres

    def pg(self) -> PostgresService:
        """The process's :class:`~.services.postgres.PostgresService` (started on first
        call). Raises :class:`~.errors.ServiceError`."""
        return self._matrix_pg().start()

    @property
    def opened(self) -> int:
        """How many live harnesses this process opened (or tried to)."""
        with self._lock:
            return len(self._harnesses) + len(self._failed)

    def harness(self, subject: str, workload: str) -> LiveHarness:
        """The open :class:`~.live.LiveHarness` of ``subject`` on ``workload``. Raises
        :class:`~.errors.ServiceError` (or the registry's error) when it cannot start;
        the error is kept, so later calls fail at once instead of starting again."""
        from .explorer import Options
        from .live import LiveHarness

        with self._lock:
            key = (subject, workload)
            if key in self._failed:
                raise self._failed[key]
            if key not in self._harnesses:
                try:
                    postgres = self._matrix_pg()
                    postgres.start()
                    self._harnesses[key] = LiveHarness(
                        subject, workload, postgres=postgres, options=Options(proxy_seed=self.seed)).open()
                except CrashmatrixError as exc:
                    self._failed[key] = exc
                    raise
            return self._harnesses[key]

    def faultproxy_url(self) -> str:
        """``$TOXIPROXY_URL`` if set, else the URL of an embedded Toxiproxy-compatible
        fault proxy seeded with the run's seed (started on first call)."""
        url = os.environ.get("TOXIPROXY_URL")
        if url:
            return url
        with self._lock:
            if self._faultproxy is None:
                from .faultproxy import EmbeddedToxiproxy

                self._faultproxy = EmbeddedToxiproxy(seed=self.seed)
                self._faultproxy.start()
            return str(self._faultproxy.url)

    def close(self) -> None:
        """Stop the harnesses, the fault proxy, PostgreSQL (the shared one when its last
        user leaves), the working directory and the watchdog; idempotent. Raises the
        first error a harness raised while closing (after closing the rest)."""
        with self._lock:
            errors = []
            for h in self._harnesses.values():
                try:
                    h.close()
                except Exception as exc:  # keep closing the rest
                    errors.append(exc)
            self._harnesses.clear()
            if self._faultproxy is not None:
                self._faultproxy.stop()
                self._faultproxy = None
            if self._postgres is not None:
                self._postgres.close()
                self._postgres = None
            if self._workdir is not None:
                self._workdir.close()
                self._workdir = None
            if errors:
                raise errors[0]


class Harnesses:
    """What the ``crashmatrix_harness`` fixture gives: live harness sessions on this
    process's services (one per subject and workload, opened on first use, closed
    when pytest ends), for tests that run cases of their own.

    - :meth:`harness` ``(subject, workload)``: the open :class:`~.live.LiveHarness`
      (``.golden(conversation)``, ``.run_case(case)``);
    - :meth:`golden` and :meth:`run_case`: the same, in one call;
    - ``seed``: the run's seed (the embedded fault proxy's, Hypothesis's).

    Raises :class:`~.errors.ServiceError` (or the registry's error for an unknown
    name) when a session cannot start."""

    def __init__(self, services: Services) -> None:
        self._services = services

    @property
    def seed(self) -> int:
        return self._services.seed

    def harness(self, subject: str = "reference", workload: str = "checkout") -> LiveHarness:
        """The open live harness of ``subject`` on ``workload`` (started on first call)."""
        return self._services.harness(subject, workload)

    def golden(self, conversation: str, subject: str = "reference", workload: str = "checkout") -> GoldenRun:
        """The golden run of ``conversation`` in that harness (run once, then kept)."""
        return self.harness(subject, workload).golden(conversation)

    def run_case(self, case: Case, subject: str = "reference") -> CaseResult:
        """Run ``case`` (a :class:`~.plan.Case`; its workload names the harness) on
        ``subject`` against the golden run of its conversation; never raises for the
        case's own failure (:meth:`.explorer.Explorer.run_case`)."""
        return self.harness(subject, case.workload).run_case(case)
