"""The launcher: parallel start, process groups, READY handshake, clean close."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from crashmatrix.harness.errors import ServiceError
from crashmatrix.harness.services.providers import clients
from crashmatrix.harness.services.providers.launcher import ProviderStartError, start_providers
from crashmatrix.harness.services.providers.ledger import LedgerFile, read_ledger_file


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for the interpreter (ignores its arguments)."""
    path = tmp_path / "fakepy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_start_three_in_parallel_register_groups_and_close_leaves_nothing(tmp_path: Path) -> None:
    registered: list[int] = []
    with start_providers(tmp_path, register_pgid=registered.append) as p:
        assert set(p.urls) == {"payment", "mail", "model"}
        assert sorted(registered) == sorted(p.pids.values())
        for kind, pid in p.pids.items():
            assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # own session and group
            assert p.urls[kind].startswith("http://127.0.0.1:")
            assert p.ledger_paths[kind] == tmp_path / f"{kind}.sqlite3"
        assert p.start_s < 5.0, p.start_s  # typically 0.3-0.7 s on two cores

        async def kinds() -> list[Any]:
            async with aiohttp.ClientSession() as s:
                return [await clients.health(s, p.urls[k]) for k in p.urls]

        assert asyncio.run(kinds()) == list(p.urls)
    assert p.exit_codes == {"payment": 0, "mail": 0, "model": 0}  # SIGTERM -> clean exit
    assert all(gone(pid) for pid in p.pids.values())
    p.close()  # idempotent


def test_the_ledger_outlives_the_server(tmp_path: Path) -> None:
    async def charge(url: str) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s:
            return await clients.charge(s, url, key="k-1", amount=300, currency="eur", card="4242", run_id="r1")

    with start_providers(tmp_path, kinds=("payment",)) as p:
        first = asyncio.run(charge(p.urls["payment"]))
        os.kill(p.pids["payment"], signal.SIGKILL)  # no clean shutdown, no checkpoint
    assert p.exit_codes["payment"] == -signal.SIGKILL
    rows = read_ledger_file(tmp_path / "payment.sqlite3", "r1")
    assert [(r["key"], r["attempts"]) for r in rows] == [("k-1", 1)]
    with start_providers(tmp_path, kinds=("payment",)) as p2:
        assert asyncio.run(charge(p2.urls["payment"])) == first  # deduped across restarts
    assert [r["attempts"] for r in read_ledger_file(tmp_path / "payment.sqlite3", "r1")] == [2]


def test_the_ledger_read_from_its_file_is_what_the_server_answers_after_every_request(tmp_path: Path) -> None:
    """The controller reads a running provider's ledger from its file (``LedgerFile``,
    one kept connection): after each answered request, the same rows and refusals as
    ``GET /ledger`` and ``GET /refusals``, a later commit seen by the same connection."""
    ledger = LedgerFile(tmp_path / "payment.sqlite3")

    async def scenario(url: str) -> None:
        async with aiohttp.ClientSession() as s:
            for n, key in enumerate(("k-1", "k-2", "k-1"), 1):
                await clients.charge(s, url, key=key, amount=300, currency="eur", card="4242", run_id="r1")
                rows = ledger.rows("r1")
                assert rows == await clients.read_ledger(s, url, "r1") and len(rows) == min(n, 2)
            with pytest.raises(clients.ProviderError):
                await clients.charge(s, url, key="k-3", amount=-1, currency="eur", card="4242", run_id="r1")
            refusals = ledger.refusals("r1")
            assert refusals == await clients.read_refusals(s, url, "r1") and len(refusals) == 1
            assert ledger.rows("r2") == [] and ledger.refusals("r2") == []

    try:
        with start_providers(tmp_path, kinds=("payment",)) as p:
            asyncio.run(scenario(p.urls["payment"]))
    finally:
        ledger.close()
    ledger.close()  # idempotent


def test_a_second_server_on_the_same_ledger_is_refused(tmp_path: Path) -> None:
    with start_providers(tmp_path, kinds=("mail",)):
        with pytest.raises(ProviderStartError, match=r"(?s)'mail'.*in use by another provider"):
            start_providers(tmp_path, kinds=("mail",))


def test_server_that_exits_before_ready_names_kind_and_stderr(tmp_path: Path) -> None:
    (tmp_path / "model.sqlite3").mkdir()  # a directory where the ledger file should be
    registered: list[int] = []
    with pytest.raises(ProviderStartError) as info:
        start_providers(tmp_path, register_pgid=registered.append)
    message = str(info.value)
    assert "'model'" in message and "before READY" in message and "sqlite3" in message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ServiceError)
    assert len(registered) == 3 and all(gone(pid) for pid in registered)  # others stopped too


def test_server_that_never_gets_ready_times_out_and_is_killed(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo 'starting slowly' >&2\nexec sleep 30")
    registered: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(ProviderStartError, match=r"(?s)'payment'.*did not print READY.*starting slowly"):
        start_providers(tmp_path, kinds=("payment",), python=python, ready_timeout_s=0.5,
                        register_pgid=registered.append)
    assert time.monotonic() - t0 < 3
    assert all(gone(pid) for pid in registered)


def test_close_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "trap '' TERM\necho READY 1\nexec sleep 30")
    p = start_providers(tmp_path, kinds=("mail",), python=python)
    t0 = time.monotonic()
    p.close(grace_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 2
    assert p.exit_codes == {"mail": -signal.SIGKILL} and gone(p.pids["mail"])


def test_garbage_instead_of_ready_is_an_error(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo hello\nexec sleep 30")
    with pytest.raises(ProviderStartError, match=r"printed 'hello' instead of READY"):
        start_providers(tmp_path, kinds=("payment",), python=python)


def test_bad_kinds_are_refused(tmp_path: Path) -> None:
    for kinds in [("payment", "payment"), ("bank",), ()]:
        with pytest.raises(ValueError, match="kinds"):
            start_providers(tmp_path, kinds=kinds)


def test_server_cli_prints_exactly_ready(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "crashmatrix.harness.services.providers.server", "--kind", "model",
         "--ledger", str(tmp_path / "m.sqlite3"), "--port", "0", "--delay-ms", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("READY ") and int(line.split()[1]) > 0
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and out == b"", err


def test_provider_killed_mid_request_is_ambiguous_and_applied_nothing(tmp_path: Path) -> None:
    async def crash(url: str, pid: int) -> BaseException:
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(clients.charge(
                s, url, key="k-mid", amount=5, currency="eur", card="4242", run_id="r-mid",
                worker_id="w-mid", delay_ms=5000,
            ))
            while await clients.inflight(s, url, "w-mid") == 0:
                await asyncio.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(clients.AmbiguousProviderError) as info:
                await task
            return info.value

    async def probe(url: str) -> clients.ProbeResult:
        async with aiohttp.ClientSession() as s:
            return await clients.get_charge_status(s, url, "k-mid")

    with start_providers(tmp_path, kinds=("payment",)) as p:
        err = asyncio.run(crash(p.urls["payment"], p.pids["payment"]))
    assert err.retryable and err.status is None
    with start_providers(tmp_path, kinds=("payment",)) as p2:
        assert asyncio.run(probe(p2.urls["payment"])) == clients.ProbeResult("not_applied")
