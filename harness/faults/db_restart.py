"""``db-restart``: at the point the worker stops itself (SIGSTOP); PostgreSQL is stopped
in immediate mode (a crash: no checkpoint, clients cut) and started again; the worker
wakes on a dead connection and must reconnect or die; the run is resumed as usual
(docs/design.md, "Fault kinds, precisely").

A case with a ``db-restart`` fault anywhere in its plan runs, from its first worker on,
on a PostgreSQL of its own (started on first use, prepared by the adapter, kept for the
session), one such case at a time: the restart would cut every other case's sessions.
The controller's calls for those cases go to an adapter instance of their own, prepared
on that server and closed when the session ends (:func:`adapter_for_server`): an adapter
may keep a pool made from the first DSN it saw (docs/adapters.md, "One instance, one
PostgreSQL").
It needs an embedded PostgreSQL (``Explorer.start_restartable_pg``); a user's DSN
cannot be restarted. No crash check of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import HarnessError
from ._base import CaseSetting, FaultKind, SessionResource, Stops, register, signal_self

if TYPE_CHECKING:
    from ..case import CaseRun, WorkerRun
    from ..explorer import Explorer
    from ..plan import Fault
    from ..worker import Recorder


@dataclass
class RestartablePostgres:
    """The session's PostgreSQL for db-restart cases: the server (``pg``: ``dsn``,
    ``stop_immediate()``, ``start()``, ``close()``), the controller's pool on it, the
    adapter instance prepared on it, and the lock that runs its cases one at a time."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pg: Any = None
    db: Any = None
    adapter: Any = None


@register
class DbRestart(Stops, CaseSetting, SessionResource, FaultKind):
    """Crash-restart PostgreSQL while the worker is stopped at the point."""

    name = "db-restart"
    rank = 5
    listing_order = 4
    short = "dbrs"
    why_not_run = "the worker did not use the harness's PostgreSQL after the point (a store of its own, SQLite)"
    quiesce_database = False  # the restart ended the worker's sessions
    one_at_a_time = True  # the lock in setting(); the case loop starts one at a time
    mostly_waits = True  # ~0.3 s a case, most of it PostgreSQL's stop, crash recovery and start

    def act(self, recorder: Recorder, fault: Fault) -> None:
        signal_self(signal.SIGSTOP)

    @staticmethod
    def _state(ex: Explorer) -> RestartablePostgres:
        state = ex.fault_state.get(DbRestart.name)
        if state is None:
            state = ex.fault_state[DbRestart.name] = RestartablePostgres()
        assert isinstance(state, RestartablePostgres)
        return state

    @contextlib.asynccontextmanager
    async def setting(self, cx: CaseRun) -> AsyncIterator[None]:
        """The case on the second server (started, prepared and its sequences carried
        past the main server's on first use: :func:`carry_sequences`)."""
        ex = cx.explorer
        state = self._state(ex)
        async with state.lock:
            await self._ensure(ex, state)
            with ex.scoped(env=dataclasses.replace(ex.case_env, dsn=state.pg.dsn), db=state.db, adapter=state.adapter):
                yield

    async def _ensure(self, ex: Explorer, state: RestartablePostgres) -> None:
        """Start the second server on first use: its adapter instance prepared on it,
        the controller's pool, the sequences carried. Raises :class:`HarnessError` when
        the session's PostgreSQL came from a DSN."""
        from ..services.postgres import read_pool

        if ex.start_restartable_pg is None:
            raise HarnessError("db-restart is unavailable: PostgreSQL comes from a DSN the harness cannot restart")
        if state.pg is None:
            state.pg = await asyncio.to_thread(ex.start_restartable_pg)
            state.adapter = adapter_for_server(ex.adapter)
            await state.adapter.prepare(dataclasses.replace(ex.env, dsn=state.pg.dsn))
            state.db = await read_pool(state.pg.dsn, "crashmatrix-controller", max_size=2)
            await carry_sequences(ex.db, state.db)

    async def before_matrix(self, ex: Explorer, conversation: str) -> None:
        """Before any case, where the session can restart its PostgreSQL (not a DSN of
        the user's: then every case is a harness error of its own): run
        ``conversation`` once, with no fault, on the second server and read it back
        with that server's adapter instance: ``observe`` must see what the worker wrote
        there. Raises :class:`AdapterContractError` (one line
        naming the method, exit 2) when it reads the run as ``absent``, or another status
        than the terminal one the worker returned (an ``observe`` that
        reads a server other than ``env.dsn``'s: a DSN of its own, a pool shared by
        every instance), :class:`HarnessError` when the worker left no report."""
        from ..errors import AdapterContractError
        from ..explorer import TERMINAL
        from ..plan import FaultPlan

        if ex.start_restartable_pg is None:
            return
        state = self._state(ex)
        async with state.lock:
            await self._ensure(ex, state)
            env = dataclasses.replace(ex.env, dsn=state.pg.dsn)
            with ex.scoped(env=env, db=state.db, adapter=state.adapter):
                run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
                job, log = ex.job("start", conversation, run_id, FaultPlan(), ex.workdir)
                exit_, report = await ex.run_worker(job, log)
                if report.end is None:
                    raise HarnessError(f"db-restart's check run of {conversation} on its PostgreSQL left no report: "
                                       f"{exit_.describe()}")
                seen = (await state.adapter.observe(env, run_id)).status
        wrote = report.end.status
        if (seen == "absent" and wrote != "error") or (wrote in TERMINAL and seen != wrote):
            name = type(state.adapter).__name__
            raise AdapterContractError(
                f"{name}.observe read run {run_id} as {seen!r} on the db-restart PostgreSQL, where a worker just left it "
                f"{wrote!r}: observe must read the server of the env it is given (env.dsn; docs/adapters.md, "
                f"\"One instance, one PostgreSQL\")")

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:
        pg = self._state(cx.explorer).pg
        await asyncio.to_thread(pg.stop_immediate)
        await asyncio.to_thread(pg.start)

    async def close_session(self, ex: Explorer) -> None:
        """Close the controller's pool and the server's adapter instance (they hold
        connections to it), then stop the server."""
        state = ex.fault_state.pop(self.name, None)
        if state is None or state.pg is None:
            return
        if state.db is not None:
            await state.db.close()
        if state.adapter is not None and state.adapter is not ex.adapter:
            await state.adapter.aclose()
        await asyncio.to_thread(state.pg.close)


def adapter_for_server(adapter: Any) -> Any:
    """An instance of ``adapter``'s class of its own for another PostgreSQL server (made
    as the registry makes one: no arguments). A build pair's adapter
    (:class:`.builds.BuildAdapter`) keeps nothing between calls, each made in a worker
    of its own: it serves every server as it is. Raises :class:`HarnessError` naming the
    class when it cannot be made without arguments."""
    from ..builds import BuildAdapter

    if isinstance(adapter, BuildAdapter):
        return adapter
    try:
        return type(adapter)()
    except TypeError as exc:
        raise HarnessError(f"db-restart needs an instance of {type(adapter).__name__} of its own for its PostgreSQL "
                           f"(docs/adapters.md, \"One instance, one PostgreSQL\"), and it cannot be made without "
                           f"arguments: {exc}") from None


SEQUENCE_HEADROOM = 1_000_000
"""How far past the main server's value each sequence of the second server starts."""


async def carry_sequences(main: Any, second: Any) -> int:
    """Move every sequence the second server shares with the main one (same schema and
    name, made by the adapter's ``prepare``) to the main one's value plus
    :data:`SEQUENCE_HEADROOM`; returns how many. A db-restart case runs on a second
    PostgreSQL while the providers keep every run's idempotency keys: a runtime whose keys
    come from a database sequence would otherwise mint, on the fresh server, keys that
    the main server's runs used already (the provider answers 409 "reused with different
    parameters": a false alarm of the harness's, found by a blind subject with sequence
    keys). One database restarted keeps its sequences; this keeps the two apart."""
    rows = await main.fetch("SELECT schemaname, sequencename, last_value FROM pg_sequences")
    carried = 0
    for row in rows:
        there = await second.fetchval("SELECT 1 FROM pg_sequences WHERE schemaname = $1 AND sequencename = $2",
                                      row["schemaname"], row["sequencename"])
        if there:
            await second.execute("SELECT setval(format('%I.%I', $1::text, $2::text)::regclass, $3)",
                                 row["schemaname"], row["sequencename"], int(row["last_value"] or 0) + SEQUENCE_HEADROOM)
            carried += 1
    return carried
