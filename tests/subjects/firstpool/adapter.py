"""The reference adapter with its controller-side pool keyed on nothing: ``observe`` (and
the cancel API) read through one asyncpg pool made from the first ``env.dsn`` the
instance saw, kept until ``aclose``. docs/adapters.md allows it ("One instance, one
PostgreSQL"); a harness that handed one instance two servers would read the wrong one.

Lives with the tests (``tests/subjects`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncpg

from crashmatrix.harness.adapters.reference import ReferenceAdapter


class FirstDsnPoolAdapter(ReferenceAdapter):
    """One pool per instance, on the first DSN seen."""

    name = "first-dsn-pool"
    _pool: asyncpg.Pool | None = None

    async def _oracle_pool(self, dsn: str) -> asyncpg.Pool:
        if self._pool is None:
            self._pool = await asyncpg.create_pool(
                dsn, min_size=0, max_size=4, server_settings={"application_name": "crashmatrix-oracle"})
        return self._pool

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


_SHARED: dict[str, asyncpg.Pool] = {}


class ProcessPoolAdapter(ReferenceAdapter):
    """One pool per *process*, on the first DSN any instance saw: its ``observe`` reads
    that server whatever ``env.dsn`` says (broken: an instance of its own per server
    cannot help it; the harness's check before any case names it)."""

    name = "process-pool"

    async def _oracle_pool(self, dsn: str) -> asyncpg.Pool:
        if "pool" not in _SHARED:
            _SHARED["pool"] = await asyncpg.create_pool(
                dsn, min_size=0, max_size=4, server_settings={"application_name": "crashmatrix-oracle"})
        return _SHARED["pool"]

    async def aclose(self) -> None:
        pool = _SHARED.pop("pool", None)
        if pool is not None:
            await pool.close()
