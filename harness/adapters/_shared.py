"""What the Restate, Absurd and Prefect adapters share: a runtime server started once per
adapter in the controller, and the step hooks a worker hands its workload.

:class:`ServerBackedAdapter`: :meth:`~ServerBackedAdapter.prepare` starts the runtime's
server (:meth:`~ServerBackedAdapter.start_server`, blocking, run in a thread) once per
adapter instance with a watchdog of the adapter's own (the server's process group and
directory are registered with it, so a SIGKILLed controller leaves nothing), and writes
what workers need to ``<workdir>/<server_dir>/server.json``;
:meth:`~ServerBackedAdapter.aclose` stops both. ``prepare`` runs again for ``db-restart``
cases and extra subjects: the second call is a no-op.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import aiohttp

from crashmatrix.harness.crashpoint import crashpoint, set_logical_task

from ..adapter import Adapter, Environment, RunContext


def worker_hooks(ctx: RunContext, session: aiohttp.ClientSession, point: Any, lock: threading.Lock) -> Any:
    """The workload's step hooks for one worker (``ctx.workload.step_hooks``, e.g.
    :class:`~crashmatrix.scenarios.realworld.common.StepHooks`): provider clients on
    ``session``, the harness's step hook and ``point`` (both under ``lock``,
    docs/adapters.md), the logical task setter."""

    def step(phase: str, step_id: str) -> None:
        with lock:
            ctx.on_step(phase, step_id)

    return ctx.workload.step_hooks(session, ctx.env.providers, ctx.worker_id, step, point, set_logical_task)


def point_under(lock: threading.Lock) -> Any:
    """``point(name)``: ``crashpoint(name)`` under ``lock``, the adapter's one
    process-wide lock (docs/adapters.md: a thread that reaches a point while another
    fires a kill waits there until the process dies)."""

    def point(name: str) -> None:
        with lock:
            crashpoint(name)

    return point


class ServerBackedAdapter(Adapter):
    """An adapter whose runtime has a server of its own (module docstring)."""

    #: folder under the session's workdir for the server and its ``server.json``
    server_dir = "server"

    def __init__(self) -> None:
        super().__init__()
        self._server: Any = None
        self._watchdog: Any = None
        self._http: aiohttp.ClientSession | None = None

    def start_server(self, base_dir: Path, watchdog: Any) -> tuple[Any, dict[str, Any]]:
        """Start the runtime's server in ``base_dir`` (blocking); return it (with a
        ``close()``) and the JSON workers need. Raises ``ServiceError``."""
        raise NotImplementedError

    def runtime_dir(self, env: Environment) -> Path:
        return Path(env.workdir) / self.server_dir

    def server_info(self, env: Environment) -> dict[str, Any]:
        """What :meth:`start_server` returned for workers (raises ``RuntimeError`` when
        ``prepare`` did not run in this session)."""
        path = self.runtime_dir(env) / "server.json"
        if not path.exists():
            raise RuntimeError(f"no {self.name} server for this session ({path} missing: prepare() did not run)")
        return dict(json.loads(path.read_text()))

    def http(self) -> aiohttp.ClientSession:
        """The controller's HTTP session for ``observe`` (closed by :meth:`aclose`)."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    async def prepare(self, env: Environment) -> None:
        if self._server is not None:
            return
        from ..services.watchdog import Watchdog

        self._watchdog = Watchdog.start()
        try:
            self._server, info = await asyncio.to_thread(self.start_server, self.runtime_dir(env) / "server",
                                                         self._watchdog)
        except BaseException:
            self._watchdog.close()
            self._watchdog = None
            raise
        (self.runtime_dir(env) / "server.json").write_text(json.dumps(info))

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.close)
        if self._watchdog is not None:
            watchdog, self._watchdog = self._watchdog, None
            await asyncio.to_thread(watchdog.close)
