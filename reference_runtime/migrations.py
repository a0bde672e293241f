"""Schema migrations: run once per database, under an advisory lock.

Many workers and controllers may start at once against one database; the advisory lock
makes exactly one of them apply ``schema.sql`` while the others wait, and every
statement in it is idempotent, so running it again is harmless.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

SCHEMA_VERSION = 7
"""2: adds cm_run_invocations, cm_effects.resolution and an index for retention; 3: the
``limit_exceeded`` status; 4: ``cm_runs.queue`` (the sweep's, :mod:`.sweep`); 5: the
``cannot_migrate`` and ``cancelled`` statuses; 6: ``cm_run_log.kind``, ``tokens``,
``wall_ms`` and ``spawned`` (:func:`.logstore.record_facts`; NULL in older rows); 7:
``cm_run_restored`` (:mod:`.restore`). An older database is brought to 7 by re-running the (idempotent) schema.sql."""
# An arbitrary, fixed 64-bit key for pg_advisory_lock ("crashmat" in ASCII).
_ADVISORY_KEY = 0x63726173686D6174


def schema_sql() -> str:
    """The DDL of the current schema version (``schema.sql`` beside this module)."""
    return resources.files(__package__).joinpath("schema.sql").read_text()


async def migrate(conn: asyncpg.Connection) -> int:
    """Bring the database behind ``conn`` to :data:`SCHEMA_VERSION`; return that version.

    Holds ``pg_advisory_lock`` for the duration. Raises ``RuntimeError`` if the database
    carries a newer schema than this build knows (an older build must not write to it).
    """
    await conn.execute("SELECT pg_advisory_lock($1)", _ADVISORY_KEY)
    try:
        exists = await conn.fetchval("SELECT to_regclass('cm_schema_version') IS NOT NULL")
        if exists:
            current = await conn.fetchval("SELECT max(version) FROM cm_schema_version")
            if current is not None and current > SCHEMA_VERSION:
                raise RuntimeError(
                    f"database schema version {current} is newer than this build's "
                    f"{SCHEMA_VERSION}; upgrade crashmatrix"
                )
            if current == SCHEMA_VERSION:
                return SCHEMA_VERSION
        await conn.execute(schema_sql())
        return SCHEMA_VERSION
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _ADVISORY_KEY)
