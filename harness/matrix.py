"""Run a whole matrix: golden runs, enumeration, cases in parallel, one report.

:func:`run` runs the matrix one :class:`.settings.RunSettings` describes (what ``crashmatrix
run`` and ``replay`` build); :func:`run_matrix` is the same with the settings as keywords,
importable and typed. Cases run
``jobs`` at a time (default: twice the number of cores; docs/benchmarks.md); each reports through ``on_result``
as it finishes, so the caller can draw progress.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import faults
from .errors import GoldenRunRefused, PlanError
from .defaults import DefaultMatrix
from .enumeration import double_fault_cases, double_fault_note, enumerate_cases, shard, validate_case
from .case import CaseHook, CaseResult
from .explorer import Explorer, Options
from .golden import GoldenRun, golden_effects, golden_failure
from .names import Names
from .plan import DEFAULT_SOURCES, Case, FaultPlan, Resume
from .policies import policy_of
from .pool import fork_only
from .session import open_session
from .settings import RunSettings
from .sources import releases_line, subject_releases


OUTCOMES = ("pass", "fail", "flaky", "harness-error", "not-run", "not-applicable")
"""Every outcome a case can have; ``flaky``: it failed, and a replay did not;
``not-run``: its fault could not take effect (:mod:`.coverage`); ``not-applicable``:
its resume policy needs something the adapter does not declare
(:meth:`.policies.Policy.not_applicable`)."""
FAILING = ("fail", "flaky", "harness-error")
"""Outcomes listed as failures (first, in the failing list and the progress bar)."""
NON_EVENTS = ("not-run", "not-applicable")
"""Outcomes that tested nothing: never counted as failed nor passed, listed apart with
their reason (:func:`.report.non_event_groups`)."""
OUTCOME_WORDS = {"pass": "passed", "fail": "failed", "flaky": "flaky", "harness-error": "harness errors",
                 "not-run": "not run", "not-applicable": "not applicable"}
"""How a count of each outcome reads (``3 failed``): in the terminal's summary, the
pytest plugin's and a run's closing line (:func:`.report.count_phrases`)."""


@dataclass
class MatrixReport:
    """Everything a matrix run produced. ``seconds``: wall time of the cases only
    (golden runs and service start excluded); ``setup_seconds``: the rest.

    ``results`` grows as cases finish (finishing order) and is put in case order when
    each level of the matrix ends. ``planned``: the number of cases enumerated (both
    levels with ``depth=2``). A run stopped before its end (Ctrl-C, SIGTERM) is marked
    with :meth:`interrupt`: ``complete`` False and ``reason`` saying why; its results
    are the cases that finished."""

    workload: str
    subject: str
    kinds: tuple[str, ...]
    sources: tuple[str, ...]
    goldens: dict[str, GoldenRun]
    results: list[CaseResult] = field(default_factory=list)
    #: golden runs reported as results of their own (:func:`golden_result`, case id
    #: ``WORKLOAD/CONV/golden``): each that breaks an invariant (no case of its
    #: conversation ran; it fails the run), and those asked for by a replay of that id
    golden_results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    setup_seconds: float = 0.0
    jobs: int = 1
    #: the most spare lanes that took cases at once, beside the ``jobs`` slots, while the
    #: cores idled (:class:`.runner.CaseLoop`)
    spare_jobs: int = 0
    #: lines for the reader about how the cases were made (depth 2: how many double
    #: faults and, when none, why; what pruning did)
    notes: list[str] = field(default_factory=list)
    replay_failures: int = 0
    planned: int = 0
    complete: bool = True
    reason: str | None = None
    #: what crash-state pruning did (:class:`.pruning.PruneSummary`); None: not pruned
    pruning: Any = None
    #: the recovery branches the cases reached, the cases not run (:class:`.coverage.Coverage`)
    coverage: Any = None
    #: an unreached branch or a not-run case fails the run (``--require-coverage``)
    require_coverage: bool = False
    #: the runtime's installed release, per build (the subject, or each build's label):
    #: distribution -> version (:func:`.sources.runtime_releases`); empty for a runtime
    #: run from a source tree
    releases: dict[str, dict[str, str]] = field(default_factory=dict)

    def interrupt(self, reason: str) -> None:
        """Mark the report incomplete: the run stopped before its end, for ``reason``
        (e.g. ``"stopped by SIGTERM"``)."""
        self.complete = False
        self.reason = reason

    @property
    def counts(self) -> dict[str, int]:
        """Cases by outcome (:data:`OUTCOMES`; a flaky case is not also counted failed;
        ``not-run``: its fault could not take effect, :mod:`.coverage`)."""
        out = dict.fromkeys(OUTCOMES, 0)
        for r in self.results:
            out[r.outcome] += 1
        return out

    @property
    def cases_per_second(self) -> float:
        return len(self.results) / self.seconds if self.seconds > 0 else 0.0

    @property
    def exit_code(self) -> int:
        """0 every case passed (or was not run: its fault could not take effect; or was
        not applicable: :data:`NON_EVENTS`); 1 some
        case failed an oracle check, always or on some runs only (flaky: a race is a bug
        of the subject), or coverage is required and incomplete; 3 harness errors only."""
        c = self.counts
        if c["fail"] or c["flaky"] or any(r.outcome != "pass" for r in self.golden_results):
            return 1
        if self.require_coverage and self.coverage is not None and not self.coverage.complete:
            return 1
        if c["harness-error"]:
            return 3
        return 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON report: :func:`.report.matrix_dict`'s shape, with the run's wall
        clock (``summary.seconds``, ``setup_seconds``, ``cases_per_second``), the jobs,
        ``replay_failures``, each golden run's id, points, seconds, effects applied per
        effect provider (``applied``) and refused calls (``refusals``), and whether the
        run is ``complete`` (else ``reason`` and ``planned``, the cases it meant to
        run)."""
        from .report import case_dict, matrix_dict

        golden = {c: {"run_id": g.run_id, "points": len(g.trace), "seconds": round(g.seconds, 4),
                      "applied": dict(g.applied), "refusals": list(g.refusals)}
                  for c, g in sorted(self.goldens.items())}
        out = matrix_dict(self.workload, self.subject, self.kinds, self.sources, [case_dict(r) for r in self.results],
                          golden, complete=self.complete, reason=self.reason, planned=self.planned)
        out["jobs"] = self.jobs
        out["spare_jobs"] = self.spare_jobs
        out["golden_results"] = [r.to_dict() for r in self.golden_results]
        out["notes"] = list(self.notes)
        out["replay_failures"] = self.replay_failures
        out["releases"] = {who: dict(r) for who, r in self.releases.items()}
        if self.pruning is not None:
            out["pruning"] = self.pruning.to_dict()
        if self.coverage is not None:
            out["coverage"] = self.coverage.to_dict()
        from .report import non_event_groups

        # the cases that tested nothing, apart from the failures, with the reason per kind/policy
        out["non_events"] = non_event_groups(self.results)
        out["summary"].update(seconds=round(self.seconds, 3), setup_seconds=round(self.setup_seconds, 3),
                              cases_per_second=round(self.cases_per_second, 2))
        return out


async def run_matrix(
    workload: str | Names = "checkout",
    subject: str = "reference",
    *,
    kinds: tuple[str, ...] | None = None,
    sources: tuple[str, ...] = DEFAULT_SOURCES,
    conversations: tuple[str, ...] | None = None,
    cases: list[Case] | None = None,
    jobs: int | None = None,
    dsn: str | None = None,
    options: Options | None = None,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    depth: int = 1,
    sample: int | None = None,
    seed: int = 0,
    shard_spec: str | None = None,
    replay_failures: int = 1,
    on_report: Callable[[MatrixReport], None] | None = None,
    require_coverage: bool = False,
    resume: Resume = Resume(),
    sampled_kinds: Mapping[str, int] | None = None,
    sampled_policies: Mapping[str, int] | None = None,
    matrix: DefaultMatrix | None = None,
) -> MatrixReport:
    """Start services, run golden runs, then the matrix (or the given ``cases``).

    ``workload``, ``subject``, ``kinds``, ``sources`` and ``conversations`` are resolved
    and checked by :func:`.names.resolve`; or ``workload`` is the :class:`.names.Names`
    a caller resolved already (then the other four must be left at their defaults).

    ``kinds`` None (and a workload given by name): the default matrix, what ``crashmatrix
    run WORKLOAD`` runs (:func:`.defaults.default_matrix`: kill, term and cancel at every
    point, and seeded samples of :data:`.plan.SAMPLED_KINDS` and
    :data:`.plan.SAMPLED_POLICIES`, drawn with ``seed``); ``kinds`` given, or resolved
    :class:`.names.Names`: those kinds at every point, nothing sampled. ``matrix``: the
    shape to run instead (:class:`.defaults.DefaultMatrix`; its ``kinds`` must be the
    kinds run at every point). ``sampled_kinds`` (kind -> n) and ``sampled_policies``
    (resume policy -> n) set the samples by hand: n cases of each kind
    (:func:`sample_by_kind`), n cases resumed under each policy when ``resume`` is the
    default policy (:func:`sample_by_policy`); a note says how many of how many.

    Raises ``ServiceError``/``RegistryError``/``InvalidArgument`` before any case runs
    when services or names are wrong, ``PlanError`` when a given case does not fit
    the golden trace, and ``GoldenRunRefused`` when the golden runs did not exercise
    what the workload declares (:func:`.golden.golden_effects`; its lines, each
    provider's effects applied, are the report's first notes).
    ``on_start(n)`` is called with the number of cases once they are enumerated (and
    again for the second level when ``depth`` is 2).

    ``depth=2`` adds double faults: after the single-fault cases ran, each is extended
    with a second fault at every point of its resume's trace (``sample`` of them, drawn
    with ``seed``). ``shard_spec`` ``"K/N"`` keeps the K-th of N disjoint shards.

    ``replay_failures``: each failing case is run again up to this many times on the
    same session; one whose replay disagrees is ``flaky`` (:func:`run_case_replayed`;
    0: no replay). ``on_report(report)`` is called once the cases are enumerated, with
    the report that then fills as they finish: a caller interrupted mid-run (cancelled:
    Ctrl-C, SIGTERM) still holds the cases that ran (:meth:`MatrixReport.interrupt`).
    Kill cases are pruned by crash state and resumes shared as ``options.prune`` says
    (:mod:`.pruning`); ``require_coverage``: a recovery branch of the subject no case
    reached, or a case whose fault could not take effect, fails the run (:mod:`.coverage`).
    ``resume``: the resume policy of the enumerated cases (:mod:`.policies`; given
    ``cases`` keep their own).
    """
    settings = RunSettings.of(
        workload, subject, kinds=kinds, sources=sources, conversations=conversations, cases=cases, jobs=jobs, dsn=dsn,
        options=options, depth=depth, sample=sample, seed=seed, shard=shard_spec, replay_failures=replay_failures,
        require_coverage=require_coverage, resume=resume, sampled_kinds=sampled_kinds,
        sampled_policies=sampled_policies, matrix=matrix)
    return await run(settings, on_start=on_start, on_result=on_result, on_report=on_report)


async def run(
    settings: RunSettings, *, on_start: Callable[[int], None] | None = None,
    on_result: Callable[[CaseResult], None] | None = None, on_report: Callable[[MatrixReport], None] | None = None,
) -> MatrixReport:
    """Run the matrix ``settings`` describe (:class:`.settings.RunSettings`): services,
    golden runs, the cases, each level of the matrix in turn; ``on_start``,
    ``on_result`` and ``on_report`` as :func:`run_matrix` says. Raises as
    :func:`run_matrix` does once services start."""
    t0 = time.monotonic()
    s = settings
    async with open_session(s.names.subject, s.names.workload, dsn=s.dsn, options=s.options) as explorer:
        if s.wants_proxy:  # an unreachable fault proxy: one ServiceError here (exit 2), not one per case
            await explorer.fault_proxy.client()
        report, cases = await _prepare(explorer, s)
        report.setup_seconds = time.monotonic() - t0  # kept as it is if the cases are interrupted
        if on_report:
            on_report(report)
        if on_start:
            on_start(len(cases))
        await _run_levels(explorer, s, report, cases, on_start, on_result)
        from .coverage import coverage_of

        report.coverage = coverage_of(explorer.adapter, report.results)
        report.notes += report.coverage.lines()
    report.setup_seconds = time.monotonic() - t0 - report.seconds
    return report


async def _prepare(explorer: Explorer, s: RunSettings) -> tuple[MatrixReport, list[Case]]:
    """The golden runs (a broken one reported as a result of its own, no case of its
    conversation run), the fault kinds' checks before any case
    (:meth:`.faults.FaultKind.before_matrix`), the cases (enumerated, or the given
    ones checked), sharded; returns the report to fill and the cases. Raises
    ``GoldenRunRefused`` when the golden runs exercised nothing to judge."""
    from .builds import check_case_label, label_cases
    from .faults.db_outage import with_window

    workload, subject, wl = s.names.workload, s.names.subject, explorer.workload
    given = list(s.cases) if s.cases is not None else None
    wanted = s.names.conversations or (tuple(sorted({c.conversation for c in given})) if given else wl.conversations)
    goldens = {}
    for conv in wanted:
        goldens[conv] = await explorer.golden(conv)
    # a golden run that breaks an invariant is a defect of the subject, never a
    # baseline: it is reported once, and its conversation's cases are not run
    asked = {c.conversation for c in given or [] if not c.plan.faults}  # a replay of WORKLOAD/CONV/golden
    reported = [golden_result(workload, subject, g) for g in goldens.values() if g.broken or g.conversation in asked]
    healthy = {c: g for c, g in goldens.items() if not g.broken and not g.skipped}
    notes: list[str] = [f"not applicable, no case run: {g.skipped}" for g in goldens.values() if g.skipped]
    effect_lines, refused = golden_effects(workload, wl, list(healthy.values()))
    if refused is not None:  # every case would pass vacuously: nothing to judge against
        raise GoldenRunRefused(refused)
    notes += effect_lines
    notes += [n for p in getattr(explorer.pool, "pools", {}).values() or [explorer.pool] for n in getattr(p, "notes", ())]
    releases = subject_releases(explorer.adapter, subject)
    line = releases_line(releases)
    if line is not None:
        notes.insert(0, line)
    used = s.kinds_used
    for name in [k for k in faults.KINDS if k in used] if healthy else []:  # each kind's checks before any case
        await faults.kind(name).before_matrix(explorer, next(iter(healthy)))
    if given is None:
        notes.append(f"kinds at every crash point: {', '.join(s.names.kinds) or 'none'}; "
                     f"sources: {', '.join(s.names.sources)}")
        found, lines = s.matrix.cases(workload, healthy, s.names.sources, s.resume, s.seed)
        cases = with_window(label_cases(found, explorer.upgrade), s.options.outage_window_ms)
        notes += lines
    else:
        from .netfaults import check_links

        cases = given
        for case in cases:
            check_case_label(case, explorer.upgrade)
            validate_case(case, goldens)
            check_links(case, tuple(wl.providers))
    if s.shard:  # kill cases of one crash state stay in one shard, so it prunes as the whole does
        from .pruning import shard_by_crash_state

        prune = explorer.options.prune
        cases = (shard_by_crash_state(cases, goldens, s.shard, prune) if prune is None or prune.prune
                 else shard(cases, s.shard))
    cases = [c for c in cases if c.conversation in healthy and c.plan.faults]
    report = MatrixReport(workload, subject, s.matrix.all_kinds, s.names.sources, goldens, jobs=s.jobs,
                          golden_results=reported, replay_failures=s.replay_failures, planned=len(cases),
                          require_coverage=s.require_coverage, notes=notes, releases=releases)
    return report, cases


async def _run_levels(explorer: Explorer, s: RunSettings, report: MatrixReport, cases: list[Case],
                      on_start: Callable[[int], None] | None, on_result: Callable[[CaseResult], None] | None) -> None:
    """The cases (:func:`.runner.run_loop`, pruned as the options say), then with
    ``depth`` 2 the double faults; fills ``report`` as they finish (a case run again
    replaces its result), its seconds, the pruning summary and notes."""
    from .faults.db_outage import with_window
    from .pruning import executed, workers_forked, workers_run
    from .runner import run_loop

    t1 = time.monotonic()
    at: dict[str, int] = {}  # case id -> its place in report.results (a case run again replaces its result)

    def finished(result: CaseResult) -> None:
        if result.case.id in at:
            report.results[at[result.case.id]] = result
        else:
            at[result.case.id] = len(report.results)
            report.results.append(result)
        report.seconds = time.monotonic() - t1
        if on_result:
            on_result(result)

    def peak(n: int) -> None:
        report.spare_jobs = n

    results, report.pruning = await run_loop(explorer, cases, report.goldens, s.jobs, finished,
                                             replay_failures=s.replay_failures, spare=s.spare_jobs, peak=peak)
    report.results[:] = results
    at = {r.case.id: i for i, r in enumerate(results)}
    report.notes += report.pruning.lines()
    if s.depth == 2:
        kinds = s.names.kinds
        doubles = with_window(double_fault_cases(report.results, kinds, sample=s.sample, seed=s.seed),
                              s.options.outage_window_ms)
        report.notes.append(double_fault_note(report.results, kinds, len(doubles)))
        report.planned += len(doubles)
        if on_start:
            on_start(len(doubles))
        level = len(report.results)
        report.results[level:] = await run_cases(explorer, doubles, report.goldens, s.jobs, finished,
                                                 replay_failures=s.replay_failures)
    report.seconds = time.monotonic() - t1
    ran = executed(report.results)
    if report.seconds > 0 and ran < len(report.results):
        run_n, forked = workers_run(report.results), workers_forked(report.results)
        report.notes.append(f"executed {ran:,} of {len(report.results):,} cases ({ran / report.seconds:.1f} "
                            f"executed cases/s, {run_n:,} workers" + (f", {run_n - forked:,} of them in long-lived "
                            f"processes" if forked < run_n else "") + ")")


def golden_result(workload: str, subject: str, golden: GoldenRun) -> CaseResult:
    """A golden run as a result of its own: case ``WORKLOAD/CONV/golden``, its invariants
    as verdicts, outcome ``fail`` when it breaks one (then it is no baseline, and no case
    of its conversation runs)."""
    result = CaseResult(Case(workload, golden.conversation, FaultPlan()), subject, "fail" if golden.broken else "pass",
                        verdicts=list(golden.verdicts), run_id=golden.run_id, seconds=golden.seconds)
    if golden.broken:
        checks = [v.check for v in golden.broken]
        what = golden_failure(checks) + ("" if checks == ["run.ends"] else f" ({', '.join(checks)})")
        result.error = f"the golden run {what}: it is no baseline, so no case of {golden.conversation} was run"
    return result


async def run_case_replayed(
    explorer: Explorer, case: Case, golden: GoldenRun, replay_failures: int = 0, hook: CaseHook | None = None,
) -> CaseResult:
    """Run ``case`` against ``golden``; when it fails an oracle check, run it again (the
    same case id, the same plan, on the same session) up to ``replay_failures`` times,
    stopping at the first replay whose outcome differs. A case whose replays all fail
    keeps outcome ``fail``; one whose replay disagrees becomes ``flaky`` (a race in the
    subject: a failure of the subject, not a deterministic one). A replay forks every
    worker of its own (:func:`.pool.fork_only`) unless the case's resume policy runs in a
    long-lived worker by design: a failure that a long-lived worker's earlier jobs may
    have caused is then replayed without them. The replays'
    own results are in ``result.replays``; the first run's verdicts stay the result's.
    A harness error is not replayed (it is the harness's failure, not the subject's).
    A passing case whose fault could not take effect is ``not-run``
    (:func:`.coverage.mark_not_run`), whichever path ran it (the pytest plugin's too).
    ``hook``: the case loop's pruning hook (:class:`.pruning.CrashStates`), given to
    every run of the case."""
    from .coverage import mark_not_run

    result = await explorer.run_case(case, golden, hook)
    mark_not_run(result)
    if result.outcome != "fail":
        return result
    fresh = not policy_of(case.resume).long_lived  # warm-worker, same-worker: resumed in one by design
    for _ in range(replay_failures):
        with fork_only() if fresh else contextlib.nullcontext():
            again = await explorer.run_case(case, golden, hook)
        result.replays.append(again)
        if again.outcome != "fail":
            result.outcome = "flaky"
            break
    return result


def _seeded_sample(indices: list[int], n: int, stream: str) -> list[int]:
    """``n`` of ``indices`` drawn with the random stream named ``stream`` (all of them when
    there are fewer), in order."""
    return indices if len(indices) <= n else sorted(random.Random(stream).sample(indices, n))


def _ranked_sample(found: list[Case], indices: list[int], n: int, stream: str) -> list[int]:
    """``n`` of ``indices`` (into ``found``; all of them when there are fewer): those whose
    case ids rank first by a draw of their own (the random stream ``stream:<case id>``), in
    order. A case is picked or not by its own draw and the ``n``-th best of the others, so
    a candidate more or fewer leaves the other picks as they were: the crash states of a
    workload with concurrent tool calls are not the same in every session (the golden
    runs' reads inside the concurrent stretch land at points of their timing), and a
    positional draw (:func:`_seeded_sample`) would then pick another set throughout."""
    if len(indices) <= n:
        return indices
    rank = {i: random.Random(f"{stream}:{found[i].id}").random() for i in indices}
    return sorted(sorted(indices, key=rank.__getitem__)[:n])


def _across_point_names(found: list[Case], n: int, stream: str) -> tuple[list[int], int]:
    """``n`` indices of ``found`` spread evenly over its crash point names (``log.append.before``,
    ``tool.request.before``...: a share each, in the order the names first appear, a name
    with fewer cases giving its spare to the others), each share drawn with its own random
    stream; in enumeration order, with the number of names."""
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(found):
        groups.setdefault(case.plan.faults[0].point.name, []).append(i)
    share = dict.fromkeys(groups, 0)
    left = min(n, len(found))
    while left:
        for name, members in groups.items():
            if left and share[name] < len(members):
                share[name] += 1
                left -= 1
    chosen = [i for name, members in groups.items() for i in _seeded_sample(members, share[name], f"{stream}:{name}")]
    return sorted(chosen), len(groups)


def sample_by_policy(workload: str, goldens: Mapping[str, GoldenRun], per_policy: Mapping[str, int],
                     sources: tuple[str, ...], seed: int = 0, *,
                     states: Mapping[str, Sequence[int]] | None = None) -> tuple[list[Case], str]:
    """For each resume policy of ``per_policy`` (a :meth:`.plan.Resume.parse` spec, e.g.
    ``"concurrent"``), a seeded sample of that many cases of ``goldens`` of the policy's
    kind (:attr:`.policies.Policy.sampled_kind`: kill; cancel for ``same-worker``) resumed
    under it, at most one per crash state (:func:`.pruning.crash_state_groups`: the first point
    of each; a golden run without I/O marks gives every point its own), in enumeration
    order; deterministic as :func:`sample_by_kind`, and a crash state more or fewer changes
    at most one pick (:func:`_ranked_sample`). A long stretch of points that leave one
    state (a model call's) would otherwise take most of the sample, and the states a
    policy's defects live in (an effect started and not yet answered, a record not yet
    appended) are a point or two each. A kind the worker outlives (cancel) is spread over
    the crash point names instead (:func:`_across_point_names`): what it leaves depends on
    where the cancellation lands, at the next await (inside the append's statement after
    ``log.append.before``, in the provider's request after ``tool.request.before``), not on
    the durable writes that group kill points, and a kill state's first point is never a
    ``*.before`` one. Returns the cases and a note (``"sampled resume policies (seed 0;
    --resume runs a policy at every point): concurrent 24 of 114 crash states (367 kill
    cases), same-worker 24 of 367 cancel cases, across 12 crash point names"``). Raises
    ``PlanError`` for a bad spec. ``states``: conversation -> the crash state of each
    trace entry (:func:`.defaults.crash_states`), for goldens that carry a trace only
    (the pytest plugin's cache); default: computed from each golden run's I/O marks."""
    from .defaults import crash_states

    state_of: dict[str, dict[tuple[str, str, int], int]] = {}
    for conv, golden in goldens.items():
        own = states.get(conv) if states is not None else None
        state_of[conv] = {tuple(e[1:]): i for e, i in zip(golden.trace, crash_states(golden) if own is None else own)}
    out: list[Case] = []
    parts = []
    for spec, n in per_policy.items():
        resume = Resume.parse(spec)
        kind = policy_of(resume).sampled_kind
        found = enumerate_cases(workload, dict(goldens), (kind,), sources, resume)
        if faults.kind(kind).survives:  # where the cancellation lands decides, not the durable writes
            chosen, names = _across_point_names(found, n, f"{seed}:resume:{spec}")
            out += [found[i] for i in chosen]
            parts.append(f"{spec} {len(chosen)} of {len(found)} {kind} cases, across {names} crash point names")
            continue
        firsts: list[int] = []
        seen: set[tuple[str, int]] = set()
        for i, case in enumerate(found):
            state = state_of.get(case.conversation, {}).get(case.plan.faults[0].point.key)
            key = (case.conversation, state if state is not None else -1 - i)
            if key not in seen:
                seen.add(key)
                firsts.append(i)
        chosen = _ranked_sample(found, firsts, n, f"{seed}:resume:{spec}")
        out += [found[i] for i in chosen]
        parts.append(f"{spec} {len(chosen)} of {len(firsts)} crash states ({len(found)} {kind} cases)")
    return out, f"sampled resume policies (seed {seed}; --resume runs a policy at every point): " + ", ".join(parts)


def sample_by_kind(cases: list[Case], per_kind: Mapping[str, int], seed: int = 0) -> tuple[list[Case], str]:
    """Of ``cases``, keep for each kind of ``per_kind`` a seeded sample of that many cases
    (all of them when there are fewer), in their enumeration order; cases of other kinds
    are dropped. Deterministic: the same cases, counts and ``seed`` give the same sample.
    Returns the sample and a note for the report (``"sampled kinds (seed 0): pause 24 of
    363, ..."``)."""
    by_kind: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        by_kind.setdefault(case.plan.faults[0].kind, []).append(i)
    keep: list[int] = []
    parts = []
    for kind, n in per_kind.items():
        found = by_kind.get(kind, [])
        chosen = _seeded_sample(found, n, f"{seed}:{kind}")
        keep += chosen
        parts.append(f"{kind} {len(chosen)} of {len(found)}")
    return [cases[i] for i in sorted(keep)], (f"sampled kinds (seed {seed}; --kinds runs a kind at every point): "
                                              + ", ".join(parts))


async def run_cases(
    explorer: Explorer, cases: list[Case], goldens: dict[str, GoldenRun], jobs: int,
    on_result: Callable[[CaseResult], None] | None = None, *, stop: Callable[[CaseResult], bool] | None = None,
    replay_failures: int = 0,
) -> list[CaseResult]:
    """Run ``cases`` on ``explorer``'s session, ``jobs`` at a time, each against the
    golden run of its conversation; results in case order. ``on_result`` sees each as
    it finishes (after its replays); once ``stop(result)`` returns True no further case
    starts (those in flight finish and are returned). ``replay_failures``: replays of
    each failing case (:func:`run_case_replayed`; 0: none). Pruned as
    ``explorer.options.prune`` says (:func:`.runner.run_loop`: kill cases grouped by
    crash state, resumes shared); ``Options.prune`` :data:`.pruning.OFF` runs every case
    whole.

    Cancelled (Ctrl-C, SIGTERM: :mod:`.cli`), it raises ``CancelledError`` once the
    cases in flight have unwound; what finished before was given to ``on_result``."""
    if replay_failures < 0:
        raise PlanError(f"replay_failures={replay_failures!r} must be >= 0")
    from .runner import run_loop

    results, _ = await run_loop(explorer, cases, goldens, jobs, on_result, stop=stop, replay_failures=replay_failures)
    return results
