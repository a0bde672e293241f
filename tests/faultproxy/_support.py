"""Helpers for the fault proxy conformance tests: plain HTTP, real sockets, timings.

Tests run against the embedded server, or against a real Toxiproxy when
``TOXIPROXY_URL`` is set (it must reach upstreams on this host's loopback).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import requests

#: Set when the suite drives a real Toxiproxy instead of the embedded server.
REAL_URL = os.environ.get("TOXIPROXY_URL", "").rstrip("/")
IS_REAL = bool(REAL_URL)

#: Timing tolerance from the spec (Toxiproxy's own tests: ±(jitter + 10) ms) …
TOL = 0.010
#: … plus scheduling slack for a Python process on two shared cores (early is never OK).
SLACK = float(os.environ.get("FAULTPROXY_TEST_SLACK", "0.060"))

#: For tests of the embedded server's own choices (divergences, options): a real
#: Toxiproxy would crash or behave differently, by design.
embedded_only = pytest.mark.skipif(
    IS_REAL, reason="embedded-server behaviour (a documented divergence or an option Toxiproxy lacks)")

_names = itertools.count(1)


def unique(prefix: str = "p") -> str:
    return f"cmtest_{prefix}_{os.getpid()}_{next(_names)}"


class Api:
    """Plain-HTTP access to a Toxiproxy-compatible API, with a timeout on every call."""

    def __init__(self, base: str, timeout: float = 10.0) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.created: list[str] = []

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | str | None = None,
                headers: dict[str, str] | None = None) -> requests.Response:
        kwargs: dict[str, Any] = {"timeout": self.timeout, "headers": headers or {}}
        if raw is not None:
            kwargs["data"] = raw
        elif body is not None:
            kwargs["json"] = body
        return requests.request(method, self.base + path, **kwargs)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> requests.Response:
        return self.request("POST", path, body, **kw)

    def patch(self, path: str, body: Any = None, **kw: Any) -> requests.Response:
        return self.request("PATCH", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> requests.Response:
        return self.request("DELETE", path, **kw)

    # -- conveniences ------------------------------------------------------------------

    def create(self, upstream: str, name: str | None = None, listen: str = "127.0.0.1:0",
               enabled: bool | None = None) -> dict[str, Any]:
        name = name or unique()
        body: dict[str, Any] = {"name": name, "upstream": upstream, "listen": listen}
        if enabled is not None:
            body["enabled"] = enabled
        r = self.post("/proxies", body)
        assert r.status_code == 201, r.text
        self.created.append(name)
        return r.json()

    def track(self, name: str) -> None:
        self.created.append(name)

    def toxic(self, proxy: str, type: str, stream: str = "downstream", name: str | None = None,
              toxicity: float | None = None, **attributes: int) -> dict[str, Any]:
        body: dict[str, Any] = {"type": type, "stream": stream, "attributes": attributes}
        if name is not None:
            body["name"] = name
        if toxicity is not None:
            body["toxicity"] = toxicity
        r = self.post(f"/proxies/{proxy}/toxics", body)
        assert r.status_code == 200, r.text
        return r.json()

    def cleanup(self) -> None:
        for name in self.created:
            self.delete(f"/proxies/{name}")
        self.created.clear()


def port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def connect(listen: str | int, timeout: float = 5.0) -> socket.socket:
    port = listen if isinstance(listen, int) else port_of(listen)
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(sock: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    buf = bytearray()
    while len(buf) < n:
        data = sock.recv(n - len(buf))
        if not data:
            raise EOFError(f"EOF after {len(buf)} of {n} bytes")
        buf += data
    return bytes(buf)


def read_all(sock: socket.socket, timeout: float = 3.0) -> tuple[bytes, str]:
    """Read until EOF, reset or timeout: (data, "eof" | "reset" | "timeout")."""
    sock.settimeout(timeout)
    buf = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            return bytes(buf), "timeout"
        except ConnectionResetError:
            return bytes(buf), "reset"
        if not data:
            return bytes(buf), "eof"
        buf += data


def wait_close(sock: socket.socket, timeout: float = 3.0) -> tuple[str, float]:
    """Block until the peer closes: ("eof" | "reset" | "timeout", seconds waited)."""
    start = time.monotonic()
    _, how = read_all(sock, timeout)
    return how, time.monotonic() - start


def nothing_for(sock: socket.socket, seconds: float) -> bool:
    """True if no byte and no close arrive within ``seconds``."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)  # a byte or EOF both mean something arrived
    except socket.timeout:
        return True
    except ConnectionResetError:
        return False
    return False


def refused(listen: str) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port_of(listen)), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    return False


class TcpServer:
    """A listening socket on 127.0.0.1; :meth:`accept` hands out the server-side sockets."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self._accepted: list[socket.socket] = []

    def accept(self, timeout: float = 3.0) -> socket.socket:
        self.sock.settimeout(timeout)
        conn, _ = self.sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._accepted.append(conn)
        return conn

    def close(self) -> None:
        for s in self._accepted:
            s.close()
        self.sock.close()

    def __enter__(self) -> "TcpServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EchoServer:
    """Echoes every byte back on each accepted connection (one thread per connection)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self._stop = False
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rtt(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    recv_exact(sock, len(payload))
    return time.monotonic() - start


@dataclass
class Timed:
    elapsed: float = 0.0


def within(value: float, expected: float, tol: float) -> bool:
    """``expected - tol <= value <= expected + tol + SLACK``."""
    return expected - tol <= value <= expected + tol + SLACK


def iter_chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]
