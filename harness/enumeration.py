"""The matrix from golden traces: enumeration, depth 2, shards, and a given case's check.

Pure functions of the golden runs (and, for depth 2, of the single-fault results): no
services, no state. :func:`enumerate_cases` is every recorded point x every fault kind
(then the network section, :func:`.netfaults.net_cases`); :func:`double_fault_cases`
extends single-fault cases with a second fault in their resume's trace;
:func:`shard` keeps one of N disjoint slices; :func:`validate_case` checks a case from
a replay id or a plan file against the golden traces. The same inputs give the same
lists (the pytest plugin's pytest-xdist workers must collect identical ids).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from . import faults, registry
from .errors import PlanError
from .plan import DEFAULT_KINDS, DEFAULT_SOURCES, Case, CrashPoint, Fault, FaultPlan, Resume

if TYPE_CHECKING:
    from .case import CaseResult
    from .golden import GoldenRun


def enumerate_cases(
    workload: str, goldens: dict[str, GoldenRun], kinds: tuple[str, ...] = DEFAULT_KINDS,
    sources: tuple[str, ...] = DEFAULT_SOURCES, resume: Resume = Resume(), *, net: list[Case] | None = None,
) -> list[Case]:
    """The matrix: every point of every golden trace (of the given sources) x ``kinds``,
    in trace order, then (kind ``net``, labels only) the network section
    (:func:`.netfaults.net_cases`); every case under the resume policy ``resume``.
    Deterministic: the same traces give the same list. ``net``: the network section
    when the caller has it already (the pytest plugin's golden cache keeps it as case
    ids: it needs the golden runs' ledgers); default: computed from ``goldens``."""
    if "net" in kinds:
        from .netfaults import net_cases

        rest = enumerate_cases(workload, goldens, tuple(k for k in kinds if k != "net"), sources, resume)
        if "label" not in sources:
            return rest
        section = net if net is not None else net_cases(workload, goldens, tuple(registry.workload(workload).providers))
        return rest + [dataclasses.replace(c, resume=resume) for c in section]
    cases = []
    for conv in sorted(goldens):
        for source, name, task, occ in goldens[conv].trace:
            if source not in sources:
                continue
            point = CrashPoint(source, name, task, occ)
            for kind in kinds:
                cases.append(Case(workload, conv, FaultPlan((Fault(kind, point),)), resume))
    return cases


def double_fault_cases(
    results: list[CaseResult], kinds: tuple[str, ...], *, sample: int | None, seed: int
) -> list[Case]:
    """Depth 2: every single-fault case extended with a second fault at each point of
    its own resume's trace (a crash during recovery) x ``kinds``; the full product is
    about (points x kinds)^2, so ``sample`` draws that many with a seeded generator
    (reproducible: the same results, sample and seed give the same cases).

    Any kind follows any kind (:mod:`.faults`: a pause's successor takes the run over
    while it sleeps, a db-restart's case runs on its own server throughout). Kinds whose
    fault needs more than a point (``net``: its toxic; :attr:`.faults.FaultKind.bare`)
    are not drawn here; await points only after an await-point first fault. A case
    whose run ended in its faulted worker has no resume trace and is not extended
    (:func:`double_fault_note` says how many and why)."""
    import random

    pool: list[Case] = []
    for r in results:
        if len(r.case.plan.faults) != 1 or not r.resume_trace:
            continue
        for source, name, task, occ in r.resume_trace:
            if source == "await" and "await" not in {f.point.source for f in r.case.plan.faults}:
                continue
            for kind in kinds:
                if not faults.kind(kind).bare:
                    continue
                second = Fault(kind, CrashPoint(source, name, task, occ))
                pool.append(dataclasses.replace(r.case, plan=FaultPlan(r.case.plan.faults + (second,))))
    if sample is not None and sample < len(pool):
        pool = random.Random(seed).sample(pool, sample)
    return pool


def double_fault_note(results: list[CaseResult], kinds: tuple[str, ...], generated: int) -> str:
    """One line saying how many double-fault cases depth 2 generated from ``results``
    and, when none, why: how many single-fault cases ended in their faulted worker (no
    resume ran: nothing to put a second fault in, e.g. a subject that survives a
    db-restart in one worker), failed or hit a harness error (not extended), and
    whether the kinds can be drawn from a point alone."""
    singles = [r for r in results if len(r.case.plan.faults) == 1]
    with_resume = [r for r in singles if r.resume_trace]
    line = (f"depth 2: {generated} double-fault case(s) from {len(with_resume)} of {len(singles)} "
            f"single-fault case(s) with a resume")
    if generated:
        return line
    why = []
    ended = [r for r in singles if not r.resume_trace and r.outcome == "pass"]
    if ended:
        why.append(f"{len(ended)} passed with no resume: the subject finished the run in the worker the fault "
                   f"landed in, so there is no recovery to put a second fault in")
    bad = [r for r in singles if not r.resume_trace and r.outcome != "pass"]
    if bad:
        why.append(f"{len(bad)} failed or hit a harness error before a resume ran")
    drawable = [k for k in kinds if faults.kind(k).bare]
    if not drawable:
        why.append(f"none of the kinds {', '.join(kinds)} is drawn from a point alone")
    if not singles:
        why.append("there were no single-fault cases")
    return line + ": " + "; ".join(why or ["no resume trace had a point of the drawn sources"])


def shard(cases: list[Case], spec: str) -> list[Case]:
    """Keep shard ``K/N`` (1-based) of ``cases``: every N-th case from the K-th, so the
    N shards are disjoint, cover the matrix and are deterministic. A shard splits a
    matrix across CI jobs; it is not a sample: cases come kind by kind at each point, so
    with N a multiple of the number of kinds one shard holds one kind (take N prime to
    it for a mixed shard). Raises :class:`PlanError` for a malformed spec."""
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
    # only the first fault lands in the golden trace; later ones land in resumes, whose
    # points (a runtime's recovery labels among them) only a resume's trace shows
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
