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


FENCED = "fenced"
"""The status a worker returns when its runtime refused it (its lease taken by another
worker, its write fenced): like raising, it marks the refused one of concurrent resumers
(``concurrent.loser_fenced``), never a second owner."""


@dataclass(frozen=True)
class Environment:
    """The services a case runs against. Crosses process boundaries as JSON.

    ``dsn``: PostgreSQL; ``providers``: provider kind -> base URL; ``workdir``: a
    directory for files (blobs, SQLite); ``options``: free-form adapter options;
    ``workload``: the session's workload as it was named (a registry name or
    ``module:WORKLOAD``, what :func:`crashmatrix.harness.registry.workload` takes), so a
    controller-side call (``prepare``, ``observe``, ``between_crash_and_resume``) reaches
    the workload's own helpers through :meth:`Adapter.workload_of` instead of importing
    its module. ``""``: an environment made outside a session (a test's), naming none.
    """

    dsn: str
    providers: dict[str, str]
    workdir: str
    options: dict[str, Any] = field(default_factory=dict)
    workload: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "providers": self.providers, "workdir": self.workdir, "options": self.options,
                "workload": self.workload}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Environment:
        return cls(d["dsn"], dict(d["providers"]), d["workdir"], dict(d.get("options", {})), str(d.get("workload", "")))


class Workload(Protocol):
    """What a scenario module exports (see ``crashmatrix.scenarios.checkout``)."""

    name: str
    conversations: tuple[str, ...]
    providers: tuple[str, ...]

    def run_input(self, conversation: str) -> dict[str, Any]: ...


StepHook = Callable[[str, str], None]


class InputWithheld(LookupError):
    """The harness did not hand this worker the run's input (resume policy ``input-once``:
    an acknowledged request is delivered once; a resumer reads it from its store)."""


class RecoveryByIdOnly(NotImplementedError):
    """The subject has no recovery of its own that finds abandoned runs: a run is only
    resumed by a caller that knows its id (the default :meth:`Adapter.recover`)."""


@dataclass
class RunContext:
    """Everything a worker-side adapter call needs.

    ``on_step(phase, task)``: the adapter calls it before (``"before"``) and after
    (``"after"``) each node or step with the step's stable id; the harness records a
    step crash point there and may fire a fault.

    ``seed``: a stable seed of this conversation, the same in every run and worker
    (:func:`crashmatrix.harness.determinism.seed_of`); hand it to the workload's tools
    (:func:`~crashmatrix.harness.determinism.rng`) instead of using ``random``'s global
    generator. ``now()``: the frozen clock (:func:`~crashmatrix.harness.determinism.clock`),
    instead of ``time.time()`` in anything the oracle compares (docs/adapters.md,
    "Determinism").
    ``run_id`` is ``""`` in a worker that recovers by discovery (:meth:`Adapter.recover`:
    it is given no run id). ``input_given``: whether this worker is handed the run's
    input (:meth:`run_input`; resume policy ``input-once`` hands it to the first worker
    only, until the subject acknowledged the run). ``scope``: the name the case's runs
    are filed under for a recovery that looks for them (a queue, an executor id; set in
    every worker of a ``discovery`` case, else None). ``clock_offset_s``: seconds to add
    to the runtime's clock when it judges a lease expired (the harness advances time for
    a recovering worker instead of waiting the lease out). ``on_accepted``: what
    :meth:`accepted` calls.
    """

    env: Environment
    run_id: str
    workload: Any
    conversation: str
    worker_id: str
    on_step: StepHook
    input_given: bool = True
    scope: str | None = None
    clock_offset_s: float = 0.0
    on_accepted: Callable[[], None] | None = None
    seed: int = -1

    def __post_init__(self) -> None:
        if self.seed < 0:
            from .determinism import seed_of

            self.seed = seed_of(str(getattr(self.workload, "name", "")), self.conversation)

    def now(self, step: int = 0) -> float:
        """The frozen clock at ``step`` (seconds since the Unix epoch)."""
        from .determinism import clock

        return clock(step)

    def run_input(self) -> dict[str, Any]:
        """The run's input (``workload.run_input(conversation)``). Raises
        :class:`InputWithheld` when the harness did not hand it to this worker."""
        if not self.input_given:
            raise InputWithheld(f"run {self.run_id}: this worker was not handed the input (input-once); "
                                f"read it from the run's stored request")
        result: dict[str, Any] = self.workload.run_input(self.conversation)
        return result

    def accepted(self) -> None:
        """Say that the subject acknowledged the run: its request is stored, a caller
        would be told "accepted" now. From then on the run must exist after any crash
        (``run.acknowledged_durable``), and under ``input-once`` no later worker gets the
        input. The first call of a worker is also the crash point ``run.accepted`` (a
        fault right after the caller was told). Idempotent."""
        if self.on_accepted is not None:
            self.on_accepted()


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
    #: the subject's own words for why the run has its status (a failure's error, the
    #: reason a run cannot migrate); None: it records none. Read by ``upgrade.migrated``
    detail: str | None = None


def missing_runtime(subject: str, module: str, extra: str) -> str:
    """The one line for a subject whose runtime module is not installed: install the
    release the project runs (the runtime's distributions, read from the ``extra``'s
    requirements in crashmatrix's metadata), or the extra, which pins the release the
    adapter was measured with and so conflicts with another pinned release."""
    import importlib.metadata

    from packaging.requirements import Requirement

    said = f"subject {subject!r} needs its runtime, which is not installed here (No module named {module!r})"
    if not extra:
        return said
    try:
        listed = [Requirement(r) for r in importlib.metadata.requires("crashmatrix") or ()]
    except importlib.metadata.PackageNotFoundError:
        listed = []
    reqs = [r for r in listed if r.marker is not None and r.marker.evaluate({"extra": extra})
            and not r.marker.evaluate({"extra": ""})]
    if not reqs:
        return f"{said}: pip install 'crashmatrix[{extra}]'"
    return (f"{said}: pip install the release your project runs ({' '.join(r.name for r in reqs)}), or "
            f"pip install 'crashmatrix[{extra}]' for the one the adapter was measured with "
            f"({', '.join(f'{r.name}{r.specifier}' for r in reqs)})")


class Adapter(ABC):
    """Base class of every subject adapter. See docs/adapters.md."""

    #: registry name, e.g. ``"reference"``
    name: str = ""
    #: packages whose frames name await points (the subject's own code)
    subject_packages: tuple[str, ...] = ()
    #: the runtime's modules: when the adapter is made, each is looked for on the path
    #: (:func:`findable`, nothing imported: a runtime whose import starts threads must not
    #: start them in the zygote before it is probed, :mod:`.zygote`), and the zygote
    #: imports them before it forks workers when they start no thread. One that is not
    #: there raises ``RegistryError`` naming :attr:`extra`, the ``crashmatrix[...]`` extra
    #: that brings it
    requires: tuple[str, ...] = ()
    extra: str = ""

    #: the runtime expects the run's input redelivered to every worker that resumes it
    #: (True: the harness hands it to every worker by default); False: it reads it from
    #: its own store, and the default policy is ``input-once`` (docs/adapters.md)
    expects_redelivery: bool = True
    #: the terminal status the runtime ends a crash loop in (a fault at the same point
    #: in every worker: resume policy ``recurring``); None: it declares none
    crash_loop_status: str | None = None
    #: how many recoveries of one run the runtime attempts before it gives up and ends
    #: it in ``crash_loop_status`` (DBOS ``max_recovery_attempts``), as the runtime
    #: itself says (read from its package, not assumed); None: it declares none. Resume
    #: policy ``recurring`` is not applicable without ``crash_loop_status``, or with a
    #: limit at or above the harness's bound (``Options.recurring_bound``)
    recovery_attempts_limit: int | None = None
    #: seconds after which the runtime's own recovery takes an abandoned run over (its
    #: lease or timeout; the harness advances a recovering worker's clock by it, resume
    #: policy ``discovery``); None: no lease (recovery finds abandoned runs at once)
    lease_seconds: float | None = None
    #: whether the runtime takes a run over from a worker that stopped but still holds it
    #: (its lease expired or was stolen, and the stale worker is fenced); False: it never
    #: takes a run from a live owner (a session advisory lock, say: a second worker is
    #: refused while the first one's connection stands), so a ``pause`` case wakes the
    #: stopped worker without a takeover and judges no zombie (docs/adapters.md)
    takes_over_live_owner: bool = True
    #: the worker-side calls (``start``, ``resume``, ``recover``) keep nothing from one
    #: run to the next but what the runtime itself keeps, so one process may run many
    #: jobs, one at a time, as a production worker runs many runs (long-lived workers,
    #: :mod:`.resident`: resumes and cancelled workers cost ~2 ms of CPU instead of a
    #: fork's ~13). False: every job forks a worker of its own (docs/adapters.md)
    long_lived_workers: bool = False
    #: the runtime keeps each run's lease in the harness's PostgreSQL (``env.dsn``): a
    #: stopped worker's run can be taken over there (fault kind ``pause``) and that
    #: server crash-restarted under a running worker (``db-restart``). The conformance
    #: table and the findings run those kinds only on an adapter that declares it
    harness_db_leases: bool = False
    #: a cancellation of the worker's task reaches the run (it runs on the worker's event
    #: loop); False: it runs in a thread a cancel cannot reach (LangGraph's ``invoke``),
    #: and the conformance table and the findings leave ``cancel``, ``cancel-edge`` and
    #: await points out
    cancel_reaches_run: bool = True
    #: the runtime's cancel is terminal: no API of it resumes a cancelled run (Absurd:
    #: ``retry_task`` refuses a task that is not ``failed``). A ``cancel-api`` case then
    #: ends at its crash state, the run cancelled, judged by the cancel's own checks, and
    #: :meth:`Adapter.resume_cancelled` need not be implemented
    cancel_is_final: bool = False
    #: the crash point ``(name, task)`` the runtime's own recovery sweep passes once it
    #: has read which runs to recover and before it acts on any (DBOS: its list of the
    #: executor's pending workflows): the ``concurrent`` policy's resumers meet there
    #: (:class:`.worker.PointGate`), and a fault may be placed there (``--plan
    #: ...+db-outage@label[NAME]#1``); None: the runtime's recovery passes no such point
    recovery_point: tuple[str, str] | None = None
    #: one process of the runtime recovers the runs another left, by the other's
    #: identity (DBOS: ``_recover_pending_workflows([dead executor id])``, what its admin
    #: server's recovery endpoint runs): :meth:`recover_other`, resume policy
    #: ``other-executor``; False: that policy is not applicable
    recovers_other_executor: bool = False

    #: the workload's persons in the loop this adapter hands a waiting run to and goes on:
    #: ``"operator"`` (the workload's coroutine on the reference runtime's store,
    #: :mod:`crashmatrix.reference_runtime.handoff`), ``"operator_script"`` (scripted
    #: answers through your runtime's own protocol, :mod:`.human`). A golden run of a
    #: workload whose person is not listed that ends ``needs_human`` makes that
    #: conversation not applicable to this subject (the report says so), not a failure
    answers_operator: tuple[str, ...] = ()

    #: statuses in which the subject parks a run it cannot read (records of another
    #: build: a newer format, a missing upgrader), with the reason in
    #: ``Observation.detail``; terminal for the harness (docs/adapters.md, "Two builds")
    cannot_migrate_statuses: tuple[str, ...] = ()

    def __init__(self) -> None:
        for module in self.requires:
            if not findable(module):
                from .errors import RegistryError

                raise RegistryError(missing_runtime(self.name, module, self.extra)) from None

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

    async def recover(self, ctx: RunContext) -> str:
        """In a worker given no run id and no input (resume policy ``discovery``): run
        the runtime's own recovery, as a process that starts after a crash does, and
        finish every abandoned run it finds in ``ctx.scope`` (judging leases with
        ``ctx.clock_offset_s`` added to the clock); return a status word for the report
        (e.g. ``"recovered 1"``). The harness then reads the case's run. Default: raise
        :class:`RecoveryByIdOnly` (the runtime resumes a run only when given its id)."""
        raise RecoveryByIdOnly(f"{self.name or type(self).__name__} recovers a run by id only (Adapter.recover)")

    async def recover_other(self, ctx: RunContext) -> str:
        """In a worker of another identity than the one(s) that ran ``ctx.run_id`` (resume
        policy ``other-executor``, where the adapter declares ``recovers_other_executor``):
        run the runtime's recovery of the dead worker's runs from this live process, as an
        operator or a control plane does when an executor is gone, and wait (bounded) for
        run ``ctx.run_id`` to end; return its status. Default: raise
        :class:`RecoveryByIdOnly`."""
        raise RecoveryByIdOnly(f"{self.name or type(self).__name__} declares no recovery of another executor's runs "
                               "(Adapter.recover_other)")

    async def between_crash_and_resume(self, env: Environment, run_id: str) -> None:
        """In the controller, each time run ``run_id`` waits for a resume: after a
        worker ended without a terminal status (its crash state read and checked),
        before the next resume worker starts. What the subject's own background jobs
        do to a waiting run goes here (a retention pass, a scheduler's sweep), so the
        matrix covers it. Raising makes the case a harness error. Default: nothing."""

    async def aclose(self) -> None:
        """In the controller, when the session ends: release what :meth:`observe` or
        :meth:`prepare` kept open (connection pools). Default: nothing."""

    def workload_of(self, env: Environment) -> Any:
        """The session's workload object (``registry.workload(env.workload)``): how a
        controller-side call reaches the workload's helpers (a worker has
        ``ctx.workload``). Raises :class:`~crashmatrix.harness.errors.RegistryError` when
        ``env`` names no workload or one that cannot be loaded."""
        from . import registry
        from .errors import RegistryError

        if not env.workload:
            raise RegistryError(f"subject {self.name!r} reads its workload in the controller, and this "
                                "Environment names none (Environment.workload is set by open_session)")
        return registry.workload(env.workload)

    async def cancel_run(self, env: Environment, run_id: str) -> None:
        """In the controller, while the worker running ``run_id`` is stopped at a crash
        point (fault kind ``cancel-api``): cancel the run through the runtime's own API,
        as an operator or another service would (DBOS ``cancel_workflow``, the
        reference runtime's :func:`~crashmatrix.reference_runtime.cancellation.cancel`).
        The worker is woken after it returns. Default: the runtime has none (raises
        ``NotImplementedError``; :meth:`capabilities` says so)."""
        raise NotImplementedError(f"{type(self).__name__} declares no cancel API of its runtime")

    async def resume_cancelled(self, env: Environment, run_id: str) -> None:
        """In the controller, after a ``cancel-api`` fault's crash state was checked:
        undo the cancel through the runtime's own API (DBOS ``resume_workflow``), so the
        next worker continues the run. Not called for a runtime whose
        :attr:`cancel_is_final`. Default: none (``NotImplementedError``)."""
        raise NotImplementedError(f"{type(self).__name__} declares no cancel API of its runtime")

    #: what the runtime promises about the effects a run made after the point it is
    #: restored or forked to (fault kind ``restore``): ``"replays recorded"`` (its own
    #: record answers them again; no request reaches a provider), ``"fresh attempt"``
    #: (the steps run again: each such effect's request goes out exactly once more);
    #: None: the runtime has no restore API (:meth:`restore_run`)
    restore_effects: str | None = None
    #: the crash-point label after which the runtime's latest restore point is durable
    #: (a log append; LangGraph: ``checkpoint.put.after``): the ``restore`` kind finds
    #: the point in a trace by it, and takes the model calls after it as billed again
    restore_point_label: str = "log.append.after"
    #: why the runtime cannot serve fault kind ``restore`` when it has no restore API
    #: (one line, added to the not-applicable reason); None: the generic reason
    restore_not_applicable: str | None = None

    async def restore_point(self, env: Environment, run_id: str) -> str | None:
        """In the controller, while the worker running ``run_id`` is stopped at a crash
        point (fault kind ``restore``): the runtime's own name for the point the run is
        at (its latest checkpoint: a log seq, a checkpoint id, a step number), as
        :meth:`restore_run` takes it; None when the run has none yet. Default: no
        restore API (``NotImplementedError``)."""
        raise NotImplementedError(f"{type(self).__name__} declares no restore API of its runtime")

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        """In the controller, once the run has gone past ``point`` (a value of
        :meth:`restore_point`): move the run back to it through the runtime's own API
        (time travel, an operator's restore: returns ``run_id``), or fork a new run from
        it (returns the new run's id, which the harness resumes by that id). Default:
        none (``NotImplementedError``)."""
        raise NotImplementedError(f"{type(self).__name__} declares no restore API of its runtime")

    def describe(self) -> str:
        return (type(self).__doc__ or self.name).strip().splitlines()[0]

    @classmethod
    def capabilities(cls) -> frozenset[str]:
        """What the runtime can be tested for (words of :data:`CAPABILITIES`), read from
        the class's declarations (nothing imported, nothing made; a duck-typed class
        without a declaration has its default): ``"cancel"`` (:attr:`cancel_reaches_run`),
        ``"cancel-api"`` (:meth:`cancel_run` and :meth:`resume_cancelled` implemented, the
        cancel not final), ``"cancel-final"`` (:meth:`cancel_run` implemented and
        :attr:`cancel_is_final`: a cancelled run is over), ``"leases"``
        (:attr:`harness_db_leases`), ``"restore"`` (:meth:`restore_point` and
        :meth:`restore_run` implemented, :attr:`restore_effects` declared)."""
        def implements(method: str) -> bool:
            return getattr(cls, method, None) not in (None, getattr(Adapter, method))

        final = bool(getattr(cls, "cancel_is_final", False))
        words = {"cancel": getattr(cls, "cancel_reaches_run", True), "leases": getattr(cls, "harness_db_leases", False),
                 "cancel-api": implements("cancel_run") and implements("resume_cancelled") and not final,
                 "cancel-final": implements("cancel_run") and final,
                 "restore": (getattr(cls, "restore_effects", None) in RESTORE_PROMISES
                             and implements("restore_point") and implements("restore_run"))}
        return frozenset(w for w, there in words.items() if there)


def findable(module: str) -> bool:
    """Whether ``module`` (dotted) can be imported from the path, without importing it or
    its parent packages (each level looked for with the path finder in its parent's
    directories; a namespace package counts)."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    parts = module.split(".")
    if parts[0] in sys.modules:
        top = sys.modules[parts[0]]
        path = getattr(top, "__path__", None)
    else:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        path = spec.submodule_search_locations
    for i in range(1, len(parts)):
        name = ".".join(parts[: i + 1])
        if name in sys.modules:
            path = getattr(sys.modules[name], "__path__", None)
            continue
        if path is None:
            return False
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, list(path))
        except KeyError:  # a namespace package found under a parent not imported (its path needs it)
            path = [p for p in (os.path.join(d, parts[i]) for d in path) if os.path.isdir(p)]
            if not path:
                return False
            continue
        if spec is None:
            return False
        path = spec.submodule_search_locations
    return True


def capabilities_of(adapter: Any) -> frozenset[str]:
    """``adapter``'s capabilities (:meth:`Adapter.capabilities`): its own method's answer
    (a build pair asks its builds: :class:`.builds.BuildAdapter`), or, for an adapter
    that does not subclass :class:`Adapter`, what its class declares."""
    own = getattr(adapter, "capabilities", None)
    return frozenset(own()) if callable(own) else Adapter.capabilities.__func__(type(adapter))  # type: ignore[attr-defined]


CAPABILITIES = ("cancel", "cancel-api", "cancel-final", "leases", "restore")
"""The words :meth:`Adapter.capabilities` may answer."""


RESTORE_PROMISES = ("replays recorded", "fresh attempt")
"""The values of :attr:`Adapter.restore_effects`."""
