"""Bring-up and tear-down of everything a matrix needs, in one context manager.

:func:`open_session` starts, in order: the watchdog (so a SIGKILLed controller still
leaves nothing behind), PostgreSQL (the caller's, else its own: the user's DSN or embedded,
:mod:`.services.matrixpg`), the providers of the
workload (the built-in kinds it lists and the services it declares), the worker zygote,
one HTTP session; then applies the subject's migrations.
The fault proxy (network faults) starts only when the first ``net`` case needs it.
Leaving the context stops them in reverse order and removes the working directory;
whatever the controller cannot clean (it was SIGKILLed) the watchdog does.

A ``subject`` that names a build pair (``A_SPEC>>B_SPEC``: :mod:`.builds`) gets one
zygote per build (each from its build's interpreter and path) and an explorer whose
adapter calls go to workers of the builds (:class:`.builds.BuildAdapter`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from . import registry
from .adapter import Environment
from .errors import InvalidArgument, ServiceError
from .explorer import Explorer, Options
from .pool import WorkerPool
from .services.matrixpg import MATRIX_PG_SETTINGS, MatrixPostgres, Workdir
from .services.postgres import read_pool

__all__ = ["MATRIX_PG_SETTINGS", "open_session"]


def _ledger_files(stack: contextlib.AsyncExitStack, providers: Any) -> dict[str, Any]:
    """Each provider's ledger file, read by the controller (:class:`~.services.providers.ledger.LedgerFile`,
    closed with the session), by kind; ``providers`` a started
    :class:`~.services.providers.launcher.Providers`."""
    from .services.providers.ledger import LedgerFile

    ledgers = {kind: LedgerFile(path) for kind, path in providers.ledger_paths.items()}
    for file in ledgers.values():
        stack.callback(file.close)
    return ledgers


async def _providers(stack: contextlib.AsyncExitStack, watchdog: Any, workdir: Path, wl: Any,
                     services: dict[str, Any]) -> Any:
    """Start the workload ``wl``'s providers (its built-in kinds and declared
    ``services``) under ``workdir/providers``, watched by ``watchdog``, and register
    their stop on ``stack``; returns the :class:`~.services.providers.launcher.Providers`.
    Raises :class:`ServiceError` (the first line of the launcher's error) when one
    does not start."""
    from .services.providers.launcher import start_providers

    try:
        providers = await asyncio.to_thread(
            start_providers, workdir / "providers", kinds=wl.providers, services=services.values(),
            register_pgid=watchdog.watch_pgid)
    except RuntimeError as exc:
        raise ServiceError(str(exc).splitlines()[0]) from None
    def stop_providers() -> None:
        providers.close()
        for pid in providers.pids.values():
            watchdog.forget_pgid(pid)

    stack.callback(stop_providers)
    return providers


async def _pools(subject: str, workload: str, options: Options | None, preload: tuple[str, ...], upgrade: Any,
                 own: Any, workdir: Path, watchdog: Any,
                 enter_pool: Callable[[WorkerPool], Awaitable[WorkerPool]]) -> tuple[Any, Any]:
    """The worker pools of :func:`open_session`, each entered by ``enter_pool``:
    ``(pool, adapter)``, one :class:`WorkerPool` (with a residents directory unless
    ``options`` turn long-lived workers off) and no adapter, or an
    :class:`~.builds.EnvAdapter` for a subject in its own environment (``own``); for a
    build pair (``upgrade``), :class:`~.builds.BuildPools` of one pool per build and a
    :class:`~.builds.BuildAdapter`."""
    from .builds import BuildAdapter, BuildPools, EnvAdapter, worker_path, zygote_path

    adapter = None
    if upgrade is None:
        residents = None
        if options is None or options.long_lived:
            residents = workdir / "residents"
            residents.mkdir()
        # a subject in its own environment: its interpreter, crashmatrix's packages on its path
        python, path = (None, ()) if own is None else (own.python, (worker_path(workdir / "subject-path"), *own.path))
        pool: WorkerPool | BuildPools = await enter_pool(WorkerPool(
            subject if own is None else own.subject, workload, register_pgid=watchdog.watch_pgid, preload=preload,
            residents_dir=None if residents is None else str(residents), python=python, pythonpath=path))
        if own is not None:
            adapter = EnvAdapter(pool, own, workload, workdir / "builds")
    else:  # one zygote per build, each from its own interpreter and path
        pool = BuildPools(upgrade, {b.label: await enter_pool(WorkerPool(
            b.subject, workload, register_pgid=watchdog.watch_pgid, python=b.python,
            pythonpath=zygote_path(b, workdir)))
            for b in (upgrade.crash, upgrade.resume)})
        adapter = BuildAdapter(pool, workload, workdir / "builds")
    return pool, adapter


@contextlib.asynccontextmanager
async def open_session(
    subject: str = "reference", workload: str = "checkout", *, dsn: str | None = None,
    options: Options | None = None, preload: tuple[str, ...] = (), pg_settings: dict[str, str] | None = None,
    postgres: MatrixPostgres | None = None,
) -> AsyncIterator[Explorer]:
    """Yield an :class:`Explorer` on live services. Raises :class:`ServiceError` (one
    line) when PostgreSQL or a provider cannot be started or reached, and
    :class:`~crashmatrix.harness.errors.RegistryError` for an unknown subject or
    workload and :class:`~crashmatrix.harness.errors.InvalidArgument` for a workload
    whose declared services (``workload.services``, :mod:`.services.providers.declared`)
    are malformed or not in its ``providers``, before starting anything. ``preload``: further subjects the worker zygote
    imports, for :meth:`Explorer.for_subject` (one session serving several subjects).
    ``pg_settings``: the embedded PostgreSQL's settings (default
    :data:`MATRIX_PG_SETTINGS`; ``{"fsync": "on"}`` to measure with durable commits).
    ``postgres``: a PostgreSQL the caller owns (:class:`.services.matrixpg.MatrixPostgres`,
    started here if it is not yet, never stopped here), instead of one of the session's
    own from ``dsn`` and ``pg_settings`` (then both must be None; else
    :class:`~.errors.InvalidArgument`). A build pair's builds are checked by
    :func:`.builds.check_subject`."""
    from .builds import check_subject, own_build, parse_subject
    from .services.providers.declared import workload_services

    if postgres is not None and (dsn is not None or pg_settings is not None):
        raise InvalidArgument("open_session: give postgres, or dsn and pg_settings, not both")
    check_subject(subject, workload)
    for name in preload:
        registry.subject(name)
    upgrade = parse_subject(subject)
    own = own_build(subject)
    wl = registry.workload(workload)
    services = workload_services(wl)  # a bad declaration is bad input, before anything starts
    async with contextlib.AsyncExitStack() as stack:
        home = Workdir("crashmatrix-")
        stack.callback(home.close)
        workdir, watchdog = home.path, home.watchdog
        if postgres is None:
            postgres = MatrixPostgres(home, dsn=dsn, settings=pg_settings)
            stack.callback(postgres.close)
        pg = await asyncio.to_thread(postgres.start)
        providers = await _providers(stack, watchdog, workdir, wl, services)
        env = Environment(pg.dsn, dict(providers.urls), str(workdir), workload=workload)

        async def enter_pool(pool: WorkerPool) -> WorkerPool:
            # registered first, so it runs after the pool has closed (exit stacks unwind LIFO)
            stack.callback(lambda: pool.closed_cleanly and pool.pid is not None and watchdog.forget_pgid(pool.pid))
            return await stack.enter_async_context(pool)

        pool, adapter = await _pools(subject, workload, options, preload, upgrade, own, workdir, watchdog, enter_pool)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        cases_dir = workdir / "workers"
        cases_dir.mkdir()
        from .netfaults import FaultProxyService

        proxy = FaultProxyService(workdir, watchdog, seed=(options or Options()).proxy_seed,  # started by the first net case
                                  services=postgres.services)
        stack.callback(proxy.close)
        ledgers = _ledger_files(stack, providers)
        explorer = Explorer(env, pool, subject, workload, cases_dir, http, options, adapter=adapter,  # type: ignore[arg-type]
                            upgrade=upgrade, fault_proxy=proxy,
                            start_restartable_pg=postgres.start_restartable if postgres.restartable else None,
                            ledgers=ledgers)
        if adapter is not None:
            await adapter.describe()
        stack.push_async_callback(explorer.aclose)
        explorer.db = await read_pool(pg.dsn, "crashmatrix-controller")
        stack.push_async_callback(explorer.db.close)
        try:
            await explorer.adapter.prepare(env)
        except Exception as exc:  # what the embedded server lacks: one line naming it and --dsn
            from .services.pgext import explain_prepare_error

            line = explain_prepare_error(exc, subject, postgres.restartable and postgres.services == "embedded")
            if line is None:
                raise
            raise ServiceError(line) from exc
        stack.push_async_callback(explorer.adapter.aclose)
        yield explorer
