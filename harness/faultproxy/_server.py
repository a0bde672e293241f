"""Entry points: the asyncio server, its threaded runner, and the command line."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import random
import signal
import socket
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Awaitable, Callable, Literal, Sequence, TypeVar

from aiohttp import web

from ..errors import InvalidArgument, ServiceError
from ._api import VERSION, ToxiproxyApi
from ._proxy import ApiError, Metrics, ProxyCollection, Runtime, bind_listener, format_addr

__all__ = ["EmbeddedToxiproxy", "FaultProxyServer", "main", "serve"]

log = logging.getLogger("crashmatrix.harness.faultproxy")

_T = TypeVar("_T")
ResetPeerLinger = Literal["on-connect", "on-fire"]


def _check_options(host: str, port: int, seed: int, reset_peer_linger: str,
                   handler_timeout: float) -> None:
    if not isinstance(host, str):
        raise InvalidArgument(f"host={host!r} must be a string")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"port={port!r} must be an int in 0..65535")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidArgument(f"seed={seed!r} must be an int")
    if reset_peer_linger not in ("on-connect", "on-fire"):
        raise InvalidArgument(
            f"reset_peer_linger={reset_peer_linger!r} must be 'on-connect' or 'on-fire'")
    if not handler_timeout > 0:
        raise InvalidArgument(f"handler_timeout={handler_timeout!r} must be > 0")


async def _check_loopback(host: str, allow_non_loopback: bool) -> None:
    if allow_non_loopback:
        return
    if host == "":
        raise InvalidArgument("host='' listens on every interface: pass "
                              "allow_non_loopback=True to do that")
    try:
        ips = [ipaddress.ip_address(host.split("%", 1)[0])]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ServiceError(f"fault proxy: cannot resolve host={host!r}: {exc}") from None
        v4 = [i for i in infos if i[0] == socket.AF_INET]
        ips = [ipaddress.ip_address(str((v4 or infos)[0][4][0]))]
    if not all(ip.is_loopback for ip in ips):
        raise InvalidArgument(f"host={host!r} is not a loopback address: pass "
                              "allow_non_loopback=True to listen on it")


class FaultProxyServer:
    """An embedded server that speaks Toxiproxy 2.12's HTTP API (see spec/toxiproxy.md).

    Runs in the current event loop. ``seed`` drives every random choice (toxicity
    rolls, latency jitter, slicer sizes) through one :class:`random.Random`; the global
    generator is never used. Options:

    * ``allow_non_loopback`` (False): listen — API and proxies — on loopback only;
    * ``proxy_metrics`` (False): serve ``/metrics`` (Toxiproxy's ``-proxy-metrics``);
    * ``reset_peer_linger`` (``"on-connect"``): when a connection gets SO_LINGER=0 so
      that its close is an RST. ``"on-connect"`` is Toxiproxy's rule (a reset_peer toxic
      present at connect time, whatever its toxicity: Toxiproxy issue #603); ``"on-fire"`` sets it
      only when a reset_peer stage actually fires;
    * ``handler_timeout`` (25 s): an API call still running then answers 503.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8474, *, seed: int = 0,
                 allow_non_loopback: bool = False, proxy_metrics: bool = False,
                 reset_peer_linger: ResetPeerLinger = "on-connect",
                 handler_timeout: float = 25.0) -> None:
        _check_options(host, port, seed, reset_peer_linger, handler_timeout)
        self._host_arg = host
        self._port_arg = port
        self.seed = seed
        self.allow_non_loopback = allow_non_loopback
        self.runtime = Runtime(rng=random.Random(seed), allow_non_loopback=allow_non_loopback,
                               reset_peer_linger=reset_peer_linger,
                               metrics=Metrics(enabled=proxy_metrics))
        self.proxies = ProxyCollection()
        self.api = ToxiproxyApi(self.proxies, self.runtime, handler_timeout=handler_timeout)
        self._runner: web.ServerRunner | None = None
        self._address: str | None = None
        self._host = ""
        self._port = 0

    @property
    def version(self) -> str:
        return VERSION

    @property
    def host(self) -> str:
        """The bound API host (an IP address)."""
        self._require_started()
        return self._host

    @property
    def port(self) -> int:
        """The bound API port (the real one when started with port 0)."""
        self._require_started()
        return self._port

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the API (IPv6 hosts in brackets)."""
        self._require_started()
        assert self._address is not None
        return f"http://{self._address}"

    def _require_started(self) -> None:
        if self._address is None:
            raise ServiceError("fault proxy: the server is not started")

    async def start(self) -> "FaultProxyServer":
        """Bind the API and start serving. Raises InvalidArgument or ServiceError."""
        if self._runner is not None:
            raise ServiceError("fault proxy: the server is already started")
        host = self._host_arg.strip("[]")
        await _check_loopback(host, self.allow_non_loopback)
        listen = format_addr(host or None, self._port_arg)
        try:
            sock, bound = await bind_listener(listen, allow_non_loopback=self.allow_non_loopback)
        except ApiError as exc:
            raise ServiceError(f"fault proxy: cannot serve the API on {listen}: {exc.message}") from None
        server = web.Server(self.api.handle, keepalive_timeout=60.0, access_log=None)
        runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        self._address = bound
        name = sock.getsockname()
        self._host, self._port = str(name[0]), int(name[1])
        log.info("fault proxy API listening on %s (seed=%d)", self.url, self.seed)
        return self

    async def close(self) -> None:
        """Stop the API and every proxy: listeners closed, connections closed."""
        runner, self._runner = self._runner, None
        await self.proxies.close()
        self.api.cancel_background()
        if runner is not None:
            await runner.cleanup()

    async def load_config(self, path: str | Path) -> None:
        """Create proxies from a ``/populate``-format JSON file (Toxiproxy's ``-config``)."""
        body = Path(path).read_bytes()
        response = await self.api._guarded(self.api._h_populate, body)
        if response.status >= 300:
            text = getattr(response, "text", "") or ""
            raise ServiceError(f"fault proxy: config {str(path)!r} refused: {text.strip()}")

    async def __aenter__(self) -> "FaultProxyServer":
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def serve(host: str = "127.0.0.1", port: int = 8474, *, seed: int = 0,
                **options: Any) -> FaultProxyServer:
    """Start a :class:`FaultProxyServer` in the running loop and return it.

    ``options`` are :class:`FaultProxyServer`'s keyword options. Close it with
    ``await server.close()``.
    """
    return await FaultProxyServer(host, port, seed=seed, **options).start()


class EmbeddedToxiproxy:
    """A :class:`FaultProxyServer` on a background thread, for synchronous callers.

    ::

        with EmbeddedToxiproxy(seed=7) as tp:      # port 0: a free port
            requests.get(tp.url + "/version")

    The server has its own event loop on a daemon thread; :meth:`stop` closes every
    listener and connection and joins the thread.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, seed: int = 0,
                 start_timeout: float = 10.0, **options: Any) -> None:
        _check_options(host, port, seed, options.get("reset_peer_linger", "on-connect"),
                       options.get("handler_timeout", 25.0))
        self._args = (host, port)
        self._seed = seed
        self._options = options
        self._start_timeout = start_timeout
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.server: FaultProxyServer | None = None

    @property
    def url(self) -> str:
        return self._started().url

    @property
    def host(self) -> str:
        return self._started().host

    @property
    def port(self) -> int:
        return self._started().port

    def _started(self) -> FaultProxyServer:
        if self.server is None:
            raise ServiceError("fault proxy: EmbeddedToxiproxy is not started")
        return self.server

    def start(self) -> "EmbeddedToxiproxy":
        """Start the server thread; returns once the API listens (or raises its error)."""
        if self._thread is not None:
            raise ServiceError("fault proxy: EmbeddedToxiproxy is already started")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._main, name="crashmatrix-faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._start_timeout):
            raise ServiceError(f"fault proxy: not started within {self._start_timeout} s")
        if self._error is not None:
            error, self._error = self._error, None
            self._thread.join()
            self._thread = None
            raise error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start()
            if not self._ready.is_set():
                self._error = exc
        finally:
            try:
                _cancel_remaining(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await serve(*self._args, seed=self._seed, **self._options)
        self.server = server
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await server.close()

    def call(self, fn: Callable[[FaultProxyServer], Awaitable[_T]], timeout: float = 30.0) -> _T:
        """Run ``fn(server)`` on the server's loop and return its result."""
        server = self._started()
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(server), self._loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Close every listener and connection, then join the thread (idempotent)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed
                pass
        thread.join(timeout)
        if thread.is_alive():
            raise ServiceError(f"fault proxy: server thread did not stop within {timeout} s")
        self._thread = self._loop = self._stop = None
        self.server = None

    def __enter__(self) -> "EmbeddedToxiproxy":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and reap whatever tasks are left (as ``asyncio.run`` does on exit)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


_LOG_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
               "warn": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL,
               "panic": logging.CRITICAL}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="crashmatrix toxiproxy-server",
        description="Embedded fault proxy speaking Toxiproxy's HTTP API (2.12 behaviour).")
    p.add_argument("--host", default="127.0.0.1",
                   help="API address to listen on (default: %(default)s; loopback only "
                        "unless --allow-non-loopback)")
    p.add_argument("--port", type=int, default=8474,
                   help="API port; 0 picks a free one (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed for every random choice: toxicity, jitter, slicer (default: %(default)s)")
    p.add_argument("--config", metavar="FILE",
                   help="JSON array of proxies, as for POST /populate, created at startup")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="allow the API and proxies to listen on non-loopback addresses")
    p.add_argument("--proxy-metrics", action="store_true",
                   help="serve Prometheus byte counters on /metrics")
    p.add_argument("--reset-peer-linger", choices=("on-connect", "on-fire"), default="on-connect",
                   help="on-connect: RST on close whenever a reset_peer toxic existed at connect "
                        "(Toxiproxy); on-fire: only when a reset_peer stage fires")
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGINT or SIGTERM. Prints ``listening on http://HOST:PORT``."""
    args = _parser().parse_args(argv)
    level = os.environ.get("LOG_LEVEL", "").lower()
    logging.basicConfig(level=_LOG_LEVELS.get(level, logging.WARNING), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        server = await serve(args.host, args.port, seed=args.seed,
                             allow_non_loopback=args.allow_non_loopback,
                             proxy_metrics=args.proxy_metrics,
                             reset_peer_linger=args.reset_peer_linger)
        try:
            if args.config:
                await server.load_config(args.config)
            print(f"listening on {server.url}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, stop.set)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
                    signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
            await stop.wait()
        finally:
            await server.close()

    try:
        asyncio.run(run())
    except (InvalidArgument, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidArgument) else 1
    except KeyboardInterrupt:  # pragma: no cover - signal raced the handler
        pass
    return 0

