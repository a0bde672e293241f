"""Proxies: listeners, accepted connections, and the collection the API manages.

Lifecycle semantics follow spec §1.4:

* a started proxy reports the address the OS bound (``127.0.0.1:0`` → ``127.0.0.1:41234``,
  ``localhost:…`` → ``127.0.0.1:…``); one created disabled keeps its literal ``listen``;
* disable closes the listener (new connects are refused) and every live connection
  (toxics are kept); delete does the same and forgets the proxy;
* an update that changes the (resolved) listen or the upstream restarts the proxy and
  closes its connections; an update that changes nothing leaves them alone;
* an unreachable upstream: the client's connect succeeds, then it gets EOF.

Addresses are parsed and reported with Go's ``net`` rules and error texts
(``listen tcp: address bogus: missing port in address``,
``listen tcp 127.0.0.1:3310: bind: address already in use``).

Divergence: unless the server was started with ``allow_non_loopback=True``, a proxy may
only listen on loopback; an empty host (``""``, ``":0"``) binds ``127.0.0.1`` instead of
every interface, and a non-loopback address is refused with a 500 like a bind failure.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import random
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, Literal

from ._link import Direction, ToxicCollection, ToxicLink

__all__ = [
    "AlreadyStarted",
    "ApiError",
    "Connection",
    "Proxy",
    "ProxyCollection",
    "Runtime",
    "bind_listener",
    "resolve_tcp_addr",
    "split_host_port",
]

log = logging.getLogger("crashmatrix.harness.faultproxy")

ResetPeerLinger = Literal["on-connect", "on-fire"]


class ApiError(Exception):
    """An error the HTTP API reports as ``{"error": message, "status": status}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AlreadyStarted(Exception):
    """``Start`` on a running proxy (``/reset`` ignores it)."""


class _AddrError(Exception):
    """A Go ``net`` error; ``str()`` is its text without the ``listen tcp`` prefix."""


# ------------------------------------------------------------------------ addresses

def split_host_port(hostport: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``, with its error texts."""

    def err(why: str) -> _AddrError:
        return _AddrError(f"address {hostport}: {why}" if hostport else why)

    i = hostport.rfind(":")
    if i < 0:
        raise err("missing port in address")
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise err("missing ']' in address")
        if end + 1 == len(hostport):
            raise err("missing port in address")
        if end + 1 != i:
            if hostport[end + 1] == ":":
                raise err("too many colons in address")
            raise err("missing port in address")
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            raise err("too many colons in address")
    if "[" in hostport[j:]:
        raise err("unexpected '[' in address")
    if "]" in hostport[k:]:
        raise err("unexpected ']' in address")
    return host, hostport[i + 1:]


def _parse_port(service: str) -> tuple[int, bool]:
    """Go's ``parsePort``: (port, needs_lookup)."""
    if service == "":
        return 0, False
    cutoff, mx = 1 << 30, (1 << 32) - 1
    neg = False
    s = service
    if s[0] == "+":
        s = s[1:]
    elif s[0] == "-":
        neg, s = True, s[1:]
    n = 0
    for ch in s:
        if not ("0" <= ch <= "9"):
            return 0, True
        if n >= cutoff:
            n = mx
            break
        n = n * 10 + (ord(ch) - 48)
        if n > mx:
            n = mx
            break
    if not neg and n >= cutoff:
        port = cutoff - 1
    elif neg and n > cutoff:
        port = cutoff
    else:
        port = n
    return (-port if neg else port), False


def lookup_port(service: str) -> int:
    """Go's ``LookupPort("tcp", service)``: a number, a service name, or ``""`` (0)."""
    port, needs_lookup = _parse_port(service)
    if needs_lookup:
        try:
            port = socket.getservbyname(service, "tcp")
        except (OSError, UnicodeError):
            raise _AddrError(f"lookup tcp/{service}: unknown port") from None
    if not 0 <= port <= 0xFFFF:
        raise _AddrError(f"address {service}: invalid port")
    return port


async def _resolve_host(host: str) -> str | None:
    """IP text for ``host`` (None for the wildcard ``""``), preferring IPv4 like Go."""
    if host == "":
        return None
    try:
        base = host.split("%", 1)[0]
        ipaddress.ip_address(base)
        return host
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise _AddrError(f"lookup {host}: no such host") from None
    v4 = [i for i in infos if i[0] == socket.AF_INET]
    chosen = (v4 or infos)[0]
    return str(chosen[4][0])


def format_addr(ip: str | None, port: int) -> str:
    """Go's ``TCPAddr.String()``."""
    if ip is None:
        return f":{port}"
    if ":" in ip:
        return f"[{ip}]:{port}"
    return f"{ip}:{port}"


async def resolve_tcp_addr(addr: str) -> str:
    """Go's ``net.ResolveTCPAddr("tcp", addr).String()``; raises ApiError(500)."""
    try:
        if addr == "":
            return ":0"
        host, service = split_host_port(addr)
        port = lookup_port(service)
        ip = await _resolve_host(host)
    except _AddrError as exc:
        raise ApiError(500, str(exc)) from None
    return format_addr(ip, port)


def _is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def _errno_text(exc: OSError) -> str:
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return text[:1].lower() + text[1:]


async def bind_listener(listen: str, *, allow_non_loopback: bool,
                        backlog: int = 128) -> tuple[socket.socket, str]:
    """Bind and listen on ``listen`` as Go's ``net.Listen("tcp", listen)`` would.

    Returns the listening socket and the bound address as Go reports it. Raises
    :class:`ApiError` (500) with Go's text on failure.
    """
    try:
        if listen == "":
            host, port = "", 0
        else:
            host, service = split_host_port(listen)
            port = lookup_port(service)
        ip = await _resolve_host(host)
    except _AddrError as exc:
        raise ApiError(500, f"listen tcp: {exc}") from None
    wildcard = ip is None
    if wildcard and not allow_non_loopback:
        ip = "127.0.0.1"
    if ip is not None and not allow_non_loopback and not _is_loopback(ip):
        raise ApiError(500, f"listen tcp {format_addr(ip, port)}: non-loopback address refused "
                            "(the embedded fault proxy listens on loopback only unless started "
                            "with allow_non_loopback=True)")
    family = socket.AF_INET6 if (wildcard and ip is None) or (ip and ":" in ip) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ip is None:
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:  # pragma: no cover - platform without dual stack
                pass
            sock.bind(("::", port))
        elif family == socket.AF_INET6:
            sock.bind(socket.getaddrinfo(ip, port, family, socket.SOCK_STREAM)[0][4])
        else:
            sock.bind((ip, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        where = format_addr("::" if ip is None else ip, port)
        raise ApiError(500, f"listen tcp {where}: bind: {_errno_text(exc)}") from None
    bound = sock.getsockname()
    bound_ip = "::" if ip is None else str(bound[0])
    return sock, format_addr(bound_ip, int(bound[1]))


def upstream_target(upstream: str) -> tuple[str, int]:
    """Host and port to dial for ``upstream`` (Go's ``net.Dial`` rules)."""
    host, service = split_host_port(upstream)
    port = lookup_port(service)
    if host == "":
        host = "127.0.0.1"  # Go: an empty host dials the local system
    return host, port


# -------------------------------------------------------------------------- runtime

@dataclass
class Metrics:
    """``-proxy-metrics`` counters, added when a connection finishes (spec §1.7)."""

    enabled: bool = False
    counters: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict)

    def add(self, name: str, direction: str, proxy: "Proxy", value: int) -> None:
        if not self.enabled:
            return
        key = (name, direction, proxy.listen, proxy.name, proxy.upstream)
        self.counters[key] = self.counters.get(key, 0) + value

    def render(self) -> str:
        helps = {
            "toxiproxy_proxy_received_bytes_total": "The total bytes received",
            "toxiproxy_proxy_sent_bytes_total": "The total bytes sent",
        }
        lines: list[str] = []
        for name, help_text in helps.items():
            rows = sorted((k, v) for k, v in self.counters.items() if k[0] == name)
            if not rows:
                continue
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} counter")
            for (_, direction, listener, proxy, upstream), value in rows:
                labels = ",".join(f'{k}="{_label(v)}"' for k, v in (
                    ("direction", direction), ("listener", listener),
                    ("proxy", proxy), ("upstream", upstream)))
                lines.append(f"{name}{{{labels}}} {value}")
        return "\n".join(lines) + ("\n" if lines else "")


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Runtime:
    """Server-wide settings and state shared by every proxy."""

    rng: random.Random
    allow_non_loopback: bool = False
    reset_peer_linger: ResetPeerLinger = "on-connect"
    metrics: Metrics = field(default_factory=Metrics)


# ------------------------------------------------------------------------ connection

_LINGER_RST = struct.pack("ii", 1, 0)


def _tune(writer: asyncio.StreamWriter) -> None:
    # Go's writes block until the kernel took the bytes: make drain() wait likewise.
    transport = writer.transport
    if isinstance(transport, asyncio.WriteTransport):
        try:
            transport.set_write_buffer_limits(high=0, low=0)
        except (AttributeError, NotImplementedError):  # pragma: no cover
            pass


class Connection:
    """One accepted client connection and its dialled upstream: two links."""

    def __init__(self, proxy: "Proxy", client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.links: list[ToxicLink] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._finished = 0
        self._linger = False

    def start(self) -> None:
        toxics = self.proxy.toxics
        if self.proxy.runtime.reset_peer_linger == "on-connect" and toxics.has_type("reset_peer"):
            # Toxiproxy sets SO_LINGER=0 on both sockets whenever a reset_peer toxic is in
            # the chain at connect time, whatever its toxicity (Toxiproxy issue #603).
            self.set_linger()
        self.links.append(toxics.start_link(self, Direction.UPSTREAM, self.client[0], self.upstream[1]))
        self.links.append(toxics.start_link(self, Direction.DOWNSTREAM, self.upstream[0], self.client[1]))

    def set_linger(self) -> None:
        if self._linger:
            return
        self._linger = True
        for writer in (self.client[1], self.upstream[1]):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                except OSError:
                    pass

    def reset_peer_firing(self) -> None:
        if self.proxy.runtime.reset_peer_linger == "on-fire":
            self.set_linger()

    def link_finished(self, link: ToxicLink, ok: bool) -> None:
        self._finished += 1
        if self._finished >= 2:
            self._teardown()

    def abort(self) -> None:
        """Close both sockets now (proxy disabled, deleted, restarted or server closed)."""
        for _, writer in (self.client, self.upstream):
            try:
                writer.transport.abort()
            except Exception:  # pragma: no cover
                pass
        self._teardown()

    def _teardown(self) -> None:
        if self.done.done():
            return
        metrics = self.proxy.runtime.metrics
        for link in self.links:
            link.cancel()
            self.proxy.toxics.remove_link(link)
            metrics.add("toxiproxy_proxy_received_bytes_total", str(link.direction), self.proxy, link.received)
            metrics.add("toxiproxy_proxy_sent_bytes_total", str(link.direction), self.proxy, link.sent)
        self.proxy.connections.discard(self)
        self.done.set_result(None)


# ----------------------------------------------------------------------------- proxy

class Proxy:
    """A named listener that relays to ``upstream`` through its toxic chains."""

    def __init__(self, runtime: Runtime, name: str, listen: str, upstream: str) -> None:
        self.runtime = runtime
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics = ToxicCollection(self, runtime.rng)
        self.connections: set[Connection] = set()
        self.lock = asyncio.Lock()
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [w.to_json() for w in self.toxics.toxics()],
        }

    # -- start / stop ------------------------------------------------------------------

    async def start(self) -> None:
        async with self.lock:
            await self._start()

    async def stop(self) -> None:
        async with self.lock:
            await self._stop()

    async def _start(self) -> None:
        if self.enabled:
            raise AlreadyStarted(self.name)
        sock, bound = await bind_listener(self.listen, allow_non_loopback=self.runtime.allow_non_loopback)
        try:
            self._server = await asyncio.start_server(self._on_client, sock=sock)
        except OSError as exc:  # pragma: no cover - bind already succeeded
            sock.close()
            raise ApiError(500, f"listen tcp {self.listen}: {_errno_text(exc)}") from None
        self.listen = bound
        self.enabled = True

    async def _stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self.connections):
            conn.abort()
        for task in list(self._handlers):
            task.cancel()
        if server is not None:
            try:
                await asyncio.wait_for(server.wait_closed(), 5.0)
            except (asyncio.TimeoutError, Exception):  # pragma: no cover
                pass

    async def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """Apply a proxy update (Toxiproxy 2.12 semantics; raises ApiError)."""
        async with self.lock:
            changed = upstream != self.upstream
            if listen != self.listen:
                resolved = await resolve_tcp_addr(listen)
                if resolved != self.listen:
                    changed = True
            if changed:
                await self._stop()
                self.listen = listen
                self.upstream = upstream
                if enabled:
                    await self._start()
            elif enabled != self.enabled:
                if enabled:
                    await self._start()
                else:
                    await self._stop()

    async def same_address(self, listen: str, upstream: str) -> bool:
        """Whether ``listen``/``upstream`` match this proxy (listen compared resolved)."""
        if upstream != self.upstream:
            return False
        if listen == self.listen:
            return True
        try:
            return await resolve_tcp_addr(listen) == self.listen
        except ApiError:
            return False

    # -- connections ---------------------------------------------------------------------

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        conn: Connection | None = None
        try:
            _tune(writer)
            try:
                host, port = upstream_target(self.upstream)
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except (OSError, ValueError, UnicodeError, _AddrError) as exc:
                log.debug("proxy %s: cannot reach upstream %s: %s", self.name, self.upstream, exc)
                writer.close()  # the client saw its connect succeed; now it gets EOF
                return
            if not self.enabled:
                up_writer.transport.abort()
                writer.transport.abort()
                return
            _tune(up_writer)
            conn = Connection(self, (reader, writer), (up_reader, up_writer))
            self.connections.add(conn)
            conn.start()
            await asyncio.shield(conn.done)
        except asyncio.CancelledError:
            if conn is not None:
                conn.abort()
            else:
                writer.transport.abort()
        finally:
            self._handlers.discard(task)


class ProxyCollection:
    """The server's proxies by name (insertion order)."""

    def __init__(self) -> None:
        self.proxies: dict[str, Proxy] = {}
        self.lock = asyncio.Lock()

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def add(self, proxy: Proxy, start: bool) -> None:
        async with self.lock:
            if proxy.name in self.proxies:
                raise ApiError(409, "proxy already exists")
            if start:
                await proxy.start()
            self.proxies[proxy.name] = proxy

    async def add_or_replace(self, proxy: Proxy, start: bool) -> Proxy:
        async with self.lock:
            existing = self.proxies.get(proxy.name)
            if existing is not None:
                if await existing.same_address(proxy.listen, proxy.upstream):
                    return existing
                await existing.stop()
            if start:
                await proxy.start()
            self.proxies[proxy.name] = proxy
            return proxy

    async def remove(self, name: str) -> None:
        async with self.lock:
            proxy = self.proxies.pop(name, None)
            if proxy is None:
                raise ApiError(404, "proxy not found")
            await proxy.stop()

    async def close(self) -> None:
        async with self.lock:
            for proxy in list(self.proxies.values()):
                await proxy.stop()

