"""The adapter interface: how any durable runtime (a *subject*) plugs into the harness.

An adapter is a small class with five methods. The harness calls :meth:`Adapter.prepare`
once in the controller, :meth:`Adapter.start` and :meth:`Adapter.resume` inside forked
worker processes, and :meth:`Adapter.observe` in the controller to read what the durable
stores hold (after a fault: the crash state; at the end: the final state, rebuilt by
rehydrating, never read from a worker's memory).

Everything an adapter needs at run time arrives in a :class:`RunContext`; everything it
reports is plain data (:class:`Observation`), so the oracle never depends on one runtime.
Fields an adapter cannot provide are ``None`` and the checks that need them are left
out of the verdict (reported as not applicable, never as a pass).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Environment:
    """The services a case runs against. Crosses process boundaries as JSON.

    ``dsn``: PostgreSQL; ``providers``: provider kind -> base URL; ``workdir``: a
    directory for files (blobs, SQLite); ``options``: free-form adapter options.
    """

    dsn: str
    providers: dict[str, str]
    workdir: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "providers": self.providers, "workdir": self.workdir, "options": self.options}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Environment:
        return cls(d["dsn"], dict(d["providers"]), d["workdir"], dict(d.get("options", {})))


class Workload(Protocol):
    """What a scenario module exports (see ``crashmatrix.scenarios.checkout``)."""

    name: str
    conversations: tuple[str, ...]
    providers: tuple[str, ...]

    def run_input(self, conversation: str) -> dict[str, Any]: ...


StepHook = Callable[[str, str], None]


@dataclass
class RunContext:
    """Everything a worker-side adapter call needs.

    ``on_step(phase, task)``: the adapter calls it before (``"before"``) and after
    (``"after"``) each node or step with the step's stable id; the harness records a
    step crash point there and may fire a fault.
    """

    env: Environment
    run_id: str
    workload: Any
    conversation: str
    worker_id: str
    on_step: StepHook


@dataclass(frozen=True)
class LogEntry:
    """One durable step record as stored. ``error`` is set when it does not decode."""

    seq: int
    node_id: str
    parents: tuple[str, ...]
    kind: str
    lease_epoch: int
    error: str | None = None


@dataclass(frozen=True)
class EffectEntry:
    """One row of the subject's effects ledger."""

    key: str
    node_id: str
    tool: str
    status: str  # started | succeeded | failed | unknown
    result: Any
    lease_epoch: int


@dataclass(frozen=True)
class InvocationEntry:
    """One invocation (start or resume) of a run as the subject recorded it: its lease
    epoch, worker, W3C ``traceparent``, and the traceparent its span links to (the
    invocation it continues; None for the first)."""

    epoch: int
    worker: str
    traceparent: str | None
    link: str | None


@dataclass
class Observation:
    """What the durable stores hold for one run.

    ``state``: the final state rebuilt by rehydrating (``None`` when it cannot be
    rebuilt; ``state_error`` then says why). ``model_calls``: the subject's own view is
    not needed, the oracle reads the model provider's ledger.
    """

    run_id: str
    status: str
    log: list[LogEntry] | None = None
    effects: list[EffectEntry] | None = None
    state: dict[str, Any] | None = None
    state_error: str | None = None
    lease_epoch: int | None = None
    #: the run's invocations in epoch order (None: the subject does not record them);
    #: read by ``harness.trace_check.check_trace_continues``
    invocations: list[InvocationEntry] | None = None


class Adapter(ABC):
    """Base class of every subject adapter. See docs/adapters.md."""

    #: registry name, e.g. ``"reference"``
    name: str = ""
    #: packages whose frames name await points (the subject's own code)
    subject_packages: tuple[str, ...] = ()

    @abstractmethod
    async def prepare(self, env: Environment) -> None:
        """Once per controller, before any case: migrations, schema. Idempotent."""

    @abstractmethod
    async def start(self, ctx: RunContext) -> str:
        """In a worker: create run ``ctx.run_id`` and run it; return its status
        (``completed``, ``paused``...). Cancellation must propagate (re-raise)."""

    @abstractmethod
    async def resume(self, ctx: RunContext) -> str:
        """In a new worker: continue run ``ctx.run_id`` from its durable state."""

    @abstractmethod
    async def observe(self, env: Environment, run_id: str) -> Observation:
        """In the controller: read the run's durable state (never a worker's memory)."""

    async def between_crash_and_resume(self, env: Environment, run_id: str) -> None:
        """In the controller, each time run ``run_id`` waits for a resume: after a
        worker ended without a terminal status (its crash state read and checked),
        before the next resume worker starts. What the subject's own background jobs
        do to a waiting run goes here (a retention pass, a scheduler's sweep), so the
        matrix covers it. Raising makes the case a harness error. Default: nothing."""

    async def aclose(self) -> None:
        """In the controller, when the session ends: release what :meth:`observe` or
        :meth:`prepare` kept open (connection pools). Default: nothing."""

    def describe(self) -> str:
        return (type(self).__doc__ or self.name).strip().splitlines()[0]
