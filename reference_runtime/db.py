"""One connection per worker, shared by the run's concurrent nodes; reconnects when the
link breaks.

asyncpg refuses two concurrent operations on one connection, so every round trip goes
through :class:`Db`, which serialises them by a turn (``turns.py``: FIFO, and taking it
suspends exactly once whether it is free or not, so the await points of a round trip do
not depend on timing; ``anyio.Lock``, which it replaced, did the same at the price of a
shielded checkpoint: 17.8-18.6 us of CPU a round trip against 11.6-11.9 on a stand-in
connection, ``benchmarks/bench_db_turn.py``). Taking the turn is also a cancellation
checkpoint (``anyio.lowlevel.checkpoint_if_cancelled`` once the turn is held): a write
attempted inside a cancelled scope without a shield never reaches the server (which is
what docs/design.md's "an unshielded recovery write is lost" means in practice).

**Lost connections** (a reset, a server restart, a proxy that cuts the link): the worker
keeps one connection at a time, and makes a new one when that one breaks. Two kinds of
round trip:

- :meth:`Db.fetch`, :meth:`Db.fetchrow`, :meth:`Db.fetchval`, :meth:`Db.execute` are
  for **idempotent** statements, which are all the runtime sends besides the append:
  reads; ``INSERT ... ON CONFLICT DO NOTHING`` (run submission, ``started`` rows,
  invocations); fenced ``UPDATE``\\ s that set a value (status, ``unknown``, trace
  context); and the lease take-over, whose repeat only bumps the epoch once more (the
  lost epoch never wrote anything). When the connection breaks with one in flight,
  they reconnect and send it again until it is answered.
- :meth:`Db.fetchrow_once` sends a statement once. When the connection breaks with it
  in flight, it reconnects and raises :class:`ConnectionLost`: the statement's outcome
  is unknown (its COMMIT may have landed and only the acknowledgement was lost), and
  the caller resolves it on the new connection. The log append does (``logstore``: it
  re-reads the log).

Reconnecting: each attempt first reaches the crash point ``db.reconnect`` on logical
task ``db`` (occurrence *n*: the *n*-th attempt of this worker, the harness heals a
network fault there), then connects with a ``connect_timeout_s`` bound; attempts back
off from 20 ms to 0.5 s. On the new connection it first ends the old connection's server
process (``pg_terminate_backend``) and waits until it is gone, so that a statement the
old one was still running has committed or rolled back before anything is re-read or
sent again. When no connection could be made within ``reconnect_deadline_s`` of the
loss, :class:`DatabaseUnavailable` is raised: the worker fails loudly, and the run is
left as it was, to be resumed by another worker. A statement unanswered after
``command_timeout_s`` (a link that went silent) counts as a lost connection. A
:class:`Db` built without a DSN (``Db(conn)``) cannot reconnect: errors pass through.

**A worker process that runs many runs** keeps its connection from one run to the next,
as a production worker keeps its pool (:class:`ConnectionKeeper`): a new connection
costs the server a process of its own (fork, authentication, catalog caches, a plan for
every statement), ~5 ms of PostgreSQL's CPU a run on the checkout matrix
(docs/benchmarks.md, "A long-lived worker's kept connection, and xdist's own floor").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg

from crashmatrix.harness.crashpoint import DB_RECONNECT, crashpoint, reset_logical_task, set_logical_task

from .turns import Turns


RECONNECT_DEADLINE_S = 5.0
"""Seconds a worker keeps trying to reconnect after losing its connection."""
CONNECT_TIMEOUT_S = 2.0
"""Seconds one connection attempt may take (asyncpg's own default is 60)."""
COMMAND_TIMEOUT_S = 30.0
"""Seconds a statement may go unanswered before the connection counts as lost."""


class ConnectionLost(ConnectionError):
    """The connection broke while a statement was in flight, so its outcome is unknown;
    the :class:`Db` has already reconnected. Raised by :meth:`Db.fetchrow_once`."""


class DatabaseUnavailable(ConnectionError):
    """No connection could be made within the reconnect deadline. The worker stops
    (loudly); the run's durable state is whatever committed, resumable elsewhere."""


def connection_lost(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """True when ``exc`` means the link to the server broke (not a SQL error): asyncpg's
    connection errors (SQLSTATE class 08, "closed in the middle of operation"), socket
    errors, a statement timeout, or any error after which the connection is closed (an
    administrator shutdown, 57P01)."""
    if isinstance(exc, (asyncpg.PostgresConnectionError, OSError, TimeoutError)):
        return True
    return isinstance(exc, Exception) and conn.is_closed()


class Db:
    """An asyncpg connection used one round trip at a time, that reconnects (see the
    module docstring). ``conn`` is public for code that holds the turn (:meth:`_take_turn`);
    it is replaced on reconnect."""

    def __init__(
        self, conn: asyncpg.Connection, *, dsn: str | None = None, application_name: str | None = None,
        reconnect_deadline_s: float = RECONNECT_DEADLINE_S, connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.conn = conn
        self._turns = Turns()
        self.dsn = dsn
        self.application_name = application_name
        self.reconnect_deadline_s = reconnect_deadline_s
        self.connect_timeout_s = connect_timeout_s
        self.reconnects = 0
        """Connections made after the first (for tests and reports)."""

    async def _take_turn(self) -> None:
        """Hold the connection for one round trip (or a reconnect): FIFO, suspending
        exactly once, then a cancellation checkpoint (see the module docstring). The
        holder calls ``self._turns.end()`` when done."""
        turn = self._turns.take()
        try:
            await turn
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            self._turns.leave(turn)  # gives it back if it was held
            raise

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self._until_answered("fetch", query, args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await self._until_answered("fetchrow", query, args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._until_answered("fetchval", query, args)

    async def execute(self, query: str, *args: Any) -> str:
        return await self._until_answered("execute", query, args)

    async def fetchrow_once(self, query: str, *args: Any) -> asyncpg.Record | None:
        """Send ``query`` once; raises :class:`ConnectionLost` (after reconnecting) when
        the link broke with it in flight, :class:`DatabaseUnavailable` when it could not
        reconnect."""
        await self._take_turn()
        try:
            return await self.conn.fetchrow(query, *args)
        except Exception as exc:
            if self.dsn is None or not connection_lost(exc, self.conn):
                raise
            await self._reconnect(exc, time.monotonic() + self.reconnect_deadline_s)
            raise ConnectionLost(f"connection lost with a statement in flight ({type(exc).__name__}: {exc}); "
                                 f"reconnected, its outcome is unknown") from exc
        finally:
            self._turns.end()

    async def _until_answered(self, method: str, query: str, args: tuple[Any, ...]) -> Any:
        deadline: float | None = None
        await self._take_turn()
        try:
            while True:
                try:
                    return await getattr(self.conn, method)(query, *args)
                except Exception as exc:
                    if self.dsn is None or not connection_lost(exc, self.conn):
                        raise
                    if deadline is None:
                        deadline = time.monotonic() + self.reconnect_deadline_s
                    await self._reconnect(exc, deadline)
        finally:
            self._turns.end()

    async def _reconnect(self, cause: BaseException, deadline: float) -> None:
        """Replace the broken connection (caller holds the turn); raises
        :class:`DatabaseUnavailable` past ``deadline`` (monotonic seconds)."""
        assert self.dsn is not None
        old_pid = self.conn.get_server_pid()
        self.conn.terminate()
        delay = 0.02
        token = set_logical_task("db")
        try:
            while True:
                crashpoint(DB_RECONNECT)
                try:
                    timeout = max(0.05, min(self.connect_timeout_s, deadline - time.monotonic()))
                    conn = await _connect(self.dsn, self.application_name, timeout)
                    await _end_backend(conn, old_pid, deadline)
                    self.conn = conn
                    self.reconnects += 1
                    return
                except Exception as exc:  # refused, reset, timed out, server starting up
                    last = exc
                if time.monotonic() + delay > deadline:
                    raise DatabaseUnavailable(
                        f"database unreachable: the connection was lost ({type(cause).__name__}: {cause}) and no new one "
                        f"could be made in {self.reconnect_deadline_s:g} s (last attempt: {type(last).__name__}: {last})"
                    ) from last
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.5)
        finally:
            reset_logical_task(token)

    async def close(self) -> None:
        await self.conn.close()


async def _connect(dsn: str, application_name: str | None, timeout: float) -> asyncpg.Connection:
    settings = {"application_name": application_name} if application_name else {}
    # statements stay cached for the connection's life (asyncpg's default expires each
    # after 300 s by a timer on the loop, which a long-lived worker would end between runs)
    return await asyncpg.connect(dsn, server_settings=settings, timeout=timeout, command_timeout=COMMAND_TIMEOUT_S,
                                 max_cached_statement_lifetime=0)


async def _end_backend(conn: asyncpg.Connection, pid: int, deadline: float) -> None:
    """Terminate server process ``pid`` (the broken connection's) and wait until it has
    exited; closes ``conn`` and raises if that cannot be done by ``deadline``."""
    try:
        try:
            await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        except asyncpg.InsufficientPrivilegeError:
            pass  # another role's process cannot be signalled: wait for it to notice the broken socket
        while await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the old connection's server process {pid} did not exit")
            await anyio.sleep(0.005)
    except BaseException:
        conn.terminate()
        raise


async def connect(dsn: str, *, application_name: str = "crashmatrix-runtime",
                  reconnect_deadline_s: float = RECONNECT_DEADLINE_S) -> Db:
    """Open one connection to ``dsn``; ``application_name`` lets a controller find this
    worker's sessions in ``pg_stat_activity`` after the worker died. The :class:`Db`
    reconnects to the same DSN (same application name) when the connection breaks."""
    conn = await _connect(dsn, application_name, CONNECT_TIMEOUT_S * 5)
    return Db(conn, dsn=dsn, application_name=application_name, reconnect_deadline_s=reconnect_deadline_s)


class ConnectionKeeper:
    """The connection a worker process keeps from one run to the next.

    :meth:`release` keeps a run's connection unless it is closed or inside a
    transaction (a run cancelled mid-transaction: closing it ends the transaction and
    its locks at once, as a worker's exit would). :meth:`connect` hands the kept
    connection to the next run in one round trip: reset as asyncpg's pool resets one
    (``Connection.get_reset_query``: advisory locks, cursors, listeners and session
    settings dropped) and named for that run (``application_name``: the controller finds
    a worker's sessions by it); it opens a new one (:func:`connect`) when none is kept
    for ``dsn`` on the running event loop or the kept one does not answer (its server
    restarted, its link cut, a cancelled statement still in flight). One connection at
    most: keeping one for another DSN (a ``db-restart`` case's server) closes the one
    kept before. For one event loop at a time; not thread-safe.
    """

    def __init__(self) -> None:
        self._kept: tuple[asyncio.AbstractEventLoop, str, asyncpg.Connection] | None = None

    async def connect(self, dsn: str, *, application_name: str,
                      reconnect_deadline_s: float = RECONNECT_DEADLINE_S) -> Db:
        """A :class:`Db` on ``dsn`` named ``application_name``: the kept connection when
        it answers, else a new one (raises as :func:`connect` does)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            loop, kept_dsn, conn = kept
            if loop is asyncio.get_running_loop() and kept_dsn == dsn and not conn.is_closed():
                name = "'" + application_name.replace("'", "''") + "'"
                try:
                    await conn.execute(f"{conn.get_reset_query()}\nSELECT set_config('application_name', {name}, false);",
                                       timeout=CONNECT_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - gone or busy: a new connection instead
                    _abandon(conn)
                except BaseException:
                    _abandon(conn)
                    raise
                else:
                    return Db(conn, dsn=dsn, application_name=application_name,
                              reconnect_deadline_s=reconnect_deadline_s)
            else:
                _abandon(conn)
        return await connect(dsn, application_name=application_name, reconnect_deadline_s=reconnect_deadline_s)

    def release(self, db: Db) -> None:
        """Keep ``db``'s connection for the next run (closing the one kept before), or
        close it when it is inside a transaction."""
        conn = db.conn
        if db.dsn is None or conn.is_closed():
            return
        if conn.is_in_transaction():
            _abandon(conn)
            return
        if self._kept is not None:
            _abandon(self._kept[2])
        self._kept = (asyncio.get_running_loop(), db.dsn, conn)


def _abandon(conn: asyncpg.Connection) -> None:
    """Close ``conn`` at once (no round trip); a connection whose event loop has closed
    leaves its socket to the garbage collector."""
    try:
        conn.terminate()
    except Exception:  # noqa: BLE001 - its loop is closed
        pass
