"""Start the provider servers, each in its own process and process group::

    with start_providers(tmp_path, register_pgid=watchdog.add) as providers:
        providers.urls["payment"]          # "http://127.0.0.1:41234"
        providers.ledger_paths["payment"]  # tmp_path / "payment.sqlite3"

All kinds start in parallel; ``start_s`` records how long the start took. Each server
costs one interpreter start plus the aiohttp import (~0.25 s of CPU), so on two cores
one kind is ready in ~0.25 s and all three in ~0.5 s (measured: median 0.48 s).
Each server writes its stderr to ``workdir/<kind>.stderr.log``. Ledgers persist in
``workdir``: starting again on the same workdir reopens the same truth. A declared
service (:class:`~.declared.ServiceSpec`, passed in ``services``) starts the same way
under its name, its spec written to ``workdir/<name>.service.json`` for the server.
Processes are started, awaited and stopped with :mod:`crashmatrix.harness.services.process`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from crashmatrix.harness.errors import InvalidArgument, ServiceError

from ..process import NotReady, first_lines, spawn, stderr_tail, stop_process_groups
from .declared import BUILTIN_KINDS, ServiceSpec

__all__ = ["Providers", "ProviderStartError", "start_providers", "KINDS", "DEFAULT_KINDS",
           "stop_process_groups", "stderr_tail"]

KINDS = BUILTIN_KINDS
DEFAULT_KINDS = ("payment", "mail", "model")
"""What :func:`start_providers` starts when ``kinds`` is not given (the checkout
workload's three; ``docstore`` serves the probe certifier's examples)."""
_SERVER_MODULE = "crashmatrix.harness.services.providers.server"


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


def _wait_ready(
    procs: Mapping[str, subprocess.Popen[bytes]],
    stderr_paths: Mapping[str, Path],
    timeout_s: float,
) -> dict[str, int]:
    """Each server's ``READY <port>`` line (:func:`~..process.first_lines`); kind -> port."""
    try:
        lines = first_lines(procs, timeout_s)
    except NotReady as exc:
        tail = stderr_tail(stderr_paths[exc.name])
        if exc.why == "exited":
            raise ProviderStartError(f"provider {exc.name!r} exited with code {exc.returncode} before READY;"
                                     f" stderr tail:\n{tail}") from None
        raise ProviderStartError(f"provider {exc.name!r} (and {exc.pending[1:] or 'no other'}) did not print"
                                 f" READY within {timeout_s:g} s; stderr tail:\n{tail}") from None
    ports: dict[str, int] = {}
    for kind, line in lines.items():
        word, _, port = line.partition(" ")
        if word != "READY" or not port.isdigit():
            raise ProviderStartError(f"provider {kind!r} printed {line!r} instead of READY <port>;"
                                     f" stderr tail:\n{stderr_tail(stderr_paths[kind])}")
        ports[kind] = int(port)
    return ports


def _server_command(kind: str, spec: ServiceSpec | None, workdir: Path, ledger: Path, *, python: str | None,
                    port: int, delay_ms: int, synchronous: str) -> list[str]:
    """The command line that starts the provider server of ``kind`` (a built-in kind, or
    the declared service ``spec``, whose JSON it writes to ``workdir/<kind>.service.json``)
    on ``127.0.0.1:port`` (0: a free one) with its ledger at ``ledger``."""
    if spec is not None:
        spec_path = workdir / f"{kind}.service.json"
        spec_path.write_text(json.dumps(spec.to_json(), indent=1), encoding="utf-8")
        what = ["--service", str(spec_path)]
    else:
        what = ["--kind", kind]
    return [
        python or sys.executable,
        "-P",  # the working directory is not on sys.path: a ./crashmatrix folder there must not shadow the install
        "-m",
        _SERVER_MODULE,
        *what,
        "--ledger", str(ledger),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--delay-ms", str(delay_ms),
        "--synchronous", synchronous,
    ]


def start_providers(
    workdir: Path,
    *,
    kinds: Iterable[str] = DEFAULT_KINDS,
    services: Iterable[ServiceSpec] = (),
    register_pgid: Callable[[int], None] | None = None,
    delay_ms: int = 0,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    ready_timeout_s: float = 10.0,
    synchronous: str = "NORMAL",
    ports: Mapping[str, int] | None = None,
) -> Providers:
    """Start one server per kind in ``kinds`` (``payment``, ``mail``, ``model``,
    ``docstore``, or the name of one of the declared ``services``; default
    :data:`DEFAULT_KINDS`), in parallel, each in a new session (its own process group,
    pgid == pid). A service in ``services`` that ``kinds`` does not name is not started.

    ``register_pgid(pid)`` is called for each as soon as it is spawned, so a watchdog
    can kill it if the controller dies. ``delay_ms``: every server's default delay
    before applying a request. ``env``: extra environment variables for the servers
    (e.g. ``PYTHONPATH`` so the model server can import a workload's scripts; relative
    entries, there or in this process's environment, are resolved against the current
    directory, not the servers' ``workdir``: :func:`~..process.child_env`).
    ``python``: interpreter (default: this one). Ledgers are
    ``workdir/<kind>.sqlite3``; they are reused if present. ``ports``: kind -> port to
    listen on (default 0, a free one), e.g. to restart a killed provider where its
    clients and proxies already point.

    Raises :class:`ProviderStartError` (a RuntimeError) naming the kind and its stderr
    tail if a server is not ready within ``ready_timeout_s`` or exits first; the servers
    already started are stopped and reaped before it is raised.
    """
    kinds = tuple(kinds)
    declared = {spec.name: spec for spec in services}
    unknown = [k for k in kinds if k not in KINDS and k not in declared]
    if unknown or len(set(kinds)) != len(kinds) or not kinds:
        raise InvalidArgument(f"kinds={kinds!r} must be distinct names from {KINDS}"
                              + (f" or the declared services ({', '.join(declared)})" if declared else ""))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ledgers = {kind: workdir / f"{kind}.sqlite3" for kind in kinds}
    stderrs = {kind: workdir / f"{kind}.stderr.log" for kind in kinds}
    try:
        for kind in kinds:
            cmd = _server_command(kind, declared.get(kind), workdir, ledgers[kind], python=python,
                                  port=(ports or {}).get(kind, 0), delay_ms=delay_ms, synchronous=synchronous)
            procs[kind] = spawn(cmd, stderr_path=stderrs[kind], env=env, cwd=workdir, register_pgid=register_pgid)
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
