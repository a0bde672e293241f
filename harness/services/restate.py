"""The Restate server for the harness: the real ``restate-server`` binary on loopback ports.

Restate's Python SDK (``restate-sdk``) is only a service endpoint; the durable journal
lives in ``restate-server``, which Restate ships as a static binary inside the npm
registry's platform packages (``@restatedev/restate-server-linux-x64`` and its
siblings; the package ``@restatedev/restate-server`` only selects one). This module:

- finds the binary (:func:`server_binary`): ``$CRASHMATRIX_RESTATE_SERVER`` if set, else
  a cached copy under ``$CRASHMATRIX_CACHE`` (default ``~/.cache/crashmatrix``)
  ``/restate-server-<version>/restate-server``, else fetches it once with the ordinary
  npm client (``npm pack @restatedev/restate-server-<platform>@<version>``, ~80 MB, no
  install scripts run) and unpacks the binary into that cache. ``python -m
  crashmatrix.harness.services.restate fetch`` does only that; a fresh CI machine
  fetches it at the first test that starts a server, so it needs ``npm`` on ``PATH``);
- starts one server (:func:`start_restate`) per session: a fresh base directory,
  admin, ingress and node-to-node ports on 127.0.0.1 (free ports chosen at start),
  telemetry off, one partition, small RocksDB budgets, and a fast invocation retry
  policy (:data:`RETRY_POLICY`: a killed service endpoint is retried every 20-250 ms,
  not 0.5-60 s) so a resumed worker is reached quickly. It runs in a process group of
  its own; with a :class:`~.watchdog.Watchdog` the group and the directory are
  registered before the server starts, so a SIGKILLed controller still has the server
  killed and its data removed (the watchdog's ``pgid`` and ``path`` ops: the server is a
  single process, no ``setsid`` children). :meth:`RestateService.close` stops it
  (SIGTERM, 5 s, SIGKILL), reaps it and removes the directory.

The server checks for a newer release at start (``check_if_latest_version`` in
restate's ``server/src/build_info.rs``: a GET to the GitHub API, not switched off by
``disable-telemetry``). Nothing may leave this machine, so where the harness can make a
private mount namespace (root, or unprivileged user namespaces) the server runs under
``unshare --mount`` with an ``/etc/hosts`` that maps that host to 127.0.0.1: the check
meets a closed local port. Elsewhere the server starts as is and the check fails on
name resolution (measured here: DNS queries for the host, no connection).

Process handling: the process toolkit (:mod:`.process`: spawn in a process group of its
own, the release check's namespace probe and the npm fetch as short runs,
SIGTERM-then-SIGKILL of the group) through :mod:`._serverproc` (the directory and the
watchdog's registrations, readiness by health URL). What is Restate's own here: the
binary's fetch and cache, the configuration, and the mount namespace.

Errors: :class:`~crashmatrix.harness.errors.ServiceError`, one line (no npm, a failed
fetch, a server that does not become healthy within :data:`START_TIMEOUT` s, with the
log's last lines).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashmatrix.harness.errors import ServiceError

from . import process
from ._serverproc import ServerProcess, free_port, start_server

__all__ = ["RESTATE_VERSION", "RETRY_POLICY", "RestateService", "fetch_binary", "server_binary", "start_restate"]

RESTATE_VERSION = "1.7.12"
"""The restate-server release the harness runs (the npm packages' version)."""
BINARY_ENV = "CRASHMATRIX_RESTATE_SERVER"
"""Path of a restate-server binary to use instead of the cached npm one."""
CACHE_ENV = "CRASHMATRIX_CACHE"
START_TIMEOUT = 30.0  # seconds until admin and ingress answer
RETRY_POLICY = {"initial-interval": "20ms", "exponentiation-factor": 1.5, "max-interval": "250ms",
                "max-attempts": 100000, "on-max-attempts": "pause"}
"""The server's default invocation retry policy (``[default-retry-policy]``)."""
RELEASE_CHECK_HOSTS = ("api.github.com",)
"""Hosts the server contacts on its own at start; mapped to 127.0.0.1 when possible."""


def _platform_package() -> str:
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    system = {"linux": "linux", "darwin": "darwin"}.get(sys.platform)
    if arch is None or system is None:
        raise ServiceError(f"restate-server: no npm package for platform {sys.platform}/{machine}")
    return f"@restatedev/restate-server-{system}-{arch}"


def cache_dir(version: str = RESTATE_VERSION) -> Path:
    """Where the fetched binary is kept: ``$CRASHMATRIX_CACHE/restate-server-<version>``."""
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "crashmatrix")
    return Path(base) / f"restate-server-{version}"


def fetch_binary(version: str = RESTATE_VERSION) -> Path:
    """Fetch the platform package with ``npm pack`` and unpack ``restate-server`` into
    :func:`cache_dir`; returns its path. Raises ``ServiceError`` without npm or when the
    fetch fails. Atomic: a half-fetched binary is never left under the final name."""
    target = cache_dir(version) / "restate-server"
    if target.exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise ServiceError("restate-server: not cached and npm is not on PATH to fetch "
                           f"{_platform_package()}@{version} (or set {BINARY_ENV})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        spec = f"{_platform_package()}@{version}"
        proc = process.run([npm, "pack", spec, "--silent", "--pack-destination", tmp], cwd=tmp, timeout=600)
        tgz = [p for p in Path(tmp).glob("*.tgz")]
        if proc.returncode != 0 or not tgz:
            why = " ".join(f"{proc.stdout or ''} {proc.stderr or ''}".split())[-300:]
            raise ServiceError(f"restate-server: npm pack {spec} failed (exit {proc.returncode}): {why}")
        with tarfile.open(tgz[0]) as tar:
            member = tar.getmember("package/bin/restate-server")
            src = tar.extractfile(member)
            assert src is not None
            part = Path(tmp) / "restate-server"
            with open(part, "wb") as out:
                shutil.copyfileobj(src, out)
        part.chmod(0o755)
        os.replace(part, target)
    return target


def server_binary(version: str = RESTATE_VERSION, fetch: bool = True) -> Path:
    """The restate-server binary to run (module docstring: env, cache, npm fetch)."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServiceError(f"{BINARY_ENV}={explicit!r} must be an executable restate-server binary")
        return path
    cached = cache_dir(version) / "restate-server"
    if cached.exists() or not fetch:
        return cached
    return fetch_binary(version)


def _toml_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def config_toml(base_dir: Path, admin: int, ingress: int, fabric: int) -> str:
    """The server's configuration: loopback ports, telemetry off, small budgets,
    :data:`RETRY_POLICY`."""
    top = {
        "cluster-name": "crashmatrix", "node-name": "cm", "auto-provision": True,
        "default-num-partitions": 1, "disable-telemetry": True, "disable-prometheus": True,
        "rocksdb-total-memory-size": "256 MiB", "base-dir": str(base_dir),
        "bind-address": f"127.0.0.1:{fabric}", "advertised-address": f"http://127.0.0.1:{fabric}/",
        "log-format": "compact", "log-disable-ansi-codes": True, "log-filter": "warn,restate=warn",
    }
    lines = ['roles = ["http-ingress", "admin", "worker", "log-server", "metadata-server"]']
    lines += [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    lines += ["", "[default-retry-policy]"] + [f"{k} = {_toml_value(v)}" for k, v in RETRY_POLICY.items()]
    lines += ["", "[admin]", f'bind-address = "127.0.0.1:{admin}"', "disable-web-ui = true",
              "", "[ingress]", f'bind-address = "127.0.0.1:{ingress}"', ""]
    return "\n".join(lines)


def _private_hosts_command(hosts_file: Path, argv: list[str]) -> list[str] | None:
    """``argv`` wrapped to run in a private mount namespace whose ``/etc/hosts`` is
    ``hosts_file``; None when this machine cannot make one (no ``unshare``, or not
    permitted)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    if process.run([unshare, "--mount", "true"], timeout=10).returncode != 0:
        return None
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return [unshare, "--mount", "sh", "-c", script, str(hosts_file), *argv]


@dataclass
class RestateService:
    """A running restate-server. ``admin_url`` / ``ingress_url``: ``http://127.0.0.1:PORT``;
    ``server.base_dir``: its directory (config, data, log), removed by :meth:`close`."""

    server: ServerProcess
    admin_url: str
    ingress_url: str
    binary: Path
    private_hosts: bool

    @property
    def pid(self) -> int:
        return self.server.pid

    def to_dict(self) -> dict[str, Any]:
        """What workers need (JSON): the two URLs and the version."""
        return {"admin_url": self.admin_url, "ingress_url": self.ingress_url, "version": RESTATE_VERSION}

    def close(self) -> None:
        """Stop the server, reap it, remove its directory (idempotent)."""
        self.server.close()

    def __enter__(self) -> RestateService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_restate(base_dir: Path, *, watchdog: Any = None, binary: Path | None = None) -> RestateService:
    """Start a restate-server in ``base_dir`` (created; must not hold another server's
    data) and wait until its admin API and ingress answer. With ``watchdog``, the
    process group and ``base_dir`` are registered first. Raises ``ServiceError``."""
    binary = binary or server_binary()
    base_dir = Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    admin, ingress, fabric = free_port(), free_port(), free_port()
    config = base_dir / "restate.toml"
    config.write_text(config_toml(base_dir / "data", admin, ingress, fabric))
    hosts = base_dir / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost\n"
                     + "".join(f"127.0.0.1 {h}\n" for h in RELEASE_CHECK_HOSTS))
    argv = [str(binary), "--no-logo", "--config-file", str(config)]
    wrapped = _private_hosts_command(hosts, argv)
    server = start_server("restate-server", wrapped or argv, base_dir, watchdog=watchdog)
    service = RestateService(server, f"http://127.0.0.1:{admin}", f"http://127.0.0.1:{ingress}", binary,
                             wrapped is not None)
    server.wait_healthy([f"{service.admin_url}/health", f"{service.ingress_url}/restate/health"], START_TIMEOUT)
    return service


def main(argv: list[str] | None = None) -> int:
    """``python -m crashmatrix.harness.services.restate fetch``: fetch and cache the
    binary, print its path."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["fetch"]:
        print("usage: python -m crashmatrix.harness.services.restate fetch", file=sys.stderr)
        return 2
    try:
        print(server_binary())
    except ServiceError as exc:
        print(f"crashmatrix: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
