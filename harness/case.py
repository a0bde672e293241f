"""One case end to end: its workers, its fault kinds' hooks, its resume policy, its verdicts.

:func:`run_case` runs one case of a matrix on an :class:`.explorer.Explorer`'s session
(services, golden runs, quiescing, evidence); :class:`CaseRun` is the case in progress
and owns its flow:

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
7. read the final state (rehydrated) and the providers' ledgers, run the end checks
   (:meth:`CaseRun.end_verdicts`: the one place a case's end verdicts are composed).

One generic runner (:meth:`CaseRun.drive`) does this for every plan; what differs
between kinds is the kinds' (:class:`.faults.FaultKind` and its abilities), between
resume policies the policy's (:class:`.policies.Policy`). Kinds and policies call the
case's public methods (:meth:`CaseRun.drive`, :meth:`CaseRun.resume`,
:meth:`CaseRun.job`, :meth:`CaseRun.without_fault`, :meth:`CaseRun.observe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import faults, invariants, oracle, policies
from .adapter import Observation
from .checks import Check
from .errors import CaseNotApplicable, HarnessError
from .faults import CaseSetting, Drains, FaultKind, ObservesBefore, Stops
from .golden import golden_failure, trace_divergence
from .history import Trace, WorkerReport, labels_of
from .plan import Case, Fault, FaultPlan
from .pool import WorkerExit
from .verdicts import EndContext, crash_verdicts
from .verdicts import end_verdicts as composed_end_verdicts
from .worker import Job

if TYPE_CHECKING:
    from .explorer import Explorer, Options
    from .golden import GoldenRun


# the case flow's own checks (docs/checks.md)
RUN_ENDS = Check("run.ends", "resumability", "stuck run", "end",
                 "the run reached a terminal status within the resumes allowed")
RESUME_RUNS = Check("resume.runs", "resumability", "resume crashed", "end",
                    "every resume worker ended by itself, with a status, without raising")
WORKER_STUCK = Check("worker.stuck", "resumability", "worker hung after its fault", "crash",
                     "after its fault the worker passed a crash point or exited within the bound")
WORKER_WARM_PATH = Check("worker.warm_path", "resumability", "state one run left in the process", "crash",
                         "a run started in a long-lived worker that ran others behaves as in a fresh one")


class CaseHook(Protocol):
    """What a case loop may hook into its cases (:class:`.pruning.CrashStates`: crash
    states read whole, resumes shared between equal crash states)."""

    async def share_resume(self, cx: CaseRun) -> bool:
        """Before ``cx``'s first fault-free resume: True when its final state was taken
        from an equal crash state's resume (``cx.final``), so it resumes no further."""

    def finished(self, cx: CaseRun, final: oracle.Evidence) -> None:
        """``cx`` read its ``final`` state."""

    def judged(self, result: CaseResult) -> None:
        """``result``'s run was judged (before its directory is removed)."""


@dataclass
class CaseResult:
    """One case's outcome: ``outcome`` is ``pass``, ``fail`` or ``harness-error``, or
    ``flaky`` when the case failed and a replay of it on the same session did not
    (:func:`.matrix.run_case_replayed`; ``replays`` holds each replay's own result)."""

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
    #: replays of a failing case, in order (:func:`.matrix.run_case_replayed`)
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
    shells. A workload or subject imported as ``module:NAME`` from outside crashmatrix
    while ``$PYTHONPATH`` is set gets it in the line, made absolute, so the line runs
    as pasted from another directory."""
    from .builds import replay_options

    return shlex.join([*_path_prefix(case, subject), "crashmatrix", "replay", case.id, *replay_options(subject)])


def _path_prefix(case: Case, subject: str) -> list[str]:
    """``["PYTHONPATH=..."]`` when :func:`replay_command`'s line needs it, else ``[]``."""
    path = os.environ.get("PYTHONPATH")
    names = (case.id.split("/", 1)[0], subject)
    if not path or not any(re.fullmatch(r"[\w.]+:[\w.]+", n) and not n.startswith(("crashmatrix.", "defect:"))
                           for n in names):
        return []
    return ["PYTHONPATH=" + os.pathsep.join(os.path.abspath(p) for p in path.split(os.pathsep) if p)]


def read_log(path: str) -> str:
    """A worker's log (or any text file), "" when it is gone."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def tail(text: str, lines: int) -> str:
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


async def run_case(explorer: Explorer, case: Case, golden: GoldenRun, hook: CaseHook | None = None) -> CaseResult:
    """Run ``case`` end to end on ``explorer``'s session (module docstring) against its
    conversation's ``golden`` run; ``hook``: the pruning hook of the case loop running
    it (:class:`CaseHook`: crash states read whole, resumes shared). Never
    raises for a case's own failure: harness problems become ``harness-error`` results."""
    t0 = time.monotonic()
    run_id = f"cm-run-{uuid.uuid4().hex[:16]}"
    result = CaseResult(case, explorer.subject, "pass", run_id=run_id)
    if golden.broken:  # not a baseline: judging a case against it would be meaningless
        result.outcome, result.verdicts = "fail", list(golden.broken)
        result.error = (f"not run: the golden run of {case.conversation} "
                        f"{golden_failure([v.check for v in golden.broken])} ({invariants.summary(golden.broken)})")
        return result
    why = policies.policy_of(case.resume).not_applicable(explorer.adapter, explorer.options)
    for fault in case.plan.faults:  # what each fault's kind needs the adapter to declare
        why = why or faults.kind(fault.kind).not_applicable(explorer.adapter)
    if why is not None:  # the policy needs what the adapter does not declare: nothing to run
        from .coverage import NOT_APPLICABLE  # lazily: coverage reads case results

        result.outcome, result.error = NOT_APPLICABLE, f"not applicable: {why}"
        return result
    directory = explorer.workdir / run_id
    try:
        directory.mkdir(parents=True, exist_ok=True)
        await CaseRun(explorer, case, golden, run_id, result, directory, hook).run()
    except CaseNotApplicable as exc:  # what the case needed of the runtime turned out missing while it ran
        from .coverage import NOT_APPLICABLE

        result.outcome, result.error = NOT_APPLICABLE, f"not applicable: {exc}"
    except HarnessError as exc:
        result.outcome, result.error = "harness-error", str(exc)
    except Exception as exc:
        result.outcome, result.error = "harness-error", f"{type(exc).__name__}: {exc}"
    if hook is not None:
        hook.judged(result)
    result.seconds = time.monotonic() - t0
    await asyncio.to_thread(keep_or_remove, result, directory, explorer.options.keep_failed)
    return result


def keep_or_remove(result: CaseResult, directory: Path, keep: Path | None) -> None:
    """Remove a passing case's directory; keep a failing one's, with its plan and a
    note, under ``keep`` (``Options.keep_failed``; named after the case,
    :func:`artifact_name`) and name it in ``result.artifacts``. A directory that cannot
    be kept stays where it is (the session removes it) and the failure to keep it is
    the artifacts' field: ``"not kept: ..."``."""
    if result.outcome == "pass" or not directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
        return
    (directory / "plan.json").write_text(result.case.plan.to_json() + "\n")
    (directory / "case.txt").write_text(
        f"{result.case.id}\nsubject: {result.subject}\nrun: {result.run_id}\noutcome: {result.outcome}\n"
        f"replay: {result.replay}\n")
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


@dataclass
class CaseRun:
    """One case in progress: its flow (module docstring) and what the fault kinds'
    hooks and the resume policy share with it.

    ``allowance``: node -> model calls in flight when a fault landed (the end check's
    margin); ``resumes``: resume steps started so far; ``done``: the run was driven to
    its end (no worker starts after); ``kind_state``: per fault kind (and resume
    policy), what it keeps for this case (a net case's links); ``workdir``: the case's
    own directory (its workers' event files and logs); ``acknowledged``: the subject
    acknowledged the run; ``hook``: the case loop's pruning hook, if any."""

    explorer: Explorer
    case: Case
    golden: GoldenRun
    run_id: str
    result: CaseResult
    workdir: Path
    hook: CaseHook | None = None
    allowance: dict[str, int] = field(default_factory=dict)
    resumes: int = 0
    done: bool = False
    kind_state: dict[str, Any] = field(default_factory=dict)
    #: with the pruning hook: the crash state after the last faulted worker, read whole
    #: (ledgers too), and a final state taken from an equal crash state's resume
    #: (:mod:`.pruning`)
    crash: oracle.Evidence | None = None
    final: oracle.Evidence | None = None
    #: with the pruning hook: the first faulted worker's trace up to its fault
    first_trace: Trace | None = None
    #: some worker reported that the subject acknowledged the run (``RunContext.accepted``)
    acknowledged: bool = False
    #: the case's exit stack while its workers run (a policy's held process ends with it)
    stack: contextlib.AsyncExitStack | None = None
    #: the case's resume policy (:func:`.policies.policy_of` of ``case.resume``)
    policy: policies.Policy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = policies.policy_of(self.case.resume)

    async def observe(self) -> Observation:
        """The run's durable state now (the adapter's ``observe`` on the case's env)."""
        return await self.explorer.adapter.observe(self.explorer.case_env, self.run_id)

    def job(self, role: str, plan: FaultPlan = FaultPlan(), *, conversation: str | None = None,
            run_id: str | None = None, input_given: bool | None = None, **worker: Any) -> tuple[Job, str]:
        """A job of this case and its log path (:meth:`.explorer.Explorer.job`): the
        case's conversation and run (unless given), files in its directory, the input
        handed as the policy says for the next resume (:func:`.policies.hands_input`)
        unless ``input_given`` says; ``worker``: the job's further fields (a start gate,
        a clock offset)."""
        if input_given is None:
            input_given = policies.hands_input(self.explorer.adapter, self.case.resume, self.resumes, self.acknowledged)
        return self.explorer.job(role, conversation or self.case.conversation,
                                 self.run_id if run_id is None else run_id, plan, self.workdir,
                                 input_given=input_given, **worker)

    async def run(self) -> None:
        """Every plan's one path: the settings of the plan's kinds, the workers
        (:meth:`drive`), the kinds' end-of-case checks, the end checks; sets the
        result's outcome."""
        used = {f.kind for f in self.case.plan.faults}
        settings = [k for name, k in faults.KINDS.items() if name in used and isinstance(k, CaseSetting)]
        scope = policies.scope_of(self.run_id) if self.case.resume.policy == "discovery" else None
        ex = self.explorer
        async with contextlib.AsyncExitStack() as stack:
            self.stack = stack
            if scope is not None:  # the controller's reads see it too (an adapter may file runs by it)
                env = ex.case_env
                stack.enter_context(ex.scoped(scope=scope, env=dataclasses.replace(
                    env, options={**env.options, policies.SCOPE_OPTION: scope})))
            for kind in settings:  # registry order: a db-restart's server before a net case's links to it
                await stack.enter_async_context(kind.setting(self))
            await self.drive(0, "absent")
            for kind in settings:
                await kind.case_end(self)
            self.result.verdicts += self.end_verdicts(await self.final_evidence())
        self.result.outcome = "pass" if oracle.merge(self.result.verdicts) is True else "fail"

    async def drive(self, index: int, status: str) -> str:
        """Run workers ``index``, ``index + 1``, ... of the case until the run is
        terminal: worker *i* gets the plan's fault *i* (:meth:`faulted_worker`), or runs
        fault-free once the plan is used up (the policy's resume, else :meth:`resume`).
        Before each resume the adapter's ``between_crash_and_resume``; the case's resume
        policy (:mod:`.policies`) says which fault each worker gets, how a fault-free
        resume runs and how many may run (default: ``max_resumes`` beyond the plan's
        later faults, else ``run.ends`` fails). A stopping kind's hook calls it while its
        worker sleeps. Marks the case done and returns the last status."""
        plan, ex = self.case.plan.faults, self.explorer
        while not self.done:
            if index > 0:
                if status in ex.terminal_statuses():
                    break
                if self.resumes >= self.policy.bound(ex.options, plan):
                    self.result.verdicts.append(self.policy.over_bound(self, status))
                    break
                if index == len(plan) and self.hook is not None and await self.hook.share_resume(self):
                    break  # an equal crash state was resumed already: its final state stands for this one's
                self.resumes += 1
                await ex.adapter.between_crash_and_resume(ex.case_env, self.run_id)
            fault = self.policy.fault_for(plan, index)
            if fault is not None:
                status = await self.faulted_worker(index, fault)
            else:
                status, ran = await self.policy.resume(self) or await self.resume()
                if not ran:
                    break
            index += 1
        self.done = True
        return status

    async def faulted_worker(self, index: int, fault: Fault) -> str:
        """Worker ``index`` with ``fault`` armed, through its kind's hooks: the state
        before it (:class:`.faults.ObservesBefore`), its run (:meth:`_run_worker`), what
        it left (``after_worker``), that the fault fired (and for the first worker, that
        the run followed the golden run up to it), quiet
        (:meth:`.explorer.Explorer.quiesce`), the crash state and its checks
        (:meth:`_crash_state`). Returns the status the case goes on from. Raises
        :class:`HarnessError`."""
        kind = faults.kind(fault.kind)
        role = "start" if index == 0 else "resume"
        if index == 0:
            before: Observation | None = Observation(self.run_id, "absent")  # each case runs a run id of its own
        else:
            before = await self.observe() if isinstance(kind, ObservesBefore) else None
        input_given = policies.hands_input(self.explorer.adapter, self.case.resume, index, self.acknowledged)
        job, log = self.job(role, FaultPlan((fault,)), input_given=input_given)
        entry: dict[str, Any] = {"role": (kind.role if isinstance(kind, Stops) else None) or role}
        self.result.workers.append(entry)
        w = WorkerRun(index, fault, job, log, entry, before)
        await self._run_worker(w, kind)
        await kind.after_worker(self, w)
        if w.report.fired is None and self.policy.optional(self.case.plan.faults, index):
            # a repeated fault whose point this worker did not reach: it gave up, or got past it
            assert w.exit is not None
            status, ran = await self.without_fault(job, log, w.exit, w.report)
            self.done = self.done or not ran
            return status
        try:
            at_fault = self.fired(w, self.golden if index == 0 else None)
        except HarnessError as exc:
            return await self._warm_path(w, exc)
        return await self._crash_state(w, kind, at_fault)

    async def _run_worker(self, w: WorkerRun, kind: FaultKind) -> None:
        """Run faulted worker ``w`` to its end: in the process the policy holds for it
        (``same-worker``), else in the pool, with the drain grace
        (:class:`.faults.Drains`) and the kind acting while it is stopped
        (:class:`.faults.Stops`); a worker silent too long after its fault fails
        ``worker.stuck``. Sets ``w.exit`` and ``w.report``."""
        ex, job = self.explorer, w.job

        async def at_stop(pid: int) -> None:  # the worker sleeps at its fault: check it got there, then act
            assert isinstance(kind, Stops)
            w.pid = pid
            w.report = WorkerReport.from_file(job.result_path)
            self.fired(w, self.golden if w.index == 0 else None)
            await kind.at_stop(self, w)

        held = await self.policy.holds_worker(self, w.index, job)
        if held is not None:  # the policy keeps this worker's process for a later one (same-worker)
            w.exit = await held(job, w.log, ex.options.worker_timeout, at_stop if isinstance(kind, Stops) else None)
        else:
            w.exit = await ex.pool.run(
                job, w.log, timeout=ex.options.worker_timeout,
                term_grace=ex.options.term_grace if isinstance(kind, Drains) else None,
                at_stop=at_stop if isinstance(kind, Stops) else None, stuck_after=ex.options.stuck_after)
        w.entry.update(w.exit.to_dict())
        if w.exit.stuck_s is not None:  # the subject's failure, not the harness's deadline
            self.result.verdicts.append(stuck_verdict(w.fault, w.exit, ex.options))
        w.report = WorkerReport.from_file(job.result_path)
        self.acknowledged = self.acknowledged or w.report.accepted

    async def _warm_path(self, w: WorkerRun, exc: HarnessError) -> str:
        """The first worker's fault did not fire as the golden run said (``exc``): a
        harness error, unless it ran in a long-lived worker that had run other jobs of
        the matrix (the golden pair, each in a fresh worker, agreed: the process's state
        took the run elsewhere, which is the subject's failure ``worker.warm_path``).
        Then the case ends here; returns the run's status."""
        if not (w.index == 0 and w.exit is not None and w.exit.resident and w.exit.jobs_before):
            raise exc
        self.result.verdicts.append(oracle.Verdict(
            "worker.warm_path", "crash", False,
            f"started in a long-lived worker that had run {w.exit.jobs_before} other job(s) of this matrix, the "
            f"run left the golden run's path before its fault ({exc}); the golden pair, each in a fresh worker, "
            f"followed it: state those runs left in the process changed this one"))
        await self.explorer.quiesce(w.job.worker_id, live=w.exit.live)
        self.done = True
        return (await self.observe()).status

    async def _crash_state(self, w: WorkerRun, kind: FaultKind, at_fault: Trace) -> str:
        """After faulted worker ``w`` fired at ``at_fault``: the labels it reached, whether
        its fault took effect (first worker), quiet, the crash state (read whole, ledgers
        too, when the kind or the pruning hook reads them) and its checks, the model calls
        it left in flight; then the kind's ``settle``. Returns the status it gives."""
        ex, exit_, index = self.explorer, w.exit, w.index
        assert exit_ is not None
        full = w.report.trace()  # a worker that died after its fault: up to it and every point it passed since
        self.result.reached |= labels_of(full[len(at_fault):] if index == 0 else full)
        if index == 0:  # a fault that changed nothing makes the case not-run (:mod:`.coverage`)
            from .coverage import took_effect  # lazily: coverage reads case results

            ended_asleep = (w.woke is not None and w.taken_over and w.woke.observation.status in ex.terminal_statuses())
            w.entry["took_effect"] = took_effect(w.fault.kind, self.golden, w.report.end, exit_.returncode, at_fault,
                                                 taken_over=ended_asleep)
        await ex.quiesce(w.job.worker_id, database=kind.quiesce_database if isinstance(kind, Stops) else True,
                         live=exit_.live)
        ledgers = None
        if kind.reads_ledgers or self.hook is not None:  # the pruning hook compares crash states
            if index == 0 and self.hook is not None:
                self.first_trace = list(at_fault)
            crash = self.crash = await ex.evidence(self.run_id)
            obs, ledgers = crash.observation, crash.ledgers if kind.reads_ledgers else None
        else:
            obs = await self.observe()
        evidence = oracle.CrashEvidence(w.fault, at_fault, full, exit_.returncode, exit_.signal, exit_.timed_out, obs,
                                        w.before, end=w.report.end, woke=w.woke, taken_over=w.taken_over,
                                        ledgers=ledgers, acknowledged=self.acknowledged,
                                        signalled_at=w.report.signalled.at if w.report.signalled else None)
        self.result.verdicts += crash_verdicts(evidence)
        # a cancel lands after it fires (at the next await): what was in flight is what
        # the faulted worker's whole trace shows unfinished (the kind decides: a drain
        # that had time to finish its nodes leaves nothing to pay again)
        for node, n in kind.allowance(evidence).items():
            self.allowance[node] = self.allowance.get(node, 0) + n
        return await kind.settle(self, w, obs)

    async def resume(self) -> tuple[str, bool]:
        """A resume without a fault, by run id; its trace becomes the case's
        ``resume_trace``. Returns its status and whether it ran (exit 0 with an ``end``
        report; else ``resume.runs`` fails and the status is read from the store)."""
        ex = self.explorer
        job, log = self.job("resume")
        exit_ = await ex.pool.run(job, log, timeout=ex.options.worker_timeout)
        report = WorkerReport.from_file(job.result_path)
        self.result.workers.append({"role": "resume", **exit_.to_dict()})
        self.acknowledged = self.acknowledged or report.accepted
        return await self.without_fault(job, log, exit_, report)

    async def without_fault(self, job: Job, log: str, exit_: WorkerExit, report: WorkerReport) -> tuple[str, bool]:
        """A resume that ran without a fault firing (``job``, its ``log``, how it ended):
        its trace becomes the case's ``resume_trace``; its status, and whether it ran
        (else ``resume.runs`` fails)."""
        end = report.end
        if end is not None:
            self.result.resume_trace = end.trace
            self.result.reached |= labels_of(end.trace)
        if exit_.returncode != 0 or end is None:
            await self.explorer.quiesce(job.worker_id, live=exit_.live)
            detail = (end.error if end is not None else None) or f"{exit_.describe()}; {tail(read_log(log), 3)}"
            self.result.verdicts.append(oracle.Verdict("resume.runs", "end", False,
                                                       f"resume {self.resumes} failed: {detail}"))
            return (await self.observe()).status, False
        return end.status, True

    def fired(self, w: WorkerRun, golden: GoldenRun | None) -> Trace:
        """The trace up to ``w``'s fault; raises :class:`HarnessError` if the fault never
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

    async def final_evidence(self) -> oracle.Evidence:
        """The case's final state: read from its run, or an equal crash state's resume's
        when the pruning hook gave one (``final``); handed to the hook."""
        final = self.final or await self.explorer.evidence(self.run_id)
        if self.hook is not None:
            self.hook.finished(self, final)
        return final

    def end_verdicts(self, final: oracle.Evidence) -> list[oracle.Verdict]:
        """Every end verdict of the case on its ``final`` state: the resume policy's own
        (:meth:`.policies.Policy.judge`), then, unless the policy judges the run by its
        own checks only, the end checks against the golden run (identifiers renamed as
        the golden pair taught) and the invariants with the case's model-call allowance,
        the human-in-the-loop checks, and for a build pair (:mod:`.builds`)
        ``upgrade.migrated``: the run A left, resumed by B."""
        ex, golden, result = self.explorer, self.golden, self.result
        verdicts, generic = self.policy.judge(self, final)
        if not generic:
            return verdicts
        for fault in result.case.plan.faults:  # a kind that ended the case on its own (a final cancel)
            only = faults.kind(fault.kind).end_checks_only(self)
            if only is not None:
                return verdicts + [v for v in invariants.end_invariants(final, self.allowance) if v.check in only]
        return verdicts + composed_end_verdicts(EndContext(golden.evidence, final, self.allowance, result, ex.adapter,
                                                           ex.workload, golden.identifiers, ex.upgrade))
