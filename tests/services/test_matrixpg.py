"""The matrix's PostgreSQL (harness/services/matrixpg.py): where the main and the
restartable servers come from, their settings, and that nothing is left behind."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from crashmatrix.harness.errors import HarnessError
from crashmatrix.harness.services.matrixpg import MATRIX_PG_SETTINGS, MatrixPostgres, Workdir
from crashmatrix.harness.services.postgres import DSN_ENV, PostgresService
from crashmatrix.harness.services.process import pid_alive


async def _setting(dsn: str, name: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval("SELECT current_setting($1)", name))
    finally:
        await conn.close()


def test_embedded_main_and_restartable_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    home = Workdir("crashmatrix-test-")
    pg = MatrixPostgres(home)
    try:
        main = pg.start()
        assert pg.start() is main and main.embedded and pg.restartable
        assert main.base_dir is not None and main.base_dir.parent == home.path / "pg"
        assert asyncio.run(_setting(main.dsn, "fsync")) == MATRIX_PG_SETTINGS["fsync"]
        second = pg.start_restartable()
        try:
            assert second.port != main.port and second.base_dir is not None
            assert second.base_dir.parent == home.path / "pg-restart"
            second.stop_immediate()
            second.start()
            assert asyncio.run(_setting(second.dsn, "fsync")) == MATRIX_PG_SETTINGS["fsync"]
        finally:
            second.close()
        postmaster = main.postmaster_pid
        assert postmaster is not None
    finally:
        pg.close()
        home.close()
    assert not pid_alive(postmaster)
    assert not home.path.exists() and home.watchdog.closed


def test_settings_given_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    home = Workdir("crashmatrix-test-")
    pg = MatrixPostgres(home, settings={"fsync": "on"})
    try:
        assert asyncio.run(_setting(pg.start().dsn, "fsync")) == "on"
    finally:
        pg.close()
        home.close()


def test_a_users_dsn_is_used_as_is_and_not_restartable(embedded_pg: PostgresService,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    home = Workdir("crashmatrix-test-")
    try:
        for pg in (MatrixPostgres(home, dsn=embedded_pg.dsn), _from_env(home, monkeypatch, embedded_pg.dsn)):
            assert not pg.restartable
            main = pg.start()
            assert main.dsn == embedded_pg.dsn and not main.embedded
            with pytest.raises(HarnessError, match="user's DSN"):
                pg.start_restartable()
            pg.close()
            assert embedded_pg.running  # the user's server is left alone
        assert list(home.path.iterdir()) == []  # no embedded server was started
    finally:
        home.close()


def _from_env(home: Workdir, monkeypatch: pytest.MonkeyPatch, dsn: str) -> MatrixPostgres:
    monkeypatch.setenv(DSN_ENV, dsn)
    return MatrixPostgres(home)
