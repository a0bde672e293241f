"""Golden runs as data, and the determinism gate: what a case is judged against.

:class:`GoldenRun` is a conversation run once without faults (its trace, evidence,
identifiers, invariants, I/O at each point); :func:`determinism_gate` judges the two
golden runs the explorer runs at once (:meth:`.explorer.Explorer.golden`); the trace
comparisons, per logical task, are how a faulted run is checked against its golden run
up to the fault (:func:`trace_divergence`) and two golden runs against each other
(:func:`trace_difference`). Pure: no services, no processes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from . import oracle
from .errors import NondeterministicWorkload
from .history import Trace
from .iostate import GoldenIo
from .normalize import IdentifierModel


@dataclass
class GoldenRun:
    """A conversation run once without faults: its run id, crash-point trace (entries
    ``(source, name, task, occurrence)``), end evidence and wall seconds."""

    conversation: str
    run_id: str
    trace: Trace
    evidence: oracle.Evidence
    seconds: float
    #: the conversation's identifiers, learned from this run and a second golden run
    #: (:func:`.oracle.learn_identifiers`); None: only the declared places
    identifiers: IdentifierModel | None = None
    #: the invariants checked on this run (:mod:`.invariants`): a golden run that
    #: breaks one is a defect of the subject, never a baseline
    verdicts: list[oracle.Verdict] = field(default_factory=list)
    #: the worker's I/O at each crash point of this run and of its twin (:mod:`.iostate`):
    #: what crash-state pruning groups kill cases by (:mod:`.pruning`); None: not measured
    io: GoldenIo | None = None
    #: why no case of this conversation can run on this subject, though nothing is wrong
    #: with it (the run waits for a person of the workload the adapter does not answer:
    #: ``Adapter.answers_operator``); None: a baseline or a broken run
    skipped: str | None = None

    @property
    def broken(self) -> list[oracle.Verdict]:
        """The invariants this golden run breaks (empty: it is a valid baseline)."""
        return [v for v in self.verdicts if v.valid is not True]

    @property
    def incomplete(self) -> str | None:
        """Why the subject did not complete this run with no fault (its ``run.ends``
        verdict, or why it is not applicable: :attr:`skipped`), or None. Callers with no report to put it in (the pytest plugin's
        golden cache, the selftest) raise it as a :class:`HarnessError`."""
        return self.skipped or next((v.details for v in self.broken if v.check == "run.ends"), None)



def per_task(trace: Trace) -> dict[str, list[tuple[str, int]]]:
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


def trace_divergence(golden: Trace, faulted: Trace) -> str | None:
    """Where ``faulted`` (a trace up to a fault) stops being a prefix of ``golden``,
    compared per logical task (:func:`first_departures`); None if it is."""
    g, mine = per_task(golden), per_task(faulted)
    for task, i in first_departures(g, mine).items():
        if i < len(mine[task]):
            ref, item = g.get(task, []), mine[task][i]
            want = f"{ref[i][0]}#{ref[i][1]}" if i < len(ref) else "nothing"
            return f"task {task}: point {i + 1} is {item[0]}#{item[1]}, golden has {want}"
    return None


def trace_difference(first: Trace, second: Trace) -> str | None:
    """Where two golden runs' traces differ, per logical task (the interleaving of tasks
    may differ, each task's own sequence may not); None when they agree."""
    a, b = per_task(first), per_task(second)
    for task in list(a) + [t for t in b if t not in a]:
        sa, sb = a.get(task, []), b.get(task, [])
        if sa != sb:
            i = next((k for k, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
            show = lambda seq: f"{seq[i][0]}#{seq[i][1]}" if i < len(seq) else "nothing"  # noqa: E731
            return f"task {task}: point {i + 1} is {show(sa)} in one run, {show(sb)} in the other"
    return None


def determinism_gate(first: GoldenRun, second: GoldenRun, identifier_fields: tuple[str, ...], where: str) -> IdentifierModel:
    """Judge two golden runs of one conversation (docs/design.md "Determinism"): their
    crash-point traces, per logical task (:func:`trace_difference`), and their evidence
    once identifiers are renamed (:func:`.oracle.learn_identifiers`, with the declared
    ``identifier_fields``). Returns the identifier model the pair taught; raises
    :class:`NondeterministicWorkload` (one line, ``where`` naming workload, conversation
    and subject, with every difference on the exception) when they differ."""
    differences = [f"the crash-point trace differs: {d}"] if (d := trace_difference(first.trace, second.trace)) else []
    model, diffs = oracle.learn_identifiers(first.evidence, second.evidence, identifier_fields)
    differences += [d.describe() for d in diffs]
    if differences:
        more = f" (and {len(differences) - 1} more place(s))" if len(differences) > 1 else ""
        raise NondeterministicWorkload(
            f"workload is not deterministic: {where}: two golden runs differ: {differences[0]}{more}; "
            f"seed its randomness and clock (docs/adapters.md, \"Determinism\")", differences)
    return model


def golden_failure(broken_checks: list[str]) -> str:
    """How a golden run's failure reads, in the matrix's result, a case refused for it
    and the summary line: ``"did not complete"`` when its one broken check is
    ``run.ends`` (the subject returned another status, or raised), else ``"breaks an
    invariant"``."""
    return "did not complete" if broken_checks == ["run.ends"] else "breaks an invariant"
