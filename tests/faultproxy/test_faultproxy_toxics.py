"""Toxic behaviour through real sockets (spec §2, §3 items 3-11, §5 issue table).

Timings use the spec's tolerances (±(jitter + 10) ms); see ``_support.SLACK`` for the
extra allowance on the late side only.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
import time

import pytest

from crashmatrix.harness.faultproxy import EmbeddedToxiproxy

from ._support import (SLACK, TOL, Api, EchoServer, TcpServer, connect, embedded_only, nothing_for,
                       read_all, recv_exact, rtt, wait_close, within)


def pair(api: Api, upstream: TcpServer, **kw: object) -> tuple[dict, socket.socket, socket.socket]:
    """A proxy to ``upstream`` and one connection: (proxy, client side, upstream side)."""
    p = api.create(upstream.addr, **kw)  # type: ignore[arg-type]
    c = connect(p["listen"])
    s = upstream.accept()
    return p, c, s


def one_way(src: socket.socket, dst: socket.socket, payload: bytes = b"x") -> float:
    start = time.monotonic()
    src.sendall(payload)
    assert recv_exact(dst, len(payload)) == payload
    return time.monotonic() - start


# --------------------------------------------------------------------------------- relay

def test_relay_is_byte_exact(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    c = connect(p["listen"])
    for payload in (b"hello world", os.urandom(64 * 1024)):
        c.sendall(payload)
        assert recv_exact(c, len(payload)) == payload
    c.sendall(b"ab")
    c.sendall(b"cd")
    assert recv_exact(c, 4) == b"abcd"


def test_disable_refuses_new_and_closes_live_connections(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "latency", latency=1)
    assert one_way(c, s) < 0.5
    r = api.post(f"/proxies/{p['name']}", {"enabled": False})
    assert r.json()["enabled"] is False
    assert wait_close(c)[0] == "eof"
    assert wait_close(s)[0] == "eof"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(p["listen"].rsplit(":", 1)[1])), timeout=1)
    assert [t["name"] for t in api.get(f"/proxies/{p['name']}/toxics").json()] == ["latency_downstream"]
    assert api.post(f"/proxies/{p['name']}", {"enabled": True}).json()["listen"] == p["listen"]
    c2 = connect(p["listen"])
    s2 = upstream.accept()
    assert one_way(c2, s2) < 0.5


def test_half_close_tears_down_the_whole_connection(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    c.sendall(b"req")
    assert recv_exact(s, 3) == b"req"
    c.shutdown(socket.SHUT_WR)
    assert read_all(s, 2.0) == (b"", "eof")
    try:
        s.sendall(b"late reply")
    except OSError:
        pass
    data, how = read_all(c, 2.0)
    assert data == b"" and how in ("eof", "reset")


# ------------------------------------------------------------------------------ latency

def test_latency_is_one_way_downstream_by_default(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "latency", latency=100)
    assert one_way(c, s) < TOL + SLACK  # upstream untouched
    assert within(one_way(s, c), 0.100, TOL)


def test_latency_rtt_adds_one_direction_only(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    c = connect(p["listen"])
    assert rtt(c) < TOL + SLACK
    api.toxic(p["name"], "latency", latency=100)
    assert within(rtt(c), 0.100, TOL)  # Toxiproxy issue #655: L, not 2L
    api.toxic(p["name"], "latency", stream="upstream", latency=50)
    assert within(rtt(c), 0.150, 2 * TOL)


def test_latency_applies_to_live_connection_and_removal_restores(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    c = connect(p["listen"])
    assert rtt(c) < TOL + SLACK
    api.toxic(p["name"], "latency", name="lat", latency=120)
    assert within(rtt(c), 0.120, TOL)
    start = time.monotonic()
    assert api.delete(f"/proxies/{p['name']}/toxics/lat").status_code == 204
    assert time.monotonic() - start < 0.5
    assert rtt(c) < TOL + SLACK


def test_latency_jitter_bounds(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "latency", latency=80, jitter=30)
    samples = [one_way(s, c) for _ in range(5)]
    for sample in samples:
        assert within(sample, 0.080, 0.030 + TOL), samples


def test_stacked_latencies_add_up(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "latency", stream="upstream", name="a", latency=80)
    api.toxic(p["name"], "latency", stream="upstream", name="b", latency=80)
    assert within(one_way(c, s), 0.160, TOL)


def test_latency_is_pipelined(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "latency", stream="upstream", latency=100)
    sent: list[float] = []

    def writer() -> None:
        for i in range(8):
            sent.append(time.monotonic())
            c.sendall(bytes([i]))
            time.sleep(0.02)

    t = threading.Thread(target=writer)
    t.start()
    for i in range(8):
        assert recv_exact(s, 1) == bytes([i])
        delay = time.monotonic() - sent[i]
        assert within(delay, 0.100, TOL), (i, delay)
    t.join()


def test_latency_keeps_throughput(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "latency", stream="upstream", latency=100)
    payload = os.urandom(4 * 1024 * 1024)
    t = threading.Thread(target=c.sendall, args=(payload,))
    start = time.monotonic()
    t.start()
    got = bytearray()
    s.settimeout(5)
    while len(got) < len(payload):
        got += s.recv(1 << 20)
    elapsed = time.monotonic() - start
    t.join()
    assert bytes(got) == payload
    # Not 100 ms per chunk (that would be > 12 s): one latency plus transfer time.
    assert elapsed < 0.1 + 1.5, elapsed


def test_concurrent_connections_are_independent(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    api.toxic(p["name"], "latency", latency=150)
    conns = [connect(p["listen"]) for _ in range(4)]
    start = time.monotonic()
    for c in conns:
        c.sendall(b"x")
    for c in conns:
        assert recv_exact(c, 1) == b"x"
    assert within(time.monotonic() - start, 0.150, TOL)  # Toxiproxy issue #193: not 4 x 150 ms


def test_per_hop_overhead_is_small(api: Api, echo: EchoServer) -> None:
    """Toxiproxy's own test: under 300 µs per one-way hop (median here, not mean)."""
    p = api.create(echo.addr)
    direct = socket.create_connection(("127.0.0.1", echo.port))
    direct.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proxied = connect(p["listen"])
    for sock in (direct, proxied):
        for _ in range(20):
            rtt(sock)
    d = sorted(rtt(direct) for _ in range(300))[150]
    v = sorted(rtt(proxied) for _ in range(300))[150]
    assert (v - d) / 2 < 300e-6, (v, d)


# ---------------------------------------------------------------------------- bandwidth

def test_bandwidth_kilobyte_is_1000_bytes(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "bandwidth", stream="upstream", rate=10)  # 10 KB/s: 1000 B per 100 ms
    start = time.monotonic()
    c.sendall(b"k" * 3000)
    arrivals: list[tuple[float, int]] = []
    total = 0
    s.settimeout(3)
    while total < 3000:
        n = len(s.recv(65536))
        total += n
        arrivals.append((time.monotonic() - start, total))
    by_150 = max((t for el, t in arrivals if el < 0.15), default=0)
    by_250 = max((t for el, t in arrivals if el < 0.25), default=0)
    assert by_150 == 1000, arrivals
    assert by_250 == 2000, arrivals
    assert within(arrivals[-1][0], 0.300, TOL), arrivals


def test_bandwidth_zero_stalls_and_removal_flushes(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "bandwidth", name="cut", rate=0)
    s.sendall(b"held back")
    assert nothing_for(c, 0.3)
    start = time.monotonic()
    assert api.delete(f"/proxies/{p['name']}/toxics/cut").status_code == 204
    assert time.monotonic() - start < 0.5
    assert recv_exact(c, 9, timeout=1.0) == b"held back"
    assert one_way(s, c) < 0.5


def test_removal_under_load_returns_promptly(api: Api, upstream: TcpServer) -> None:
    """Issues #88, #159, #210, #412, #558, #500: removal must not hang under traffic."""
    p, c, s = pair(api, upstream)
    for stream in ("upstream", "downstream"):
        api.toxic(p["name"], "bandwidth", stream=stream, name=f"cut_{stream}", rate=0)
    api.toxic(p["name"], "latency", stream="upstream", name="slow", latency=1000)
    stop = threading.Event()

    def pump(sock: socket.socket) -> None:
        sock.settimeout(0.2)
        block = b"L" * 65536
        while not stop.is_set():
            try:
                sock.send(block)
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return

    pumps = [threading.Thread(target=pump, args=(x,), daemon=True) for x in (c, s)]
    for t in pumps:
        t.start()
    time.sleep(0.3)  # both directions back up to the socket buffers
    try:
        for name in ("slow", "cut_upstream", "cut_downstream"):
            start = time.monotonic()
            r = api.delete(f"/proxies/{p['name']}/toxics/{name}")
            assert r.status_code == 204
            assert time.monotonic() - start < 1.0, name
        start = time.monotonic()
        assert api.post("/reset").status_code == 204
        assert time.monotonic() - start < 1.0
    finally:
        stop.set()
        for t in pumps:
            t.join(2)


def test_no_data_dropped_or_reordered_under_toxic_churn(api: Api, upstream: TcpServer) -> None:
    """Go TestNoDataDropped: ordered 2-byte writes survive add/remove of a 1 s latency."""
    p, c, s = pair(api, upstream)
    count = 4000
    done = threading.Event()

    def writer() -> None:
        for i in range(count):
            c.sendall(struct.pack(">H", i))
            if i % 200 == 0:
                time.sleep(0.005)
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    for _ in range(10):
        api.toxic(p["name"], "latency", stream="upstream", name="churn", latency=1000)
        time.sleep(0.01)
        assert api.delete(f"/proxies/{p['name']}/toxics/churn").status_code == 204
    t.join(5)
    data = recv_exact(s, 2 * count, timeout=5.0)
    assert list(struct.unpack(f">{count}H", data)) == list(range(count))
    c.close()
    assert read_all(s, 2.0) == (b"", "eof")


# --------------------------------------------------------------------------- slow_close

def test_slow_close_delays_the_eof(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "slow_close", delay=200)
    s.sendall(b"bye")
    start = time.monotonic()
    s.close()
    assert recv_exact(c, 3, timeout=1) == b"bye"
    assert time.monotonic() - start < TOL + SLACK
    how, _ = wait_close(c, 2.0)
    assert how == "eof"
    assert within(time.monotonic() - start, 0.200, TOL)


# ------------------------------------------------------------------------------ timeout

def test_timeout_drops_data_and_closes_after_idle_time(api: Api, upstream: TcpServer) -> None:
    p = api.create(upstream.addr)
    api.toxic(p["name"], "timeout", stream="upstream", timeout=200)
    start = time.monotonic()
    c = connect(p["listen"])
    s = upstream.accept()
    c.sendall(b"lost")
    how, _ = wait_close(c, 2.0)
    assert how == "eof"
    assert within(time.monotonic() - start, 0.200, TOL)
    assert read_all(s, 1.0) == (b"", "eof")  # the upstream got nothing, then EOF


def test_timeout_timer_restarts_on_every_chunk(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "timeout", stream="upstream", timeout=200)
    for _ in range(5):
        c.sendall(b".")
        time.sleep(0.08)
    last = time.monotonic() - 0.08
    how, _ = wait_close(c, 2.0)
    assert how == "eof"
    assert within(time.monotonic() - last, 0.200, TOL)


def test_timeout_zero_blackholes_and_removal_closes_both_sides(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "timeout", name="hole", timeout=0)
    s.sendall(b"into the void")
    assert nothing_for(c, 0.3)
    start = time.monotonic()
    assert api.delete(f"/proxies/{p['name']}/toxics/hole").status_code == 204
    assert time.monotonic() - start < 1.0
    assert wait_close(c, 1.0)[0] == "eof"
    assert wait_close(s, 1.0)[0] == "eof"


def test_reset_endpoint_removing_a_timeout_closes_its_connections(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "timeout", stream="upstream", timeout=0)
    assert api.post("/reset").status_code == 204
    assert wait_close(c, 1.0)[0] == "eof"
    assert wait_close(s, 1.0)[0] == "eof"


def test_timeout_toxicity_zero_then_update_to_one(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "timeout", name="t", toxicity=0, timeout=100)
    assert one_way(c, s) < TOL + SLACK
    assert nothing_for(c, 0.15)
    r = api.post(f"/proxies/{p['name']}/toxics/t", {"toxicity": 1})
    assert r.status_code == 200
    start = time.monotonic()
    assert wait_close(c, 1.0)[0] == "eof"
    assert time.monotonic() - start < 0.150 + SLACK


# --------------------------------------------------------------------------- reset_peer

def test_reset_peer_present_at_connect_resets_both_sides(api: Api, upstream: TcpServer) -> None:
    p = api.create(upstream.addr)
    api.toxic(p["name"], "reset_peer", stream="upstream", timeout=0)
    c = connect(p["listen"])
    s = upstream.accept()
    start = time.monotonic()
    c.sendall(b"x")
    data, how = read_all(c, 2.0)
    assert (data, how) == (b"", "reset")
    assert time.monotonic() - start < TOL + SLACK
    assert read_all(c, 1.0) == (b"", "eof")
    assert read_all(s, 1.0)[1] == "reset"


def test_reset_peer_downstream_waits_for_data_then_timeout(api: Api, upstream: TcpServer) -> None:
    p = api.create(upstream.addr)
    api.toxic(p["name"], "reset_peer", timeout=100)
    c = connect(p["listen"])
    s = upstream.accept()
    assert nothing_for(c, 0.2)  # no data in its direction: nothing happens
    start = time.monotonic()
    s.sendall(b"trigger")
    data, how = read_all(c, 2.0)
    assert (data, how) == (b"", "reset")
    assert within(time.monotonic() - start, 0.100, 0.100 + TOL)


def test_reset_peer_added_to_open_connection_gives_eof(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "reset_peer", stream="upstream", timeout=0)
    c.sendall(b"x")
    assert read_all(c, 2.0) == (b"", "eof")
    assert read_all(s, 2.0) == (b"", "eof")


def test_reset_peer_toxicity_zero_still_resets_on_close(api: Api, upstream: TcpServer) -> None:
    """Issue #603: SO_LINGER=0 applies to connections opened while the toxic exists."""
    p = api.create(upstream.addr)
    api.toxic(p["name"], "reset_peer", toxicity=0, timeout=0)
    c = connect(p["listen"])
    s = upstream.accept()
    s.sendall(b"reply")
    assert recv_exact(c, 5) == b"reply"
    s.close()
    data, how = read_all(c, 2.0)
    assert (data, how) == (b"", "reset")


@embedded_only
def test_reset_peer_linger_on_fire_option(upstream: TcpServer) -> None:
    with EmbeddedToxiproxy(reset_peer_linger="on-fire") as tp:
        api = Api(tp.url)
        p = api.create(upstream.addr)
        api.toxic(p["name"], "reset_peer", toxicity=0, timeout=0)
        c = connect(p["listen"])
        s = upstream.accept()
        s.sendall(b"reply")
        assert recv_exact(c, 5) == b"reply"
        s.close()
        assert read_all(c, 2.0) == (b"", "eof")  # the sane behaviour: no stray RST
        api.toxic(p["name"], "reset_peer", name="live", stream="upstream", timeout=0)
        c2 = connect(p["listen"])
        upstream.accept()
        c2.sendall(b"x")
        assert read_all(c2, 2.0) == (b"", "reset")  # RST when it fires


# ------------------------------------------------------------------------------- slicer

def test_slicer_splits_into_pieces_with_microsecond_delay(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "slicer", average_size=1, size_variation=0, delay=30_000)  # 30 ms
    start = time.monotonic()
    s.sendall(b"abcde")
    pieces = []
    c.settimeout(2)
    while sum(map(len, pieces)) < 5:
        pieces.append(c.recv(100))
    elapsed = time.monotonic() - start
    assert b"".join(pieces) == b"abcde"
    assert len(pieces) == 5, pieces
    assert within(elapsed, 0.120, 4 * TOL)


def test_slicer_reassembles_byte_exact(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "slicer", stream="upstream", average_size=1024, size_variation=512, delay=0)
    payload = os.urandom(480 * 1024)
    t = threading.Thread(target=c.sendall, args=(payload,))
    t.start()
    assert recv_exact(s, len(payload), timeout=5) == payload
    t.join()


# --------------------------------------------------------------------------- limit_data

def test_limit_data_truncates_then_closes_both_sides(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "limit_data", stream="upstream", bytes=10)
    c.sendall(bytes(range(100)))
    assert read_all(s, 2.0) == (bytes(range(10)), "eof")
    assert read_all(c, 2.0) == (b"", "eof")


def test_limit_data_is_per_connection_and_per_direction(api: Api, upstream: TcpServer) -> None:
    p = api.create(upstream.addr)
    api.toxic(p["name"], "limit_data", stream="upstream", bytes=10)
    for _ in range(2):  # Toxiproxy issue #126: each connection gets its own budget
        c = connect(p["listen"])
        s = upstream.accept()
        s.sendall(b"d" * 100)  # downstream is not limited
        assert recv_exact(c, 100) == b"d" * 100
        c.sendall(b"u" * 6)
        assert recv_exact(s, 6) == b"u" * 6
        c.sendall(b"u" * 6)
        assert read_all(s, 2.0) == (b"u" * 4, "eof")


def test_limit_data_zero_closes_at_first_chunk(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "limit_data", stream="upstream", bytes=0)
    assert nothing_for(c, 0.2)  # not immediately
    c.sendall(b"x")
    assert read_all(s, 2.0) == (b"", "eof")
    assert read_all(c, 2.0) == (b"", "eof")


def test_limit_data_count_survives_update(api: Api, upstream: TcpServer) -> None:
    p, c, s = pair(api, upstream)
    api.toxic(p["name"], "limit_data", stream="upstream", name="lim", bytes=10)
    c.sendall(b"a" * 9)
    assert recv_exact(s, 9) == b"a" * 9
    assert api.post(f"/proxies/{p['name']}/toxics/lim", {"attributes": {"bytes": 10}}).status_code == 200
    c.sendall(b"b" * 5)
    assert read_all(s, 2.0) == (b"b", "eof")


# ----------------------------------------------------------------------------- toxicity

def _classify(conns: list[socket.socket]) -> list[bool]:
    """Send on every connection at once; True where the reply came late (delayed)."""
    sel = selectors.DefaultSelector()
    start = time.monotonic()
    for i, c in enumerate(conns):
        c.sendall(b"?")
        sel.register(c, selectors.EVENT_READ, i)
    arrival: dict[int, float] = {}
    while len(arrival) < len(conns) and time.monotonic() - start < 3:
        for key, _ in sel.select(0.5):
            arrival[key.data] = time.monotonic() - start
            recv_exact(conns[key.data], 1)
            sel.unregister(key.fileobj)
    sel.close()
    # Slowed replies cannot come before 150 ms; unslowed ones come within a few ms.
    return [arrival[i] > 0.100 for i in range(len(conns))]


def test_toxicity_is_sampled_per_connection_and_resampled_on_update(api: Api, echo: EchoServer) -> None:
    p = api.create(echo.addr)
    api.toxic(p["name"], "latency", name="half", toxicity=0.5, latency=150)
    conns = [connect(p["listen"]) for _ in range(24)]
    _classify(conns)  # warm-up: every connection is set up at the proxy
    first = _classify(conns)
    assert 3 <= sum(first) <= 21, first
    assert _classify(conns) == first  # stable without API changes
    api.toxic(p["name"], "noop", stream="upstream", name="other_direction")
    assert _classify(conns) == first  # a toxic in the other direction re-rolls nothing
    api.post(f"/proxies/{p['name']}/toxics/half", {"toxicity": 0.5})
    second = _classify(conns)
    assert second != first  # re-rolled on update (all 24 equal again: p = 2^-24)
    assert 3 <= sum(second) <= 21, second
    api.toxic(p["name"], "noop", name="appended")  # same direction: the stage before restarts
    assert _classify(conns) != second


@embedded_only
def test_toxicity_rolls_come_from_the_seed(echo: EchoServer) -> None:
    outcomes = []
    for _ in range(2):
        with EmbeddedToxiproxy(seed=1234) as tp:
            api = Api(tp.url)
            p = api.create(echo.addr, name="seeded")
            api.toxic("seeded", "latency", toxicity=0.5, latency=100)
            conns = []
            for _ in range(12):  # one at a time: rolls happen in connection order
                conns.append(connect(p["listen"]))
                rtt(conns[-1])
            outcomes.append(_classify(conns))
    assert outcomes[0] == outcomes[1]
    assert 0 < sum(outcomes[0]) < 12


@embedded_only
def test_the_sessions_fault_proxy_service_rolls_with_the_seed_it_is_given(echo: EchoServer, tmp_path) -> None:
    """The fault proxy the matrix's net cases use (netfaults.FaultProxyService, a process
    of its own) gets the run's seed (``--seed`` of ``crashmatrix run``, the plugin's seed):
    its rolls are those of an embedded server with that seed."""
    import asyncio

    from crashmatrix.harness.netfaults import FaultProxyService

    def pattern(url: str, name: str) -> list[bool]:
        api = Api(url)
        p = api.create(echo.addr, name=name)
        api.toxic(name, "latency", toxicity=0.5, latency=100)
        conns = []
        for _ in range(12):  # one at a time: rolls happen in connection order
            conns.append(connect(p["listen"]))
            rtt(conns[-1])
        return _classify(conns)

    with EmbeddedToxiproxy(seed=1234) as tp:
        expected = pattern(tp.url, "seeded")
    service = FaultProxyService(tmp_path, seed=1234)
    try:
        client = asyncio.run(service.client())
        assert pattern(client.url, "seeded") == expected
    finally:
        service.close()
    assert service.proc is None
