"""One connection per worker, shared by the run's concurrent nodes.

asyncpg refuses two concurrent operations on one connection, so every round trip goes
through :class:`Db`, which serialises them with an ``anyio.Lock``. The lock is also a
cancellation checkpoint: a write attempted inside a cancelled scope without a shield
never reaches the server (which is what DESIGN.md's "an unshielded recovery write is
lost" means in practice).
"""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg


class Db:
    """A locked asyncpg connection. ``conn`` is public for code that holds the lock."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.lock = anyio.Lock()

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async with self.lock:
            return await self.conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        async with self.lock:
            return await self.conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self.lock:
            return await self.conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        async with self.lock:
            return await self.conn.execute(query, *args)

    async def close(self) -> None:
        await self.conn.close()


async def connect(dsn: str, *, application_name: str = "crashmatrix-runtime") -> Db:
    """Open one connection to ``dsn``; ``application_name`` lets a controller find this
    worker's sessions in ``pg_stat_activity`` after the worker died."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": application_name})
    return Db(conn)
