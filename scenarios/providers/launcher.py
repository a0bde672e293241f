"""Start the provider servers, each in its own process and process group::

    with start_providers(tmp_path, register_pgid=watchdog.add) as providers:
        providers.urls["payment"]          # "http://127.0.0.1:41234"
        providers.ledger_paths["payment"]  # tmp_path / "payment.sqlite3"

All kinds start in parallel; ``start_s`` records how long the start took. Each server
costs one interpreter start plus the aiohttp import (~0.25 s of CPU), so on two cores
one kind is ready in ~0.25 s and all three in ~0.5 s (measured: median 0.48 s).
Each server writes its stderr to ``workdir/<kind>.stderr.log``. Ledgers persist in
``workdir``: starting again on the same workdir reopens the same truth.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from crashmatrix.harness.errors import ServiceError

__all__ = ["Providers", "ProviderStartError", "start_providers", "KINDS", "DEFAULT_KINDS"]

KINDS = ("payment", "mail", "model", "docstore")
DEFAULT_KINDS = ("payment", "mail", "model")
"""What :func:`start_providers` starts when ``kinds`` is not given (the checkout
workload's three; ``docstore`` serves the probe certifier's examples)."""
_SERVER_MODULE = "crashmatrix.scenarios.providers.server"
_STDERR_TAIL = 2000


class ProviderStartError(ServiceError, RuntimeError):
    """A provider did not print ``READY <port>`` in time, or exited first. The message
    names the kind and ends with the tail of its stderr."""


@dataclass
class Providers:
    """Running providers. ``urls``: kind -> ``"http://127.0.0.1:PORT"``;
    ``ledger_paths``: kind -> SQLite ledger file; ``pids``: kind -> pid (also the
    process-group id); ``start_s``: seconds the start took; ``exit_codes``: filled by
    :meth:`close` (negative: killed by that signal)."""

    urls: dict[str, str]
    ledger_paths: dict[str, Path]
    pids: dict[str, int]
    stderr_paths: dict[str, Path]
    start_s: float
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def close(self, grace_s: float = 3.0) -> None:
        """SIGTERM every provider's process group, SIGKILL what is left after
        ``grace_s`` seconds, and reap all of them. Idempotent."""
        stop_process_groups(self._procs, grace_s)
        for kind, proc in self._procs.items():
            self.exit_codes[kind] = proc.returncode

    def __enter__(self) -> Providers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # Only while not reaped: an unreaped (possibly zombie) leader keeps its pid, and so
    # its process-group id, from being reused.
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


def stop_process_groups(procs: Mapping[str, subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM each process's group, wait up to ``grace_s`` seconds (shared), SIGKILL the
    late ones, then SIGKILL whatever is left in each group, and close their stdout pipes.
    Reaps every process. (Also stops the harness's embedded fault proxy.)"""
    for proc in procs.values():
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        # Anything the server left in its group (it starts no children) goes too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.stdout is not None:
            proc.stdout.close()


def stderr_tail(path: Path) -> str:
    """The last bytes of a server's stderr file, for an error message."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _STDERR_TAIL))
            text = f.read().decode("utf-8", "replace").strip()
    except OSError as exc:
        return f"(stderr unreadable: {exc})"
    return text or "(stderr empty)"


def _wait_ready(
    procs: Mapping[str, subprocess.Popen[bytes]],
    stderr_paths: Mapping[str, Path],
    timeout_s: float,
) -> dict[str, int]:
    """Read each server's stdout until its ``READY <port>`` line; return kind -> port."""
    ports: dict[str, int] = {}
    buffers = {kind: b"" for kind in procs}
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for kind, proc in procs.items():
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ, kind)
        while len(ports) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pending = sorted(set(procs) - set(ports))
                kind = pending[0]
                raise ProviderStartError(
                    f"provider {kind!r} (and {pending[1:] or 'no other'}) did not print"
                    f" READY within {timeout_s:g} s; stderr tail:\n{stderr_tail(stderr_paths[kind])}"
                )
            for key, _ in sel.select(remaining):
                kind = key.data
                chunk = os.read(key.fd, 4096)
                if not chunk:
                    sel.unregister(key.fileobj)
                    code = procs[kind].wait()
                    raise ProviderStartError(
                        f"provider {kind!r} exited with code {code} before READY;"
                        f" stderr tail:\n{stderr_tail(stderr_paths[kind])}"
                    )
                buffers[kind] += chunk
                if b"\n" in buffers[kind]:
                    line = buffers[kind].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
                    word, _, port = line.partition(" ")
                    if word != "READY" or not port.isdigit():
                        raise ProviderStartError(
                            f"provider {kind!r} printed {line!r} instead of READY <port>;"
                            f" stderr tail:\n{stderr_tail(stderr_paths[kind])}"
                        )
                    ports[kind] = int(port)
                    sel.unregister(key.fileobj)
    return ports


def start_providers(
    workdir: Path,
    *,
    kinds: Iterable[str] = DEFAULT_KINDS,
    register_pgid: Callable[[int], None] | None = None,
    delay_ms: int = 0,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    ready_timeout_s: float = 10.0,
    synchronous: str = "NORMAL",
    ports: Mapping[str, int] | None = None,
) -> Providers:
    """Start one server per kind in ``kinds`` (``payment``, ``mail``, ``model``,
    ``docstore``; default :data:`DEFAULT_KINDS`), in parallel, each in a new session
    (its own process group, pgid == pid).

    ``register_pgid(pid)`` is called for each as soon as it is spawned, so a watchdog
    can kill it if the controller dies. ``delay_ms``: every server's default delay
    before applying a request. ``env``: extra environment variables for the servers
    (e.g. ``PYTHONPATH`` so the model server can import a workload's scripts).
    ``python``: interpreter (default: this one). Ledgers are
    ``workdir/<kind>.sqlite3``; they are reused if present. ``ports``: kind -> port to
    listen on (default 0, a free one), e.g. to restart a killed provider where its
    clients and proxies already point.

    Raises :class:`ProviderStartError` (a RuntimeError) naming the kind and its stderr
    tail if a server is not ready within ``ready_timeout_s`` or exits first; the servers
    already started are stopped and reaped before it is raised.
    """
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or len(set(kinds)) != len(kinds) or not kinds:
        raise ValueError(f"kinds={kinds!r} must be distinct names from {KINDS}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    started = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ledgers = {kind: workdir / f"{kind}.sqlite3" for kind in kinds}
    stderrs = {kind: workdir / f"{kind}.stderr.log" for kind in kinds}
    try:
        for kind in kinds:
            cmd = [
                python or sys.executable,
                "-P",  # the working directory is not on sys.path: a ./crashmatrix folder there must not shadow the install
                "-m",
                _SERVER_MODULE,
                "--kind", kind,
                "--ledger", str(ledgers[kind]),
                "--host", "127.0.0.1",
                "--port", str((ports or {}).get(kind, 0)),
                "--delay-ms", str(delay_ms),
                "--synchronous", synchronous,
            ]
            with open(stderrs[kind], "ab") as err:
                procs[kind] = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=child_env,
                    cwd=workdir,
                    start_new_session=True,
                    close_fds=True,
                )
            if register_pgid is not None:
                register_pgid(procs[kind].pid)
        ports = _wait_ready(procs, stderrs, ready_timeout_s)
    except BaseException:
        stop_process_groups(procs, 0.5)
        raise
    for proc in procs.values():
        assert proc.stdout is not None
        proc.stdout.close()  # the server points its stdout at /dev/null after READY
    return Providers(
        urls={kind: f"http://127.0.0.1:{ports[kind]}" for kind in kinds},
        ledger_paths=ledgers,
        pids={kind: proc.pid for kind, proc in procs.items()},
        stderr_paths=stderrs,
        start_s=time.monotonic() - started,
        _procs=procs,
    )
