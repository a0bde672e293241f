"""crashmatrix.harness.iostate on this kernel: the counters crash-state pruning rests on
count what the process sends and reads, and nothing else (real sockets and files)."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from crashmatrix.harness.iostate import IoMeter, tcp_bytes, talks_to_itself


@pytest.fixture(scope="module")
def meter() -> IoMeter:
    return IoMeter()  # adds an audit hook to this process: it only counts socket objects


@pytest.fixture()
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname())
        server, _ = srv.accept()
    with client, server:
        yield client, server


def test_two_marks_with_nothing_done_between_them_are_equal(meter: IoMeter, pair: tuple[socket.socket, socket.socket]) -> None:
    assert meter.mark() == meter.mark()


def test_bytes_sent_on_a_tcp_socket_are_counted_once_written(meter: IoMeter, pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    before = tcp_bytes(client.fileno())
    a = meter.mark()
    client.send(b"x" * 1000)
    b = meter.mark()
    assert b.sent - a.sent == 1000 and (b.wchar, b.syscw) == (a.wchar, a.syscw)  # send(2) is no write(2)
    assert tcp_bytes(client.fileno()).written - before.written == 1000


def test_bytes_count_as_read_only_once_the_process_read_them(meter: IoMeter, pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    server.sendall(b"y" * 300)
    a = meter.mark()  # loopback: the 300 bytes are in the client's queue, unread
    assert client.recv(100) == b"y" * 100
    b = meter.mark()
    assert b.read - a.read == 100 and b.sent == a.sent


def test_a_file_write_moves_wchar_and_syscw_only(meter: IoMeter) -> None:
    with tempfile.TemporaryFile() as f:
        a = meter.mark()
        os.write(f.fileno(), b"z" * 4096)
        b = meter.mark()
    assert b.wchar - a.wchar == 4096 and b.syscw - a.syscw == 1 and b.sent == a.sent


def test_a_socket_opened_and_closed_between_two_marks_is_seen(meter: IoMeter) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = meter.mark()
        with socket.create_connection(srv.getsockname()) as s:
            s.send(b"q")
        b = meter.mark()
    assert b.opened > a.opened


def test_the_process_talking_to_itself_is_no_link_but_udp_cannot_be_counted(meter: IoMeter) -> None:
    r, w = socket.socketpair()
    with r, w:
        assert talks_to_itself(r.fileno())
        a = meter.mark()
        w.send(b"wake")
        assert meter.mark().opaque == a.opaque
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        first = meter.mark()
        assert tcp_bytes(u.fileno()) is None
        assert meter.mark().opaque == first.opaque + 1  # every point alone while it is open
