"""A :class:`Sandbox` over this project's own provider servers (payment, mail, docstore)
or a service a workload declares (:class:`~..services.providers.declared.ServiceSpec`).

The provider runs in its own process with its own SQLite ledger
(:mod:`crashmatrix.harness.services.providers.server`); "slow" is its ``POST /admin/delay``,
"in flight" its ``GET /inflight``, "restarted" a SIGKILL of its process group and a new
process on the same ledger file and port, and the ground truth is read from the ledger
file itself (:func:`crashmatrix.harness.services.providers.ledger.read_ledger_file`), never
through the provider's HTTP API.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from crashmatrix.reference_runtime.agent import ToolOutcome

from ..services.process import signal_group
from ..services.providers import clients
from ..services.providers.declared import ServiceSpec
from ..services.providers.launcher import KINDS, start_providers
from ..services.providers.ledger import read_ledger_file
from .contract import Sandbox, Truth

__all__ = ["ProviderSandbox"]


class ProviderSandbox(Sandbox):
    """One provider server of kind ``kind`` (``"payment"``, ``"mail"``, ``"docstore"``),
    or of a declared service when ``kind`` is its :class:`ServiceSpec`.

    ``arguments``: the certified call's arguments. ``resources(session, base_url,
    worker_id)``: builds the tool's ``ctx.resources``. ``version``: recorded in the
    certificate (default: the installed crashmatrix version, which ships the server).
    Raises ``ValueError`` for a kind without effects or an unknown one.
    """

    def __init__(
        self,
        kind: str | ServiceSpec,
        *,
        arguments: dict[str, Any],
        resources: Callable[[aiohttp.ClientSession, str, str], Any],
        name: str | None = None,
        version: str | None = None,
    ) -> None:
        self.service = kind if isinstance(kind, ServiceSpec) else None
        if self.service is not None:
            kind = self.service.name
        elif kind not in KINDS or kind == "model":
            raise ValueError(f"kind={kind!r} must be a provider with effects (payment, mail or docstore) "
                             "or a declared service's ServiceSpec")
        self.kind = kind
        self.name = name or (f"{kind} service (declared; crashmatrix.harness.services.providers.server)"
                             if self.service else f"{kind} provider (crashmatrix.harness.services.providers.server)")
        self.arguments = dict(arguments)
        self._resources = resources
        self.version = version if version is not None else _installed_version()
        self._providers: Any = None
        self._workdir: Path | None = None
        self._register: Callable[[int], None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.restarts = 0
        self.started_pids: list[int] = []
        """Every server process (and group) id this sandbox started, restarts included."""

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, workdir: Path, register_pgid: Callable[[int], None] | None = None) -> None:
        """Start the server with its ledger in ``workdir`` (one interpreter, ~0.3 s)."""
        self._workdir, self._register = Path(workdir), register_pgid
        await self._spawn(port=0)
        self._session = aiohttp.ClientSession()

    async def _spawn(self, port: int) -> None:
        assert self._workdir is not None
        self._providers = await asyncio.to_thread(
            start_providers, self._workdir, kinds=(self.kind,), services=(self.service,) if self.service else (),
            register_pgid=self._register, ports={self.kind: port})
        self.started_pids.extend(self._providers.pids.values())

    async def restart(self) -> None:
        """SIGKILL the server's process group, reap it, start it again on the same
        ledger and port (a crash, not a drain: requests in flight die with it)."""
        old = self._providers
        port = int(self.url.rsplit(":", 1)[1])
        signal_group(old.pids[self.kind], signal.SIGKILL)
        await asyncio.to_thread(old.close, 0.5)
        await self._spawn(port=port)
        self.restarts += 1
        if self._session is not None:  # its pooled connections went to the dead process
            await self._session.close()
            self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._providers is not None:
            await asyncio.to_thread(self._providers.close)
            self._providers = None

    @property
    def pids(self) -> list[int]:
        """Process ids (and group ids) of the running server, for cleanup checks."""
        return [] if self._providers is None else list(self._providers.pids.values())

    # -- the provider ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._providers.urls[self.kind]

    @property
    def ledger_path(self) -> Path:
        """The SQLite ledger file (the provider's own truth)."""
        return self._providers.ledger_paths[self.kind]

    def resources(self, session: Any, base_url: str, worker_id: str) -> Any:
        return self._resources(session, base_url, worker_id)

    async def set_delay(self, delay_ms: int) -> None:
        assert self._session is not None
        await clients.set_delay(self._session, self.url, delay_ms)

    async def inflight(self, worker_id: str) -> int:
        assert self._session is not None
        return await clients.inflight(self._session, self.url, worker_id, timeout=5.0)

    async def quiesce(self, worker_id: str, timeout_s: float) -> None:
        assert self._session is not None
        await clients.wait_inflight_zero(self._session, self.url, worker_id, deadline_s=timeout_s, poll_s=0.005)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every ledger row, read from the file (``attempts`` included)."""
        return read_ledger_file(self.ledger_path)

    # -- ground truth helpers ---------------------------------------------------------------

    def truth(self, op: str, key: str, outcome: Callable[[dict[str, Any]], ToolOutcome]) -> Truth:
        """The :class:`Truth` for ledger rows ``(op, key)``, read from the file;
        ``outcome(row)`` turns the row into the ToolOutcome the tool returns for it."""
        rows = [r for r in self.snapshot() if r["op"] == op and r["key"] == key]
        if not rows:
            return Truth(False)
        return Truth(True, outcome(rows[0]), rows=len(rows), attempts=sum(r["attempts"] for r in rows))


def _installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "crashmatrix " + version("crashmatrix")
    except PackageNotFoundError:
        return None
