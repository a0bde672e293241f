"""``certify_probe``: run every ambiguous window of one call against a sandbox provider.

Services, in order: a watchdog (removes the work directory and stops the sandbox's
processes if this process dies), the fault proxy (the embedded Toxiproxy-compatible
server on a thread, seeded; or ``toxiproxy_url``), the sandbox. Then a clean
calibration call (the truth must agree with the tool's own answer), then each window in
turn on its own key and proxies. Everything is stopped, reaped and removed on the way
out, pass, fail, error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .certificate import Certificate, WindowResult
from .contract import CertifyError, CertifyHarnessError, Sandbox, load_parts
from .windows import WINDOWS, window_names
from ._bench import Bench, TruthFailed, Window

__all__ = ["certify_probe", "certify_probe_sync"]

DEFAULT_DEADLINE_MS = 500
DEFAULT_BOUND_MS = 2000


def _select(windows: Sequence[str] | None) -> list[Any]:
    if windows is None:
        return list(WINDOWS)
    names = window_names()
    unknown = [w for w in windows if w not in names]
    if unknown or not windows:
        raise CertifyError(f"windows={list(windows)!r}: each must be one of {', '.join(names)}")
    return [spec for spec in WINDOWS if spec.name in set(windows)]


def _check_ms(**values: Any) -> None:
    """Raise :class:`CertifyError` naming the first of ``values`` (name -> ms) that is not
    an integer in 50..600000."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 50 <= value <= 600_000:
            raise CertifyError(f"{name}={value!r} must be an integer number of ms in 50..600000")


def _check_sandbox(sandbox: Any) -> Sandbox:
    needed = ("start", "url", "resources", "restart", "set_delay", "inflight", "quiesce", "snapshot", "close")
    missing = [m for m in needed if not hasattr(type(sandbox), m)]
    if missing:
        raise CertifyError(f"sandbox factory returned {sandbox!r}, which lacks {', '.join(missing)} (see Sandbox)")
    return sandbox


async def _run_window(bench: Bench, spec: Any) -> WindowResult:
    window = Window(bench, spec.name, spec.what)
    started = time.monotonic()
    try:
        await window.open()
        await spec.run(window)
        window.finish()
    except TruthFailed as exc:
        window.result.error = str(exc)
    except Exception as exc:  # the harness's own failure in this window: an error, never a pass
        window.result.error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            await bench.sandbox.set_delay(0)
        await window.close()
    window.result.ms = round((time.monotonic() - started) * 1000, 1)
    return window.result


async def _run_windows(
    parts: Any,
    box: Sandbox,
    client: Any,
    specs: Sequence[Any],
    *,
    seed: int,
    deadline_ms: int,
    bound_ms: int,
    metrics_url: str | None,
    proxy_version: Any,
    provider_version: str | None,
    on_window: Callable[[WindowResult], None] | None,
) -> Certificate:
    """:func:`certify_probe` once its services run: calibrate a :class:`~._bench.Bench`
    on the started sandbox ``box`` and fault proxy ``client``, then run each window of
    ``specs`` in order, calling ``on_window`` with each result; returns the certificate
    (its ``ms`` not set). Raises :class:`CertifyError` when calibration fails (a clean
    call the truth disagrees with)."""
    bench = Bench(parts, box, client, seed=seed, deadline_ms=deadline_ms, bound_ms=bound_ms, metrics_url=metrics_url)
    try:
        await bench.calibrate()
    except (ValueError, TruthFailed) as exc:
        raise CertifyError(f"cannot certify: {exc}") from None
    cert = Certificate(
        tool=parts.tool_name, probe=parts.probe_name, truth=parts.truth_name, sandbox=box.name,
        provider_version=provider_version or getattr(box, "version", None),
        settings={"seed": seed, "deadline_ms": deadline_ms, "bound_ms": bound_ms,
                  "fault_proxy": proxy_version, "windows": [s.name for s in specs],
                  "request_bytes": bench.request_bytes, "response_bytes": bench.response_bytes},
    )
    for spec in specs:
        result = await _run_window(bench, spec)
        cert.windows.append(result)
        if on_window is not None:
            on_window(result)
    return cert


async def certify_probe(
    tool: Any,
    probe: Any = None,
    truth: Any = None,
    *,
    sandbox: Any = None,
    windows: Sequence[str] | None = None,
    seed: int = 0,
    deadline_ms: int = DEFAULT_DEADLINE_MS,
    bound_ms: int = DEFAULT_BOUND_MS,
    provider_version: str | None = None,
    toxiproxy_url: str | None = None,
    on_window: Callable[[WindowResult], None] | None = None,
) -> Certificate:
    """Certify ``probe`` for ``tool`` against ``truth``; return the :class:`Certificate`.

    ``tool``, ``probe``, ``truth``, ``sandbox``: objects or ``"MODULE:NAME"`` strings
    (:func:`~.contract.load_parts`). ``windows``: names to run (default all, in
    :data:`~.windows.WINDOWS` order). ``seed``: seeds the fault proxy's toxicity rolls
    and the keys. ``deadline_ms``: the caller's deadline in the deadline windows.
    ``bound_ms``: the probe must answer within it. ``provider_version``: recorded
    (default: the sandbox's ``version``). ``toxiproxy_url``: a running
    Toxiproxy-compatible server to use instead of the embedded one (it must reach
    127.0.0.1; without ``-proxy-metrics`` the truncation windows cut at 32 bytes).
    ``on_window``: called with each window's result as it ends.

    Raises :class:`CertifyError` (bad input, before anything starts; or a truth that
    disagrees with the tool on a clean call) and :class:`CertifyHarnessError` (a
    service did not start). A probe that lies, raises or hangs is not an exception: it
    is a failed window in the certificate.
    """
    parts = load_parts(tool, probe, truth, sandbox)
    specs = _select(windows)
    _check_ms(deadline_ms=deadline_ms, bound_ms=bound_ms)
    box = _check_sandbox(parts.sandbox())
    from ..faultproxy import EmbeddedToxiproxy
    from ..faultproxy.client import ToxiproxyClient
    from ..services.watchdog import Watchdog

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="crashmatrix-certify-"))
    registered: list[int] = []
    watchdog = Watchdog.start()
    embedded: EmbeddedToxiproxy | None = None
    try:
        watchdog.watch_path(workdir)

        def register(pgid: int) -> None:
            registered.append(pgid)
            watchdog.watch_pgid(pgid)

        try:
            if toxiproxy_url is None:
                embedded = EmbeddedToxiproxy(seed=seed, proxy_metrics=True).start()
                url, metrics = embedded.url, embedded.url + "/metrics"
            else:
                url, metrics = toxiproxy_url, None
            client = ToxiproxyClient(url, timeout=10)
            proxy_version = await asyncio.to_thread(client.version)
            await box.start(workdir / "sandbox", register)
        except CertifyError:
            raise
        except Exception as exc:
            raise CertifyHarnessError(f"cannot start the certification services: {type(exc).__name__}: {exc}") from exc
        cert = await _run_windows(parts, box, client, specs, seed=seed, deadline_ms=deadline_ms, bound_ms=bound_ms,
                                  metrics_url=metrics, proxy_version=proxy_version,
                                  provider_version=provider_version, on_window=on_window)
        cert.ms = (time.monotonic() - started) * 1000
        return cert
    finally:
        with contextlib.suppress(Exception):
            await box.close()
        if embedded is not None:
            embedded.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        for pgid in registered:
            watchdog.forget_pgid(pgid)
        watchdog.forget_path(workdir)
        watchdog.close()


def certify_probe_sync(*args: Any, **kwargs: Any) -> Certificate:
    """:func:`certify_probe` from synchronous code (runs its own event loop)."""
    return asyncio.run(certify_probe(*args, **kwargs))
