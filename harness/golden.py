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
from typing import Any

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
    #: per effect provider the workload declares (every provider but ``model``): the
    #: effects this run applied (its ledger rows answered below 400)
    applied: dict[str, int] = field(default_factory=dict)
    #: the requests of this run a provider answered 4xx or 5xx, in arrival order:
    #: ``{"provider", "method", "path", "http_status", "error"}``
    refusals: list[dict[str, Any]] = field(default_factory=list)

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



#: a logical task's two streams of points: its await points, and its labels and step
#: boundaries. Each stream's own order is compared; the interleaving of the two is not,
#: because a subject may fire labels on a thread of its own while its event loop
#: suspends in the same logical task (DBOS records a step's output on an
#: ``asyncio.to_thread`` thread and fires its commit trigger there, while the workflow's
#: coroutine awaits it: two golden runs of a correct DBOS workflow put that label before
#: or after the await, by the scheduler's timing). Await points fire only on an event loop.
Stream = tuple[str, str]


def stream_of(source: str, task: str) -> Stream:
    """The stream a point of ``source`` (``"label"``, ``"step"``, ``"await"``) in logical
    task ``task`` belongs to: ``(task, "awaits")`` or ``(task, "labels")``."""
    return (task, "awaits" if source == "await" else "labels")


def describe_stream(stream: Stream) -> str:
    """``"task turn-1"`` for a task's labels, ``"task turn-1 (awaits)"`` for its awaits."""
    task, kind = stream
    return f"task {task}" + (" (awaits)" if kind == "awaits" else "")


def per_task(trace: Trace) -> dict[Stream, list[tuple[str, int]]]:
    """A trace split by logical task and stream (:func:`stream_of`):
    ``{(task, stream): [(name, occurrence), ...]}``, in order of first appearance
    (interleaving between tasks, and between a task's two streams, may differ between
    runs; each stream's own sequence may not)."""
    out: dict[Stream, list[tuple[str, int]]] = defaultdict(list)
    for source, name, task, occ in trace:
        out[stream_of(source, task)].append((name, occ))
    return out


def first_departures(reference: dict[Stream, list[tuple[str, int]]],
                     trace: dict[Stream, list[tuple[str, int]]]) -> dict[Stream, int]:
    """For each stream of ``trace`` (both split by :func:`per_task`): the index, among
    that stream's points, of the first one that differs from ``reference``'s (or that
    ``reference`` does not have); the stream's length when it follows ``reference``
    throughout."""
    out = {}
    for stream, seq in trace.items():
        theirs = reference.get(stream, [])
        out[stream] = next((i for i, item in enumerate(seq) if i >= len(theirs) or theirs[i] != item), len(seq))
    return out


def trace_divergence(golden: Trace, faulted: Trace) -> str | None:
    """Where ``faulted`` (a trace up to a fault) stops being a prefix of ``golden``,
    compared per logical task and stream (:func:`first_departures`); None if it is."""
    g, mine = per_task(golden), per_task(faulted)
    for stream, i in first_departures(g, mine).items():
        if i < len(mine[stream]):
            ref, item = g.get(stream, []), mine[stream][i]
            want = f"{ref[i][0]}#{ref[i][1]}" if i < len(ref) else "nothing"
            return f"{describe_stream(stream)}: point {i + 1} is {item[0]}#{item[1]}, golden has {want}"
    return None


def trace_difference(first: Trace, second: Trace) -> str | None:
    """Where two golden runs' traces differ, per logical task and stream (the
    interleaving of tasks and of a task's streams may differ, each stream's own sequence
    may not: :data:`Stream`); None when they agree."""
    a, b = per_task(first), per_task(second)
    for stream in list(a) + [t for t in b if t not in a]:
        sa, sb = a.get(stream, []), b.get(stream, [])
        if sa != sb:
            i = next((k for k, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
            show = lambda seq: f"{seq[i][0]}#{seq[i][1]}" if i < len(seq) else "nothing"  # noqa: E731
            return f"{describe_stream(stream)}: point {i + 1} is {show(sa)} in one run, {show(sb)} in the other"
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


def effect_providers(workload: object) -> tuple[str, ...]:
    """The providers of ``workload`` that apply effects: every one it declares but the
    model (which bills completions)."""
    return tuple(p for p in getattr(workload, "providers", ()) or () if p != "model")


def declares_no_effects(workload: object, conversation: str) -> bool:
    """Whether ``workload`` says ``conversation`` applies no effect: its
    ``makes_no_effects`` is True (every conversation) or names it (a tuple of
    conversation names). Default: every conversation of a workload with an effect
    provider applies at least one."""
    flag = getattr(workload, "makes_no_effects", False)
    return flag is True or (isinstance(flag, (tuple, list, frozenset, set)) and conversation in flag)


def _refusal(r: dict[str, Any]) -> str:
    return f"{r['provider']} answered {r['http_status']} to {r['method']} {r['path']}: {r['error']}"


def provider_failure(where: str, refusals: list[dict[str, Any]]) -> str | None:
    """One line naming the first request of ``refusals`` a provider answered 5xx (a
    provider or its script failed: no baseline, whatever the run did next), or None.
    ``where`` names the golden run."""
    server = next((r for r in refusals if int(r["http_status"]) >= 500), None)
    return None if server is None else f"{where}: {_refusal(server)}; a provider's failure is no baseline"


def golden_effects(workload_name: str, workload: object, goldens: list[GoldenRun]) -> tuple[list[str], str | None]:
    """Whether the golden runs exercised what the workload declares, before any case.
    Returns the summary's lines (per provider, the effects the golden runs applied, with
    each conversation's; the calls a provider refused; a declared provider no golden
    run reached) and, when no case can be judged against them, why, in one line (the
    caller refuses the matrix, exit 2): a provider answered a golden run 5xx; a golden
    run applied no effect though the workload declares effect providers (naming the
    provider that refused it and its message, or that none was reached), unless the
    workload declares it makes none (``makes_no_effects``); or a workload that declares
    none applied some. ``goldens``: the baselines (neither broken nor skipped)."""
    providers = effect_providers(workload)
    lines, why = [], None
    if providers and goldens:
        parts = []
        for p in providers:
            total = sum(g.applied.get(p, 0) for g in goldens)
            each = ", ".join(f"{g.conversation} {g.applied.get(p, 0)}" for g in goldens)
            parts.append(f"{p} {total} ({each})")
        lines.append("golden runs applied effects: " + "; ".join(parts))
    refused = [(g, r) for g in goldens for r in g.refusals]
    if refused:
        shown = "; ".join(f"{g.conversation}: {_refusal(r)}" for g, r in refused[:4])
        more = f" (and {len(refused) - 4} more)" if len(refused) > 4 else ""
        lines.append(f"golden runs' calls refused: {shown}{more}")
    declared = tuple(getattr(workload, "providers", ()) or ())
    reached = {p for g in goldens for p, n in g.applied.items() if n} | {str(r["provider"]) for _, r in refused}
    reached |= {"model"} if any(g.evidence.model_calls for g in goldens) else set()
    none_meant = all(declares_no_effects(workload, g.conversation) for g in goldens)
    never = [p for p in declared if p not in reached and (p == "model" or not none_meant)]
    if goldens and never:
        lines.append(f"declared provider(s) no golden run reached: {', '.join(never)}")
    for g in goldens:
        where = f"the golden run of {workload_name}/{g.conversation}"
        applied = sum(g.applied.get(p, 0) for p in providers)
        if (failure := provider_failure(where, g.refusals)) is not None:
            why = failure
        elif declares_no_effects(workload, g.conversation) and applied:
            at = ", ".join(f"{p} {n}" for p, n in g.applied.items() if n)
            why = (f"{where} applied {applied} effect(s) ({at}), yet the workload declares it makes none "
                   f"(makes_no_effects)")
        elif providers and not applied and not declares_no_effects(workload, g.conversation):
            at_effects = [r for r in g.refusals if r["provider"] in providers] or g.refusals
            if at_effects:
                what = _refusal(at_effects[0]) + (f" (and {len(at_effects) - 1} more refused)" if len(at_effects) > 1 else "")
            else:
                what = f"no request reached {', '.join(providers)}"
            why = (f"{where} applied no effect at {', '.join(providers)}: {what}; no case could fail "
                   f"(declare makes_no_effects on the workload if that is meant)")
        if why is not None:
            break
    return lines, why
