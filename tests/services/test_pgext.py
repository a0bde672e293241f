"""The SQL extensions uuid-ossp and pgcrypto on the embedded PostgreSQL (real server):
what they provide computes what the C modules do, what they leave out is absent, and a
prepare that needs what the server lacks gets one line naming it and --dsn."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
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
        digests = {a: await c.fetchval("SELECT digest('abc'::text, $1)", a)
                   for a in ("md5", "sha1", "sha224", "SHA256", "sha384", "sha512")}
        long_key = "k" * 200
        macs = {a: await c.fetchval("SELECT hmac('msg'::text, $2, $1)", a, long_key) for a in ("md5", "sha1", "sha256", "sha512")}
        # SHA-1 is written in PL/pgSQL: every padding case (0, 55, 56, 63, 64 bytes, several blocks)
        sha1 = {n: await c.fetchval("SELECT digest($1::bytea, 'sha1')", bytes(i % 251 for i in range(n)))
                for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000)}
        v5 = {name: await c.fetchval("SELECT uuid_generate_v5(uuid_ns_dns(), $1)", name) for name in ("", "example.com", "ü" * 40)}
        v1mc = [await c.fetchval("SELECT uuid_generate_v1mc()") for _ in range(20)]
        return v4, v3, nil, gen, rnd, digests, macs, sha1, v5, v1mc

    v4, v3, nil, gen, rnd, digests, macs, sha1, v5, v1mc = _run(dsn, body)
    assert len(set(v4)) == 3 and all(u.version == 4 for u in v4)
    assert v3 == uuid.uuid3(uuid.NAMESPACE_URL, "https://example.com/ü")
    assert nil == uuid.UUID(int=0) and gen.version == 4
    assert [len(b) for b in rnd] == [1, 14, 15, 1024] and len(set(rnd[3])) > 200
    for alg, got in digests.items():
        assert got == hashlib.new(alg.lower(), b"abc").digest(), alg
    for alg, got in macs.items():
        assert got == hmac.new(b"k" * 200, b"msg", alg).digest(), alg
    for n, got in sha1.items():
        assert got == hashlib.sha1(bytes(i % 251 for i in range(n))).digest(), n
    for name, got in v5.items():
        assert got == uuid.uuid5(uuid.NAMESPACE_DNS, name), name
    now = time.time_ns() // 100 + 0x01B21DD213814000  # 100 ns since 1582-10-15
    assert len(set(v1mc)) == 20
    for u in v1mc:  # version 1, RFC 4122 variant, multicast node, the server's time
        assert u.version == 1 and u.variant == uuid.RFC_4122 and (u.node >> 40) & 1 == 1
        assert abs(u.time - now) < 60 * 10**7, (u, now)


def test_what_is_not_provided_fails_and_prepare_says_so_in_one_line(dsn: str) -> None:
    async def body(c):
        await c.execute('CREATE EXTENSION IF NOT EXISTS "uuid-ossp"; CREATE EXTENSION IF NOT EXISTS pgcrypto')
        errors = []
        for sql in ("SELECT digest('abc', 'ripemd160')", "SELECT uuid_generate_v1()",
                    "SELECT crypt('pw', gen_salt('bf'))", "CREATE EXTENSION postgis", "SELECT 1/0"):
            try:
                await c.execute(sql)
            except asyncpg.PostgresError as exc:
                errors.append(exc)
        return errors

    ripemd, v1, crypt, postgis, zero = _run(dsn, body)
    assert isinstance(ripemd, asyncpg.FeatureNotSupportedError) and '"ripemd160"' in str(ripemd)
    assert isinstance(v1, asyncpg.UndefinedFunctionError) and isinstance(crypt, asyncpg.UndefinedFunctionError)
    line = explain_prepare_error(v1, "dbos", embedded=True)
    assert line is not None and "uuid_generate_v1() of uuid-ossp" in line and "--dsn" in line and "\n" not in line
    assert "gen_salt() of pgcrypto" in explain_prepare_error(crypt, "x", embedded=True)
    wrapped = RuntimeError("migration failed")
    wrapped.__cause__ = postgis  # as SQLAlchemy and the like wrap the driver's error
    line = explain_prepare_error(wrapped, "absurd", embedded=True)
    assert line is not None and 'no extension "postgis"' in line and "--dsn" in line
    assert explain_prepare_error(postgis, "absurd", embedded=False) is None  # the user's server: its own business
    assert explain_prepare_error(zero, "absurd", embedded=True) is None
