"""The crash-point explorer: one session's services, golden runs and case plumbing.

An :class:`Explorer` holds what the cases of one subject and workload share: the
environment (PostgreSQL, providers), the worker pool, the HTTP session, the fault
proxy, the adapter (one instance per PostgreSQL server), the options. For each
conversation it runs the workload once with no fault, twice at once (the golden run
and its twin: :meth:`Explorer.golden`) and records its crash-point trace;
:func:`.enumeration.enumerate_cases` turns the trace into the matrix (every recorded
point x every fault kind). A case runs through :meth:`Explorer.run_case`, which hands
it to :mod:`.case` (the case's own flow: its workers, its fault kinds' hooks, its
resume policy, its verdicts); the case calls back only the session's services here:
:meth:`Explorer.job` (a worker's job), :meth:`Explorer.quiesce`,
:meth:`Explorer.evidence`, :meth:`Explorer.scoped` (a case's own environment, set by
a fault kind's setting), :meth:`Explorer.terminal_statuses`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import asyncpg

from . import faults, invariants, oracle, registry
from .adapter import Environment
from .errors import CrashmatrixError, GoldenRunRefused, HarnessError
from .case import CaseHook, CaseResult, read_log, run_case, tail
from .faults import SessionResource
from .golden import GoldenRun, determinism_gate, provider_failure
from .history import End, WorkerReport
from .iostate import GoldenIo
from .plan import Case, FaultPlan
from .pool import STUCK_AFTER_S, WorkerExit, WorkerPool
from .worker import Job

if TYPE_CHECKING:
    from .netfaults import FaultProxyService
    from .services.postgres import PostgresService
    from .services.providers.ledger import LedgerFile

_CASE_ENV: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("crashmatrix_case_env", default=None)
#: the environment the case's *workers* get when it differs from the one the controller
#: reads (a network case: links through its proxies; set by :mod:`.faults.net`)
_WORKER_ENV: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("crashmatrix_worker_env", default=None)
#: the controller's pool on the case's PostgreSQL when it is not the session's (a
#: db-restart case's server of its own; set by :mod:`.faults.db_restart`)
_CASE_DB: contextvars.ContextVar[asyncpg.Pool | None] = contextvars.ContextVar("crashmatrix_case_db", default=None)
#: the recovery scope the case's workers file its run under (a discovery case's)
_CASE_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar("crashmatrix_case_scope", default=None)
#: the controller's adapter instance for the case's PostgreSQL when it is not the
#: session's (a db-restart case's server: an instance of its own, prepared on it)
_CASE_ADAPTER: contextvars.ContextVar[Any] = contextvars.ContextVar("crashmatrix_case_adapter", default=None)
TERMINAL = ("completed", "failed", "needs_human", "limit_exceeded")
RECURRING_BOUND = 12
"""Resumes a ``recurring`` case runs before the harness stops it (its own bound, reported
as such: ``recurring.bounded`` fails; :mod:`.policies`)."""


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
    recurring_bound: int = RECURRING_BOUND
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


class Explorer:
    """Runs golden runs and cases for one subject and workload on live services."""

    def __init__(
        self, env: Environment, pool: WorkerPool, subject: str, workload: str, workdir: Path,
        http: aiohttp.ClientSession, options: Options | None = None, *, adapter: Any = None,
        upgrade: Any = None, fault_proxy: FaultProxyService | None = None,
        start_restartable_pg: Callable[[], PostgresService] | None = None,
        ledgers: Mapping[str, LedgerFile] | None = None,
    ) -> None:
        self.env = env
        self.pool = pool
        self.subject = subject
        self.workload_name = workload
        self.workload = registry.workload(workload)
        #: the controller's adapter; a build pair's is a :class:`.builds.BuildAdapter`
        #: (``subject`` then names the pair: :mod:`.builds`)
        self._adapter = adapter if adapter is not None else registry.subject(subject)
        #: the build pair of a two-build session (:class:`.builds.Upgrade`; typed Any: builds
        #: imports the case flow, which would put it on the explorer's import circle):
        #: resumes run build B
        self.upgrade = upgrade
        self.workdir = workdir
        self.http = http
        self.options = options or Options()
        self.db: asyncpg.Pool | None = None  # the controller's own connections (session)
        #: starts a PostgreSQL that db-restart cases may stop (set by the session); None
        #: when the user gave a DSN: the harness cannot restart someone else's server
        self.start_restartable_pg = start_restartable_pg
        #: per fault kind, what it keeps for the session (:mod:`.faults.db_restart`'s
        #: server); released by :meth:`aclose`
        self.fault_state: dict[str, Any] = {}
        self._n = 0
        #: the session's fault proxy (:class:`.netfaults.FaultProxyService`), for net faults
        self.fault_proxy = fault_proxy
        #: provider kind -> its ledger file, read directly (:meth:`evidence`); a provider
        #: without one is read over HTTP (``GET /ledger``)
        self.ledgers: Mapping[str, LedgerFile] = ledgers or {}

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

    @property
    def worker_env(self) -> Environment:
        """The environment the case running in this task gives its workers: its links
        through a fault proxy when a kind's setting made some (:meth:`scoped`), else
        :attr:`case_env`."""
        return _WORKER_ENV.get() or self.case_env

    @contextlib.contextmanager
    def scoped(self, *, env: Environment | None = None, worker_env: Environment | None = None,
               db: asyncpg.Pool | None = None, adapter: Any = None, scope: str | None = None) -> Iterator[None]:
        """Within the block, in this task: the case's environment (what the controller
        reads: :attr:`case_env`), its workers' environment (links through a proxy), the
        controller's pool on the case's PostgreSQL (:meth:`quiesce`) and the adapter
        instance prepared on that server (:attr:`adapter`); the recovery ``scope`` the
        case's jobs file its run under (a discovery case's). A fault kind's setting uses
        it (:class:`.faults.CaseSetting`)."""
        pairs: tuple[tuple[contextvars.ContextVar[Any], Any], ...] = (
            (_CASE_ENV, env), (_WORKER_ENV, worker_env), (_CASE_DB, db), (_CASE_ADAPTER, adapter), (_CASE_SCOPE, scope))
        tokens = [(var, var.set(value)) for var, value in pairs if value is not None]
        try:
            yield
        finally:
            for var, token in reversed(tokens):
                var.reset(token)

    def job(self, role: str, conversation: str, run_id: str, plan: FaultPlan, directory: Path, *,
            input_given: bool = True, clock_offset_s: float = 0.0, start_gate: str = "",
            gate_parties: int = 0, hold_at: tuple[str, str] | None = None, lead: bool = False
            ) -> tuple[Job, str]:
        """A worker's job (``role``: ``start``, ``resume``, ``recover``) for run ``run_id``
        of ``conversation`` with ``plan`` armed, and its log path; its event file and log
        go to ``directory``. The worker id is new; the job runs the build of its role
        (a build pair's), in the environment of the case running in this task (its
        workers' links), filed under the case's recovery scope."""
        self._n += 1
        worker_id = f"cmw-{self._n}-{uuid.uuid4().hex[:8]}"
        base = directory / worker_id
        env = self.worker_env
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

    async def run_worker(self, job: Job, log: str) -> tuple[WorkerExit, WorkerReport]:
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
        """The run's durable state (rehydrated), its provider ledgers and model bills
        (each ledger read from its file when the session gave it: :attr:`ledgers`)."""
        from .services.providers import clients

        obs = await self.adapter.observe(self.case_env, run_id)
        ledgers = {}
        model_calls: dict[str, int] = {}
        model_rows: list[dict[str, Any]] = []
        for kind in self.workload.providers:
            file = self.ledgers.get(kind)
            rows = (file.rows(run_id) if file is not None
                    else await clients.read_ledger(self.http, self.case_env.providers[kind], run_id))
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
        first.verdicts = invariants.end_invariants(first.evidence) + self.human_checks(first.evidence, None, 0)
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
            file = self.ledgers.get(kind)
            for row in (file.refusals(run_id) if file is not None
                        else await clients.read_refusals(self.http, self.case_env.providers[kind], run_id)):
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
        job, log = self.job("start", conversation, run_id, FaultPlan(), self.workdir)
        job = dataclasses.replace(job, record_io=True)
        exit_, report = await self.run_worker(job, log)
        end = report.end
        if end is None and exit_.timed_out:  # the subject never returned: its own failure, as a hang in production
            return run_id, End("timed-out", report.trace()), time.monotonic() - t0, (
                f"it did not return within the worker deadline ({exit_.describe()})")
        if end is None:
            last = tail(read_log(log), 12)
            raise HarnessError(
                f"golden run of {self.workload_name}/{conversation} on {self.subject} did not complete: "
                f"{exit_.describe()}" + (f"\n{last}" if last else ""))
        why = None
        if end.status != "completed" or exit_.returncode != 0:
            why = f"it raised {end.error}" if end.error else f"it ended {end.status!r}"
            last = tail(end.traceback or "", 6)
            why += f"\n{last}" if last else ""
        return run_id, end, time.monotonic() - t0, why

    # -- one case -----------------------------------------------------------------------

    async def run_case(self, case: Case, golden: GoldenRun, hook: CaseHook | None = None) -> CaseResult:
        """Run ``case`` end to end on this session (:func:`.case.run_case`; ``hook``: a
        case loop's pruning hook); never raises for a case's own failure: harness
        problems become ``harness-error`` results."""
        return await run_case(self, case, golden, hook)

    def human_checks(self, final: oracle.Evidence, golden: oracle.Evidence | None, faults: int) -> list[oracle.Verdict]:
        """A workload with a scripted operator: what the run did with its answers
        (:mod:`.human`), after ``faults`` faults; none for a workload without one."""
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
        other.fault_state, other._n = {}, 0
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
