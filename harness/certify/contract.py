"""The tool and probe contract the certifier checks (docs/probes.md), and its parts.

A **tool** with an effect is the reference runtime's :data:`ToolFn`:
``async fn(ctx: ToolContext, arguments) -> ToolOutcome``; it sends ``ctx.idem_key`` as
the idempotency key and raises :class:`OutcomeUnknown` when it cannot tell whether the
provider applied the call. A **probe** is a :data:`ProbeFn`: ``async probe(ctx) ->
ProbeOutcome`` -- ``applied`` (with the :class:`ToolOutcome` the original call would have
returned), ``not_applied``, or ``cannot_tell`` (``cannot_tell_yet`` when the provider
could not be reached: transient, the runtime asks again); it never raises. A **ground truth** is
``truth(sandbox, key) -> Truth`` (sync or async), supplied only for certification: it
reads the provider's own ledger, never the network path the probe uses. A **sandbox**
(:class:`Sandbox`) is a test instance of the provider that the certifier may start,
slow down, kill and restart.

The late-arrival race is closed by **same-key retry**, not by fencing: after a probe
said ``not_applied`` the runtime calls the tool again with the *same* key, so a first
request that was still on its way lands as a duplicate the provider deduplicates. The
certifier's ``late.arrival`` and ``provider.slow`` windows test exactly that.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashmatrix.reference_runtime.agent import ProbeOutcome, Tool, ToolOutcome

from ..errors import HarnessError, InvalidArgument

__all__ = [
    "CertifyError",
    "CertifyHarnessError",
    "Parts",
    "Sandbox",
    "Truth",
    "TruthFn",
    "ground_truth",
    "load_parts",
]


class CertifyError(InvalidArgument):
    """Bad input to the certifier: an unimportable ``MODULE:NAME``, a tool, probe or
    truth of the wrong shape, a truth with no sandbox. The message lists every problem
    found, one per line after the first."""


class CertifyHarnessError(HarnessError):
    """The certifier could not carry out its work: the sandbox or the fault proxy did
    not start, or the truth function disagrees with the tool's own clean answer (so no
    window could be judged)."""


@dataclass(frozen=True)
class Truth:
    """What the provider's own ledger holds for one idempotency key.

    ``applied``: a row exists. ``outcome``: the :class:`ToolOutcome` the tool returned
    (or would have returned) for it -- required when applied, None otherwise. ``rows``:
    how many ledger rows carry the key (deduplication means never more than 1).
    ``attempts``: requests that arrived with the key, when the ledger counts them (None
    otherwise; the certifier then cannot see a late request land). Raises
    :class:`ValueError` on an inconsistent combination.
    """

    applied: bool
    outcome: ToolOutcome | None = None
    rows: int = 0
    attempts: int | None = None

    def __post_init__(self) -> None:
        if self.applied and (self.outcome is None or self.rows < 1):
            raise ValueError(f"Truth(applied=True) needs an outcome and rows >= 1, got {self!r}")
        if not self.applied and (self.outcome is not None or self.rows != 0):
            raise ValueError(f"Truth(applied=False) must have no outcome and rows=0, got {self!r}")

    def to_json(self) -> dict[str, Any]:
        """``{"answer": "applied" | "not_applied", "outcome": {...} | None, "rows", "attempts"}``."""
        return {
            "answer": "applied" if self.applied else "not_applied",
            "outcome": outcome_json(self.outcome),
            "rows": self.rows,
            "attempts": self.attempts,
        }


def outcome_json(outcome: ToolOutcome | None) -> dict[str, Any] | None:
    """A ToolOutcome as ``{"status", "result"}`` (None stays None)."""
    return None if outcome is None else {"status": outcome.status, "result": outcome.result}


TruthFn = Callable[["Sandbox", str], "Truth | Awaitable[Truth]"]


class Sandbox(abc.ABC):
    """A test instance of a provider, owned by one certification.

    ``name``: shown in the certificate; ``version``: the provider's version, if known;
    ``arguments``: the arguments of the one call the certifier makes in every window
    (the neighbour calls use them too, with other keys). Every method may raise; the
    certifier reports the window as an error then. Lifecycle: :meth:`start` once,
    :meth:`close` once (also after a failed start).
    """

    name: str = "sandbox"
    version: str | None = None
    arguments: dict[str, Any] = {}

    @abc.abstractmethod
    async def start(self, workdir: Path, register_pgid: Callable[[int], None] | None = None) -> None:
        """Start the provider with its ledger under ``workdir``; call ``register_pgid``
        with each process group started, so a watchdog can stop it."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The provider's base URL, ``http://127.0.0.1:PORT`` (direct, no proxy)."""

    @property
    def upstream(self) -> str:
        """``HOST:PORT`` the fault proxy dials (default: taken from :attr:`url`)."""
        return self.url.split("://", 1)[1].rstrip("/")

    @abc.abstractmethod
    def resources(self, session: Any, base_url: str, worker_id: str) -> Any:
        """The ``ToolContext.resources`` the tool and the probe get: clients pointed at
        ``base_url`` (a fault-proxy address or :attr:`url`), using the aiohttp
        ``session`` the certifier opened for this link."""

    @abc.abstractmethod
    async def restart(self) -> None:
        """Kill the provider (SIGKILL) and start it again on the same ledger and port."""

    @abc.abstractmethod
    async def set_delay(self, delay_ms: int) -> None:
        """Make later requests wait ``delay_ms`` before the provider applies them."""

    @abc.abstractmethod
    async def inflight(self, worker_id: str) -> int:
        """Requests from ``worker_id`` the provider is still working on."""

    @abc.abstractmethod
    async def quiesce(self, worker_id: str, timeout_s: float) -> None:
        """Return once no request from ``worker_id`` is still running at the provider;
        raise TimeoutError after ``timeout_s``."""

    @abc.abstractmethod
    def snapshot(self) -> Any:
        """The whole ledger, comparable with ``==`` (the read-only check)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop every process started and reap it. Idempotent."""


def ground_truth(sandbox: Callable[[], Sandbox]) -> Callable[[TruthFn], TruthFn]:
    """Decorator: mark ``fn(sandbox, key) -> Truth`` as a ground truth read from the
    ledger of the sandbox that ``sandbox()`` makes (a fresh one per certification). The
    factory is stored as ``fn.sandbox``; it is how ``crashmatrix certify-probe`` knows
    which provider to start when only ``--truth`` is given."""
    if not callable(sandbox):
        raise InvalidArgument(f"sandbox={sandbox!r} must be a zero-argument factory of a Sandbox")

    def mark(fn: TruthFn) -> TruthFn:
        fn.sandbox = sandbox  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True)
class Parts:
    """The validated parts of one certification: callables and their display names."""

    tool: Callable[..., Awaitable[ToolOutcome]]
    probe: Callable[..., Awaitable[ProbeOutcome]]
    truth: TruthFn
    sandbox: Callable[[], Sandbox]
    tool_name: str
    probe_name: str
    truth_name: str


def _load(ref: str, what: str, problems: list[str]) -> Any:
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        problems.append(f"{what}={ref!r} must be MODULE:NAME, e.g. package.module:function")
        return None
    import importlib

    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module raising on import
        problems.append(f"{what}={ref!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})")
        return None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            problems.append(f"{what}={ref!r}: module {module_name!r} has no attribute {attr!r}")
            return None
    return obj


def _name(obj: Any, ref: Any) -> str:
    if isinstance(ref, str):
        return ref
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{module}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_fn(obj: Any, what: str, n_args: int, problems: list[str], *, coroutine: bool) -> None:
    if not callable(obj):
        problems.append(f"{what}={_short(obj)} is not callable (a {type(obj).__name__})")
        return
    if coroutine and not (inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(getattr(obj, "__call__", None))):
        problems.append(f"{what}={_name(obj, None)} must be an async function")
    try:
        inspect.signature(obj).bind(*range(n_args))
    except TypeError:
        problems.append(f"{what}={_name(obj, None)} must accept {n_args} positional argument(s)")
    except ValueError:  # no signature (a builtin): let the call decide
        pass


def load_parts(
    tool: Any,
    probe: Any = None,
    truth: Any = None,
    sandbox: Any = None,
) -> Parts:
    """Resolve and validate the parts of a certification.

    Each argument is an object or a ``"MODULE:NAME"`` string. ``tool``: a
    :class:`Tool` (its ``fn``; its ``probe`` when ``probe`` is None) or an async
    ``fn(ctx, arguments)``. ``probe``: an async ``probe(ctx)``. ``truth``: ``fn(sandbox,
    key)``. ``sandbox``: a zero-argument factory of a :class:`Sandbox`; default
    ``truth.sandbox`` (set by :func:`ground_truth`). Raises :class:`CertifyError` listing
    every problem found.
    """
    problems: list[str] = []
    tool_obj = _load(tool, "tool", problems) if isinstance(tool, str) else tool
    probe_obj = _load(probe, "probe", problems) if isinstance(probe, str) else probe
    truth_obj = _load(truth, "truth", problems) if isinstance(truth, str) else truth
    sandbox_obj = _load(sandbox, "sandbox", problems) if isinstance(sandbox, str) else sandbox
    tool_fn = tool_obj
    if isinstance(tool_obj, Tool):
        tool_fn = tool_obj.fn
        if not tool_obj.effect:
            problems.append(f"tool={_name(tool_obj, tool)}: Tool {tool_obj.name!r} has effect=False: nothing to certify")
        if probe_obj is None and probe is None:
            probe_obj = tool_obj.probe
    if tool_fn is not None:
        _check_fn(tool_fn, "tool", 2, problems, coroutine=True)
    elif tool is None:
        problems.append("tool is required")
    if probe_obj is not None:
        _check_fn(probe_obj, "probe", 1, problems, coroutine=True)
    elif probe is None:
        problems.append("probe is required (give --probe, or a Tool whose probe is set)")
    if truth_obj is not None:
        _check_fn(truth_obj, "truth", 2, problems, coroutine=False)
        if sandbox_obj is None and sandbox is None:
            sandbox_obj = getattr(truth_obj, "sandbox", None)
            if sandbox_obj is None:
                problems.append(
                    f"truth={_name(truth_obj, truth)} names no sandbox: decorate it with "
                    "@ground_truth(factory) or give --sandbox MODULE:FACTORY")
    elif truth is None:
        problems.append("truth is required (a function reading the provider's own ledger)")
    if sandbox_obj is not None and not callable(sandbox_obj):
        problems.append(f"sandbox={_short(sandbox_obj)} must be a zero-argument factory of a Sandbox")
    if problems:
        raise CertifyError("cannot certify: " + "; ".join(problems) if len(problems) == 1
                           else "cannot certify:\n  " + "\n  ".join(problems))
    return Parts(
        tool=tool_fn, probe=probe_obj, truth=truth_obj, sandbox=sandbox_obj,
        tool_name=_name(tool_obj, tool), probe_name=_name(probe_obj, probe), truth_name=_name(truth_obj, truth),
    )
