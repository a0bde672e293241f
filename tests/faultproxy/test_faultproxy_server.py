"""The embedded server's entry points: serve(), EmbeddedToxiproxy, main() and the CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import requests

from crashmatrix.harness.errors import InvalidArgument, ServiceError
from crashmatrix.harness.faultproxy import EmbeddedToxiproxy, FaultProxyServer, main, serve

from ._support import EchoServer, closed_port


def test_serve_runs_in_the_current_loop_and_close_closes_everything(echo: EchoServer) -> None:
    async def scenario() -> None:
        server = await serve(port=0, seed=3)
        assert isinstance(server, FaultProxyServer)
        assert server.url == f"http://127.0.0.1:{server.port}" and server.host == "127.0.0.1"
        async with aiohttp.ClientSession() as http:
            async with http.post(server.url + "/proxies", json={
                    "name": "a", "upstream": echo.addr, "listen": "127.0.0.1:0"}) as r:
                assert r.status == 201
                listen = (await r.json())["listen"]
        port = int(listen.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 2) == b"ping"
        await server.close()
        assert await asyncio.wait_for(reader.read(), 2) == b""  # live connection closed
        writer.close()
        for p in (port, server.port):
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", p)

    asyncio.run(scenario())


def test_server_refuses_non_loopback_unless_allowed() -> None:
    async def scenario() -> None:
        with pytest.raises(InvalidArgument):
            await serve("0.0.0.0", 0)
        with pytest.raises(InvalidArgument):
            await serve("", 0)
        server = await serve("localhost", 0)
        assert server.host == "127.0.0.1"
        await server.close()
        allowed = await serve("0.0.0.0", 0, allow_non_loopback=True)
        assert allowed.host == "0.0.0.0"
        await allowed.close()

    asyncio.run(scenario())


def test_bad_options_are_invalid_arguments() -> None:
    for kwargs in ({"port": -1}, {"port": 70000}, {"seed": "x"}, {"reset_peer_linger": "never"},
                   {"handler_timeout": 0}):
        with pytest.raises(InvalidArgument):
            FaultProxyServer(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ServiceError):
        FaultProxyServer().url


def test_busy_api_port_is_a_service_error() -> None:
    blocker = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(ServiceError, match="address already in use"):
            EmbeddedToxiproxy(port=blocker.getsockname()[1]).start()
    finally:
        blocker.close()


def test_embedded_runner_stops_and_joins() -> None:
    tp = EmbeddedToxiproxy(seed=9).start()
    url = tp.url
    assert requests.get(url + "/version", timeout=5).status_code == 200
    assert tp.call(lambda server: _count(server)) == 0
    thread = tp._thread
    tp.stop()
    assert thread is not None and not thread.is_alive()
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/version", timeout=2)
    tp.stop()  # idempotent


async def _count(server: FaultProxyServer) -> int:
    return len(server.proxies.proxies)


def _spawn(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "crashmatrix.harness.faultproxy", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    return proc, line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_prints_address_and_exits_on_signal(sig: signal.Signals, tmp_path: Path, echo: EchoServer) -> None:
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "cfg", "upstream": echo.addr, "listen": "127.0.0.1:0"}]))
    proc, line = _spawn("--port", "0", "--seed", "4", "--config", str(config))
    try:
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        assert requests.get(url + "/version", timeout=5).status_code == 200
        assert "cfg" in requests.get(url + "/proxies", timeout=5).json()
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_main_reports_bad_host_and_busy_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2
    assert "allow_non_loopback" in capsys.readouterr().err
    blocker = socket.create_server(("127.0.0.1", 0))
    try:
        assert main(["--port", str(blocker.getsockname()[1])]) == 1
        assert "address already in use" in capsys.readouterr().err
    finally:
        blocker.close()


def test_config_with_a_bad_entry_fails_startup(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps([{"name": "x"}]))
    proc, line = _spawn("--port", "0", "--config", str(config))
    try:
        assert proc.wait(10) == 1
        assert line == ""
        assert proc.stderr is not None and "missing required field: upstream at proxy 1" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unreachable_upstream_port_closes_client(echo: EchoServer) -> None:
    with EmbeddedToxiproxy() as tp:
        r = requests.post(tp.url + "/proxies", timeout=5, json={
            "name": "dead", "upstream": f"localhost:{closed_port()}", "listen": "127.0.0.1:0"})
        port = int(r.json()["listen"].rsplit(":", 1)[1])
        c = socket.create_connection(("127.0.0.1", port), timeout=2)
        assert c.recv(1) == b""
