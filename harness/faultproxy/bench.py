"""Measure the fault proxy's cost: per-hop latency overhead and throughput.

Usage::

    python -m crashmatrix.harness.faultproxy.bench [--rounds 3000] [--mb 64] [--inprocess]
    python -m crashmatrix.harness.faultproxy.bench --url http://127.0.0.1:8474   # any server

The proxy runs in its own process (``python -m crashmatrix.harness.faultproxy``) unless
``--inprocess`` (then on a thread of this process, sharing its GIL) or ``--url`` (an
already running Toxiproxy-compatible server). Upstream servers run in a forked child
process, the client in this one, all on loopback.

Reported:

* round trip of a 1-byte message, direct and through the proxy (median and p99, µs);
  per-hop overhead = (proxied − direct) / 2, since a round trip crosses the upstream
  link and the downstream link once each;
* one-way throughput (MB/s, MB = 10^6 bytes) direct, through the proxy, and through
  the proxy with a 100 ms latency toxic (Toxiproxy's own test expects ≥ ~100 MB/s there).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import requests


def _echo_conn(conn: socket.socket) -> None:
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            conn.sendall(data)
    except OSError:
        return
    finally:
        conn.close()


def _sink_conn(conn: socket.socket) -> None:
    """Read an 8-byte length, then that many bytes; answer one byte."""
    try:
        header = b""
        while len(header) < 8:
            chunk = conn.recv(8 - len(header))
            if not chunk:
                return
            header += chunk
        (remaining,) = struct.unpack(">Q", header)
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while remaining > 0:
            n = conn.recv_into(view, min(len(buf), remaining))
            if n == 0:
                return
            remaining -= n
        conn.sendall(b"k")
        conn.recv(1)
    except OSError:
        return
    finally:
        conn.close()


def _serve(sock: socket.socket, handler: Any) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=handler, args=(conn,), daemon=True).start()


def _upstreams(echo: socket.socket, sink: socket.socket) -> None:
    threading.Thread(target=_serve, args=(echo, _echo_conn), daemon=True).start()
    _serve(sink, _sink_conn)


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _rtts(port: int, rounds: int) -> list[float]:
    s = _connect(port)
    out = []
    try:
        for _ in range(50):  # warm up
            s.sendall(b"x")
            s.recv(1)
        for _ in range(rounds):
            t = time.perf_counter()
            s.sendall(b"x")
            s.recv(1)
            out.append(time.perf_counter() - t)
    finally:
        s.close()
    return out


def _throughput(port: int, nbytes: int) -> float:
    s = _connect(port)
    try:
        block = os.urandom(1 << 20)
        t = time.perf_counter()
        s.sendall(struct.pack(">Q", nbytes))
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            s.sendall(block[:n])
            left -= n
        ack = s.recv(1)
        elapsed = time.perf_counter() - t
        if ack != b"k":
            raise RuntimeError("sink did not acknowledge")
    finally:
        s.close()
    return nbytes / elapsed / 1e6


def _us(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return statistics.median(values) * 1e6, values[int(len(values) * 0.99) - 1] * 1e6


def _proxy(url: str, name: str, upstream_port: int) -> int:
    """Create (replacing any of that name) the proxy ``name`` to ``127.0.0.1:upstream_port``
    on the Toxiproxy-compatible server at ``url``; returns the port it listens on."""
    requests.delete(f"{url}/proxies/{name}", timeout=10)
    r = requests.post(f"{url}/proxies", timeout=10, json={
        "name": name, "upstream": f"127.0.0.1:{upstream_port}", "listen": "127.0.0.1:0"})
    r.raise_for_status()
    return int(r.json()["listen"].rsplit(":", 1)[1])


def _measure(url: str, label: str, rounds: int, mb: int, echo_port: int, sink_port: int) -> None:
    """Through proxies made on the server at ``url`` (described by ``label``), measure
    ``rounds`` 1-byte round trips to the echo upstream on ``echo_port`` and ``mb`` MB sent
    to the sink on ``sink_port`` (direct, proxied, proxied with a 100 ms latency toxic)
    and print the figures; the proxies are deleted afterwards."""
    p_echo = _proxy(url, "bench_echo", echo_port)
    p_sink = _proxy(url, "bench_sink", sink_port)
    nbytes = mb * 1_000_000

    direct = _us(_rtts(echo_port, rounds))
    proxied = _us(_rtts(p_echo, rounds))
    tp_direct = _throughput(sink_port, nbytes)
    tp_proxy = _throughput(p_sink, nbytes)
    requests.post(f"{url}/proxies/bench_sink/toxics", timeout=10, json={
        "type": "latency", "stream": "upstream", "attributes": {"latency": 100}}).raise_for_status()
    tp_latency = _throughput(p_sink, nbytes)
    for name in ("bench_echo", "bench_sink"):
        requests.delete(f"{url}/proxies/{name}", timeout=10)

    print(f"fault proxy benchmark: {label}; {rounds} round trips, {mb} MB transfers")
    print(f"  1-byte round trip, direct        median {direct[0]:8.1f} µs   p99 {direct[1]:8.1f} µs")
    print(f"  1-byte round trip, via proxy     median {proxied[0]:8.1f} µs   p99 {proxied[1]:8.1f} µs")
    print(f"  per-hop overhead (median)        {(proxied[0] - direct[0]) / 2:8.1f} µs "
          f"(Toxiproxy's own test: < 300 µs average)")
    print(f"  throughput, direct               {tp_direct:8.1f} MB/s")
    print(f"  throughput, via proxy            {tp_proxy:8.1f} MB/s")
    print(f"  throughput, via proxy + 100 ms latency toxic  {tp_latency:8.1f} MB/s")


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`: ``--rounds``, ``--mb`` and where the proxy runs
    (``--inprocess``, ``--url``, or by default a server process of its own)."""
    parser = argparse.ArgumentParser(prog="python -m crashmatrix.harness.faultproxy.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000, help="round trips per measurement")
    parser.add_argument("--mb", type=int, default=64, help="MB sent per throughput measurement")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--inprocess", action="store_true", help="run the proxy on a thread here")
    where.add_argument("--url", help="use this running Toxiproxy-compatible server")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print them; returns the exit status."""
    args = _parser().parse_args(argv)

    echo_sock = socket.create_server(("127.0.0.1", 0))
    sink_sock = socket.create_server(("127.0.0.1", 0))
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_upstreams, args=(echo_sock, sink_sock), daemon=True)
    child.start()
    echo_port, sink_port = echo_sock.getsockname()[1], sink_sock.getsockname()[1]

    server_proc: subprocess.Popen[str] | None = None
    embedded = None
    try:
        if args.url:
            url = args.url.rstrip("/")
            label = f"server at {url}"
        elif args.inprocess:
            from ._server import EmbeddedToxiproxy

            embedded = EmbeddedToxiproxy().start()
            url = embedded.url
            label = "embedded server, same process (shares the GIL with the client)"
        else:
            server_proc = subprocess.Popen(
                [sys.executable, "-m", "crashmatrix.harness.faultproxy", "--port", "0"],
                stdout=subprocess.PIPE, text=True)
            assert server_proc.stdout is not None
            line = server_proc.stdout.readline().strip()
            if not line.startswith("listening on "):
                raise RuntimeError(f"server did not start: {line!r}")
            url = line.split()[-1]
            label = "embedded server, own process"

        _measure(url, label, args.rounds, args.mb, echo_port, sink_port)
    finally:
        if embedded is not None:
            embedded.stop()
        if server_proc is not None:
            server_proc.terminate()
            server_proc.wait(10)
        child.terminate()
        child.join(5)
        echo_sock.close()
        sink_sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
