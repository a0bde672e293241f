"""A Prefect 3 API server for the harness: ``prefect server start`` on a loopback port,
SQLite database in its own directory.

Prefect records flow and task runs through its API; without ``PREFECT_API_URL`` every
process would start an ephemeral server of its own (a subprocess and seconds per
worker). The harness starts one per session instead (:func:`start_prefect`):
``PREFECT_HOME`` (so the SQLite database ``prefect.db``) in a fresh directory, UI,
analytics and the background services off (``--no-services``: no scheduler, no zombie
detection: a run whose worker died stays ``Running``, which is what the matrix must
see), a free port on 127.0.0.1. Started in a process group of its own and reaped like
PostgreSQL, with the process toolkit (:mod:`.process`, through :mod:`._serverproc`: with a
watchdog the directory is registered first and the group as it is spawned). The
server sees none of the user's own ``PREFECT_*`` variables (:func:`server_argv`).

Start-up is Prefect's import and database migrations: seconds on a quiet machine, much
more under load, hence :data:`START_TIMEOUT`. Errors: ``ServiceError`` (one line).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._serverproc import ServerProcess, free_port, start_server

__all__ = ["PrefectService", "server_argv", "server_env", "start_prefect"]

START_TIMEOUT = 240.0  # seconds until /api/health answers


def server_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    """The environment of a Prefect process of the harness: ``PREFECT_HOME``, no
    analytics or UI, and (clients) the API URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING"})
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


@dataclass
class PrefectService:
    """A running Prefect API server; ``api_url`` is ``http://127.0.0.1:PORT/api``."""

    server: ServerProcess
    api_url: str

    @property
    def pid(self) -> int:
        return self.server.pid

    def close(self) -> None:
        """Stop the server and its uvicorn children, remove its directory (idempotent)."""
        self.server.close()


def server_argv(port: int, env: dict[str, str]) -> list[str]:
    """``prefect server start`` on ``127.0.0.1:port`` without services. A child gets
    ``os.environ`` plus its extras (:func:`.process.child_env`), so every inherited
    ``PREFECT_*`` variable that ``env`` (:func:`server_env`) leaves out is unset by
    ``env -u`` in front: the server reads only the harness's settings."""
    unset = [arg for name in sorted(os.environ) if name.startswith("PREFECT_") and name not in env
             for arg in ("-u", name)]
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
            "--no-services"]
    return ["env", *unset, *argv] if unset else argv


def start_prefect(base_dir: Path, *, watchdog: Any = None) -> PrefectService:
    """Start ``prefect server start`` with its home in ``base_dir`` (created) and wait
    until its API answers. Raises ``ServiceError``."""
    base_dir = Path(base_dir)
    port = free_port()
    env = server_env(base_dir / "home")
    server = start_server("prefect server", server_argv(port, env), base_dir, env=env, watchdog=watchdog)
    api_url = f"http://127.0.0.1:{port}/api"
    server.wait_healthy([f"{api_url}/health"], START_TIMEOUT)
    return PrefectService(server, api_url)
