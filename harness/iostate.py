"""What a worker has sent to the world so far, measured at the source (docs/design.md,
"Crash points"; docs/architecture.md, "Crash-state pruning").

A SIGKILL leaves behind only what the worker had already handed to the kernel: rows it
sent to PostgreSQL, requests it sent to a provider, bytes it wrote to files. Two kill
points between which the worker handed the kernel nothing, and read no answer, leave
the same crash state (:mod:`.pruning` groups them). The golden run measures, at every
crash point (:meth:`IoMeter.mark`):

* ``/proc/self/io`` ``wchar`` and ``syscw``: bytes passed to, and calls of, the
  ``write(2)`` family (files, pipes; summed over the process's threads);
* for each TCP socket the worker holds (``/proc/self/fd``), ``getsockopt(TCP_INFO)``:
  bytes written (``tcpi_bytes_sent - tcpi_bytes_retrans + tcpi_notsent_bytes``: sent
  once, plus still queued) and bytes the worker read (``tcpi_bytes_received`` minus the
  unread ``FIONREAD``). The kernel's counters see every client library alike (libpq,
  asyncpg, aiohttp, a thread's blocking socket), where wrapping Python's socket methods
  would miss C code. Linux >= 4.19 (``tcpi_bytes_sent``);
* sockets opened and closed: distinct socket inodes seen, inodes gone, and Python
  socket objects created (an audit hook on ``socket.__new__``, which also sees a socket
  opened and closed between two points);
* a socket whose bytes cannot be counted (UDP, netlink, a Unix socket to another
  process): ``opaque`` grows at every point while one is open, so no two such points
  are ever grouped. A Unix socket whose peer is this process (asyncio's self-pipe) is
  the worker talking to itself and is ignored.

Not seen: writes through ``mmap``, and what a child process of the worker sends.
Every field only grows, so two points have equal marks exactly when nothing changed
between them. Measuring costs ~0.1-0.3 ms a point (docs/benchmarks.md), which is why
only golden runs do it (``Job.record_io``): cases never pay for it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
import termios
from typing import NamedTuple

TCP_INFO = 11
SO_DOMAIN = 39
SO_PEERCRED = 17
_TCP_INFO_LEN = 232
_OFF_BYTES_RECEIVED = 128  # __u64 tcpi_bytes_received
_OFF_NOTSENT = 144  # __u32 tcpi_notsent_bytes
_OFF_BYTES_SENT = 200  # __u64 tcpi_bytes_sent (Linux 4.19)
_OFF_BYTES_RETRANS = 208  # __u64 tcpi_bytes_retrans
_NEEDED = _OFF_BYTES_RETRANS + 8
_TCP_LISTEN = 10


class IoMark(NamedTuple):
    """What the worker had handed the kernel by one crash point; every field only grows.

    ``wchar``/``syscw``: ``/proc/self/io``; ``sent``/``read``: bytes written to / read
    from TCP sockets (closed ones as last seen); ``opened``: distinct sockets seen plus
    Python socket objects created; ``closed``: sockets gone; ``opaque``: points at which
    a socket the meter cannot count was open."""

    wchar: int
    syscw: int
    sent: int
    read: int
    opened: int
    closed: int
    opaque: int


class SocketBytes(NamedTuple):
    """One TCP socket's counters: bytes ``written`` by the process, bytes ``read`` by it."""

    written: int
    read: int


def _libc() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.POINTER(ctypes.c_uint32)]
        return lib
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _getsockopt(fd: int, level: int, name: int, size: int) -> bytes | None:
    """``getsockopt(fd, level, name)`` on a bare descriptor (no socket object, so nothing
    can close it); None when the call fails (the option does not apply)."""
    assert _LIBC is not None
    buf = ctypes.create_string_buffer(size)
    length = ctypes.c_uint32(size)
    if _LIBC.getsockopt(fd, level, name, buf, ctypes.byref(length)) != 0:
        return None
    return buf.raw[:length.value]


def tcp_bytes(fd: int) -> SocketBytes | None:
    """The TCP socket ``fd``'s bytes written and read by this process; None when ``fd``
    is not a TCP socket, or the kernel's ``tcp_info`` has no byte counters (< 4.19).
    Raises ``OSError`` only for a descriptor that is gone (``EBADF``)."""
    info = _getsockopt(fd, socket.IPPROTO_TCP, TCP_INFO, _TCP_INFO_LEN)
    if info is None:
        if ctypes.get_errno() == errno.EBADF:
            raise OSError(errno.EBADF, "descriptor closed")
        return None
    if len(info) < _NEEDED:
        return None
    if info[0] == _TCP_LISTEN:
        return SocketBytes(0, 0)
    received, = struct.unpack_from("=Q", info, _OFF_BYTES_RECEIVED)
    notsent, = struct.unpack_from("=I", info, _OFF_NOTSENT)
    sent, retrans = struct.unpack_from("=QQ", info, _OFF_BYTES_SENT)
    try:
        unread = struct.unpack("=i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        unread = 0
    return SocketBytes(sent - retrans + notsent, received - unread)


def talks_to_itself(fd: int) -> bool:
    """Whether ``fd`` is a Unix socket whose peer is this process (asyncio's self-pipe,
    a ``socketpair``): the worker talking to itself, no link of the subject."""
    dom = _getsockopt(fd, socket.SOL_SOCKET, SO_DOMAIN, 4)
    if dom is None or struct.unpack("=i", dom)[0] != socket.AF_UNIX:
        return False
    cred = _getsockopt(fd, socket.SOL_SOCKET, SO_PEERCRED, 12)
    return cred is not None and struct.unpack("=iII", cred)[0] == os.getpid()


class Unavailable(RuntimeError):
    """This kernel or process cannot be measured (no ``/proc/self/io``, no TCP byte
    counters): pruning is off, and the note says why."""


class IoMeter:
    """Marks the worker's outbound I/O at each crash point (module docstring). One per
    worker process; :meth:`mark` is called with the recorder's lock held."""

    def __init__(self) -> None:
        if _LIBC is None:
            raise Unavailable("no C library to call getsockopt with")
        if not os.path.exists("/proc/self/io"):
            raise Unavailable("/proc/self/io is not readable (a kernel without task I/O accounting)")
        self.known: dict[str, SocketBytes] = {}  # socket inode -> its counters when last seen
        self.gone_sent = self.gone_read = 0
        self.opened = self.closed = self.opaque = 0
        self.created = 0  # Python socket objects created (audit hook)
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[object, ...]) -> None:
        if event == "socket.__new__":
            self.created += 1

    @staticmethod
    def _proc_io() -> tuple[int, int]:
        fd = os.open("/proc/self/io", os.O_RDONLY)
        try:
            text = os.read(fd, 1024)
        finally:
            os.close(fd)
        fields = dict(line.split(b": ") for line in text.splitlines() if b": " in line)
        return int(fields[b"wchar"]), int(fields[b"syscw"])

    def mark(self) -> IoMark:
        """The mark now. Raises :class:`Unavailable` if ``/proc/self/io`` cannot be read."""
        try:
            wchar, syscw = self._proc_io()
        except (OSError, KeyError, ValueError) as exc:
            raise Unavailable(f"/proc/self/io: {exc}") from None
        live: dict[str, SocketBytes] = {}
        opaque = False
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue  # closed meanwhile (the listing's own descriptor)
            if not target.startswith("socket:"):
                continue
            try:
                counted = tcp_bytes(fd)
            except OSError:
                continue
            if counted is None:
                if not talks_to_itself(fd):
                    opaque = True
                continue
            live[target] = counted
        for inode in self.known.keys() - live.keys():
            gone = self.known.pop(inode)
            self.gone_sent += gone.written
            self.gone_read += gone.read
            self.closed += 1
        self.opened += len(live.keys() - self.known.keys())
        self.known.update(live)
        self.opaque += opaque
        sent = self.gone_sent + sum(s.written for s in live.values())
        read = self.gone_read + sum(s.read for s in live.values())
        return IoMark(wchar, syscw, sent, read, self.opened + self.created, self.closed, self.opaque)


class GoldenIo(NamedTuple):
    """A golden run's marks (one :class:`IoMark` a trace entry) and those of its twin
    (the determinism gate's second golden run, with its own trace: the same points in
    an order of its own), which :mod:`.pruning` also consults. ``note``: why there are
    none (the worker could not measure)."""

    marks: list[IoMark] | None
    twin_trace: list[tuple[str, str, str, int]]
    twin_marks: list[IoMark] | None
    note: str | None = None

    @classmethod
    def of(cls, first: object, second: object) -> GoldenIo:
        """From the two golden workers' ``end`` reports (:class:`.history.End`)."""
        def marks(end: object) -> list[IoMark] | None:
            raw = getattr(end, "marks", None)
            trace = getattr(end, "trace", [])
            if raw is None or len(raw) != len(trace):
                return None
            return [IoMark(*m) for m in raw]

        note = getattr(first, "io_note", None) or getattr(second, "io_note", None)
        return cls(marks(first), list(getattr(second, "trace", [])), marks(second), note)
