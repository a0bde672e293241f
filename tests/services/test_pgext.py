"""The SQL extensions uuid-ossp and pgcrypto on the embedded PostgreSQL (real server):
what they provide computes what the C modules do, what they leave out is absent, and a
prepare that needs what the server lacks gets one line naming it and --dsn."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import uuid

import asyncpg
import pytest

from crashmatrix.harness.services.pgext import explain_prepare_error
from crashmatrix.harness.services.postgres import start_postgres


@pytest.fixture(scope="module")
def dsn():
    pg = start_postgres()
    try:
        yield pg.dsn
    finally:
        pg.close()


def _run(dsn: str, body):
    async def main():
        conn = await asyncpg.connect(dsn)
        try:
            return await body(conn)
        finally:
            await conn.close()
    return asyncio.run(main())


def test_uuid_ossp_and_pgcrypto_create_and_compute_right(dsn: str) -> None:
    async def body(c):
        await c.execute('CREATE EXTENSION IF NOT EXISTS "uuid-ossp"; CREATE EXTENSION IF NOT EXISTS pgcrypto')
        v4 = [await c.fetchval("SELECT uuid_generate_v4()") for _ in range(3)]
        v3 = await c.fetchval("SELECT uuid_generate_v3(uuid_ns_url(), 'https://example.com/ü')")
        nil = await c.fetchval("SELECT uuid_nil()")
        gen = await c.fetchval("SELECT gen_random_uuid()")
        rnd = [await c.fetchval("SELECT gen_random_bytes($1)", n) for n in (1, 14, 15, 1024)]
        digests = {a: await c.fetchval("SELECT digest('abc'::text, $1)", a) for a in ("md5", "sha224", "SHA256", "sha384", "sha512")}
        long_key = "k" * 200
        macs = {a: await c.fetchval("SELECT hmac('msg'::text, $2, $1)", a, long_key) for a in ("md5", "sha256", "sha512")}
        return v4, v3, nil, gen, rnd, digests, macs

    v4, v3, nil, gen, rnd, digests, macs = _run(dsn, body)
    assert len(set(v4)) == 3 and all(u.version == 4 for u in v4)
    assert v3 == uuid.uuid3(uuid.NAMESPACE_URL, "https://example.com/ü")
    assert nil == uuid.UUID(int=0) and gen.version == 4
    assert [len(b) for b in rnd] == [1, 14, 15, 1024] and len(set(rnd[3])) > 200
    for alg, got in digests.items():
        assert got == hashlib.new(alg.lower(), b"abc").digest(), alg
    for alg, got in macs.items():
        assert got == hmac.new(b"k" * 200, b"msg", alg).digest(), alg


def test_what_is_not_provided_fails_and_prepare_says_so_in_one_line(dsn: str) -> None:
    async def body(c):
        await c.execute('CREATE EXTENSION IF NOT EXISTS "uuid-ossp"; CREATE EXTENSION IF NOT EXISTS pgcrypto')
        errors = []
        for sql in ("SELECT digest('abc', 'sha1')", "SELECT uuid_generate_v5(uuid_ns_dns(), 'x')",
                    "SELECT crypt('pw', gen_salt('bf'))", "CREATE EXTENSION postgis", "SELECT 1/0"):
            try:
                await c.execute(sql)
            except asyncpg.PostgresError as exc:
                errors.append(exc)
        return errors

    sha1, v5, crypt, postgis, zero = _run(dsn, body)
    assert isinstance(sha1, asyncpg.FeatureNotSupportedError) and '"sha1"' in str(sha1)
    assert isinstance(v5, asyncpg.UndefinedFunctionError) and isinstance(crypt, asyncpg.UndefinedFunctionError)
    line = explain_prepare_error(v5, "dbos", embedded=True)
    assert line is not None and "uuid_generate_v5() of uuid-ossp" in line and "--dsn" in line and "\n" not in line
    assert "gen_salt() of pgcrypto" in explain_prepare_error(crypt, "x", embedded=True)
    wrapped = RuntimeError("migration failed")
    wrapped.__cause__ = postgis  # as SQLAlchemy and the like wrap the driver's error
    line = explain_prepare_error(wrapped, "absurd", embedded=True)
    assert line is not None and 'no extension "postgis"' in line and "--dsn" in line
    assert explain_prepare_error(postgis, "absurd", embedded=False) is None  # the user's server: its own business
    assert explain_prepare_error(zero, "absurd", embedded=True) is None
