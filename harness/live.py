"""A live harness for synchronous callers: one session on a background event loop.

pytest and Hypothesis call tests synchronously; the harness (:mod:`.session`,
:mod:`.explorer`) is asyncio. :class:`LiveHarness` enters :func:`.session.open_session`
on an event loop that runs in a thread of its own for as long as the harness is open,
and offers :meth:`~LiveHarness.golden` and :meth:`~LiveHarness.run_case` as blocking
calls that any thread may make (each call waits for its coroutine on that loop). It
reuses the explorer as it is: golden runs, cases and the oracle are the same code the
CLI runs.

The loop thread is not a daemon left to die: :meth:`~LiveHarness.close` leaves the
session (services stopped in reverse order, the working directory removed), stops the
loop and joins the thread. A controller that is SIGKILLed still leaves nothing behind:
the session's watchdog cleans up (docs/design.md, "Processes").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import HarnessError
from .case import CaseResult
from .explorer import Explorer, Options
from .golden import GoldenRun
from .plan import Case

if TYPE_CHECKING:
    from .services.matrixpg import MatrixPostgres

_T = TypeVar("_T")


class LiveHarness:
    """One subject and workload on live services, driven from synchronous code.

    ``postgres``: a PostgreSQL the caller owns and keeps beyond this harness (a
    :class:`~.services.matrixpg.MatrixPostgres`: its main server and, for ``db-restart``
    cases, its restartable ones); else ``dsn``, the user's server, else the session
    starts an embedded one of its own; ``options``: the explorer's knobs.

    Use as a context manager, or call :meth:`open` and :meth:`close`. Raises what
    :func:`~.session.open_session` raises (``ServiceError``, ``RegistryError``) from
    :meth:`open`.
    """

    def __init__(
        self, subject: str, workload: str, *, dsn: str | None = None,
        postgres: MatrixPostgres | None = None, options: Options | None = None,
    ) -> None:
        self.subject = subject
        self.workload = workload
        self.dsn = dsn
        self.options = options
        self.postgres = postgres
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self.explorer: Explorer | None = None
        self._goldens: dict[str, GoldenRun] = {}
        self._golden_lock = threading.Lock()

    # -- lifetime -----------------------------------------------------------------------

    def open(self) -> LiveHarness:
        """Start the loop thread and the session; returns ``self``."""
        from .session import open_session

        if self._loop is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"crashmatrix-{self.subject}-{self.workload}", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        stack = self._stack
        try:
            self.explorer = self._call(stack.enter_async_context(
                open_session(self.subject, self.workload, dsn=self.dsn, options=self.options, postgres=self.postgres)))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Leave the session and stop the loop thread; idempotent."""
        loop, stack = self._loop, self._stack
        if loop is None:
            return
        try:
            if stack is not None:
                self._call(stack.aclose())
        finally:
            self._stack = None
            self.explorer = None
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(60)
            loop.close()
            self._loop = None
            self._thread = None

    def __enter__(self) -> LiveHarness:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls --------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the live harness is not open")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:  # Ctrl-C while waiting: cancel the coroutine, then leave
            future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule ``coro`` on the harness's loop; returns a future (for callers that
        keep several cases in flight)."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("the live harness is not open")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _explorer(self) -> Explorer:
        if self.explorer is None:
            self.open()
        assert self.explorer is not None
        return self.explorer

    def releases(self) -> dict[str, dict[str, str]]:
        """The installed release of the runtime under test, per build
        (:func:`.sources.subject_releases`; opens the session if needed)."""
        from .sources import subject_releases

        return subject_releases(self._explorer().adapter, self.subject)

    def golden(self, conversation: str) -> GoldenRun:
        """The golden run of ``conversation`` (run once per harness, then cached).
        Raises :class:`~.errors.HarnessError` if it does not complete."""
        with self._golden_lock:
            if conversation not in self._goldens:
                golden = self._call(self._explorer().golden(conversation))
                if golden.incomplete:  # no trace to cache or collect cases from
                    raise HarnessError(golden.incomplete)
                self._goldens[conversation] = golden
            return self._goldens[conversation]

    def run_case(self, case: Case) -> CaseResult:
        """Run ``case`` against the golden run of its conversation (never raises for the
        case's own failure; see :meth:`.explorer.Explorer.run_case`)."""
        golden = self.golden(case.conversation)
        return self._call(self._explorer().run_case(case, golden))
