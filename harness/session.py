"""Bring-up and tear-down of everything a matrix needs, in one context manager.

:func:`open_session` starts, in order: the watchdog (so a SIGKILLed controller still
leaves nothing behind), PostgreSQL (the user's DSN, else embedded), the providers of the
workload, the worker zygote, one HTTP session; then applies the subject's migrations.
The fault proxy (network faults) starts only when the first ``net`` case needs it.
Leaving the context stops them in reverse order and removes the working directory;
whatever the controller cannot clean (it was SIGKILLed) the watchdog does.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg

from . import registry
from .adapter import Environment
from .errors import ServiceError
from .explorer import Explorer, Options
from .pool import WorkerPool


@contextlib.asynccontextmanager
async def open_session(
    subject: str = "reference", workload: str = "checkout", *, dsn: str | None = None,
    options: Options | None = None, preload: tuple[str, ...] = (),
) -> AsyncIterator[Explorer]:
    """Yield an :class:`Explorer` on live services. Raises :class:`ServiceError` (one
    line) when PostgreSQL or a provider cannot be started or reached, and
    :class:`~crashmatrix.harness.errors.RegistryError` for an unknown subject or
    workload, before starting anything. ``preload``: further subjects the worker zygote
    imports, for :meth:`Explorer.for_subject` (one session serving several subjects)."""
    from crashmatrix.scenarios.providers.launcher import start_providers

    from .services.postgres import start_postgres
    from .services.watchdog import Watchdog

    for name in (subject, *preload):
        registry.subject(name)
    wl = registry.workload(workload)
    workdir = Path(tempfile.mkdtemp(prefix="crashmatrix-"))
    async with contextlib.AsyncExitStack() as stack:
        watchdog = Watchdog.start()
        stack.callback(watchdog.close)
        watchdog.watch_path(workdir)

        def remove_workdir() -> None:
            shutil.rmtree(workdir, ignore_errors=True)
            watchdog.forget_path(workdir)

        stack.callback(remove_workdir)
        pg = await asyncio.to_thread(start_postgres, workdir / "pg", dsn=dsn, watchdog=watchdog)
        stack.callback(pg.close)
        try:
            providers = await asyncio.to_thread(
                start_providers, workdir / "providers", kinds=wl.providers, register_pgid=watchdog.watch_pgid)
        except RuntimeError as exc:
            raise ServiceError(str(exc).splitlines()[0]) from None
        def stop_providers() -> None:
            providers.close()
            for pid in providers.pids.values():
                watchdog.forget_pgid(pid)

        stack.callback(stop_providers)
        env = Environment(pg.dsn, dict(providers.urls), str(workdir))
        pool = WorkerPool(subject, workload, register_pgid=watchdog.watch_pgid, preload=preload)
        # registered first, so it runs after the pool has closed (exit stacks unwind LIFO)
        stack.callback(lambda: pool.closed_cleanly and pool.pid is not None and watchdog.forget_pgid(pool.pid))
        await stack.enter_async_context(pool)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        cases_dir = workdir / "workers"
        cases_dir.mkdir()
        explorer = Explorer(env, pool, subject, workload, cases_dir, http, options)
        from .netfaults import FaultProxyService

        # started by the first net case
        explorer.fault_proxy = FaultProxyService(workdir, watchdog, seed=explorer.options.proxy_seed)
        stack.callback(explorer.fault_proxy.close)
        if pg.restartable:
            explorer.start_restartable_pg = lambda: start_postgres(workdir / "pg-restart", watchdog=watchdog)
        stack.push_async_callback(explorer.aclose)
        explorer.db = await asyncpg.create_pool(
            pg.dsn, min_size=1, max_size=4, server_settings={"application_name": "crashmatrix-controller"})
        stack.push_async_callback(explorer.db.close)
        await explorer.adapter.prepare(env)
        stack.push_async_callback(explorer.adapter.aclose)
        yield explorer
