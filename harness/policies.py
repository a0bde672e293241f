"""Resume policies: how the workers after a fault resume a run, as production does it.

The default (the harness owns the resume) hands every resuming worker the
run id and, unless the adapter says its runtime reads it from its own store, the run's
input, and runs resumers one after another up to ``Options.max_resumes``. Production
does none of that, and recovery bugs live there. Each policy below changes one thing;
a case carries one (:class:`.plan.Resume`, the last component of its id; ``crashmatrix
run --resume``), and the case runner (:meth:`.case.CaseRun.drive`) asks it:

- which fault worker *i* gets (:meth:`Policy.fault_for`: the plan's, or for
  ``recurring`` its last fault again in every later worker);
- how many resumes may run before the case is stopped, and what that means
  (:meth:`Policy.bound`, :meth:`Policy.over_bound`);
- how a fault-free resume runs (:meth:`Policy.resume`: one worker by id, the case's
  own :meth:`.case.CaseRun.resume`;
  ``concurrent``: N workers at once, held at a start gate until all are forked,
  :func:`.worker.wait_at_gate`, or, where the adapter declares a ``recovery_point``,
  at that point of the runtime's recovery sweep until all have read what to recover
  (:class:`.worker.PointGate`); ``discovery``: a worker given no run id that runs
  the runtime's own recovery, :meth:`.adapter.Adapter.recover`; ``warm-worker``: the
  first resume in a long-lived worker that has just run another run of the same
  conversation from its start to its end, :mod:`.resident`; ``same-worker``: the first
  resume in the very process a cancellation or network fault struck, once its job
  ended, :meth:`Policy.holds_worker`);
- whether a worker is handed the input (:func:`hands_input`: ``input-once`` only until
  the subject acknowledged the run, ``redelivery`` always, else the adapter's
  ``expects_redelivery``);
- how the case is judged at its end (:meth:`Policy.judge`: the policy's own end
  verdicts, and whether the end checks against the golden run apply too; ``recurring``
  judges a run the runtime gave up on by its own checks instead).

Checks (phase ``resume``, beside the crash and end checks of docs/design.md):

- ``concurrent.one_terminal_status``: the resumers that ended the run agree on its
  status, and the store holds it;
- ``concurrent.loser_fenced``: at most one resumer ran a step and was not refused (the
  others were refused by the runtime, fenced, or found nothing to do), unless every one
  that ran steps then stopped at the run's wait for a person (a hand-over);
- ``concurrent.log_intact``: the log after the round is a clean prefix (no node twice,
  no gap: no interleaved writes);
- ``concurrent.effects_once`` / ``recurring.effects_once``: no provider holds more rows
  of an operation than the golden run made (nothing applied twice across the workers);
  (``model.calls_billed``, at the end, allows each concurrent resumer's model calls whose
  record it did not append, as it allows a crashed worker's: a loser refused mid-node);
- ``recurring.bounded``: the runtime itself ended the crash loop, in the terminal status
  its adapter declares (``Adapter.crash_loop_status``), or finished the run; a case the
  harness had to stop (``Options.recurring_bound`` resumes) fails it;
- ``other_executor.recovered`` (``other-executor``): a live worker of another identity
  ran the runtime's recovery of the dead worker's runs, and the run ended by it;
- ``discovery.found``: the runtime's own recovery, given no run id and its clock advanced
  past its declared lease (``Adapter.lease_seconds``), found the abandoned run and
  finished it.

A policy that needs what the adapter does not declare makes its cases
``not-applicable`` with the reason, before any worker runs
(:meth:`Policy.not_applicable`): ``discovery`` without ``recover()``, ``recurring``
without ``crash_loop_status`` or with a ``recovery_attempts_limit`` at or above
``Options.recurring_bound``, ``input-once`` where the adapter ``expects_redelivery``,
``warm-worker`` and ``same-worker`` without ``long_lived_workers`` (or with
``--fresh-workers``).
- ``warm.worker``: the first resume ran in the process that had just run the workload's
  next conversation, then the same one, each to a terminal status ("not
  applicable", with the reason, when the adapter does not declare ``long_lived_workers``,
  with ``--fresh-workers``, or when such a run did not end); what the process-wide
  state of those runs does to the next is then judged by the end checks, as in any case.
- ``same.worker``: the first resume ran in the process the fault struck ("not
  applicable", with the reason, after a fault that ends the process or where every job
  forks); what the runtime kept of the run in memory is then judged by the end checks.

``run.acknowledged_durable`` (a run the subject acknowledged exists after any crash) is
a crash check of every case: :func:`.oracle.check_acknowledged_run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import zlib
from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar

from . import human, oracle
from .adapter import FENCED, Adapter, Observation
from .checks import Check
from .history import Trace, WorkerReport, labels_of
from .plan import Fault, Resume

if TYPE_CHECKING:
    from .case import CaseRun
    from .explorer import Explorer, Options
    from .pool import WorkerExit
    from .resident import HeldRun
    from .worker import Job

CLOCK_MARGIN_S = 1.0
"""Seconds added to the runtime's declared lease when the harness advances a recovering
worker's clock (``discovery``)."""


# the resume policies' own checks (docs/checks.md)
CONCURRENT_ONE_STATUS = Check("concurrent.one_terminal_status", "fencing", "two owners disagree", "resume",
                              "concurrent resumers agree on one terminal status")
CONCURRENT_LOSER_FENCED = Check("concurrent.loser_fenced", "fencing", "two owners ran steps", "resume",
                                "at most one concurrent resumer ran steps and was not refused")
CONCURRENT_LOG_INTACT = Check("concurrent.log_intact", "checkpoint validity", "interleaved writes", "resume",
                              "the log after a concurrent round is a clean prefix")
CONCURRENT_EFFECTS_ONCE = Check("concurrent.effects_once", "effect exactly-once", "duplicated effect", "resume",
                                "no provider row beyond the golden run's after a concurrent round")
RECURRING_EFFECTS_ONCE = Check("recurring.effects_once", "effect exactly-once", "duplicated effect", "resume",
                               "no provider row beyond the golden run's under a fault in every worker")
RECURRING_BOUNDED = Check("recurring.bounded", "resumability", "crash loop", "resume",
                          "a fault in every worker ends in the runtime's crash-loop status, or the run finishes")
DISCOVERY_FOUND = Check("discovery.found", "resumability", "abandoned run never recovered", "resume",
                        "the runtime's own recovery, given no run id, found the run and ended it")
WARM_WORKER = Check("warm.worker", "resumability", "state one run left in the process", "resume",
                    "the first resume ran in a long-lived worker that had just run other conversations")
SAME_WORKER = Check("same.worker", "resumability", "a run resumed from what the process kept of it", "resume",
                    "the first resume ran in the very process the fault struck")
OTHER_EXECUTOR_RECOVERED = Check("other_executor.recovered", "resumability", "abandoned run never recovered", "resume",
                                   "another executor's recovery of the dead worker's runs ended the run")


def _verdict(check: str, valid: bool | None, details: str) -> oracle.Verdict:
    return oracle.Verdict(check, "resume", valid, details)


def hands_input(adapter: Adapter, resume: Resume, index: int, acknowledged: bool) -> bool:
    """Whether worker ``index`` of a case is handed the run's input: the first always;
    a later one under ``redelivery``, or before the subject acknowledged the run (a
    caller retries a request nobody acknowledged), or when the adapter expects
    redelivery and the policy is not ``input-once``."""
    if index == 0 or not acknowledged or resume.policy == "redelivery":
        return True
    if resume.policy == "input-once":
        return False
    return bool(adapter.expects_redelivery)


def check_effects_once(name: str, golden: dict[str, list[dict[str, Any]]], ledgers: dict[str, list[dict[str, Any]]]) -> oracle.Verdict:
    """``NAME``: per provider and operation, no more rows than the golden run made (a
    charge under a second key, a mail sent twice), and no key in two rows."""
    over = []
    for kind in sorted(ledgers):
        mine = Counter(str(r.get("op")) for r in ledgers[kind])
        theirs = Counter(str(r.get("op")) for r in golden.get(kind, []))
        over += [f"{kind} {op}: {n} row(s), golden {theirs[op]}" for op, n in sorted(mine.items()) if n > theirs[op]]
        keys = Counter(r.get("key") for r in ledgers[kind] if r.get("key"))
        over += [f"{kind} key {str(k)[:12]} in {n} rows" for k, n in keys.items() if n > 1]
    if over:
        return _verdict(name, False, "applied more than once: " + "; ".join(over))
    total = sum(len(rows) for rows in ledgers.values())
    return _verdict(name, True, f"{total} provider row(s), none beyond the golden run's")


class Policy:
    """The default resume policy (module docstring); the others subclass it."""

    name: ClassVar[str] = "default"
    #: the fault kind of the cases the matrix samples under this policy (``crashmatrix
    #: run``'s default, :func:`.matrix.sample_by_policy`)
    sampled_kind: ClassVar[str] = "kill"
    #: whether a case's resume runs in a long-lived worker by this policy's own design
    #: (warm-worker, same-worker): its replays keep them (:func:`.matrix.run_case_replayed`)
    long_lived: ClassVar[bool] = False

    def __init__(self, spec: Resume) -> None:
        self.spec = spec

    async def holds_worker(self, cx: CaseRun, index: int,
                           job: Job) -> HeldRun | None:
        """How faulted worker ``index`` runs when this policy keeps its process for a
        later worker (``same-worker``): a runner ``run(job, log, timeout, at_stop)``; None (every
        policy but that one) lets the pool run it."""
        return None

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        """Why this policy cannot test ``adapter``'s runtime, from what the adapter
        declares (its cases are then ``not-applicable`` with this reason, never run, never
        counted failed); None: applicable."""
        return None

    def fault_for(self, plan: tuple[Fault, ...], index: int) -> Fault | None:
        """The fault armed in worker ``index`` (None: it runs fault-free)."""
        return plan[index] if index < len(plan) else None

    def optional(self, plan: tuple[Fault, ...], index: int) -> bool:
        """Whether worker ``index``'s fault may go unfired (a repeated fault whose point
        the worker did not reach); else that is a harness error."""
        return False

    def bound(self, options: Options, plan: tuple[Fault, ...]) -> int:
        """Resumes the case may start before it is stopped."""
        return options.max_resumes + len(plan) - 1

    def over_bound(self, cx: CaseRun, status: str) -> oracle.Verdict:
        return oracle.Verdict("run.ends", "end", False, f"the run did not end after {cx.resumes} resume(s); last status {status!r}")

    async def resume(self, cx: CaseRun) -> tuple[str, bool] | None:
        """One fault-free resume step of the policy's own: its status and whether it
        ran; None: the case's plain resume by id (:meth:`.case.CaseRun.resume`) runs."""
        return None

    def judge(self, cx: CaseRun, final: oracle.Evidence) -> tuple[list[oracle.Verdict], bool]:
        """The policy's own end verdicts on the ``final`` state, and whether the case's
        end checks against the golden run apply too (:meth:`.case.CaseRun.end_verdicts`,
        which composes them). Default: none of its own, and they apply."""
        return [], True


class InputOnce(Policy):
    """The input goes to the first worker only (until the subject acknowledged the run)."""

    name = "input-once"

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        if adapter.expects_redelivery:
            return (f"input-once needs a runtime that keeps the run's input: {_name(adapter)} declares "
                    "expects_redelivery (its resumers are handed the input by their caller), so a resume without it "
                    "tests nothing the runtime promises")
        return None


class Redelivery(Policy):
    """The input goes to every worker, whatever the adapter declares."""

    name = "redelivery"


#: how many crash points after the fault's a ``concurrent`` round may hold its lead at
HOLD_CHOICES = 6


def hold_point(case_id: str, trace: Trace, fault: tuple[str, str, int] | None) -> tuple[str, str] | None:
    """Where the lead of a ``concurrent`` round holds while the others resume
    (:class:`.worker.Lead`): None (they all start together), or one of the first
    :data:`HOLD_CHOICES` distinct points (``(name, task)``) the golden run passed after
    the fault's point ``fault`` (``(name, task, occurrence)``): the points a resume from
    there passes first, in the node it takes up again (its probe, its provider call, its
    append). Chosen by the case id (CRC-32), so a replay holds at the same place."""
    after: list[tuple[str, str]] = []
    if fault is not None:
        at = next((i for i, e in enumerate(trace) if (e[1], e[2], e[3]) == fault), None)
        for _, name, task, _ in trace[at + 1:] if at is not None else ():
            if (name, task) not in after:
                after.append((name, task))
            if len(after) == HOLD_CHOICES:
                break
    choices: list[tuple[str, str] | None] = [None, *after]
    return choices[zlib.crc32(case_id.encode()) % len(choices)]


def _steps_run(report: WorkerReport, limit: int = 4) -> str:
    """The steps (``step.before`` tasks) a worker ran, in order: ``plan, charge, +2 more``."""
    tasks = list(dict.fromkeys(e.task for e in report.trace() if e.source == "step" and e.name == "step.before"))
    return ", ".join(tasks[:limit]) + (f", +{len(tasks) - limit} more" if len(tasks) > limit else "")


class Concurrent(Policy):
    """After the fault, ``resume.workers`` resumers on the same run: started together,
    or the first held at :func:`hold_point` while the others resume (:class:`.worker.Lead`)."""

    name = "concurrent"

    async def resume(self, cx: CaseRun) -> tuple[str, bool] | None:
        ex = cx.explorer
        if cx.kind_state.get("concurrent-done"):  # one round at once, then as usual
            return None
        cx.kind_state["concurrent-done"] = True
        n = self.spec.workers
        gate = cx.workdir / f"start-gate-{cx.resumes}"  # they wait there for each other (worker.wait_at_gate)
        gate.mkdir()
        # where the runtime's recovery sweep has read what to recover, they all meet before
        # any acts on it (worker.PointGate); else the first may hold in the node it takes
        # up again while the others resume (worker.Lead)
        meet = ex.adapter.recovery_point
        fault = cx.case.plan.faults[0].point.key if cx.case.plan.faults else None
        hold = None if meet else hold_point(cx.case.id, cx.golden.trace, fault)
        jobs = [cx.job("resume", start_gate=str(gate), gate_parties=n, hold_at=hold, lead=i == 0) for i in range(n)]
        if meet:
            jobs = [(dataclasses.replace(job, gate_at=tuple(meet)), log) for job, log in jobs]
        exits = await asyncio.gather(*(ex.pool.run(job, log, timeout=ex.options.worker_timeout) for job, log in jobs))
        reports = [WorkerReport.from_file(job.result_path) for job, _ in jobs]
        for (job, _), exit_, report in zip(jobs, exits, reports):
            # "held_at": where the first resumer held while the others resumed (None: none held)
            cx.result.workers.append({"role": "resume", "concurrent": n, "lead": job.lead,
                                      "held_at": "[".join(hold) + "]" if hold else None,
                                      "met_at": "[".join(meet) + "]" if meet else None, **exit_.to_dict()})
            cx.acknowledged = cx.acknowledged or report.accepted
            # the recovery branches each resumer reached count for coverage, winner or not
            cx.result.reached |= labels_of(report.trace())
            await ex.quiesce(job.worker_id, live=exit_.live)
            # a resumer refused mid-node (the other took the lease) left its model call
            # unrecorded, as a crash does: it may be billed once more (docs/design.md, the
            # oracle); two owners that both recorded their calls get no such margin
            for node, calls in oracle.in_flight_model_calls(report.trace()).items():
                cx.allowance[node] = cx.allowance.get(node, 0) + calls
        final = await ex.evidence(cx.run_id)
        terminal = ex.terminal_statuses()
        ended = [r.end for r, e in zip(reports, exits) if r.end is not None and e.returncode == 0]
        if ended:
            cx.result.resume_trace = ended[0].trace
        cx.result.verdicts += [
            oracle.run_check("concurrent.one_terminal_status", "resume", lambda: self._one_status(reports, final.observation.status, terminal)),
            oracle.run_check("concurrent.loser_fenced", "resume", lambda: self._loser_fenced(reports, exits, terminal)),
            oracle.run_check("concurrent.log_intact", "resume", lambda: self._log_intact(final.observation)),
            oracle.run_check("concurrent.effects_once", "resume",
                             lambda: check_effects_once("concurrent.effects_once", cx.golden.evidence.ledgers, final.ledgers)),
        ]
        if not ended:
            cx.result.verdicts.append(oracle.Verdict(
                "resume.runs", "end", False, f"none of the {n} concurrent resumers ended by itself: "
                + "; ".join((r.end.error or r.end.status) if r.end else e.describe() for r, e in zip(reports, exits))))
            return final.observation.status, False
        return final.observation.status, True

    @staticmethod
    def _one_status(reports: list[WorkerReport], stored: str, terminal: tuple[str, ...]) -> oracle.Verdict:
        said = sorted({r.end.status for r in reports if r.end is not None and r.end.status in terminal})
        if len(said) > 1:
            return _verdict("concurrent.one_terminal_status", False, f"the resumers ended the run as {', '.join(said)}")
        if said and stored != said[0]:
            return _verdict("concurrent.one_terminal_status", False, f"a resumer ended the run {said[0]!r}, the store holds {stored!r}")
        return _verdict("concurrent.one_terminal_status", True, f"status {stored}" + (f", as {len(reports)} resumers agree" if said else ""))

    @staticmethod
    def _loser_fenced(reports: list[WorkerReport], exits: list[Any], terminal: tuple[str, ...]) -> oracle.Verdict:
        def ran_steps(r: WorkerReport) -> bool:
            return any(e.source == "step" and e.name == "step.before" for e in r.trace())

        def waited(r: WorkerReport) -> bool:  # stopped at a person's wait after running steps
            trace = r.trace()
            first = next((i for i, e in enumerate(trace) if e.source == "step" and e.name == "step.before"), None)
            return first is not None and any(e.source == "label" and e.name == human.WAIT for e in trace[first:])

        owners = [i for i, (r, e) in enumerate(zip(reports, exits))
                  if e.returncode == 0 and r.end is not None and r.end.status not in ("error", FENCED) and ran_steps(r)]
        if len(owners) > 1 and all(waited(reports[i]) for i in owners):
            # each owner stopped at the run's wait for a person, which hands the run over (its
            # lease given up durably), and took it up again after the answer: a hand-over,
            # not two owners at once; overlapping writes are what the log and the ledgers show
            # (concurrent.log_intact, concurrent.effects_once)
            return _verdict("concurrent.loser_fenced", True, f"{len(owners)} resumers ran steps, each handing the "
                            f"run over at a person's wait ({human.WAIT}) before another took it")
        if len(owners) > 1:
            said = ", ".join(sorted({reports[i].end.status for i in owners if reports[i].end is not None}))
            ran = "; ".join(f"resumer {i + 1} ran {_steps_run(reports[i])}" for i in owners)
            return _verdict("concurrent.loser_fenced", False, f"{len(owners)} of {len(reports)} resumers ran steps and "
                            f"none of them was refused (they ended {said}; {ran}): two owners at once, no loser "
                            "fenced. A unique record per step does not stop two owners from both starting the same "
                            "step between the check and the record (its model call billed, its effects sent, "
                            "twice); a lease or fence on the run does (docs/checks.md)")
        refused = [(r.end.error or "").split(":")[0] if r.end.status == "error" else FENCED
                   for r, e in zip(reports, exits) if r.end is not None and r.end.status in ("error", FENCED)]
        how = f"; refused: {', '.join(refused)}" if refused else ""
        return _verdict("concurrent.loser_fenced", True, f"{len(owners)} resumer(s) ran steps unrefused{how}")

    @staticmethod
    def _log_intact(obs: Any) -> oracle.Verdict:
        v = oracle.check_clean_prefix(obs)
        return _verdict("concurrent.log_intact", v.valid, v.details)


class Recurring(Policy):
    """The plan's last fault again in every later worker, until the runtime gives up."""

    name = "recurring"

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        """Not applicable when the adapter declares no ``crash_loop_status`` (nothing
        tells the runtime's giving up from another end), or when its runtime's own
        limit (``recovery_attempts_limit``) is at or above the harness's bound (the case
        could only end by the harness stopping it)."""
        status, limit = adapter.crash_loop_status, recovery_limit(adapter)
        bound = options.recurring_bound
        if status is None:
            gives_up = f"; its runtime gives up after {limit} recovery attempt(s)" if limit is not None else ""
            return (f"recurring needs the status the runtime ends a crash loop in: {_name(adapter)} declares no "
                    f"crash_loop_status{gives_up}")
        if limit is not None and limit >= bound:
            return (f"{_name(adapter)}'s runtime gives up after {limit} recovery attempt(s) (recovery_attempts_limit), "
                    f"not fewer than the harness's bound of {bound} resume(s) (Options.recurring_bound): the case could "
                    f"only end by the harness stopping it")
        return None

    def fault_for(self, plan: tuple[Fault, ...], index: int) -> Fault | None:
        return plan[min(index, len(plan) - 1)] if plan else None

    def optional(self, plan: tuple[Fault, ...], index: int) -> bool:
        return index >= len(plan)

    def bound(self, options: Options, plan: tuple[Fault, ...]) -> int:
        return options.recurring_bound

    def over_bound(self, cx: CaseRun, status: str) -> oracle.Verdict:
        fault = cx.case.plan.faults[-1]
        return _verdict("recurring.bounded", False,
                        f"the runtime did not give up: {cx.resumes} resume(s), each with {fault.label()}, and the run is "
                        f"still {status!r}; the case was stopped by the harness's own bound (Options.recurring_bound="
                        f"{cx.explorer.options.recurring_bound}), not by the runtime")

    def judge(self, cx: CaseRun, final: oracle.Evidence) -> tuple[list[oracle.Verdict], bool]:
        """``recurring.bounded`` (unless the harness stopped the case: :meth:`over_bound`
        gave it) and ``recurring.effects_once``; the end checks apply only when the run
        finished as the golden run did."""
        status, golden = final.observation.status, cx.golden.evidence.observation.status
        declared = cx.explorer.adapter.crash_loop_status
        stopped = any(v.check == "recurring.bounded" for v in cx.result.verdicts)
        verdicts: list[oracle.Verdict] = []
        if not stopped:
            attempts = cx.resumes + 1
            if status == golden:
                verdicts.append(_verdict("recurring.bounded", True, f"the run ended {status} after {attempts} "
                                         f"worker(s): the fault's point was not reached again"))
            elif declared is not None and status == declared:
                verdicts.append(_verdict("recurring.bounded", True, f"the runtime gave up after {attempts} worker(s): "
                                         f"{status} (its crash-loop status)"))
            else:
                want = f"its declared crash-loop status {declared!r}" if declared else "a crash-loop status (the adapter declares none)"
                verdicts.append(_verdict("recurring.bounded", False, f"the run ended {status!r} after {attempts} "
                                         f"worker(s): neither {golden!r} nor {want}"))
        verdicts.append(oracle.run_check("recurring.effects_once", "resume", lambda: check_effects_once(
            "recurring.effects_once", cx.golden.evidence.ledgers, final.ledgers)))
        return verdicts, status == golden  # it finished: judged as any case too


class Discovery(Policy):
    """After the fault, a worker given no run id and no input runs the runtime's own
    recovery, its clock advanced past the declared lease; then resumes by id."""

    name = "discovery"

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        if type(adapter).recover is Adapter.recover:
            return (f"discovery needs the runtime's own recovery: {_name(adapter)} declares no recover() (its runtime "
                    "resumes a run only when a caller gives its id)")
        return None

    async def resume(self, cx: CaseRun) -> tuple[str, bool] | None:
        ex = cx.explorer
        if cx.kind_state.get("discovery-done"):
            return None
        cx.kind_state["discovery-done"] = True
        before = await cx.observe()
        lease = ex.adapter.lease_seconds
        offset = (lease + CLOCK_MARGIN_S) if lease is not None else 0.0
        report, how, after = await _recovery_worker(cx, "recover", run_id="", input_given=False,
                                                    clock_offset_s=offset)
        clock = f"clock advanced {offset:g} s" if offset else "no lease declared"
        if after.status in ex.terminal_statuses():
            cx.result.verdicts.append(_verdict("discovery.found", True, f"the runtime's own recovery found the run "
                                               f"({before.status}) and ended it {after.status} ({clock}; it said {how})"))
        else:
            touched = (after.lease_epoch or 0) != (before.lease_epoch or 0)
            what = "took the run but left it" if touched else "did not find the run: it is still"
            cx.result.verdicts.append(_verdict("discovery.found", False, f"the runtime's own recovery {what} "
                                               f"{after.status!r} ({clock}; it said {how})"))
        if report.end is not None:
            cx.result.resume_trace = report.end.trace
        return after.status, True


async def _recovery_worker(cx: CaseRun, role: str, **job: Any) -> tuple[WorkerReport, str, Observation]:
    """Run one worker of ``role`` (``recover``, ``recover-other``; ``job``: the job's
    other fields, :meth:`.case.CaseRun.job`), record it among the case's workers and
    quiesce it. Returns its report, how it ended in its own words (its error or status,
    else how its process ended) and the run's state after it."""
    ex = cx.explorer
    j, log = cx.job(role, **job)
    exit_ = await ex.pool.run(j, log, timeout=ex.options.worker_timeout)
    report = WorkerReport.from_file(j.result_path)
    cx.result.workers.append({"role": role, **exit_.to_dict()})
    await ex.quiesce(j.worker_id, live=exit_.live)
    how = (report.end.error or report.end.status) if report.end is not None else exit_.describe()
    return report, how, await cx.observe()


class OtherExecutor(Policy):
    """After the fault, the first resume runs in a worker of another identity than the
    one that ran the run (another executor id): a live process runs the runtime's own
    recovery of the dead worker's runs (:meth:`.adapter.Adapter.recover_other`; DBOS:
    ``_recover_pending_workflows([dead executor id])``, what its admin server's recovery
    endpoint runs when a control plane sees an executor gone), then waits for the run.
    ``other_executor.recovered``: the run ended in a terminal status by that recovery (a
    run nothing durable was left of, never acknowledged, is its caller's to send again:
    valid, resumed as usual). Then by id as usual. Not applicable where the adapter does
    not declare ``recovers_other_executor``."""

    name = "other-executor"

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        if not getattr(adapter, "recovers_other_executor", False):
            return (f"other-executor needs a runtime whose live process recovers another executor's runs: "
                    f"{_name(adapter)} does not declare recovers_other_executor (Adapter.recover_other)")
        return None

    async def resume(self, cx: CaseRun) -> tuple[str, bool] | None:
        ex = cx.explorer
        if cx.kind_state.get("other-done"):
            return None
        cx.kind_state["other-done"] = True
        before = await cx.observe()
        if before.status == "absent":
            cx.result.verdicts.append(_verdict("other_executor.recovered", True, "nothing durable to recover (no run "
                                               "stored): its caller sends it again"))
            return None
        report, how, after = await _recovery_worker(cx, "recover-other")
        cx.acknowledged = cx.acknowledged or report.accepted
        ok = after.status in ex.terminal_statuses()
        cx.result.verdicts.append(_verdict("other_executor.recovered", ok, (
            f"another executor's recovery took the run over ({before.status}) and it ended {after.status}" if ok else
            f"another executor's recovery left the run {after.status!r} (it was {before.status!r}; the "
            f"recovering worker said {how})")))
        if report.end is not None:
            cx.result.resume_trace = report.end.trace
            cx.result.reached |= labels_of(report.end.trace)
        return after.status, True


class WarmWorker(Policy):
    """After the fault, the first resume runs in a long-lived worker of its own that has
    just run other runs of the workload, each from its input to its end: the workload's
    next conversation, if it has another (a read-through cache keyed by node ids, which
    keeps the first value it saw, then holds another run's values), then the same
    conversation (a cache keyed by the call's arguments then holds this run's own calls,
    a charge among them). A production worker resumes a run after
    serving others: what one run leaves in the process (a module cache, a registry keyed
    by node id, a pool's state) meets the next. Deterministic and replayable, unlike the
    order in which a matrix's long-lived workers happen to serve cases
    (:mod:`.resident`). Then resumes by id as usual."""

    name = "warm-worker"
    long_lived = True

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        return _needs_long_lived(self.name, adapter, options)

    async def resume(self, cx: CaseRun) -> tuple[str, bool] | None:
        ex = cx.explorer
        if cx.kind_state.get("warm-done"):
            return None
        cx.kind_state["warm-done"] = True
        residents = _residents(ex)
        if residents is None:
            cx.result.verdicts.append(_verdict("warm.worker", True, f"not applicable: {FORKS_ONLY}; the resume ran in "
                                               "a fresh worker"))
            return None
        from .errors import HarnessError

        conversation = cx.case.conversation
        order = list(ex.workload.conversations)
        others = order[order.index(conversation) + 1:] + order[:order.index(conversation)] if conversation in order else []
        warm_ups = [cx.job("start", conversation=conv, run_id=f"cm-run-warm{n}-{cx.run_id.removeprefix('cm-run-')}",
                           input_given=True)
                    for n, conv in enumerate([*others[:1], conversation])]
        job, log = cx.job("resume")
        terminal = ex.terminal_statuses()
        ran = []
        assert ex.pool.residents_dir is not None  # type: ignore[union-attr]
        async with residents.dedicated(job.subject, ex.pool.residents_dir) as run:  # type: ignore[union-attr]
            try:
                for warm, warm_log in warm_ups:
                    first = await run(warm, warm_log, ex.options.worker_timeout)
                    end = WorkerReport.from_file(warm.result_path).end
                    if first.returncode != 0 or end is None or end.status not in terminal:
                        raise HarnessError(f"its run of {warm.conversation} ended "
                                           f"{end.status if end else first.describe()!r}, not in a terminal status")
                    ran.append((warm, first, end.status))
                exit_ = await run(job, log, ex.options.worker_timeout)
            except HarnessError as exc:
                cx.result.verdicts.append(_verdict("warm.worker", True, f"not applicable: the resume ran in a fresh "
                                                   f"worker: {exc}"))
                return None
        for _, first, _ in ran:
            cx.result.workers.append({"role": "warm-up", **first.to_dict()})
        cx.result.workers.append({"role": "resume", "warm": True, **exit_.to_dict()})
        report = WorkerReport.from_file(job.result_path)
        cx.acknowledged = cx.acknowledged or report.accepted
        before = ", then ".join(f"{warm.run_id} ({warm.conversation}) to {status}" for warm, _, status in ran)
        cx.result.verdicts.append(_verdict("warm.worker", True, f"the resume ran in worker {exit_.pid}, which had just "
                                           f"run {before}"))
        return await cx.without_fault(job, log, exit_, report)


class SameWorker(Policy):
    """After a fault its worker outlives (a cancellation, a network fault: the process
    carries on, :attr:`.faults.FaultKind.survives`), the first resume runs in that very
    process, a long-lived worker held for the case once the faulted job has ended: a
    production worker whose task was cancelled (a client's cancel, a drain cut short, a
    broken connection) takes the run up again when the queue hands it back to the same
    consumer. What the runtime kept of the run in memory (its graph, a cursor, a cache
    of records or results) then meets what its store holds; a resume that trusts the
    first is judged by the end checks. A fault that stops the worker and wakes it in
    place (cancel-api, restore: :attr:`.faults.Stops.wakes_intact`) is resumed there too,
    once its woken job has ended. A fault that ends the process (kill, term), one whose
    run other workers take over while the faulted one sleeps (pause: its ``zombie``
    role), a subject without ``long_lived_workers``, ``--fresh-workers`` or two builds:
    "not applicable", resumed as usual. The matrix samples cancel cases (:attr:`sampled_kind`).
    Deterministic and replayable: the same process by construction. Then by id as usual."""

    name = "same-worker"
    sampled_kind = "cancel"
    long_lived = True

    def not_applicable(self, adapter: Adapter, options: Options) -> str | None:
        return _needs_long_lived(self.name, adapter, options)

    async def holds_worker(self, cx: CaseRun, index: int,
                           job: Job) -> HeldRun | None:
        from . import faults
        from .resident import eligible

        if index != 0:
            return None
        ex = cx.explorer
        residents = _residents(ex)
        if residents is None:
            cx.kind_state["same-why"] = FORKS_ONLY
            return None
        zombie = [f.kind for f in job.plan.faults if getattr(faults.kind(f.kind), "role", None) == "zombie"]
        if zombie:  # pause: the run is taken over while the worker sleeps, before its job ends
            cx.kind_state["same-why"] = (f"a {zombie[0]} fault's run is resumed by other workers while the faulted "
                                         "one sleeps, before its job ends in that process")
            return None
        if not eligible(job):
            ends = [f.kind for f in job.plan.faults if not faults.kind(f.kind).survives]
            cx.kind_state["same-why"] = (
                f"a {ends[0]} fault ends its worker's process" if ends else
                "a fault at an await point needs the await-point tracer a fresh worker arms at its start, which a "
                "long-lived worker does not" if job.await_points else
                f"a {job.role} job of this kind never runs in a long-lived worker (resident.eligible)")
            return None
        held = contextlib.AsyncExitStack()
        assert cx.stack is not None and ex.pool.residents_dir is not None  # type: ignore[union-attr]
        cx.stack.push_async_callback(held.aclose)  # ended with the case at the latest
        run = await held.enter_async_context(residents.dedicated(job.subject, ex.pool.residents_dir))  # type: ignore[union-attr]
        cx.kind_state["same-run"] = (run, held)
        return run

    async def resume(self, cx: CaseRun) -> tuple[str, bool] | None:
        from .errors import HarnessError

        ex = cx.explorer
        if cx.kind_state.get("same-done"):
            return None
        cx.kind_state["same-done"] = True
        kept = cx.kind_state.pop("same-run", None)
        if kept is None:
            why = cx.kind_state.get("same-why", "no faulted worker's process was held")
            cx.result.verdicts.append(_verdict("same.worker", True, f"not applicable: {why}; the resume ran in a "
                                               "fresh worker"))
            return None
        run, held = kept
        job, log = cx.job("resume")
        try:
            exit_ = await run(job, log, ex.options.worker_timeout)
        except HarnessError as exc:
            cx.result.verdicts.append(_verdict("same.worker", True, f"not applicable: the faulted worker's process "
                                               f"did not outlive its job ({exc}); the resume ran in a fresh worker"))
            return None
        finally:
            await held.aclose()
        cx.result.workers.append({"role": "resume", "same": True, **exit_.to_dict()})
        report = WorkerReport.from_file(job.result_path)
        cx.acknowledged = cx.acknowledged or report.accepted
        kind = cx.case.plan.faults[0].kind
        cx.result.verdicts.append(_verdict("same.worker", True, f"the resume ran in worker {exit_.pid}, the process "
                                           f"the {kind} fault struck, after its job had ended"))
        return await cx.without_fault(job, log, exit_, report)


def _name(adapter: Adapter) -> str:
    return adapter.name or type(adapter).__name__


def recovery_limit(adapter: Adapter) -> int | None:
    """The adapter's ``recovery_attempts_limit`` (how many recoveries of a run its
    runtime attempts before it gives up, as the runtime itself says), None when it
    declares none. Raises :class:`.errors.InvalidArgument` naming the adapter when it is
    not a positive int."""
    limit = getattr(adapter, "recovery_attempts_limit", None)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        from .errors import InvalidArgument

        raise InvalidArgument(f"{_name(adapter)}.recovery_attempts_limit must be a positive int or None (got {limit!r})")
    return limit


def _needs_long_lived(policy: str, adapter: Adapter, options: Options) -> str | None:
    """Why ``policy`` (warm-worker, same-worker: a resume in a process that ran other
    jobs) cannot run here: the adapter does not declare ``long_lived_workers``, or
    ``--fresh-workers`` forks every job; None when it can."""
    if not getattr(adapter, "long_lived_workers", False):
        return (f"{policy} needs a worker process that serves many jobs: {_name(adapter)} does not declare "
                "long_lived_workers (every job forks a worker of its own)")
    if not options.long_lived:
        return f"{policy} needs a worker process that serves many jobs: --fresh-workers forks every job"
    return None


def _residents(ex: Explorer) -> Any:
    """The pool's long-lived workers (:class:`.resident.Residents`) when this subject's
    jobs may run in them; None where every job forks (:data:`FORKS_ONLY`)."""
    residents = getattr(ex.pool, "residents", None)
    if residents is None or not getattr(ex.adapter, "long_lived_workers", False) or ex.upgrade is not None:
        return None
    return residents


FORKS_ONLY = ("every job forks a worker of its own here (the adapter does not declare long_lived_workers, "
              "--fresh-workers, or two builds)")
"""Why a policy that needs a long-lived worker (``warm-worker``, ``same-worker``) is not
applicable to a case."""

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Policy, InputOnce, Redelivery, Concurrent, Recurring, Discovery,
                                                         WarmWorker, SameWorker, OtherExecutor)}
"""Policy classes by name (:data:`.plan.RESUME_POLICIES`)."""


def policy_of(resume: Resume) -> Policy:
    """The policy object of a case's :class:`.plan.Resume`."""
    return POLICIES[resume.policy](resume)


SCOPE_OPTION = "recovery_scope"
"""``Environment.options`` key of a discovery case's scope (the controller's reads, such
as ``observe``, see it too; workers also get it as ``RunContext.scope``)."""


def scope_of(run_id: str) -> str:
    """The recovery scope of a ``discovery`` case's run (its queue, executor id): a name
    of the case's own, so a sweep never takes another case's run."""
    return "cm-scope-" + run_id.removeprefix("cm-run-")
