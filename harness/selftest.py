"""``crashmatrix selftest``: prove, on this machine, that the harness catches the known
defect classes: every mutant of the catalogue is caught by a check it names, and the
clean runtime it is a variant of passes the same cases.

For each workload the catalogue uses, one session (one PostgreSQL, one set of providers,
one zygote that preloads every subject involved) serves every subject in turn through
:meth:`~crashmatrix.harness.explorer.Explorer.for_subject`:

1. the baselines (``reference``, and whatever clean subject a mutant names as its
   ``baseline``) run their golden runs;
2. each mutant runs its golden runs, then its matrix: the default fault kinds and point
   sources plus the ones its metadata names (``fault_kinds``, ``point_sources``); a case
   *catches* the mutant when it fails a check in the mutant's ``caught_by``;
3. each baseline runs the cases that caught its mutants (``fast``; a catch at a point
   only the mutant's trace has is reported as skipped), or the whole matrix of every
   kind and source its mutants needed (full mode), and must pass them all.

Full mode runs every case, on every conversation of the workload. ``fast`` (CI) runs the
mutant's own ``conversations`` only, stops each mutant at its first catch, and orders
its cases so the likely catchers run first (:func:`fast_order`: from the metadata and
the golden runs, never a case id per mutant).

Time to first detection: wall seconds from the moment the mutant's turn began (its
golden runs included) to the end of the first case that caught it.

Exit codes (:attr:`SelftestReport.exit_code`): 0 every mutant caught and every baseline
case passed; 1 a mutant missed or a baseline case failed; 3 otherwise a harness error
left something unjudged (a golden run that did not complete, a baseline case that
could not run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import registry
from .errors import CrashmatrixError, HarnessError, InvalidArgument, PlanError, RegistryError
from .enumeration import enumerate_cases, validate_case
from .case import CaseResult
from .explorer import Explorer, Options
from .golden import GoldenRun, first_departures, per_task
from .matrix import NON_EVENTS, run_cases
from .fault_registry import names as fault_kinds
from .plan import DEFAULT_KINDS, DEFAULT_SOURCES, POINT_SOURCES, RESUME_POLICIES, Case, Resume
from .session import open_session

MUTANT_PREFIX = "defect:"


@dataclass(frozen=True)
class MutantSpec:
    """One mutant of the catalogue and its metadata (``scenarios/defects/_base.py``).

    ``subject``: its registry name (``defect:NAME``); ``caught_by``: the checks any one
    of which catches it; ``fault_kinds`` / ``point_sources``: what reaches it, most
    telling first; ``conversations``: the smallest set that reaches it; ``baseline``:
    the clean subject it is a variant of; ``resume_policies``: the resume policies its
    cases run under (:mod:`.policies`)."""

    subject: str
    defect: str
    source: str
    caught_by: tuple[str, ...]
    fault_kinds: tuple[str, ...]
    point_sources: tuple[str, ...]
    conversations: tuple[str, ...]
    workload: str
    baseline: str
    resume_policies: tuple[str, ...] = ("default",)
    #: a mutant of a deploy (a defective new build): the build spec its runs crash
    #: under, and the source tree of its own build (:mod:`.builds`); None otherwise
    crash_with: str | None = None
    build_path: str | None = None

    @property
    def name(self) -> str:
        return self.subject.removeprefix(MUTANT_PREFIX)

    @property
    def session_subject(self) -> str:
        """What its session runs: the subject, or for a mutant of a deploy the pair
        ``crash_with`` >> the mutant (from ``build_path`` when it has one)."""
        if self.crash_with is None:
            return self.subject
        from .builds import pair

        return pair(self.crash_with, f"{self.subject}@{self.build_path}" if self.build_path else self.subject)


def mutant_spec(name: str) -> MutantSpec:
    """The metadata of mutant ``name`` (``NAME`` or ``defect:NAME``). Raises
    :class:`~crashmatrix.harness.errors.RegistryError` for an unregistered name and
    :class:`InvalidArgument` listing every missing or malformed attribute at once."""
    subject = name if name.startswith(MUTANT_PREFIX) else MUTANT_PREFIX + name
    if subject not in registry.subject_names():
        known = ", ".join(n.removeprefix(MUTANT_PREFIX) for n in mutant_names())
        raise RegistryError(f"mutant={name!r} is not in the catalogue; known: {known}")
    adapter = registry.subject(subject)
    problems: list[str] = []

    def text(attr: str, default: str | None = None) -> str:
        value = getattr(adapter, attr, default)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{attr} must be a non-empty string (got {value!r})")
            return ""
        return value

    def names(attr: str, allowed: Sequence[str] | None, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        value = getattr(adapter, attr, default)
        if not isinstance(value, tuple | list) or not value or not all(isinstance(v, str) for v in value):
            problems.append(f"{attr} must be a non-empty tuple of names (got {value!r})")
            return ()
        bad = [v for v in value if allowed is not None and v not in allowed]
        if bad:
            problems.append(f"{attr}={tuple(value)!r}: {', '.join(map(repr, bad))} not one of {', '.join(allowed or ())}")
        return tuple(value)

    workload = text("workload", "checkout")
    conversations: Sequence[str] | None = None
    if workload:
        try:
            conversations = registry.workload(workload).conversations
        except CrashmatrixError as exc:
            problems.append(str(exc))
    baseline = text("baseline", "reference")
    if baseline:
        from .builds import check_subject

        try:
            check_subject(baseline)  # a registered subject, or a clean build pair
        except CrashmatrixError as exc:
            problems.append(f"baseline={baseline!r} is not a registered subject or build pair ({exc})")
    crash_with = getattr(adapter, "crash_with", None)
    build_path = getattr(adapter, "build_path", None)
    for attr, value in (("crash_with", crash_with), ("build_path", build_path)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            problems.append(f"{attr} must be None or a non-empty string (got {value!r})")
    spec = MutantSpec(
        subject, text("defect"), text("source"), names("caught_by", None), names("fault_kinds", fault_kinds()),
        names("point_sources", POINT_SOURCES, DEFAULT_SOURCES), names("conversations", conversations, ("conv1",)),
        workload, baseline, names("resume_policies", RESUME_POLICIES, ("default",)), crash_with, build_path,
    )
    if problems:
        raise InvalidArgument(f"mutant {subject} ({type(adapter).__name__}): " + "; ".join(problems))
    return spec


def mutant_names() -> list[str]:
    """Every registered mutant's subject name, sorted."""
    return [n for n in registry.subject_names() if n.startswith(MUTANT_PREFIX)]


def catalogue(names: Sequence[str] | None = None) -> list[MutantSpec]:
    """The specs of the mutants named (default: all), in catalogue order; raises as
    :func:`mutant_spec` does, for the first bad name."""
    return [mutant_spec(n) for n in (names or mutant_names())]


# -- the order in which --fast runs a mutant's cases ----------------------------------


def _spread(n: int) -> list[int]:
    """A permutation of ``range(n)`` that visits the beginning, the middle and the end
    early (bit-reversed positions: 0, n/2, n/4, 3n/4, ...)."""
    bits = max(1, (n - 1).bit_length())
    order = sorted(range(1 << bits), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2))
    return [i for i in order if i < n]


def _departures(mutant: list[tuple[str, str, str, int]], baseline: list[tuple[str, str, str, int]] | None) -> set[tuple[str, str, int]]:
    """Points (name, task, occurrence) of ``mutant``'s trace from the first place, per
    logical task, where it departs from ``baseline``'s trace (its change is there)."""
    if baseline is None:
        return set()
    mine = per_task(mutant)
    return {(name, stream[0], occ) for stream, i in first_departures(per_task(baseline), mine).items()
            for name, occ in mine[stream][i:]}


def fast_order(cases: list[Case], spec: MutantSpec, goldens: dict[str, GoldenRun],
               baseline_goldens: dict[str, GoldenRun] | None = None) -> list[Case]:
    """``cases`` (one fault each, as :func:`enumerate_cases` makes them) reordered so
    the likely catchers of ``spec`` come first. Keys, in order:

    1. the fault kind, in the order of ``spec.fault_kinds`` (other kinds after);
    2. points of a source in ``spec.point_sources`` before the others;
    3. points where the mutant's golden trace departs from its baseline's (per logical
       task, from the first difference on: a mutant that writes something the clean
       runtime does not, labelled like the runtime labels its writes, shows there);
    4. points of logical tasks that made an effect in the golden run (docs/design.md: the
       expensive bugs live around effects);
    5. within each group, spread over the run (:func:`_spread`), since a defect tends
       to show in one region of the run.

    Deterministic: the same inputs give the same order."""

    def rank(items: tuple[str, ...], value: str) -> int:
        return items.index(value) if value in items else len(items)

    theirs = baseline_goldens or {}
    departs = {conv: _departures(g.trace, theirs[conv].trace if conv in theirs else None) for conv, g in goldens.items()}
    effect_tasks = {conv: {e.node_id for e in (g.evidence.observation.effects or [])} for conv, g in goldens.items()}

    def group(case: Case) -> tuple[int, ...]:
        fault = case.plan.faults[0]
        p = fault.point
        return (rank(spec.fault_kinds, fault.kind), 0 if p.source in spec.point_sources else 1,
                0 if (p.name, p.task, p.occurrence) in departs.get(case.conversation, set()) else 1,
                0 if p.task in effect_tasks.get(case.conversation, set()) else 1)

    groups: dict[tuple[int, ...], list[Case]] = {}
    for case in cases:
        groups.setdefault(group(case), []).append(case)
    out: list[Case] = []
    for key in sorted(groups):
        members = groups[key]
        out += [members[i] for i in _spread(len(members))]
    return out


# -- outcomes --------------------------------------------------------------------------


@dataclass
class SubjectOutcome:
    """What one subject (a mutant, or a baseline) did in the selftest.

    ``first_catch``: the first case (in completion order) that failed a check of the
    mutant's ``caught_by``; ``first_catch_seconds``: wall seconds from the start of the
    subject's turn (golden runs included) to its end; ``error``: why the subject could
    not be judged (its golden run did not complete)."""

    subject: str
    spec: MutantSpec | None
    results: list[CaseResult] = field(default_factory=list)
    #: a baseline's cases that could not run on it: a mutant's catch at a point only the
    #: mutant has (its golden trace departs there), with why
    skipped: dict[str, str] = field(default_factory=dict)
    first_catch: CaseResult | None = None
    first_catch_seconds: float | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def is_mutant(self) -> bool:
        return self.spec is not None

    @property
    def catching_check(self) -> str | None:
        """The first failed check of the first catch that the mutant names."""
        if self.first_catch is None or self.spec is None:
            return None
        return next(v.check for v in self.first_catch.failed if v.check in self.spec.caught_by)

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(r.outcome for r in self.results)
        return {"pass": c["pass"], "fail": c["fail"], "harness-error": c["harness-error"]}

    @property
    def ok(self) -> bool:
        """A mutant: caught. A baseline: ran and passed every case (a case that tested
        nothing, not run or not applicable, is no failure)."""
        if self.error is not None:
            return False
        if self.spec is not None:
            return self.first_catch is not None
        return all(r.outcome == "pass" or r.outcome in NON_EVENTS for r in self.results)

    def failed_checks(self) -> dict[str, int]:
        """Failed check -> number of cases it failed in."""
        return dict(sorted(Counter(v.check for r in self.results for v in r.failed).items()))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "subject": self.subject, "role": "mutant" if self.spec else "baseline", "ok": self.ok,
            "cases": {**self.counts, "run": len(self.results)}, "failed_checks": self.failed_checks(),
            "seconds": round(self.seconds, 3), "error": self.error,
        }
        if self.spec is not None:
            out.update({
                "defect": self.spec.defect, "source": self.spec.source, "caught_by": list(self.spec.caught_by),
                "baseline": self.spec.baseline, "caught": self.first_catch is not None,
                "first_case": self.first_catch.case.id if self.first_catch else None,
                "check": self.catching_check,
                "seconds_to_detection": round(self.first_catch_seconds, 3) if self.first_catch_seconds is not None else None,
                "replay": self.first_catch.replay if self.first_catch else None,
            })
        else:
            out["skipped"] = self.skipped
            out["failures"] = [{"case": r.case.id, "outcome": r.outcome, "checks": [v.check for v in r.failed],
                                "error": r.error, "replay": r.replay} for r in self.results
                               if r.outcome != "pass" and r.outcome not in NON_EVENTS]
        return out


@dataclass
class SelftestReport:
    """Every subject's outcome: mutants in catalogue order, then the baselines."""

    fast: bool
    mutants: list[SubjectOutcome] = field(default_factory=list)
    baselines: list[SubjectOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 all caught and clean; 1 a mutant missed or a baseline case failed; 3 a
        harness error left something unjudged."""
        if any(m.error is None and m.first_catch is None for m in self.mutants) or any(
                r.outcome == "fail" for b in self.baselines for r in b.results):
            return 1
        if not all(s.ok for s in self.mutants + self.baselines):
            return 3
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "fast" if self.fast else "full", "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
            "mutants": [m.to_dict() for m in self.mutants], "baselines": [b.to_dict() for b in self.baselines],
        }

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_dict` to ``path`` (atomically: a temporary file, then rename)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


# -- running ---------------------------------------------------------------------------


def _union(*groups: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for g in groups for x in g))


async def _goldens(explorer: Explorer, conversations: Sequence[str]) -> dict[str, GoldenRun]:
    """The golden runs; raises :class:`HarnessError` for one the subject did not complete
    (``run.ends``): a subject the selftest cannot judge (``SubjectOutcome.error``)."""
    goldens = {c: await explorer.golden(c) for c in conversations}
    for g in goldens.values():
        if g.incomplete:
            raise HarnessError(g.incomplete)
    return goldens


async def run_selftest(
    mutants: Sequence[str] | None = None,
    *,
    fast: bool = False,
    jobs: int | None = None,
    dsn: str | None = None,
    options: Options | None = None,
    on_outcome: Callable[[SubjectOutcome], None] | None = None,
    on_case: Callable[[str, CaseResult], None] | None = None,
) -> SelftestReport:
    """Run the selftest (module docstring) on the mutants named (default: the whole
    catalogue). ``on_outcome`` sees each subject's outcome as it completes, ``on_case``
    each case's result with its subject (progress display). Raises
    ``RegistryError``/``InvalidArgument`` for a bad mutant name or metadata and
    ``ServiceError`` when services cannot start, before any case runs."""
    specs = catalogue(mutants)
    jobs = jobs or 2 * (os.cpu_count() or 1)
    report = SelftestReport(fast)
    t0 = time.monotonic()
    by_workload: dict[str, list[MutantSpec]] = {}
    for spec in specs:
        if spec.crash_with is None:
            by_workload.setdefault(spec.workload, []).append(spec)
    for workload, group in by_workload.items():
        await _run_workload(workload, group, report, fast=fast, jobs=jobs, dsn=dsn, options=options,
                            on_outcome=on_outcome, on_case=on_case)
    deploys = [s for s in specs if s.crash_with is not None]
    if deploys:
        await _run_deploys(deploys, report, fast=fast, jobs=jobs, dsn=dsn, options=options, on_outcome=on_outcome,
                           on_case=on_case)
    report.mutants.sort(key=lambda m: specs.index(m.spec))  # type: ignore[arg-type]
    report.seconds = time.monotonic() - t0
    return report


async def _run_workload(
    workload: str, specs: list[MutantSpec], report: SelftestReport, *, fast: bool, jobs: int, dsn: str | None,
    options: Options | None, on_outcome: Callable[[SubjectOutcome], None] | None,
    on_case: Callable[[str, CaseResult], None] | None,
) -> None:
    conversations_all = registry.workload(workload).conversations
    baselines = _union([s.baseline for s in specs])
    subjects = _union(baselines, [s.subject for s in specs])
    if any("await" in s.point_sources for s in specs) and not (options and options.await_points):
        options = dataclasses.replace(options or Options(), await_points=True)
    async with open_session(subjects[0], workload, dsn=dsn, options=options, preload=subjects[1:]) as session:
        async with contextlib.AsyncExitStack() as stack:
            clean: dict[str, Explorer] = {}
            clean_goldens: dict[str, dict[str, GoldenRun]] = {}
            clean_outcomes: dict[str, SubjectOutcome] = {}
            for b in baselines:
                clean[b] = await stack.enter_async_context(session.for_subject(b))
                clean_outcomes[b] = SubjectOutcome(b, None)
                convs = _union(*[s.conversations for s in specs if s.baseline == b]) if fast else conversations_all
                try:
                    clean_goldens[b] = await _goldens(clean[b], convs)
                except HarnessError as exc:
                    clean_outcomes[b].error = str(exc)
            for spec in specs:
                outcome = await _run_mutant(session, spec, clean_goldens.get(spec.baseline), fast=fast, jobs=jobs,
                                            conversations=spec.conversations if fast else conversations_all,
                                            on_case=on_case)
                report.mutants.append(outcome)
                if on_outcome:
                    on_outcome(outcome)
            for b in baselines:
                outcome = clean_outcomes[b]
                t0 = time.monotonic()
                if outcome.error is None:
                    mine = [s for s in specs if s.baseline == b]
                    if fast:
                        cases = []
                        seen: dict[str, str] = {}  # a catch as the baseline runs it -> its first catch's id
                        for case in {m.first_catch.case.id: m.first_catch.case for m in report.mutants
                                     if m.spec in mine and m.first_catch is not None}.values():
                            mine_case = dataclasses.replace(case, upgrade=getattr(clean[b].upgrade, "label", None))
                            if mine_case.id in seen:  # catches of two pairs at one point: one case here
                                outcome.skipped[case.id] = f"the same case on this baseline as {seen[mine_case.id]}"
                                continue
                            seen[mine_case.id] = case.id
                            try:
                                validate_case(case, clean_goldens[b])
                                cases.append(case)
                            except PlanError as exc:
                                outcome.skipped[case.id] = str(exc)
                    else:
                        cases = [c for policy in _union(*[s.resume_policies for s in mine])
                                 for c in enumerate_cases(workload, clean_goldens[b],
                                                          _union(DEFAULT_KINDS, *[s.fault_kinds for s in mine]),
                                                          _union(DEFAULT_SOURCES, *[s.point_sources for s in mine]),
                                                          Resume(policy))]
                    report_case = (lambda r, b=b: on_case(b, r)) if on_case else None
                    if fast:  # each catch run whole on the clean runtime: a handful, never pruned
                        from .pruning import OFF
                        from .runner import run_loop

                        outcome.results, _ = await run_loop(clean[b], cases, clean_goldens[b], jobs, report_case,
                                                            options=OFF)
                    else:
                        outcome.results = await run_cases(clean[b], cases, clean_goldens[b], jobs, report_case)
                outcome.seconds = time.monotonic() - t0
                report.baselines.append(outcome)
                if on_outcome:
                    on_outcome(outcome)


async def _run_deploys(
    specs: list[MutantSpec], report: SelftestReport, *, fast: bool, jobs: int, dsn: str | None,
    options: Options | None, on_outcome: Callable[[SubjectOutcome], None] | None,
    on_case: Callable[[str, CaseResult], None] | None,
) -> None:
    """The mutants of a deploy (``crash_with``): each in a session of its own pair (one
    zygote per build: :mod:`.builds`), then each baseline pair on the cases that caught
    its mutants (relabelled with its own builds) or on its whole matrix."""
    from .builds import label_cases

    for spec in specs:
        conversations = spec.conversations if fast else registry.workload(spec.workload).conversations
        async with open_session(spec.session_subject, spec.workload, dsn=dsn, options=options) as explorer:
            outcome = await _run_mutant(explorer, spec, None, fast=fast, jobs=jobs, conversations=conversations,
                                        on_case=on_case, own_session=True)
        report.mutants.append(outcome)
        if on_outcome:
            on_outcome(outcome)
    for (baseline, workload) in dict.fromkeys((s.baseline, s.workload) for s in specs):
        mine = [s for s in specs if s.baseline == baseline and s.workload == workload]
        outcome, t0 = SubjectOutcome(baseline, None), time.monotonic()
        convs = _union(*[s.conversations for s in mine]) if fast else registry.workload(workload).conversations
        async with open_session(baseline, workload, dsn=dsn, options=options) as explorer:
            try:
                goldens = await _goldens(explorer, convs)
            except HarnessError as exc:
                outcome.error = str(exc)
            else:
                if fast:
                    catches = [m.first_catch.case for m in report.mutants if m.spec in mine and m.first_catch]
                    cases = []
                    seen: dict[str, str] = {}  # a catch as this baseline runs it -> its first catch's id
                    for catch, case in zip(catches, label_cases(catches, explorer.upgrade)):
                        if case.id in seen:  # catches of two build pairs at one point: one case here
                            if catch.id != seen[case.id]:
                                outcome.skipped[catch.id] = f"the same case on this baseline as {seen[case.id]}"
                            continue
                        seen[case.id] = catch.id
                        try:
                            validate_case(case, goldens)
                            cases.append(case)
                        except PlanError as exc:
                            outcome.skipped[case.id] = str(exc)
                else:
                    cases = label_cases(enumerate_cases(workload, goldens, _union(DEFAULT_KINDS, *[s.fault_kinds for s in mine]),
                                                        _union(DEFAULT_SOURCES, *[s.point_sources for s in mine])),
                                        explorer.upgrade)
                outcome.results = await run_cases(explorer, cases, goldens, jobs,
                                                  (lambda r: on_case(baseline, r)) if on_case else None)
        outcome.seconds = time.monotonic() - t0
        report.baselines.append(outcome)
        if on_outcome:
            on_outcome(outcome)


async def _run_mutant(session: Explorer, spec: MutantSpec, baseline_goldens: dict[str, GoldenRun] | None, *,
                      fast: bool, jobs: int, conversations: Sequence[str],
                      on_case: Callable[[str, CaseResult], None] | None = None,
                      own_session: bool = False) -> SubjectOutcome:
    outcome = SubjectOutcome(spec.subject, spec)
    t0 = time.monotonic()

    def catches(result: CaseResult) -> bool:
        return result.outcome == "fail" and any(v.check in spec.caught_by for v in result.failed)

    def on_result(result: CaseResult) -> None:
        if outcome.first_catch is None and catches(result):
            outcome.first_catch, outcome.first_catch_seconds = result, time.monotonic() - t0
        if on_case:
            on_case(spec.subject, result)

    from .builds import label_cases

    async with (contextlib.nullcontext(session) if own_session else session.for_subject(spec.subject)) as explorer:
        try:
            goldens = await _goldens(explorer, conversations)
        except HarnessError as exc:
            outcome.error = str(exc)
            outcome.seconds = time.monotonic() - t0
            return outcome
        cases = label_cases([c for policy in spec.resume_policies
                             for c in enumerate_cases(spec.workload, goldens, _union(spec.fault_kinds, DEFAULT_KINDS),
                                                      _union(spec.point_sources, DEFAULT_SOURCES), Resume(policy))],
                            explorer.upgrade)
        if fast:
            cases = fast_order(cases, spec, goldens, baseline_goldens)
        outcome.results = await run_cases(explorer, cases, goldens, jobs, on_result, stop=catches if fast else None)
    outcome.seconds = time.monotonic() - t0
    return outcome


# -- the table -------------------------------------------------------------------------


def selftest_table(report: SelftestReport) -> Any:
    """The rich table: one row per mutant (caught or missed, the first case that caught
    it, the check, time to first detection, cases run and failed), then one per
    baseline (cases passed)."""
    from rich.markup import escape
    from rich.table import Table

    mode = "fast: each mutant stops at its first catch" if report.fast else "full matrix"
    table = Table(title=f"crashmatrix selftest ({mode})")
    for name, justify in (("mutant", "left"), ("verdict", "left"), ("first case that caught it", "left"),
                          ("check", "left"), ("detection s", "right"), ("cases run / failed", "right")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for m in report.mutants:
        if m.error is not None:
            verdict = "[yellow]error[/yellow]"
        else:
            verdict = "[green]caught[/green]" if m.first_catch else "[red]MISSED[/red]"
        c = m.counts
        table.add_row(
            escape(m.spec.name if m.spec else m.subject), verdict,
            escape(m.first_catch.case.id) if m.first_catch else escape((m.error or "-").splitlines()[0][:60]),
            escape(m.catching_check or "-"),
            f"{m.first_catch_seconds:.2f}" if m.first_catch_seconds is not None else "-",
            f"{len(m.results)} / {c['fail']}" + (f" (+{c['harness-error']} harness errors)" if c["harness-error"] else ""))
    table.add_section()
    for b in report.baselines:
        c = b.counts
        if b.error is not None:
            verdict, detail = "[yellow]error[/yellow]", escape(b.error.splitlines()[0][:60])
        elif b.ok:
            verdict, detail = "[green]clean[/green]", f"passed {c['pass']}/{len(b.results)} case(s)" + (
                f"; {len(b.skipped)} catch(es) at a point only the mutant has" if b.skipped else "")
        else:
            verdict, detail = "[red]FAILED[/red]", f"{c['fail']} failed, {c['harness-error']} harness errors"
        table.add_row(escape(f"{b.subject} (baseline)"), verdict, detail, "-", "-", f"{len(b.results)} / {c['fail']}")
    return table
