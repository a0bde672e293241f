"""The crash-point explorer: golden runs and one case end to end.

For each conversation the explorer runs the workload once with no fault (the golden
run) and records its crash-point trace; :func:`.enumeration.enumerate_cases` turns the
trace into the matrix (every recorded point x every fault kind); :meth:`Explorer.run_case`
runs one case:

1. enter the setting of every fault kind of the plan that has one (a ``net`` fault's
   link proxies, a ``db-restart`` fault's PostgreSQL of its own: :mod:`.faults`);
2. start the run in a forked worker with the plan's first fault armed; the worker
   reports ``fired`` before the fault acts (:mod:`.history`);
3. check the fault fired and, for the first worker, that its trace equals the golden
   trace up to the fault, per logical task (else: a harness error, never a pass);
4. wait until the worker's database sessions are gone and no request of its is still
   in flight at a provider (a COMMIT or a charge in flight can still land);
5. read the crash state and run the crash-state checks (the generic ones, then the
   fault kind's);
6. resume in new workers until the run reaches a terminal status (bounded), fault
   *i + 1* armed in the *i*-th resume; before each, the adapter's
   ``between_crash_and_resume`` hook (the subject's background jobs acting on the
   waiting run). A fault kind that stops its worker (pause, db-restart) acts while the
   worker sleeps: a pause lets the next workers take the run over and finish it, then
   wakes the zombie;
7. read the final state (rehydrated) and the providers' ledgers, run the end checks.

One generic runner (:meth:`Explorer._drive`) does this for every plan; what differs
between kinds is the kinds' (:class:`.faults.FaultKind` and its abilities).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import re
import shlex
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from . import coverage, faults, invariants, oracle, policies, registry
from .adapter import Environment, Observation
from .errors import CaseNotApplicable, CrashmatrixError, GoldenRunRefused, HarnessError
from .faults import CaseSetting, Drains, ObservesBefore, SessionResource, Stops
from .golden import GoldenRun, determinism_gate, golden_failure, provider_failure, trace_divergence
from .history import End, Trace, WorkerReport, labels_of
from .iostate import GoldenIo
from .plan import Case, Fault, FaultPlan
from .pool import STUCK_AFTER_S, WorkerExit, WorkerPool
from .worker import Job

_CASE_ENV: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("crashmatrix_case_env", default=None)
#: the environment the case's *workers* get when it differs from the one the controller
#: reads (a network case: links through its proxies; set by :mod:`.faults.net`)
WORKER_ENV: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("crashmatrix_worker_env", default=None)
#: the controller's pool on the case's PostgreSQL when it is not the session's (a
#: db-restart case's server of its own; set by :mod:`.faults.db_restart`)
_CASE_DB: contextvars.ContextVar[asyncpg.Pool | None] = contextvars.ContextVar("crashmatrix_case_db", default=None)
#: the recovery scope the case's workers file its run under (a discovery case's)
_CASE_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar("crashmatrix_case_scope", default=None)
#: the controller's adapter instance for the case's PostgreSQL when it is not the
#: session's (a db-restart case's server: an instance of its own, prepared on it)
_CASE_ADAPTER: contextvars.ContextVar[Any] = contextvars.ContextVar("crashmatrix_case_adapter", default=None)
TERMINAL = ("completed", "failed", "needs_human", "limit_exceeded")


@dataclass
class Options:
    """Knobs of a matrix run. Times in seconds."""

    worker_timeout: float = 60.0
    term_grace: float = 10.0
    quiesce_timeout: float = 15.0
    max_resumes: int = 3
    await_points: bool = False  # trace await points (source "await") in every worker
    #: seed of the embedded fault proxy's random choices (a latency toxic's jitter, a
    #: slicer's sizes, toxicity below 1), passed as its ``--seed``; not sent to an
    #: external server ($TOXIPROXY_URL), whose randomness is its own
    proxy_seed: int = 0
    #: where a case that did not pass keeps its directory (its workers' event files and
    #: logs, its plan: :attr:`CaseResult.artifacts`); None: in the session's directory,
    #: removed with it. A passing case's directory is always removed.
    keep_failed: Path | None = None
    #: crash-state pruning of kill cases and shared resumes (:class:`.pruning.PruneOptions`;
    #: None: its defaults, on; :data:`.pruning.OFF`: every case runs whole)
    prune: Any = None
    #: resumes a ``recurring`` case may start before the harness stops it (its own
    #: bound, reported as such: :mod:`.policies`)
    recurring_bound: int = policies.RECURRING_BOUND
    #: run the jobs that may in long-lived workers (:mod:`.resident`); False: every job
    #: forks a worker of its own (``--fresh-workers``)
    long_lived: bool = True
    #: seconds a faulted worker may stay silent after its fault (no crash point, no
    #: exit) before it is judged stuck (``worker.stuck``; :data:`.pool.STUCK_AFTER_S`);
    #: None: only the deadline (``worker_timeout``)
    stuck_after: float | None = STUCK_AFTER_S
    #: milliseconds of the ``db-outage`` faults a matrix enumerates (None:
    #: ``plan.OUTAGE_WINDOW_MS``); a case given whole keeps its own (``--outage-window``)
    outage_window_ms: int | None = None


@dataclass
class CaseResult:
    """One case's outcome: ``outcome`` is ``pass``, ``fail`` or ``harness-error``, or
    ``flaky`` when the case failed and a replay of it on the same session did not
    (:func:`.matrix.run_cases`; ``replays`` holds each replay's own result)."""

    case: Case
    subject: str
    outcome: str
    verdicts: list[oracle.Verdict] = field(default_factory=list)
    error: str | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    run_id: str = ""
    #: the trace of the last resume that ran without a fault: where double faults land
    resume_trace: Trace = field(default_factory=list)
    #: labels reached after the case's first fault fired (its faulted worker's rest,
    #: every later worker): the recovery branches it exercised (:mod:`.coverage`)
    reached: set[str] = field(default_factory=set)
    #: the directory kept for a case that did not pass (``Options.keep_failed``): its
    #: workers' event files (``cmw-*.jsonl``) and logs (``cmw-*.log``), ``plan.json``
    #: and ``case.txt`` (id, subject, outcome, replay line); None when not kept
    artifacts: str | None = None
    #: replays of a failing case, in order (:func:`.matrix.run_cases`' ``replay_failures``)
    replays: list[CaseResult] = field(default_factory=list)

    @property
    def failed(self) -> list[oracle.Verdict]:
        return [v for v in self.verdicts if v.valid is not True]

    @property
    def replay(self) -> str:
        return replay_command(self.case, self.subject)

    def to_dict(self) -> dict[str, Any]:
        first = self.failed[0] if self.failed else None
        return {
            "id": self.case.id,
            "subject": self.subject,
            "plan": self.case.plan.to_dict(),
            "outcome": self.outcome,
            "failed_check": first.check if first else None,
            "diff": first.diff if first else [],
            "error": self.error,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "workers": self.workers,
            "seconds": round(self.seconds, 4),
            "run_id": self.run_id,
            "replay": self.replay,
            "artifacts": self.artifacts,
        }


def artifact_name(result: CaseResult) -> str:
    """The name of a kept case directory: conversation, plan and the run id's tail,
    with every character but letters, digits and ``.@+-`` as ``_`` (at most ~150
    characters, so a long double-fault plan still makes a file name)."""
    text = f"{result.case.conversation}--{result.case.plan.label()}"
    safe = re.sub(r"[^A-Za-z0-9.@+-]+", "_", text).strip("_")[:140]
    return f"{safe}--{result.run_id.removeprefix('cm-run-')[:8]}"


def stuck_verdict(fault: Fault, exit_: WorkerExit, options: Options) -> oracle.Verdict:
    """``worker.stuck`` (crash phase, invalid): the worker ``exit_`` SIGKILLed after it
    stayed silent (no crash point passed, no exit) after ``fault`` for the time
    ``options`` allows (``stuck_after``; a ``term`` fault's whole grace)."""
    bound = (f"its whole grace (Options.term_grace={options.term_grace:g} s)" if fault.kind == "term"
             else f"Options.stuck_after={options.stuck_after:g} s")
    return oracle.Verdict("worker.stuck", "crash", False,
                          f"after its {fault.kind} fault the worker neither passed a crash point nor exited for "
                          f"{exit_.stuck_s:.1f} s ({bound}); the last point it passed: {exit_.last_point or '?'}; "
                          f"SIGKILLed by the harness")


def replay_command(case: Case, subject: str) -> str:
    """The shell line that re-runs ``case`` on ``subject`` (a build pair's as
    ``--subject A --resume-with B``: :func:`.builds.replay_options`), quoted for POSIX
    shells."""
    from .builds import replay_options

    return shlex.join(["crashmatrix", "replay", case.id, *replay_options(subject)])


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of a worker's log or traceback, indented (worker logs
    live in the session's directory, which is removed when the session ends)."""
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


@dataclass
class WorkerRun:
    """One faulted worker of a case, as the case runner and its fault kind's hooks see
    it: ``index`` (0 starts the run, *i* is the *i*-th resume), the ``fault`` armed in
    it, its ``job`` and log path, ``entry`` (its record in :attr:`CaseResult.workers`;
    hooks add fields), the durable state ``before`` it started (when looked at), its
    ``pid`` (once it stopped at its fault), how it ended (``exit``, ``report``) and,
    for a stopped worker, the state and the providers' ledgers just before it was woken
    (``woke``)."""

    index: int
    fault: Fault
    job: Job
    log: str
    entry: dict[str, Any]
    before: Observation | None = None
    pid: int | None = None
    exit: WorkerExit | None = None
    report: WorkerReport = field(default_factory=WorkerReport)
    woke: oracle.Evidence | None = None
    taken_over: bool = True


@dataclass
class CaseRun:
    """One case in progress: what the generic runner and the fault kinds' hooks share.

    ``allowance``: node -> model calls in flight when a fault landed (the end check's
    margin); ``resumes``: resume steps started so far; ``done``: the run was driven to
    its end (no worker starts after); ``kind_state``: per fault kind (and resume
    policy), what it keeps for this case (a net case's links); ``workdir``: the case's
    own directory (its workers' event files and logs); ``acknowledged``: the subject
    acknowledged the run."""

    explorer: Explorer
    case: Case
    golden: GoldenRun
    run_id: str
    result: CaseResult
    workdir: Path
    allowance: dict[str, int] = field(default_factory=dict)
    resumes: int = 0
    done: bool = False
    kind_state: dict[str, Any] = field(default_factory=dict)
    #: with the pruning hook (``Explorer.crash_states``): the crash state after the last
    #: faulted worker, read whole (ledgers too), and a final state taken from an equal
    #: crash state's resume (:mod:`.pruning`)
    crash: oracle.Evidence | None = None
    final: oracle.Evidence | None = None
    #: with the pruning hook: the first faulted worker's trace up to its fault
    first_trace: Trace | None = None
    #: some worker reported that the subject acknowledged the run (``RunContext.accepted``)
    acknowledged: bool = False
    #: the case's exit stack while its workers run (a policy's held process ends with it)
    stack: contextlib.AsyncExitStack | None = None

    async def observe(self) -> Observation:
        """The run's durable state now (the adapter's ``observe`` on the case's env)."""
        return await self.explorer.adapter.observe(self.explorer.case_env, self.run_id)

    async def drive(self, index: int, status: str) -> str:
        """Run the case's workers from ``index`` on until the run is terminal
        (:meth:`Explorer._drive`); a stopping kind's hook calls it while its worker
        sleeps. Returns the last status."""
        return await self.explorer._drive(self, index, status)


class Explorer:
    """Runs golden runs and cases for one subject and workload on live services."""

    def __init__(
        self, env: Environment, pool: WorkerPool, subject: str, workload: str, workdir: Path,
        http: aiohttp.ClientSession, options: Options | None = None, *, adapter: Any = None,
    ) -> None:
        self.env = env
        self.pool = pool
        self.subject = subject
        self.workload_name = workload
        self.workload = registry.workload(workload)
        #: the controller's adapter; a build pair's is a :class:`.builds.BuildAdapter`
        #: (``subject`` then names the pair: :mod:`.builds`)
        self._adapter = adapter if adapter is not None else registry.subject(subject)
        #: the build pair of a two-build session (:mod:`.builds`): resumes run build B
        self.upgrade: Any = None
        self.workdir = workdir
        self.http = http
        self.options = options or Options()
        self.db: asyncpg.Pool | None = None  # the controller's own connections (session)
        #: starts a PostgreSQL that db-restart cases may stop (set by the session); None
        #: when the user gave a DSN: the harness cannot restart someone else's server
        self.start_restartable_pg: Any = None
        #: per fault kind, what it keeps for the session (:mod:`.faults.db_restart`'s
        #: server); released by :meth:`aclose`
        self.fault_state: dict[str, Any] = {}
        self._n = 0
        #: the session's fault proxy (:class:`.netfaults.FaultProxyService`), for net faults
        self.fault_proxy: Any = None
        #: the pruning hook while :func:`.pruning.run_pruned` runs cases on this explorer
        #: (:class:`.pruning.CrashStates`): crash states read whole, resumes shared
        self.crash_states: Any = None

    @property
    def adapter(self) -> Any:
        """The controller's adapter for the case running in this task: one instance per
        PostgreSQL server (docs/adapters.md, "One instance, one PostgreSQL"): the
        session's, or a db-restart case's own (:meth:`scoped`)."""
        return _CASE_ADAPTER.get() or self._adapter

    @adapter.setter
    def adapter(self, value: Any) -> None:
        self._adapter = value

    # -- plumbing -----------------------------------------------------------------------

    def terminal_statuses(self) -> tuple[str, ...]:
        """Statuses after which no resume starts: ``needs_human`` is one, unless the
        workload brings its own human (``workload.operator``, or a scripted one,
        ``workload.operator_script``: :mod:`.human`; the adapter hands the run to it and
        goes on, so a run left waiting by a fault is resumed); and the statuses the
        subject parks a run in when it cannot migrate it (``cannot_migrate_statuses``)."""
        parked = tuple(s for s in getattr(self.adapter, "cannot_migrate_statuses", ()) or () if s not in TERMINAL)
        if getattr(self.workload, "operator", None) is None and getattr(self.workload, "operator_script", None) is None:
            return TERMINAL + parked
        return tuple(s for s in TERMINAL if s != "needs_human") + parked

    @property
    def case_env(self) -> Environment:
        """The environment of the case running in this task: the shared one, or for a
        ``db-restart`` case the PostgreSQL of its own."""
        return _CASE_ENV.get() or self.env

    @contextlib.contextmanager
    def scoped(self, *, env: Environment | None = None, worker_env: Environment | None = None,
               db: asyncpg.Pool | None = None, adapter: Any = None) -> Iterator[None]:
        """Within the block, in this task: the case's environment (what the controller
        reads: :attr:`case_env`), its workers' environment (links through a proxy), the
        controller's pool on the case's PostgreSQL (:meth:`quiesce`) and the adapter
        instance prepared on that server (:attr:`adapter`). A fault kind's setting uses
        it (:class:`.faults.CaseSetting`)."""
        pairs: tuple[tuple[contextvars.ContextVar[Any], Any], ...] = (
            (_CASE_ENV, env), (WORKER_ENV, worker_env), (_CASE_DB, db), (_CASE_ADAPTER, adapter))
        tokens = [(var, var.set(value)) for var, value in pairs if value is not None]
        try:
            yield
        finally:
            for var, token in reversed(tokens):
                var.reset(token)

    def _job(self, role: str, conversation: str, run_id: str, plan: FaultPlan, directory: Path, *,
             input_given: bool = True, clock_offset_s: float = 0.0, start_gate: str = "",
             gate_parties: int = 0, hold_at: tuple[str, str] | None = None, lead: bool = False
             ) -> tuple[Job, str]:
        self._n += 1
        worker_id = f"cmw-{self._n}-{uuid.uuid4().hex[:8]}"
        base = directory / worker_id
        env = WORKER_ENV.get() or self.case_env
        subject, build = self.subject, ""
        if self.upgrade is not None:  # A starts the run (and the golden runs), B resumes it
            b = self.upgrade.for_role(role)
            subject, build = b.subject, b.label
        elif getattr(self.adapter, "own_build", None) is not None:  # a subject in its own environment
            subject = self.adapter.own_build.subject
        job = Job(role, subject, self.workload_name, conversation, run_id, worker_id, env, plan,
                  f"{base}.jsonl", self.options.await_points, input_given=input_given, scope=_CASE_SCOPE.get(),
                  clock_offset_s=clock_offset_s, build=build, start_gate=start_gate, gate_parties=gate_parties,
                  hold_at=hold_at, lead=lead)
        return job, f"{base}.log"

    async def _worker(self, job: Job, log: str) -> tuple[WorkerExit, WorkerReport]:
        """Run a worker without a fault (a golden run, a plain resume) to its end."""
        exit_ = await self.pool.run(job, log, timeout=self.options.worker_timeout)
        return exit_, WorkerReport.from_file(job.result_path)

    async def quiesce(self, worker_id: str, *, database: bool = True, live: bool = False) -> None:
        """Wait until ``worker_id`` has no database session (unless ``database`` is
        False; ``live``: a worker whose process lives on, a long-lived worker's job that
        ended, may keep idle ones: a pool's connection has nothing in flight) and no
        provider request in flight. Raises :class:`HarnessError` after
        ``quiesce_timeout``."""
        from .services.providers import clients

        deadline = time.monotonic() + self.options.quiesce_timeout
        db = _CASE_DB.get() or self.db
        assert db is not None
        while database and await self._sessions_of(db, worker_id, deadline, live):
            if time.monotonic() > deadline:
                raise HarnessError(f"database sessions of dead worker {worker_id} did not go away in {self.options.quiesce_timeout} s")
            await asyncio.sleep(0.005)
        for kind in self.workload.providers:
            while await clients.inflight(self.http, self.case_env.providers[kind], worker_id):
                if time.monotonic() > deadline:
                    raise HarnessError(f"requests of dead worker {worker_id} still in flight at {kind}")
                await asyncio.sleep(0.01)

    @staticmethod
    async def _sessions_of(db: asyncpg.Pool, worker_id: str, deadline: float, live: bool = False) -> int:
        """Sessions of ``worker_id`` on ``db``'s server (``live``: those not idle); a
        connection the server cut (a db-restart case's server after its restart) is
        retried until ``deadline``."""
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        if live:
            sql += " AND state IS DISTINCT FROM 'idle'"
        while True:
            try:
                return int(await db.fetchval(sql, worker_id))
            except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)

    async def evidence(self, run_id: str) -> oracle.Evidence:
        """The run's durable state (rehydrated), its provider ledgers and model bills."""
        from .services.providers import clients

        obs = await self.adapter.observe(self.case_env, run_id)
        ledgers = {}
        model_calls: dict[str, int] = {}
        model_rows: list[dict[str, Any]] = []
        for kind in self.workload.providers:
            rows = await clients.read_ledger(self.http, self.case_env.providers[kind], run_id)
            if kind == "model":
                model_rows = rows
                for row in rows:
                    model_calls[row["node_id"]] = model_calls.get(row["node_id"], 0) + 1
            else:
                ledgers[kind] = rows
        return oracle.Evidence(obs, ledgers, model_calls, model_rows)

    # -- golden run ---------------------------------------------------------------------

    async def _golden_evidence(self, conversation: str, run_id: str) -> oracle.Evidence:
        """:meth:`evidence` of a golden run. The adapter's ``observe`` raising there is its
        contract broken before any case could judge anything: :class:`AdapterContractError`
        (exit 2), one line naming the method, the run and what it raised."""
        try:
            return await self.evidence(run_id)
        except (asyncio.CancelledError, CrashmatrixError):
            raise
        except Exception as exc:
            from .errors import AdapterContractError

            what = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise AdapterContractError(
                f"{type(self.adapter).__name__}.observe raised reading the golden run of {conversation} "
                f"(run {run_id}), which a worker had just ended: {what}") from None

    async def golden(self, conversation: str) -> GoldenRun:
        """Run ``conversation`` twice without faults, at once, in fresh workers with
        different run ids (the determinism gate, docs/design.md "Determinism"): learn its
        identifiers from the pair and check the invariants on the first. Returns the
        first run, with the effects it applied per effect provider and the calls a
        provider refused it (and any 5xx of its twin: :meth:`provider_answers`); one that did not complete (the subject returned another status or
        raised) is returned broken (``run.ends``: no baseline, reported). Raises
        :class:`GoldenRunRefused` when a provider answered either run 5xx,
        :class:`HarnessError` if a worker vanished and
        :class:`NondeterministicWorkload` if the two differ in their crash-point traces
        or in anything the oracle compares once identifiers are renamed."""
        t0 = time.monotonic()
        # the two workers run at once; the evidence is read one run after the other (an
        # adapter's observe may set up its pools lazily, and need not be reentrant)
        runs = await asyncio.gather(self._golden_once(conversation), self._golden_once(conversation))
        first, second = [GoldenRun(conversation, run_id, end.trace, await self._golden_evidence(conversation, run_id), seconds)
                         for run_id, end, seconds, _ in runs]
        first.applied, first.refusals = await self.provider_answers(first.run_id, first.evidence)
        first.refusals += [r for r in (await self.provider_answers(second.run_id, second.evidence))[1]
                           if r["http_status"] >= 500]  # a provider's failure in either run of the pair
        where = f"{self.workload_name}/{conversation} on {self.subject}"
        if (failure := provider_failure(f"the golden run of {where}", first.refusals)) is not None:
            raise GoldenRunRefused(failure)  # before its completion or determinism is judged: the provider's fault
        incomplete = next((why for *_, why in runs if why is not None), None)
        person = self.unanswered_person()
        if incomplete is not None and person and any(end.status == "needs_human" for _, end, *_ in runs):
            first.skipped = (f"{where}: the run waits for the workload's person ({person}), which "
                             f"{self.adapter.name or type(self.adapter).__name__} does not answer "
                             f"(Adapter.answers_operator; docs/adapters.md, \"A person in the loop\")")
            first.seconds = time.monotonic() - t0
            return first
        if incomplete is not None:  # the subject's own failure with no fault: reported, no baseline
            first.verdicts = [oracle.Verdict("run.ends", "end", False, f"the golden run (no fault) of {where} did not "
                                             f"complete: {incomplete}")]
            first.seconds = time.monotonic() - t0
            return first
        first.io = GoldenIo.of(runs[0][1], runs[1][1])
        first.identifiers = determinism_gate(first, second, self.identifier_fields(), where)
        first.verdicts = invariants.end_invariants(first.evidence) + self._human_checks(first.evidence, None, 0)
        first.seconds = time.monotonic() - t0
        return first

    async def provider_answers(self, run_id: str, evidence: oracle.Evidence) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """Per effect provider, the effects run ``run_id`` applied (its rows of
        ``evidence``'s ledgers answered below 400), and every request of it a provider
        of the workload answered 4xx or 5xx (``{"provider", "method", "path",
        "http_status", "error"}``, provider by provider)."""
        from .golden import effect_providers
        from .services.providers import clients

        applied = {p: sum(1 for row in evidence.ledgers.get(p, []) if int(row.get("http_status") or 0) < 400)
                   for p in effect_providers(self.workload)}
        refusals = []
        for kind in self.workload.providers:
            for row in await clients.read_refusals(self.http, self.case_env.providers[kind], run_id):
                refusals.append({"provider": kind, **{k: row[k] for k in ("method", "path", "http_status", "error")}})
        return applied, refusals

    def unanswered_person(self) -> str | None:
        """The workload's person in the loop (``operator``: a coroutine on the reference
        runtime's store; ``operator_script``: scripted answers, :mod:`.human`) that the
        adapter does not declare it answers (``Adapter.answers_operator``), or None."""
        for kind in ("operator", "operator_script"):
            if getattr(self.workload, kind, None) is not None and kind not in tuple(
                    getattr(self.adapter, "answers_operator", ()) or ()):
                return f"workload.{kind}"
        return None

    def identifier_fields(self) -> tuple[str, ...]:
        """Field names the adapter and the workload declare to hold identifiers
        (``identifier_fields`` on either; docs/adapters.md, "Identifiers")."""
        return (tuple(getattr(self.adapter, "identifier_fields", ()) or ())
                + tuple(getattr(self.workload, "identifier_fields", ()) or ()))

    async def _golden_once(self, conversation: str) -> tuple[str, End, float, str | None]:
        """One golden worker, measuring its I/O at every point (``Job.record_io``): its
        run id, ``end`` report (trace and marks), seconds, and why the run did not
        complete (None: it completed). A subject that returned another status, raised or
        never returned (its worker killed at the deadline, ``timed-out``) did not
        complete: its own failure, reported as the golden run's ``run.ends``. Raises
        :class:`HarnessError` when the worker left no end report otherwise (it vanished)."""
        t0 = time.monotonic()
        run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
        job, log = self._job("start", conversation, run_id, FaultPlan(), self.workdir)
        job = dataclasses.replace(job, record_io=True)
        exit_, report = await self._worker(job, log)
        end = report.end
        if end is None and exit_.timed_out:  # the subject never returned: its own failure, as a hang in production
            return run_id, End("timed-out", report.trace()), time.monotonic() - t0, (
                f"it did not return within the worker deadline ({exit_.describe()})")
        if end is None:
            tail = _tail(_read(log), 12)
            raise HarnessError(
                f"golden run of {self.workload_name}/{conversation} on {self.subject} did not complete: "
                f"{exit_.describe()}" + (f"\n{tail}" if tail else ""))
        why = None
        if end.status != "completed" or exit_.returncode != 0:
            why = f"it raised {end.error}" if end.error else f"it ended {end.status!r}"
            tail = _tail(end.traceback or "", 6)
            why += f"\n{tail}" if tail else ""
        return run_id, end, time.monotonic() - t0, why

    # -- one case -----------------------------------------------------------------------

    async def run_case(self, case: Case, golden: GoldenRun) -> CaseResult:
        """Run ``case`` end to end (module docstring); never raises for a case's own
        failure: harness problems become ``harness-error`` results."""
        t0 = time.monotonic()
        run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
        result = CaseResult(case, self.subject, "pass", run_id=run_id)
        if golden.broken:  # not a baseline: judging a case against it would be meaningless
            result.outcome, result.verdicts = "fail", list(golden.broken)
            result.error = (f"not run: the golden run of {case.conversation} "
                            f"{golden_failure([v.check for v in golden.broken])} ({invariants.summary(golden.broken)})")
            return result
        why = policies.policy_of(case.resume).not_applicable(self.adapter, self.options)
        for fault in case.plan.faults:  # what each fault's kind needs the adapter to declare
            why = why or faults.kind(fault.kind).not_applicable(self.adapter)
        if why is not None:  # the policy needs what the adapter does not declare: nothing to run
            result.outcome, result.error = coverage.NOT_APPLICABLE, f"not applicable: {why}"
            return result
        directory = self.workdir / run_id
        try:
            await self._run_case(case, golden, run_id, result, directory)
        except CaseNotApplicable as exc:
            result.outcome, result.error = coverage.NOT_APPLICABLE, f"not applicable: {exc}"
        except HarnessError as exc:
            result.outcome, result.error = "harness-error", str(exc)
        except Exception as exc:
            result.outcome, result.error = "harness-error", f"{type(exc).__name__}: {exc}"
        if self.crash_states is not None:
            self.crash_states.judged(result)
        result.seconds = time.monotonic() - t0
        await asyncio.to_thread(self._keep_or_remove, result, directory)
        return result

    def _keep_or_remove(self, result: CaseResult, directory: Path) -> None:
        """Remove a passing case's directory; keep a failing one's, with its plan and a
        note, under ``Options.keep_failed`` (named after the case, :func:`artifact_name`)
        and name it in ``result.artifacts``. A directory that cannot be kept stays where
        it is (the session removes it) and the failure to keep it is the artifacts'
        field: ``"not kept: ..."``."""
        if result.outcome == "pass" or not directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
            return
        (directory / "plan.json").write_text(result.case.plan.to_json() + "\n")
        (directory / "case.txt").write_text(
            f"{result.case.id}\nsubject: {result.subject}\nrun: {result.run_id}\noutcome: {result.outcome}\n"
            f"replay: {result.replay}\n")
        keep = self.options.keep_failed
        if keep is None:
            return
        try:
            Path(keep).mkdir(parents=True, exist_ok=True)
            target = Path(keep) / artifact_name(result)
            shutil.move(str(directory), str(target))
        except OSError as exc:
            result.artifacts = f"not kept: {exc}"
            return
        result.artifacts = str(target)

    async def _run_case(self, case: Case, golden: GoldenRun, run_id: str, result: CaseResult, directory: Path) -> None:
        """Every plan's one path: the settings of the plan's kinds, the workers
        (:meth:`_drive`), the kinds' end-of-case checks, the end checks. The workers'
        files go to ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        cx = CaseRun(self, case, golden, run_id, result, directory)
        policy = policies.policy_of(case.resume)
        used = {f.kind for f in case.plan.faults}
        settings = [k for name, k in faults.KINDS.items() if name in used and isinstance(k, CaseSetting)]
        scope = policies.scope_of(run_id) if case.resume.policy == "discovery" else None
        token = _CASE_SCOPE.set(scope)
        try:
            async with contextlib.AsyncExitStack() as stack:
                cx.stack = stack
                if scope is not None:  # the controller's reads see it too (an adapter may file runs by it)
                    env = self.case_env
                    stack.enter_context(self.scoped(env=dataclasses.replace(
                        env, options={**env.options, policies.SCOPE_OPTION: scope})))
                for kind in settings:  # registry order: a db-restart's server before a net case's links to it
                    await stack.enter_async_context(kind.setting(cx))
                await self._drive(cx, 0, "absent")
                for kind in settings:
                    await kind.case_end(cx)
                await policy.finish(self, cx)
        finally:
            _CASE_SCOPE.reset(token)
        result.outcome = "pass" if oracle.merge(result.verdicts) is True else "fail"

    async def _drive(self, cx: CaseRun, index: int, status: str) -> str:
        """Run workers ``index``, ``index + 1``, ... of the case until the run is
        terminal: worker *i* gets the plan's fault *i* (:meth:`_faulted_worker`), or runs
        fault-free once the plan is used up (:meth:`_plain_resume`). Before each resume
        the adapter's ``between_crash_and_resume``; the case's resume policy
        (:mod:`.policies`) says which fault each worker gets, how a fault-free resume
        runs and how many may run (default: ``max_resumes`` beyond the plan's later
        faults, else ``run.ends`` fails). Marks the case done and returns the last
        status."""
        plan = cx.case.plan.faults
        policy = policies.policy_of(cx.case.resume)
        while not cx.done:
            if index > 0:
                if status in self.terminal_statuses():
                    break
                if cx.resumes >= policy.bound(self.options, plan):
                    cx.result.verdicts.append(policy.over_bound(cx, status))
                    break
                if index == len(plan) and self.crash_states is not None and await self.crash_states.share_resume(cx):
                    break  # an equal crash state was resumed already: its final state stands for this one's
                cx.resumes += 1
                await self.adapter.between_crash_and_resume(self.case_env, cx.run_id)
            fault = policy.fault_for(plan, index)
            if fault is not None:
                status = await self._faulted_worker(cx, index, fault)
            else:
                status, ran = await policy.resume(self, cx)
                if not ran:
                    break
            index += 1
        cx.done = True
        return status

    async def _faulted_worker(self, cx: CaseRun, index: int, fault: Fault) -> str:
        """Worker ``index`` with ``fault`` armed, through its kind's hooks: the state
        before it (:class:`.faults.ObservesBefore`), its run (with the drain grace,
        :class:`.faults.Drains`; the kind acting while it is stopped,
        :class:`.faults.Stops`), what it left (``after_worker``), that the fault fired
        (and for the first worker, that the run followed the golden run up to it), quiet
        (:meth:`quiesce`), the crash state and its checks, the model calls it left in
        flight. Returns the crash state's status. Raises :class:`HarnessError`."""
        kind = faults.kind(fault.kind)
        role = "start" if index == 0 else "resume"
        if index == 0:
            before: Observation | None = Observation(cx.run_id, "absent")  # each case runs a run id of its own
        else:
            before = await cx.observe() if isinstance(kind, ObservesBefore) else None
        job, log = self._job(role, cx.case.conversation, cx.run_id, FaultPlan((fault,)), cx.workdir,
                             input_given=policies.hands_input(self.adapter, cx.case.resume, index, cx.acknowledged))
        entry: dict[str, Any] = {"role": (kind.role if isinstance(kind, Stops) else None) or role}
        cx.result.workers.append(entry)
        w = WorkerRun(index, fault, job, log, entry, before)

        async def at_stop(pid: int) -> None:  # the worker sleeps at its fault: check it got there, then act
            assert isinstance(kind, Stops)
            w.pid = pid
            w.report = WorkerReport.from_file(job.result_path)
            self._fired(w, cx.golden if index == 0 else None)
            await kind.at_stop(cx, w)

        held = await policies.policy_of(cx.case.resume).holds_worker(self, cx, index, job)
        if held is not None:  # the policy keeps this worker's process for a later one (same-worker)
            w.exit = await held(job, log, self.options.worker_timeout)
        else:
            w.exit = await self.pool.run(
                job, log, timeout=self.options.worker_timeout,
                term_grace=self.options.term_grace if isinstance(kind, Drains) else None,
                at_stop=at_stop if isinstance(kind, Stops) else None, stuck_after=self.options.stuck_after)
        entry.update(w.exit.to_dict())
        if w.exit.stuck_s is not None:  # the subject's failure, not the harness's deadline
            cx.result.verdicts.append(stuck_verdict(fault, w.exit, self.options))
        w.report = WorkerReport.from_file(job.result_path)
        cx.acknowledged = cx.acknowledged or w.report.accepted
        await kind.after_worker(cx, w)
        if w.report.fired is None and policies.policy_of(cx.case.resume).optional(cx.case.plan.faults, index):
            # a repeated fault whose point this worker did not reach: it gave up, or got past it
            status, ran = await self._without_fault(cx, job, log, w.exit, w.report)
            cx.done = cx.done or not ran
            return status
        try:
            at_fault = self._fired(w, cx.golden if index == 0 else None)
        except HarnessError as exc:
            if not (index == 0 and w.exit is not None and w.exit.resident and w.exit.jobs_before):
                raise
            # the golden pair, each in a fresh worker, agreed: a long-lived worker that had
            # run other jobs took the run elsewhere, which is the subject's state, not ours
            cx.result.verdicts.append(oracle.Verdict(
                "worker.warm_path", "crash", False,
                f"started in a long-lived worker that had run {w.exit.jobs_before} other job(s) of this matrix, the "
                f"run left the golden run's path before its fault ({exc}); the golden pair, each in a fresh worker, "
                f"followed it: state those runs left in the process changed this one"))
            await self.quiesce(job.worker_id, live=w.exit.live)
            cx.done = True
            return (await cx.observe()).status
        full = w.report.end.trace if w.report.end is not None else at_fault
        cx.result.reached |= labels_of(full[len(at_fault):] if index == 0 else full)
        if index == 0:  # a fault that changed nothing makes the case not-run (:mod:`.coverage`)
            entry["took_effect"] = coverage.took_effect(fault.kind, cx.golden, w.report.end, w.exit.returncode, at_fault)
        await self.quiesce(job.worker_id, database=kind.quiesce_database if isinstance(kind, Stops) else True,
                           live=w.exit.live)
        ledgers = None
        if kind.reads_ledgers or self.crash_states is not None:  # the pruning hook compares crash states
            if index == 0 and self.crash_states is not None:
                cx.first_trace = list(at_fault)
            crash = cx.crash = await self.evidence(cx.run_id)
            obs, ledgers = crash.observation, crash.ledgers if kind.reads_ledgers else None
        else:
            obs = await cx.observe()
        evidence = oracle.CrashEvidence(fault, at_fault, full, w.exit.returncode, w.exit.signal, w.exit.timed_out, obs,
                                        before, end=w.report.end, woke=w.woke, taken_over=w.taken_over, ledgers=ledgers,
                                        acknowledged=cx.acknowledged,
                                        signalled_at=w.report.signalled.at if w.report.signalled else None)
        cx.result.verdicts += oracle.crash_checks(evidence)
        # a cancel lands after it fires (at the next await): what was in flight is what
        # the faulted worker's whole trace shows unfinished (the kind decides: a drain
        # that had time to finish its nodes leaves nothing to pay again)
        for node, n in kind.allowance(evidence).items():
            cx.allowance[node] = cx.allowance.get(node, 0) + n
        return await kind.settle(cx, w, obs)

    async def _plain_resume(self, cx: CaseRun) -> tuple[str, bool]:
        """A resume without a fault; its trace becomes the case's ``resume_trace``.
        Returns its status and whether it ran (exit 0 with an ``end`` report; else
        ``resume.runs`` fails and the status is read from the store)."""
        job, log = self._job("resume", cx.case.conversation, cx.run_id, FaultPlan(), cx.workdir,
                             input_given=policies.hands_input(self.adapter, cx.case.resume, cx.resumes, cx.acknowledged))
        exit_, report = await self._worker(job, log)
        cx.result.workers.append({"role": "resume", **exit_.to_dict()})
        cx.acknowledged = cx.acknowledged or report.accepted
        return await self._without_fault(cx, job, log, exit_, report)

    async def _without_fault(self, cx: CaseRun, job: Job, log: str, exit_: WorkerExit,
                             report: WorkerReport) -> tuple[str, bool]:
        """A resume that ran without a fault firing: its trace becomes the case's
        ``resume_trace``; its status, and whether it ran (else ``resume.runs`` fails)."""
        end = report.end
        if end is not None:
            cx.result.resume_trace = end.trace
            cx.result.reached |= labels_of(end.trace)
        if exit_.returncode != 0 or end is None:
            await self.quiesce(job.worker_id, live=exit_.live)
            detail = (end.error if end is not None else None) or f"{exit_.describe()}; {_tail(_read(log), 3)}"
            cx.result.verdicts.append(oracle.Verdict("resume.runs", "end", False, f"resume {cx.resumes} failed: {detail}"))
            return (await cx.observe()).status, False
        return end.status, True

    def _fired(self, w: WorkerRun, golden: GoldenRun | None) -> Trace:
        """The trace up to the fault; raises :class:`HarnessError` if the fault never
        fired or (given the ``golden`` run) the run diverged from it before the fault."""
        fired = w.report.fired
        if fired is None:
            end = w.report.end
            where = f" (in resume {w.index})" if w.index else ""
            how = (f"the run ended {end.status!r}" if end is not None else
                   f"the worker ended ({w.exit.describe() if w.exit else '?'}) without a report")
            raise HarnessError(f"fault {w.fault.label()}{where} never fired: its point was not reached; {how}")
        if golden is not None:
            divergence = trace_divergence(golden.trace, fired.trace)
            if divergence:
                raise HarnessError(f"the faulted run diverged from the golden run before the fault: {divergence}")
        return fired.trace

    async def final_evidence(self, cx: CaseRun) -> oracle.Evidence:
        """The case's final state: read from its run, or an equal crash state's resume's
        when the pruning hook gave one (``cx.final``); handed to the hook."""
        final = cx.final or await self.evidence(cx.run_id)
        if self.crash_states is not None:
            self.crash_states.finished(cx, final)
        return final

    def end_verdicts(self, cx: CaseRun, final: oracle.Evidence) -> list[oracle.Verdict]:
        """The end checks against the golden run (identifiers renamed as the golden pair
        taught), the invariants, on ``final`` with the case's model-call allowance; the
        human-in-the-loop checks; and for a build pair (:mod:`.builds`) ``upgrade.migrated``:
        the run A left, resumed by B."""
        golden, result = cx.golden, cx.result
        verdicts = oracle.end_checks(golden.evidence, final, cx.allowance, golden.identifiers)
        verdicts += invariants.end_invariants(final, cx.allowance)
        verdicts += self._human_checks(final, golden.evidence, len(result.case.plan.faults))
        if self.upgrade is not None:
            from .builds import check_migrated

            declared = tuple(getattr(self.adapter, "cannot_migrate_statuses", ()) or ())
            upgrade = self.upgrade
            verdicts.append(oracle.run_check("upgrade.migrated", "end", lambda: check_migrated(
                golden.evidence, final, result, upgrade, declared)))
        return verdicts

    def _human_checks(self, final: oracle.Evidence, golden: oracle.Evidence | None, faults: int) -> list[oracle.Verdict]:
        """A workload with a scripted operator: what the run did with its answers
        (:mod:`.human`); none for a workload without one."""
        script = getattr(self.workload, "operator_script", None)
        if script is None:
            return []
        from .human import end_checks

        return end_checks(script, final, golden, faults)

    @contextlib.asynccontextmanager
    async def for_subject(self, subject: str) -> AsyncIterator[Explorer]:
        """An explorer for ``subject`` on this one's services (PostgreSQL, providers,
        zygote, HTTP session, workload): its adapter prepared on entry and closed on
        exit. Workers import ``subject`` after the fork unless the session preloaded it
        (``open_session(preload=...)``). Raises ``RegistryError`` for an unknown name."""
        other = copy.copy(self)  # the session's services (db, fault proxy, ...), shared
        other.subject, other.adapter = subject, registry.subject(subject)
        other.fault_state, other._n, other.crash_states = {}, 0, None
        await other.adapter.prepare(self.env)
        try:
            yield other
        finally:
            await other.aclose()
            if other.adapter is not self.adapter:
                await other.adapter.aclose()

    async def aclose(self) -> None:
        """Release what the fault kinds kept for the session (the db-restart PostgreSQL)."""
        for kind in faults.KINDS.values():
            if isinstance(kind, SessionResource):
                await kind.close_session(self)
