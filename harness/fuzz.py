"""Hypothesis fuzzing of resume paths: fault plans drawn, run, judged, shrunk.

The matrix (:mod:`.explorer`) puts one fault at every crash point. Schedules nobody
would write by hand (a kill, then a SIGTERM during the recovery, then a cancel during
the recovery of the recovery) come from drawing them: :func:`fault_plans` is a
Hypothesis strategy of :class:`~.plan.FaultPlan`, and :func:`resume_property` a
ready-made pytest test that draws plans, runs each as a case on live services and
applies the oracle::

    from crashmatrix.harness.fuzz import resume_property

    test_resume_paths = resume_property("checkout", subject="reference", conversation="conv1", max_faults=3)

**Plan semantics** (:mod:`.plan`): fault *i* is armed in the *i*-th worker of the case.
So the first fault's point is drawn from the golden trace, and fault *i + 1*'s from the
trace of the first resume that ran after the first *i* faults (that resume's own
trace, not the golden run's: a recovery passes other points), as
:func:`.enumeration.double_fault_cases` does for depth 2. Any kind may follow any kind
(:mod:`.faults`: a pause's successor takes the run over while it sleeps). A ``net``
fault (a toxic on one link, healed by the plan) is drawn at a point where a link is in
use, with one of the network section's toxics for that point (:func:`net_toxics_of`),
first or later: a later one at a resume's point that has toxics.

**Shrinking** goes toward fewer faults (the count is drawn first, from ``min_faults``),
earlier points (a point is an index into its trace, shrinking toward 0: the first point
of the run) and simpler kinds (kinds are ordered simplest first by their
:attr:`~.faults.FaultKind.rank`, :func:`order_kinds`, and drawn with ``sampled_from``,
which shrinks toward the first).

**Failures** print the minimal plan as JSON and as a replay command (and a ``run
--plan`` line), and Hypothesis stores the failing example in its example database
(``.hypothesis/examples`` unless configured), so the next run replays it first.

**Settings**: cases are slow and vary in duration, so there is no per-example
deadline. Two profiles are registered: ``crashmatrix-ci`` (20 examples, bounded; used
by :func:`resume_property` automatically when the ``CI`` environment variable is set
and no ``crashmatrix-*`` profile was loaded) and ``crashmatrix-nightly`` (500
examples); load one with ``--hypothesis-profile=crashmatrix-nightly``.

**Seeds**: when a seed is given (``--crashmatrix-seed N``, its ini key or environment
variable), it seeds the draws (Hypothesis's ``@seed``), so the run repeats exactly;
Hypothesis writes no example database for a seeded run (its rule for ``@seed`` and
``--hypothesis-seed``). When none is given, Hypothesis draws its own, saves failures in
the database and prints the ``@reproduce_failure`` blob; the plugin's drawn seed,
shown in the header, still drives the fault proxy. Hypothesis' stateful machinery is
not used: it does not run async rules, and the harness drives the async subject
itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, event, given, seed, settings
from hypothesis import strategies as st

from . import faults as _faults
from .errors import InvalidArgument
from .case import CaseResult
from .golden import GoldenRun
from .history import Trace
from .plan import DEFAULT_KINDS, DEFAULT_SOURCES, Case, CrashPoint, Fault, FaultPlan, NetToxic

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Parent: Hypothesis's own "default" profile, never the "ci" one it loads itself under CI
# (derandomized, no database): our failures must land in the example database.
# No "explain" phase: it re-runs variations of the failing example, each a case.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
settings.register_profile(
    "crashmatrix-ci", parent=settings.get_profile("default"), max_examples=20, deadline=None, print_blob=True,
    derandomize=False, phases=_PHASES, suppress_health_check=_SLOW_OK)
settings.register_profile(
    "crashmatrix-nightly", parent=settings.get_profile("default"), max_examples=500, deadline=None, print_blob=True,
    derandomize=False, phases=_PHASES, suppress_health_check=_SLOW_OK)


def order_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """``kinds`` deduplicated and ordered simplest first, by each registered kind's
    :attr:`~.faults.FaultKind.rank` (kill 0: a plain death; term: a drain; cancel:
    cancellation at every await; pause: a second worker and a zombie; net: a toxic that
    lasts until healed; db-restart 5: the database goes down); equal ranks and kinds
    not registered keep their given order, the latter last."""
    unique = list(dict.fromkeys(kinds))
    def rank(k: str) -> tuple[int, int, int]:
        known = _faults.KINDS.get(k)
        return (0 if known else 1, known.rank if known else 0, unique.index(k))
    return tuple(sorted(unique, key=rank))


def _points(trace: Sequence[Sequence[Any]], sources: tuple[str, ...]) -> list[CrashPoint]:
    seen: dict[tuple[str, str, int], CrashPoint] = {}
    for source, name, task, occ in trace:
        if source in sources and (name, task, occ) not in seen:
            seen[(name, task, occ)] = CrashPoint(source, name, task, occ)
    return list(seen.values())


def _checked_kinds(
    kinds: Sequence[str] | None,
    min_faults: int,
    max_faults: int,
    resume_trace: Callable[[FaultPlan], Sequence[Sequence[Any]] | None] | None,
    net_toxics: Callable[[CrashPoint], Sequence[NetToxic]] | None,
) -> tuple[str, ...]:
    """:func:`fault_plans`' arguments checked: the kinds to draw, simplest first
    (every kind this build injects when ``kinds`` is None, ``net`` only with
    ``net_toxics``). Raises :class:`~.errors.InvalidArgument` on a bad fault count,
    ``max_faults > 1`` without ``resume_trace``, an unknown or undrawable kind, no
    kind, or ``net`` without ``net_toxics``."""
    if not isinstance(min_faults, int) or min_faults < 1:
        raise InvalidArgument(f"min_faults={min_faults!r} must be an integer >= 1")
    if not isinstance(max_faults, int) or max_faults < min_faults:
        raise InvalidArgument(f"max_faults={max_faults!r} must be an integer >= min_faults={min_faults}")
    if max_faults > 1 and resume_trace is None:
        raise InvalidArgument(f"max_faults={max_faults} needs resume_trace: later faults land in the resume's own trace")
    if kinds is None:
        kinds = [k for k in _faults.names() if k != "net" or net_toxics is not None]
    kinds_t = order_kinds(kinds)
    unknown = [k for k in kinds_t if k not in _faults.names()]
    if unknown or not kinds_t:
        raise InvalidArgument(f"kinds={tuple(kinds or ())!r} must be non-empty, each one of {', '.join(_faults.names())}")
    if "net" in kinds_t and net_toxics is None:
        raise InvalidArgument("kinds with 'net' need net_toxics= (the toxics that may land at a point)")
    undrawable = [k for k in kinds_t if k != "net" and not _faults.kind(k).bare]
    if undrawable:
        raise InvalidArgument(f"kinds={kinds_t!r}: {', '.join(undrawable)} need(s) more than a point and cannot be drawn")
    return kinds_t


def fault_plans(
    golden_trace: Sequence[Sequence[Any]],
    *,
    kinds: Sequence[str] | None = None,
    sources: Sequence[str] = DEFAULT_SOURCES,
    min_faults: int = 1,
    max_faults: int = 1,
    resume_trace: Callable[[FaultPlan], Sequence[Sequence[Any]] | None] | None = None,
    net_toxics: Callable[[CrashPoint], Sequence[NetToxic]] | None = None,
) -> st.SearchStrategy[FaultPlan]:
    """A strategy of fault plans of ``min_faults`` to ``max_faults`` faults.

    - ``golden_trace``: the golden run's trace (entries ``(source, name, task,
      occurrence)``, :attr:`.golden.GoldenRun.trace`); the first fault lands at one of
      its points of the given ``sources``.
    - ``kinds``: the fault kinds to draw (default: every kind this build injects,
      :func:`.faults.names`, read at call time so that kinds added later are drawn
      too; ``net`` only when ``net_toxics`` is given); ordered simplest first
      (:func:`order_kinds`). Any kind at any position.
    - ``net_toxics(point)``: the toxics (:class:`~.plan.NetToxic`) that may land at a
      point, none where no link is in use (:func:`net_toxics_of` builds it from a
      golden run and the matrix's network section); a ``net`` fault is drawn at a point
      of its trace that has one, then one of its toxics (shrinking toward the first); a
      position whose trace has none draws the other kinds.
    - ``resume_trace(plan)``: the trace of the first resume that ran without a fault
      after ``plan`` (:attr:`.case.CaseResult.resume_trace`); fault *i + 1* lands at
      one of its points. Returning None or an empty trace (the run failed, or it ended
      without a resume) ends the plan there. Called during drawing, so it may run the
      shorter plan as a case; it must be deterministic (cache its results).

    Example: ``fault_plans(golden.trace, kinds=("kill", "term"), max_faults=2,
    resume_trace=...)`` draws e.g. ``kill@tool.request.after[turn-4.tool-0]#1 +
    term@log.append.before[turn-5]#1``. Shrinks toward fewer faults, earlier points and
    simpler kinds (module docstring).

    Raises :class:`~.errors.InvalidArgument` when ``min_faults < 1``, ``max_faults <
    min_faults``, ``max_faults > 1`` without ``resume_trace``, a kind is unknown, no
    kind is left, a kind needs more than a point and is not ``net``, ``net`` is asked
    for without ``net_toxics`` or no golden point has a toxic, or the golden trace has
    no point of ``sources``.
    """
    kinds_t = _checked_kinds(kinds, min_faults, max_faults, resume_trace, net_toxics)
    sources_t = tuple(sources)
    first_points = _points(golden_trace, sources_t)
    if not first_points:
        raise InvalidArgument(f"sources={sources_t!r}: the golden trace has no point of these sources")

    def with_toxics(points: list[CrashPoint]) -> list[tuple[CrashPoint, tuple[NetToxic, ...]]]:
        return [(p, tuple(t)) for p in points for t in [net_toxics(p) if net_toxics else ()] if t]

    if "net" in kinds_t and not with_toxics(first_points):
        raise InvalidArgument(f"kinds={kinds_t!r}: no point of sources={sources_t!r} has a net toxic")

    @st.composite
    def plans(draw: Callable[..., Any]) -> FaultPlan:
        n = draw(st.integers(min_faults, max_faults), label="number of faults")
        faults: list[Fault] = []
        points = first_points
        for i in range(n):
            net_points = with_toxics(points) if "net" in kinds_t else []
            here = tuple(k for k in kinds_t if k != "net" or net_points)
            if not here:
                break
            kind = draw(st.sampled_from(here), label=f"fault {i + 1} kind")
            if kind == "net":
                point, toxics = net_points[draw(st.integers(0, len(net_points) - 1), label=f"fault {i + 1} point")]
                faults.append(Fault("net", point, toxics[draw(st.integers(0, len(toxics) - 1), label=f"fault {i + 1} toxic")]))
            else:
                point = points[draw(st.integers(0, len(points) - 1), label=f"fault {i + 1} point")]
                faults.append(Fault(kind, point))
            if i == n - 1 or resume_trace is None:
                break
            points = _points(resume_trace(FaultPlan(tuple(faults))) or [], sources_t)
            if not points:
                break
        return FaultPlan(tuple(faults))

    return plans()


def net_toxics_of(workload: str, golden: GoldenRun) -> Callable[[CrashPoint], Sequence[NetToxic]]:
    """``net_toxics`` for :func:`fault_plans`: at each point of ``golden`` where a link
    is in use, the toxics the matrix's network section puts there
    (:func:`.netfaults.net_cases`: db blips and outages, provider timeouts, cut and late
    answers, each with its heal)."""
    from . import registry
    from .netfaults import net_cases

    by_point: dict[tuple[str, str, int], list[NetToxic]] = {}
    providers = tuple(registry.workload(workload).providers)
    for case in net_cases(workload, {golden.conversation: golden}, providers):
        fault = case.plan.faults[0]
        assert fault.net is not None
        by_point.setdefault(fault.point.key, []).append(fault.net)
    return lambda point: by_point.get(point.key, [])


class FaultPlanFailed(AssertionError):
    """A drawn fault plan failed the oracle or hit a harness error. The message holds
    the plan as JSON, the replay command, and the failure's details."""


def plan_failure_message(result: CaseResult, location: str | None = None) -> str:
    """The message of a failing drawn plan: the case, the plan as JSON, the replay
    command and a ``crashmatrix run --plan`` line, then :func:`.report.failure_text`."""
    from .report import case_record, failure_text

    case = result.case
    plan_json = case.plan.to_json()
    run_plan = ["crashmatrix", "run", case.workload, "--plan", "plan.json", "--conversation", case.conversation]
    if result.subject != "reference":
        run_plan += ["--subject", result.subject]
    return "\n".join([
        f"fault plan of {len(case.plan.faults)} fault(s) {result.outcome} on {result.subject}: {case.id}",
        f"plan (JSON): {plan_json}",
        f"replay: {result.replay}",
        f"or: echo {shlex.quote(plan_json)} > plan.json && {shlex.join(run_plan)}",
        failure_text(case_record(result, location)),
    ])


def _profile() -> settings:
    current = settings.get_current_profile_name()
    if not current.startswith("crashmatrix-") and os.environ.get("CI"):
        return settings.get_profile("crashmatrix-ci")
    return settings()


def resume_property(
    workload: str = "checkout",
    subject: str = "reference",
    *,
    conversation: str = "conv1",
    kinds: Sequence[str] = DEFAULT_KINDS,
    sources: Sequence[str] = DEFAULT_SOURCES,
    min_faults: int = 1,
    max_faults: int = 2,
    **settings_overrides: Any,
) -> Callable[[Any], None]:
    """A pytest test function that fuzzes ``subject``'s resume paths on one
    ``conversation`` of ``workload``: draws plans with :func:`fault_plans` (points from
    the golden run for the first fault, from each resume's own trace for later ones),
    runs each as a case on the plugin's live harness (``crashmatrix_harness``), and
    fails when a plan's case fails an oracle check or hits a harness error, with
    :func:`plan_failure_message` (the minimal plan as JSON and as a replay command).

    Assign the result to a module-level ``test_*`` name. A plan runs once per session;
    drawing it again (shrinking does) reuses its result. Settings: the active
    ``crashmatrix-*`` profile, else ``crashmatrix-ci`` when ``$CI`` is set, else the
    current Hypothesis profile; always ``deadline=None``; ``settings_overrides``
    (e.g. ``max_examples=50``) win. Seeded with the plugin's seed. Arguments are
    checked when the test runs (:func:`fault_plans`' errors)."""
    kinds_t, sources_t = tuple(kinds), tuple(sources)
    digest = hashlib.sha256(json.dumps(
        [workload, subject, conversation, kinds_t, sources_t, min_faults, max_faults]).encode()).digest()

    def test_resume_property(request: Any) -> None:
        from .plugin import record_case

        from .plugin import seed_was_given

        services = request.getfixturevalue("crashmatrix_harness")
        run_seed = request.getfixturevalue("crashmatrix_seed")
        live = services.harness(subject, workload)
        golden = live.golden(conversation)
        from .matrix import FAILING

        results: dict[str, CaseResult] = {}

        def run(plan: FaultPlan) -> CaseResult:
            key = plan.to_json()
            if key not in results:
                results[key] = live.run_case(Case(workload, conversation, plan))
                record_case(request.node, results[key], test=request.node.nodeid, kinds=kinds_t, sources=sources_t)
            return results[key]

        def resume_trace(plan: FaultPlan) -> Trace | None:
            r = run(plan)
            return r.resume_trace if r.outcome == "pass" else None

        strategy = fault_plans(golden.trace, kinds=kinds_t, sources=sources_t, min_faults=min_faults,
                               max_faults=max_faults, resume_trace=resume_trace,
                               net_toxics=net_toxics_of(workload, golden) if "net" in kinds_t else None)

        def body(data: st.DataObject) -> None:
            plan = data.draw(strategy, label="fault plan")
            result = run(plan)
            event(f"{len(plan.faults)} fault(s)")
            event(f"outcome {result.outcome}")
            if result.outcome in FAILING:  # not run / not applicable tested nothing: no failure
                raise FaultPlanFailed(plan_failure_message(result))

        overrides = {"deadline": None, "suppress_health_check": _SLOW_OK, **settings_overrides}
        wrapped = settings(_profile(), **overrides)(given(data=st.data())(body))
        if seed_was_given(request.config):
            wrapped = seed(run_seed)(wrapped)  # Hypothesis then writes no example database
        # keys this property's examples apart from another property's in the database
        # (the attribute Hypothesis's own pytest plugin sets for parametrized tests)
        wrapped.hypothesis.inner_test._hypothesis_internal_add_digest = digest  # type: ignore[attr-defined]
        wrapped()

    test_resume_property.__doc__ = (f"Fuzz resume paths of {subject} on {workload}/{conversation}: up to "
                                    f"{max_faults} fault(s) of {', '.join(order_kinds(kinds_t))}.")
    return test_resume_property
