"""Coverage that cannot be vacuous: the recovery branches a matrix exercised, and the
cells whose fault could not take effect (docs/architecture.md, "Coverage").

A green matrix says little if no case ever went down the branch that matters: a probe
that answered "applied", an effect left ``unknown`` and resolved, a drain with a node in
flight, a lease taken over from a worker that died. A subject declares those branches
as labelled crash points (``crashpoint("probe.answer.applied")``) in its adapter's
``recovery_branches`` (label -> what it means; docs/adapters.md, "Recovery branches");
the harness counts, per matrix, the cases that reached each after their first fault
fired (:attr:`.case.CaseResult.reached`: the faulted worker's rest of the run and
every later worker, as in Antithesis' ``reachable`` assertions) and reports the
branches never reached; ``--require-coverage`` makes one fail the run.

A fault that fired but changed nothing (the faulted worker ended the run itself exactly
as the golden run did: exit 0, the golden's status, the golden trace per logical task,
e.g. a cancel at a point after which the subject never awaits, or a cancelled caller
whose work ran on in a thread) tested nothing: such a case is ``not-run``, never a pass
(:func:`took_effect`, :func:`mark_not_run`). A fault that never fired stays a harness
error. ``net`` faults are left out: a latency toxic a subject rides out changes nothing
either, and it did take effect.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgument

if TYPE_CHECKING:
    from .case import CaseResult
    from .golden import GoldenRun
    from .history import End, Trace

NOT_RUN = "not-run"
"""The outcome of a case whose fault could not take effect."""
NOT_APPLICABLE = "not-applicable"
"""The outcome of a case whose resume policy needs what the adapter does not declare
(:meth:`.policies.Policy.not_applicable`); never run, never counted failed."""
def unjudged(kind: str) -> bool:
    """Whether a fault of ``kind`` may leave the run as the golden run ended and still
    have taken effect (``FaultKind.unjudged``: net, db-outage): that is its pass."""
    from .fault_registry import find

    return bool(getattr(find(kind), "unjudged", False))


def declared(adapter: Any) -> dict[str, str]:
    """The adapter's ``recovery_branches`` (label -> what it means), empty when it
    declares none. Raises :class:`InvalidArgument` naming the adapter when it is not a
    mapping of non-empty strings."""
    branches = getattr(adapter, "recovery_branches", None) or {}
    if not isinstance(branches, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                 for k, v in branches.items()):
        raise InvalidArgument(f"{type(adapter).__name__}.recovery_branches must map labels to descriptions "
                              f"(got {branches!r})")
    return dict(branches)


def took_effect(kind: str, golden: GoldenRun, end: End | None, returncode: int | None, fired: Trace,
                taken_over: bool = False) -> bool:
    """Whether the first faulted worker's fault changed anything: False when it ended by
    itself (exit 0) with the golden run's status and the golden run's whole trace (per
    logical task, :func:`.golden.trace_difference`), as if the fault had not fired.
    ``fired``: its trace up to the fault. Always True for a kind that is :func:`unjudged`,
    and when ``taken_over``: other workers took its run over and ended it while it was
    stopped (a pause's successors), whatever it did once woken."""
    from .golden import trace_difference

    if (unjudged(kind) or taken_over or end is None or returncode != 0
            or end.status != golden.evidence.observation.status):
        return True
    return len(end.trace) != len(golden.trace) or trace_difference(golden.trace, end.trace) is not None


def not_run_reason(kind: str) -> str:
    """Why a case of fault kind ``kind`` is :data:`NOT_RUN` (one line, the same for every
    case of the kind: the report groups them by it), with the kind's likely cause
    (``FaultKind.why_not_run``) when it has one."""
    from .fault_registry import find

    hint = getattr(find(kind), "why_not_run", "")
    return (f"the {kind} fault fired but could not take effect: the worker ended the run as the golden run did "
            f"(exit 0, same status, same trace), so the fault changed nothing there"
            + (f"; most likely {hint}" if hint else ""))


def mark_not_run(result: CaseResult) -> None:
    """A passing case whose first faulted worker's fault did not take effect
    (``took_effect`` False in its worker record) becomes :data:`NOT_RUN`, its ``error``
    saying where and why (:func:`not_run_reason`)."""
    first = result.workers[0] if result.workers else {}
    if result.outcome == "pass" and first.get("took_effect") is False:
        result.outcome = NOT_RUN
        fault = result.case.plan.faults[0]
        result.error = f"not run: at {fault.point.label()}, {not_run_reason(fault.kind)}"


@dataclass
class Coverage:
    """Per matrix: the declared ``branches``, the cases that reached each
    (``reached``), and the cases that were not run (their fault could not take effect)."""

    branches: dict[str, str]
    reached: dict[str, int] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)

    @property
    def unreached(self) -> list[str]:
        return [b for b in self.branches if not self.reached.get(b)]

    @property
    def complete(self) -> bool:
        """Every declared branch reached and no cell left not run."""
        return not self.unreached and not self.not_run

    def lines(self) -> list[str]:
        """``coverage: 4/6 recovery branches reached (probe.answer.applied 12, ...);
        never reached: lease.taken_over (a lease taken over)`` and the not-run count."""
        out = []
        if self.branches:
            got = ", ".join(f"{b} {self.reached[b]}" for b in self.branches if self.reached.get(b))
            line = f"coverage: {len(self.branches) - len(self.unreached)}/{len(self.branches)} recovery branches reached"
            line += f" ({got})" if got else ""
            if self.unreached:
                line += "; never reached: " + ", ".join(f"{b} ({self.branches[b]})" for b in self.unreached)
            out.append(line)
        if self.not_run:
            out.append(f"not run: {len(self.not_run)} case(s) whose fault could not take effect "
                       f"(first: {self.not_run[0]})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"branches": self.branches, "reached": {b: self.reached.get(b, 0) for b in self.branches},
                "unreached": self.unreached, "not_run": self.not_run, "complete": self.complete}


def coverage_of(adapter: Any, results: Iterable[CaseResult]) -> Coverage:
    """The matrix's coverage: per declared branch of ``adapter``, the cases whose
    ``reached`` labels include it; the not-run cases."""
    cov = Coverage(declared(adapter))
    for r in results:
        for label in r.reached:
            if label in cov.branches:
                cov.reached[label] = cov.reached.get(label, 0) + 1
        if r.outcome == NOT_RUN:
            cov.not_run.append(r.case.id)
    return cov
