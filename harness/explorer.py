"""The crash-point explorer: golden runs, the matrix, and one case end to end.

For each conversation the explorer runs the workload once with no fault (the golden
run) and records its crash-point trace; :func:`enumerate_cases` turns the trace into
the matrix (every recorded point x every fault kind); :meth:`Explorer.run_case` runs one
case:

1. start the run in a forked worker with the plan armed; the worker reports
   ``fired`` before the fault acts;
2. check the fault fired and that the worker's trace equals the golden trace up to the
   fault, per logical task (else: a harness error, never a pass);
3. wait until the dead worker's database sessions are gone and no request of its is
   still in flight at a provider (a COMMIT or a charge in flight can still land);
4. read the crash state and run the crash-state checks;
5. resume in new workers until the run reaches a terminal status (bounded); before
   each, the adapter's ``between_crash_and_resume`` hook (the subject's background
   jobs acting on the waiting run);
6. read the final state (rehydrated) and the providers' ledgers, run the end checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import os
import shlex
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import asyncpg

from . import oracle, registry
from .adapter import Environment, Observation
from .errors import HarnessError, PlanError
from .plan import Case, CrashPoint, Fault, FaultPlan
from .pool import WorkerExit, WorkerPool, _has_fired, _kill
from .worker import Job, read_events

TraceEntry = tuple[str, str, str, int]
_CASE_ENV: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("crashmatrix_case_env", default=None)
#: the environment the case's *workers* get when it differs from the one the controller
#: reads (a network case: links through its proxies; set by :mod:`.netfaults`)
WORKER_ENV: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("crashmatrix_worker_env", default=None)
TERMINAL = ("completed", "failed", "needs_human", "limit_exceeded")
DEFAULT_KINDS = ("kill", "term", "cancel")
DEFAULT_SOURCES = ("step", "label")


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


@dataclass
class GoldenRun:
    """A conversation run once without faults: its run id, crash-point trace (entries
    ``(source, name, task, occurrence)``), end evidence and wall seconds."""

    conversation: str
    run_id: str
    trace: list[TraceEntry]
    evidence: oracle.Evidence
    seconds: float


@dataclass
class CaseResult:
    """One case's outcome: ``outcome`` is ``pass``, ``fail`` or ``harness-error``."""

    case: Case
    subject: str
    outcome: str
    verdicts: list[oracle.Verdict] = field(default_factory=list)
    error: str | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    run_id: str = ""
    #: the trace of the first resume that ran without a fault: where double faults land
    resume_trace: list[TraceEntry] = field(default_factory=list)

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
        }


def replay_command(case: Case, subject: str) -> str:
    """The shell line that re-runs ``case`` on ``subject`` (quoted for POSIX shells)."""
    cmd = ["crashmatrix", "replay", case.id]
    if subject != "reference":
        cmd += ["--subject", subject]
    return shlex.join(cmd)


def enumerate_cases(
    workload: str, goldens: dict[str, GoldenRun], kinds: tuple[str, ...] = DEFAULT_KINDS,
    sources: tuple[str, ...] = DEFAULT_SOURCES,
) -> list[Case]:
    """The matrix: every point of every golden trace (of the given sources) x ``kinds``,
    in trace order, then (kind ``net``, labels only) the network section
    (:func:`.netfaults.net_cases`). Deterministic: the same traces give the same list."""
    if "net" in kinds:
        from .netfaults import net_cases

        rest = enumerate_cases(workload, goldens, tuple(k for k in kinds if k != "net"), sources)
        providers = tuple(registry.workload(workload).providers)
        return rest + (net_cases(workload, goldens, providers) if "label" in sources else [])
    cases = []
    for conv in sorted(goldens):
        for source, name, task, occ in goldens[conv].trace:
            if source not in sources:
                continue
            point = CrashPoint(source, name, task, occ)
            for kind in kinds:
                cases.append(Case(workload, conv, FaultPlan((Fault(kind, point),))))
    return cases


def double_fault_cases(
    results: list[CaseResult], kinds: tuple[str, ...], *, sample: int | None, seed: int
) -> list[Case]:
    """Depth 2: every single-fault case extended with a second fault at each point of
    its own resume's trace (a crash during recovery) x ``kinds``; the full product is
    about (points x kinds)^2, so ``sample`` draws that many with a seeded generator
    (reproducible: the same results, sample and seed give the same cases)."""
    import random

    pool: list[Case] = []
    for r in results:
        if len(r.case.plan.faults) != 1 or r.case.plan.faults[0].kind == "pause" or not r.resume_trace:
            continue
        for source, name, task, occ in r.resume_trace:
            if source == "await" and "await" not in {f.point.source for f in r.case.plan.faults}:
                continue
            for kind in kinds:
                if kind in ("pause", "net"):  # a net fault needs its toxic: not drawn here
                    continue
                second = Fault(kind, CrashPoint(source, name, task, occ))
                pool.append(Case(r.case.workload, r.case.conversation, FaultPlan(r.case.plan.faults + (second,))))
    if sample is not None and sample < len(pool):
        pool = random.Random(seed).sample(pool, sample)
    return pool


def shard(cases: list[Case], spec: str) -> list[Case]:
    """Keep shard ``K/N`` (1-based) of ``cases``: every N-th case from the K-th, so the
    N shards are disjoint, cover the matrix and are deterministic. Raises
    :class:`PlanError` for a malformed spec."""
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise PlanError(f"shard={spec!r} must look like K/N, e.g. 2/4") from None
    if not 1 <= k <= n:
        raise PlanError(f"shard={spec!r}: K must be between 1 and N")
    return cases[k - 1::n]


def validate_case(case: Case, goldens: dict[str, GoldenRun]) -> None:
    """Check a case (from a replay id or a plan file) against the golden traces; raises
    :class:`PlanError` naming what is wrong (conversation, point, occurrence)."""
    if case.conversation not in goldens:
        raise PlanError(f"conversation={case.conversation!r} is not one of {', '.join(sorted(goldens))}")
    trace = goldens[case.conversation].trace
    # only the first fault lands in the golden trace; later ones land in resumes
    for i, fault in enumerate(case.plan.faults[:1]):
        p = fault.point
        same_point = [e for e in trace if e[1] == p.name and e[2] == p.task]
        if not same_point:
            names = sorted({e[1] for e in trace if e[2] == p.task})
            known = (f"points of {p.task} there: {', '.join(names)}" if names else
                     f"tasks there: {', '.join(sorted({e[2] for e in trace}))}")
            raise PlanError(
                f"plan.faults[{i}].point {p.name}[{p.task}] is not in the golden trace of "
                f"{case.conversation}; {known}"
            )
        if p.occurrence > len(same_point):
            raise PlanError(
                f"plan.faults[{i}].point.occurrence={p.occurrence} is out of range: "
                f"{p.name}[{p.task}] occurs {len(same_point)} time(s) in the golden run"
            )


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


def _stopped(pid: int) -> bool:
    """True when ``pid`` is stopped (SIGSTOP): state ``T`` in /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (FileNotFoundError, IndexError):
        return False


def per_task(trace: list[TraceEntry]) -> dict[str, list[tuple[str, int]]]:
    """A trace split by logical task: ``{task: [(name, occurrence), ...]}``, tasks in
    order of first appearance (interleaving between tasks may differ between runs;
    each task's own sequence may not)."""
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for _, name, task, occ in trace:
        out[task].append((name, occ))
    return out


def first_departures(reference: dict[str, list[tuple[str, int]]], trace: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
    """For each logical task of ``trace`` (both split by :func:`per_task`): the index,
    among that task's points, of the first one that differs from ``reference``'s (or
    that ``reference`` does not have); the task's length when it follows ``reference``
    throughout."""
    out = {}
    for task, seq in trace.items():
        theirs = reference.get(task, [])
        out[task] = next((i for i, item in enumerate(seq) if i >= len(theirs) or theirs[i] != item), len(seq))
    return out


def trace_divergence(golden: list[TraceEntry], faulted: list[TraceEntry]) -> str | None:
    """Where ``faulted`` (a trace up to a fault) stops being a prefix of ``golden``,
    compared per logical task (:func:`first_departures`); None if it is."""
    g, mine = per_task(golden), per_task(faulted)
    for task, i in first_departures(g, mine).items():
        if i < len(mine[task]):
            ref, item = g.get(task, []), mine[task][i]
            want = f"{ref[i][0]}#{ref[i][1]}" if i < len(ref) else "nothing"
            return f"task {task}: point {i + 1} is {item[0]}#{item[1]}, golden has {want}"
    return None


class CaseHooks(Protocol):
    """What a fault kind adds to :meth:`Explorer._run_fault_case`, the one path of a case
    whose first fault is kill, term, cancel or net (:class:`.netfaults.NetCase`: the
    case's link proxies). The others add nothing (:class:`_NoHooks`)."""

    async def started(self, fault: Fault, events: list[dict[str, Any]], worker: dict[str, Any]) -> None:
        """The faulted worker ended with ``events``; ``worker`` is its entry in the
        result (add fields to it). Raises :class:`HarnessError` if the fault did not land."""

    def crash_verdicts(self, observation: Any) -> list[oracle.Verdict]:
        """Crash checks of the kind, on the state right after the faulted worker."""

    async def resumed(self) -> None:
        """After the last resume, before the end checks; raises :class:`HarnessError`
        if the harness left something behind."""


class _NoHooks:
    async def started(self, fault: Fault, events: list[dict[str, Any]], worker: dict[str, Any]) -> None:
        return None

    def crash_verdicts(self, observation: Any) -> list[oracle.Verdict]:
        return []

    async def resumed(self) -> None:
        return None


_NO_HOOKS = _NoHooks()


class Explorer:
    """Runs golden runs and cases for one subject and workload on live services."""

    def __init__(
        self, env: Environment, pool: WorkerPool, subject: str, workload: str, workdir: Path,
        http: aiohttp.ClientSession, options: Options | None = None,
    ) -> None:
        self.env = env
        self.pool = pool
        self.subject = subject
        self.workload_name = workload
        self.workload = registry.workload(workload)
        self.adapter = registry.subject(subject)
        self.workdir = workdir
        self.http = http
        self.options = options or Options()
        self.db: asyncpg.Pool | None = None  # the controller's own connections (session)
        #: starts a PostgreSQL that db-restart cases may stop (set by the session); None
        #: when the user gave a DSN: the harness cannot restart someone else's server
        self.start_restartable_pg: Any = None
        self._restart_pg: Any = None
        self._restart_lock = asyncio.Lock()
        self._n = 0
        #: the session's fault proxy (:class:`.netfaults.FaultProxyService`), for net faults
        self.fault_proxy: Any = None

    # -- plumbing -----------------------------------------------------------------------

    def terminal_statuses(self) -> tuple[str, ...]:
        """Statuses after which no resume starts: ``needs_human`` is one, unless the
        workload brings its own human (``workload.operator``: the adapter hands the
        run to it and goes on, so a run left waiting by a fault is resumed)."""
        if getattr(self.workload, "operator", None) is None:
            return TERMINAL
        return tuple(s for s in TERMINAL if s != "needs_human")

    @property
    def case_env(self) -> Environment:
        """The environment of the case running in this task: the shared one, or for a
        ``db-restart`` case the PostgreSQL of its own."""
        return _CASE_ENV.get() or self.env

    def _job(self, role: str, conversation: str, run_id: str, plan: FaultPlan) -> tuple[Job, str]:
        self._n += 1
        worker_id = f"cmw-{self._n}-{uuid.uuid4().hex[:8]}"
        base = self.workdir / worker_id
        env = WORKER_ENV.get() or self.case_env
        job = Job(role, self.subject, self.workload_name, conversation, run_id, worker_id, env, plan,
                  f"{base}.jsonl", self.options.await_points)
        return job, f"{base}.log"

    async def _worker(self, job: Job, log: str, term: bool = False) -> tuple[WorkerExit, list[dict[str, Any]]]:
        exit_ = await self.pool.run(job, log, timeout=self.options.worker_timeout,
                                    term_grace=self.options.term_grace if term else None)
        return exit_, read_events(job.result_path)

    async def quiesce(self, worker_id: str, *, database: bool = True) -> None:
        """Wait until ``worker_id`` has no database session (unless ``database`` is
        False) and no provider request in flight. Raises :class:`HarnessError` after
        ``quiesce_timeout``."""
        from crashmatrix.scenarios.providers import clients

        deadline = time.monotonic() + self.options.quiesce_timeout
        assert self.db is not None
        while database and await self.db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", worker_id
        ):
            if time.monotonic() > deadline:
                raise HarnessError(f"database sessions of dead worker {worker_id} did not go away in {self.options.quiesce_timeout} s")
            await asyncio.sleep(0.005)
        for kind in self.workload.providers:
            while await clients.inflight(self.http, self.case_env.providers[kind], worker_id):
                if time.monotonic() > deadline:
                    raise HarnessError(f"requests of dead worker {worker_id} still in flight at {kind}")
                await asyncio.sleep(0.01)

    async def evidence(self, run_id: str) -> oracle.Evidence:
        """The run's durable state (rehydrated), its provider ledgers and model bills."""
        from crashmatrix.scenarios.providers import clients

        obs = await self.adapter.observe(self.case_env, run_id)
        ledgers = {}
        model_calls: dict[str, int] = {}
        for kind in self.workload.providers:
            rows = await clients.read_ledger(self.http, self.case_env.providers[kind], run_id)
            if kind == "model":
                for row in rows:
                    model_calls[row["node_id"]] = model_calls.get(row["node_id"], 0) + 1
            else:
                ledgers[kind] = rows
        return oracle.Evidence(obs, ledgers, model_calls)

    @staticmethod
    def _end(events: list[dict[str, Any]]) -> dict[str, Any] | None:
        ends = [e for e in events if e.get("event") == "end"]
        return ends[-1] if ends else None

    # -- golden run ---------------------------------------------------------------------

    async def golden(self, conversation: str) -> GoldenRun:
        """Run ``conversation`` once without faults; raises :class:`HarnessError` if it
        does not complete."""
        t0 = time.monotonic()
        run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
        job, log = self._job("start", conversation, run_id, FaultPlan())
        exit_, events = await self._worker(job, log)
        end = self._end(events)
        if end is None or end.get("status") != "completed" or exit_.returncode != 0:
            detail = (end or {}).get("error") or (end or {}).get("status") or exit_.describe()
            tail = _tail((end or {}).get("traceback") or _read(log), 12)
            raise HarnessError(
                f"golden run of {self.workload_name}/{conversation} on {self.subject} did not complete: {detail}"
                + (f"\n{tail}" if tail else ""))
        trace = [tuple(e) for e in end["trace"]]
        return GoldenRun(conversation, run_id, trace, await self.evidence(run_id), time.monotonic() - t0)  # type: ignore[arg-type]

    # -- one case -----------------------------------------------------------------------

    async def run_case(self, case: Case, golden: GoldenRun) -> CaseResult:
        """Run ``case`` end to end (module docstring); never raises for a case's own
        failure: harness problems become ``harness-error`` results."""
        t0 = time.monotonic()
        run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
        result = CaseResult(case, self.subject, "pass", run_id=run_id)
        try:
            await self._run_case(case, golden, run_id, result)
        except HarnessError as exc:
            result.outcome, result.error = "harness-error", str(exc)
        except Exception as exc:
            result.outcome, result.error = "harness-error", f"{type(exc).__name__}: {exc}"
        result.seconds = time.monotonic() - t0
        return result

    def _fired(self, fault: Fault, events: list[dict[str, Any]], how_ended: str, golden: GoldenRun) -> list[TraceEntry]:
        """The trace up to the fault; raises :class:`HarnessError` if the fault never
        fired or the run diverged from the golden run before it."""
        fired = [e for e in events if e.get("event") == "fired"]
        if not fired:
            end = self._end(events)
            how = f"the run ended {end['status']!r}" if end else f"the worker ended ({how_ended}) without a report"
            raise HarnessError(f"fault {fault.label()} never fired: its point was not reached; {how}")
        at_fault = [tuple(e) for e in fired[0]["trace"]]
        divergence = trace_divergence(golden.trace, at_fault)  # type: ignore[arg-type]
        if divergence:
            raise HarnessError(f"the faulted run diverged from the golden run before the fault: {divergence}")
        return at_fault  # type: ignore[return-value]

    async def _resume_until_terminal(
        self, case: Case, run_id: str, result: CaseResult, status: str,
        later_faults: tuple[Fault, ...] = (), allowance: dict[str, int] | None = None,
    ) -> str:
        """Resume in new workers until the run is terminal (at most ``max_resumes``).

        ``later_faults[i]`` is armed in the i-th resume worker (a double fault: a crash
        during recovery); its crash state is checked like the first fault's, and what it
        left in flight is added to ``allowance``."""
        resumes = 0
        while status not in self.terminal_statuses():
            if resumes >= self.options.max_resumes + len(later_faults):
                result.verdicts.append(oracle.Verdict(
                    "run.ends", "end", False, f"the run did not end after {resumes} resume(s); last status {status!r}"))
                break
            fault = later_faults[resumes] if resumes < len(later_faults) else None
            resumes += 1
            await self.adapter.between_crash_and_resume(self.case_env, run_id)
            plan = FaultPlan((fault,)) if fault else FaultPlan()
            # term.drained asks whether a worker drained before it took the run left it as it was
            before = await self.adapter.observe(self.case_env, run_id) if fault is not None and fault.kind == "term" else None
            rjob, rlog = self._job("resume", case.conversation, run_id, plan)
            rexit, revents = await self._worker(rjob, rlog, term=bool(fault and fault.kind == "term"))
            result.workers.append({"role": "resume", **rexit.to_dict()})
            rend = self._end(revents)
            if fault is not None:
                fired = [e for e in revents if e.get("event") == "fired"]
                if not fired:
                    raise HarnessError(f"fault {fault.label()} (in resume {resumes}) never fired: its point was not reached; "
                                       f"the resume ended {(rend or {}).get('status', rexit.describe())!r}")
                at_fault = [tuple(e) for e in fired[0]["trace"]]
                full = [tuple(e) for e in rend["trace"]] if rend else at_fault
                await self.quiesce(rjob.worker_id)
                obs = await self.adapter.observe(self.case_env, run_id)
                result.verdicts += oracle.crash_checks(oracle.CrashEvidence(
                    fault, at_fault, full, rexit.returncode, rexit.signal, rexit.timed_out, obs, before))  # type: ignore[arg-type]
                if allowance is not None:
                    for node, n in oracle.in_flight_model_calls(full).items():  # type: ignore[arg-type]
                        allowance[node] = allowance.get(node, 0) + n
                status = obs.status
                continue
            if rend is not None:
                result.resume_trace = [tuple(e) for e in rend["trace"]]  # type: ignore[misc]
            if rexit.returncode != 0 or rend is None:
                await self.quiesce(rjob.worker_id)
                detail = (rend or {}).get("error") or f"{rexit.describe()}; {_tail(_read(rlog), 3)}"
                result.verdicts.append(oracle.Verdict("resume.runs", "end", False, f"resume {resumes} failed: {detail}"))
                status = (await self.adapter.observe(self.case_env, run_id)).status
                break
            status = rend["status"]
        return status

    async def _run_case(self, case: Case, golden: GoldenRun, run_id: str, result: CaseResult) -> None:
        fault, later = case.plan.faults[0], case.plan.faults[1:]
        if any(f.kind in ("pause", "db-restart") for f in later):
            raise HarnessError("pause and db-restart can only be the first fault of a plan")
        if fault.kind == "net":
            from .netfaults import net_case

            async with net_case(self, case, run_id) as hooks:
                await self._run_fault_case(case, golden, run_id, result, hooks)
            return
        if fault.kind in ("pause", "db-restart"):
            if later:
                raise HarnessError(f"a {fault.kind} plan holds exactly one fault")
            if fault.kind == "pause":
                await self._run_pause_case(case, golden, run_id, result, fault)
            else:
                await self._run_db_restart_case(case, golden, run_id, result, fault)
            return
        await self._run_fault_case(case, golden, run_id, result, _NO_HOOKS)

    async def _run_fault_case(self, case: Case, golden: GoldenRun, run_id: str, result: CaseResult, hooks: CaseHooks) -> None:
        """A case whose first fault is kill, term, cancel or net: start the run with it
        armed, check that it fired and that the trace matched the golden run up to it,
        check the crash state, resume until terminal (later faults armed in resumes), end
        checks; ``hooks`` add what the fault kind needs (:class:`CaseHooks`)."""
        fault, later = case.plan.faults[0], case.plan.faults[1:]
        job, log = self._job("start", case.conversation, run_id, FaultPlan((fault,)))
        exit_, events = await self._worker(job, log, term=fault.kind == "term")
        worker = {"role": "start", **exit_.to_dict()}
        result.workers.append(worker)
        await hooks.started(fault, events, worker)
        at_fault = self._fired(fault, events, exit_.describe(), golden)
        end = self._end(events)
        full = [tuple(e) for e in end["trace"]] if end else at_fault
        if fault.kind == "kill" and exit_.signal != 9:
            raise HarnessError(f"kill fault fired but the worker ended otherwise ({exit_.describe()})")
        await self.quiesce(job.worker_id)
        crash_obs = await self.adapter.observe(self.case_env, run_id)
        result.verdicts += oracle.crash_checks(oracle.CrashEvidence(
            fault, at_fault, full, exit_.returncode, exit_.signal, exit_.timed_out, crash_obs,  # type: ignore[arg-type]
            before=Observation(run_id, "absent")))  # each case runs a run id of its own
        result.verdicts += hooks.crash_verdicts(crash_obs)
        # a cancel or term lands after it fires (at the next await, at the drain): what
        # was in flight is what the faulted worker's whole trace shows unfinished
        allowance = oracle.in_flight_model_calls(full)  # type: ignore[arg-type]
        await self._resume_until_terminal(case, run_id, result, crash_obs.status, later, allowance)
        await hooks.resumed()
        await self._finish(result, golden, run_id, allowance)

    async def _finish(self, result: CaseResult, golden: GoldenRun, run_id: str, allowance: dict[str, int]) -> None:
        """The end checks against the golden run, and the case's outcome."""
        final = await self.evidence(run_id)
        result.verdicts += oracle.end_checks(golden.evidence, final, allowance)
        result.outcome = "pass" if oracle.merge(result.verdicts) is True else "fail"

    async def _start_until_stopped(
        self, case: Case, run_id: str, fault: Fault, golden: GoldenRun
    ) -> tuple[Job, int, asyncio.Future[dict[str, Any]], float, list[TraceEntry]]:
        """Start the run with ``fault`` armed and wait until the worker reported firing
        and stopped itself (pause, db-restart); returns the job, pid, exit future, start
        time and the trace up to the fault. Raises :class:`HarnessError` otherwise."""
        job, log = self._job("start", case.conversation, run_id, case.plan)
        t0 = time.monotonic()
        pid, exited = await self.pool.spawn(job, log)
        while not exited.done():
            if _has_fired(job.result_path) and _stopped(pid):
                break
            if time.monotonic() - t0 > self.options.worker_timeout:
                _kill(pid)
                break
            await asyncio.sleep(0.005)
        if exited.done():
            raise HarnessError(self._fired_error(fault, job, exited.result()))
        at_fault = self._fired(fault, read_events(job.result_path), "stopped", golden)
        return job, pid, exited, t0, at_fault

    async def _run_pause_case(self, case: Case, golden: GoldenRun, run_id: str, result: CaseResult, fault: Fault) -> None:
        """``pause``: the worker SIGSTOPs itself at the point; a new worker steals the
        lease and resumes the run to its end; then the zombie gets SIGCONT. Whatever it
        does next must be refused: the durable state may not change after it wakes."""
        job, pid, exited, t0, at_fault = await self._start_until_stopped(case, run_id, fault, golden)
        await self._resume_until_terminal(case, run_id, result, "paused")
        await self.quiesce(job.worker_id, database=False)  # the zombie's session stays
        before = await self.adapter.observe(self.case_env, run_id)
        os.kill(pid, signal.SIGCONT)
        try:
            event = await asyncio.wait_for(asyncio.shield(exited), self.options.worker_timeout)
        except asyncio.TimeoutError:
            _kill(pid)
            event = await exited
        zombie = WorkerExit(pid, event["returncode"], event["signal"], time.monotonic() - t0, False, event.get("cpu_ms"))
        result.workers.insert(0, {"role": "zombie", **zombie.to_dict()})
        end = self._end(read_events(job.result_path))
        full = [tuple(e) for e in end["trace"]] if end else at_fault
        await self.quiesce(job.worker_id)
        after = await self.adapter.observe(self.case_env, run_id)
        result.verdicts.append(oracle.check_zombie_fenced(before, after, end))
        result.verdicts += [v for v in oracle.crash_checks(oracle.CrashEvidence(
            fault, at_fault, full, zombie.returncode, zombie.signal, False, after)) if v.phase == "crash"]  # type: ignore[arg-type]
        allowance = oracle.in_flight_model_calls(full)  # type: ignore[arg-type]
        await self._finish(result, golden, run_id, allowance)

    async def _run_db_restart_case(self, case: Case, golden: GoldenRun, run_id: str, result: CaseResult, fault: Fault) -> None:
        """``db-restart``: at the point the worker stops itself (SIGSTOP); PostgreSQL is
        stopped in immediate mode (a crash) and started again; the worker continues on
        a dead connection (it must reconnect or die) and the run is resumed as usual.
        These cases run one at a time on a PostgreSQL of their own."""
        if self.start_restartable_pg is None:
            raise HarnessError("db-restart is unavailable: PostgreSQL comes from a DSN the harness cannot restart")
        async with self._restart_lock:
            if self._restart_pg is None:
                self._restart_pg = await asyncio.to_thread(self.start_restartable_pg)
                env = dataclasses.replace(self.env, dsn=self._restart_pg.dsn)
                await self.adapter.prepare(env)
            token = _CASE_ENV.set(dataclasses.replace(self.env, dsn=self._restart_pg.dsn))
            try:
                await self._run_stopped_case(case, golden, run_id, result, fault)
            finally:
                _CASE_ENV.reset(token)

    async def _run_stopped_case(self, case: Case, golden: GoldenRun, run_id: str, result: CaseResult, fault: Fault) -> None:
        job, pid, exited, t0, at_fault = await self._start_until_stopped(case, run_id, fault, golden)
        pg = self._restart_pg
        await asyncio.to_thread(pg.stop_immediate)
        await asyncio.to_thread(pg.start)
        os.kill(pid, signal.SIGCONT)
        try:
            event = await asyncio.wait_for(asyncio.shield(exited), self.options.worker_timeout)
        except asyncio.TimeoutError:
            _kill(pid)
            event = await exited
        exit_ = WorkerExit(pid, event["returncode"], event["signal"], time.monotonic() - t0, False, event.get("cpu_ms"))
        result.workers.append({"role": "start", **exit_.to_dict()})
        end = self._end(read_events(job.result_path))
        full = [tuple(e) for e in end["trace"]] if end else at_fault
        await self.quiesce(job.worker_id, database=False)
        crash_obs = await self.adapter.observe(self.case_env, run_id)
        result.verdicts += oracle.crash_checks(oracle.CrashEvidence(
            fault, at_fault, full, exit_.returncode, exit_.signal, False, crash_obs))  # type: ignore[arg-type]
        allowance = oracle.in_flight_model_calls(full)  # type: ignore[arg-type]
        status = crash_obs.status
        if status == "running":  # the worker died without a word: like any crash
            status = "interrupted"
        await self._resume_until_terminal(case, run_id, result, status, (), allowance)
        await self._finish(result, golden, run_id, allowance)

    @contextlib.asynccontextmanager
    async def for_subject(self, subject: str) -> AsyncIterator[Explorer]:
        """An explorer for ``subject`` on this one's services (PostgreSQL, providers,
        zygote, HTTP session, workload): its adapter prepared on entry and closed on
        exit. Workers import ``subject`` after the fork unless the session preloaded it
        (``open_session(preload=...)``). Raises ``RegistryError`` for an unknown name."""
        other = copy.copy(self)  # the session's services (db, fault proxy, ...), shared
        other.subject, other.adapter = subject, registry.subject(subject)
        other._restart_pg, other._restart_lock, other._n = None, asyncio.Lock(), 0
        await other.adapter.prepare(self.env)
        try:
            yield other
        finally:
            await other.aclose()
            if other.adapter is not self.adapter:
                await other.adapter.aclose()

    async def aclose(self) -> None:
        """Stop the db-restart PostgreSQL, if one was started."""
        if self._restart_pg is not None:
            await self.adapter.aclose()
            await asyncio.to_thread(self._restart_pg.close)
            self._restart_pg = None

    def _fired_error(self, fault: Fault, job: Job, event: dict[str, Any]) -> str:
        end = self._end(read_events(job.result_path))
        how = f"the run ended {end['status']!r}" if end else f"the worker ended (exit {event['returncode']}, signal {event['signal']})"
        return f"fault {fault.label()} never fired: its point was not reached; {how}"
