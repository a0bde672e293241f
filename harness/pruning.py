"""Crash states, not crash instants: kill cases grouped by the crash state they must
leave, and resumes shared between equal crash states (docs/architecture.md,
"Crash-state pruning"; docs/design.md, "Fault kinds, precisely").

A SIGKILL leaves only what the worker had handed the kernel: the durable stores'
contents and the requests already sent. The golden runs measure the worker's I/O at
every crash point (:mod:`.iostate`); two kill points between which the worker sent no
byte to any socket or file, opened or closed no socket and read no answer leave the
same crash state. :func:`crash_state_groups` cuts a golden trace into such groups,
checking the twin golden run too (the same points, measured in a run with a timing of
its own: a boundary either run sees splits the group) and keeping a point alone when
the two runs reached it at different positions of the other logical tasks (a
concurrent stretch whose interleaving is not fixed). :func:`plan_cases` runs one case
per group (its *representative*: the group's first case in the given order) and a
seeded sample of the others; every other member's result is derived, not guessed: its
own crash checks run on the representative's crash state with its own trace (the
golden trace up to its point), its end checks on the representative's final state with
its own allowance of in-flight model calls (:func:`derive`). A sampled member's crash
state (:func:`state_document`: the adapter's observation and the providers' ledgers,
identifiers renamed as the oracle does) that differs from its representative's means
the grouping was unsound for this subject (it wrote between crash points where the
golden run saw nothing: a background task), so no member's verdict is derived any
more: each conversation's sample is drawn on its own, its derived passes are held until
its sample is compared, and after one disagreement anywhere every member not yet
reported runs whole (*escalation*). The summary says so; no verdict rests on the
unsound grouping, and none is a pass that was not run.

Only ``kill`` is grouped: after a SIGTERM or a cancel the subject acts, so those cases
run at every point. Any single-fault case of a kind whose worker ends by itself
(kill, term, cancel: no setting of its own, no stopped worker) may *share* its resume:
once its crash state was read, a case whose crash state equals one already resumed
takes that resume's final state for its end checks (with its own allowance), and a
seeded sample runs its resume anyway and must end in the same state. The resume of a
crash state is a function of that state: that is the premise a durable runtime's
recovery rests on, and the sample tests it. A sampled case whose own resume ended
elsewhere keeps its own verdicts (its resume ran), its state shares no more, and the
summary names it and the cases that had taken the shared resume (found by a blind
trial: a runtime that resumes from a projection its adapter does not observe).

:class:`Pruner` is this as a strategy the case loop (:mod:`.runner`) runs every list
of cases with; :class:`PruneSummary` is what the report says: ``kill: 1,089 points -> 214 crash
states, all pass; sample 22/22 agree``, and the groups in the JSON report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import faults, invariants, oracle
from .adapter import Observation
from .history import TraceEntry
from .iostate import IoMark
from .normalize import IdentifierModel, Renamer
from .plan import Case
from .verdicts import crash_verdicts

if TYPE_CHECKING:
    from .case import CaseResult, CaseRun
    from .golden import GoldenRun

PRUNED_KINDS = ("kill",)
"""Kinds grouped by crash state: the worker dies at the point and acts no more."""
RESUME_CHECKS = ("resume.runs", "run.ends")
"""Verdicts the resume workers of a case give (not its crash or end checks)."""
DEFAULT_SAMPLE = 0.05
"""Share of pruned cases (and of shared resumes) run whole as the grouping's check."""

Same = Callable[[IoMark, IoMark], bool]
"""Whether two marks of one golden run leave the same crash state (default: equal)."""


@dataclass(frozen=True)
class PruneOptions:
    """``prune``: group kill cases and run one per group; ``share``: a resume of a crash
    state equal to one already resumed is not run again; ``sample``: the share of pruned
    cases and of shared resumes run whole anyway, drawn with ``seed``; ``same``: the
    grouping's test of two marks (a test plants an unsound one); ``keep``: how many
    resumed crash states per conversation stay shareable (the most recent: an older one
    is forgotten, and a later case with that state resumes itself; cases that share a
    state lie near each other in point order)."""

    prune: bool = True
    share: bool = True
    sample: float = DEFAULT_SAMPLE
    seed: int = 0
    same: Same | None = None
    keep: int = 128

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample <= 1.0:
            from .errors import InvalidArgument

            raise InvalidArgument(f"prune sample={self.sample!r} must be between 0 and 1")
        if self.keep < 1:
            from .errors import InvalidArgument

            raise InvalidArgument(f"prune keep={self.keep!r} must be at least 1")


OFF = PruneOptions(prune=False, share=False)
"""Every case run whole (``--no-prune``)."""


# -- grouping --------------------------------------------------------------------------


def _frontiers(trace: list[Any]) -> list[int]:
    """For each entry, a hash of how far every *other* logical task had got (its count
    of points so far): equal in two runs when the entry was reached at the same place
    of the others (an order-independent sum, updated in O(1) a point)."""
    counts: dict[str, int] = {}
    total = 0
    out = []
    mask = (1 << 61) - 1
    for entry in trace:
        task = entry[2]
        n = counts.get(task, 0)
        mine = hash((task, n)) if n else 0
        out.append((total - mine) & mask)
        counts[task] = n + 1
        total = (total - mine + hash((task, n + 1))) & mask
    return out


@dataclass
class PointGroup:
    """Consecutive points of one golden trace that leave one crash state: the entries,
    and the mark (:class:`.iostate.IoMark`) they share."""

    entries: list[TraceEntry]
    mark: IoMark | None


def crash_state_groups(golden: GoldenRun, same: Same | None = None) -> tuple[list[PointGroup], str | None]:
    """The golden trace cut into groups of points that leave one crash state (module
    docstring), in trace order, and None; or every point alone and the reason when the
    golden runs carry no marks (:attr:`.golden.GoldenRun.io`)."""
    same = same or (lambda a, b: a == b)
    io = golden.io
    trace = golden.trace
    if io is None or io.marks is None or io.twin_marks is None:
        why = (io.note if io is not None and io.note else "the golden runs did not measure their I/O")
        return [PointGroup([e], None) for e in trace], why
    twin = {tuple(e[1:]): (m, f) for e, m, f in zip(io.twin_trace, io.twin_marks, _frontiers(io.twin_trace))}
    groups: list[PointGroup] = []
    open_: tuple[IoMark, IoMark] | None = None  # the open group's marks in both runs
    for entry, mark, frontier in zip(trace, io.marks, _frontiers(trace)):
        other = twin.get(tuple(entry[1:]))
        settled = other is not None and other[1] == frontier
        if settled and open_ is not None and same(open_[0], mark) and same(open_[1], other[0]):
            groups[-1].entries.append(entry)
            continue
        groups.append(PointGroup([entry], mark))
        open_ = (mark, other[0]) if settled and other is not None else None
    return groups, None


@dataclass
class CaseGroup:
    """Kill cases that must leave one crash state: ``cases[0]`` runs (the
    representative), the others are derived from it unless sampled."""

    conversation: str
    kind: str
    cases: list[Case]
    mark: IoMark | None

    @property
    def representative(self) -> Case:
        return self.cases[0]

    def to_dict(self) -> dict[str, Any]:
        return {"conversation": self.conversation, "kind": self.kind, "representative": self.representative.id,
                "members": [c.id for c in self.cases[1:]],
                "mark": dict(self.mark._asdict()) if self.mark is not None else None}


@dataclass
class Plan:
    """How a list of cases runs: ``groups`` (every grouped kill case, in groups of one
    or more), ``sampled`` (ids of members run whole as the check), ``group_of`` (case id
    -> its group), ``notes`` (conversations left ungrouped, and why)."""

    groups: list[CaseGroup] = field(default_factory=list)
    sampled: set[str] = field(default_factory=set)
    group_of: dict[str, CaseGroup] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def runs(self, case: Case) -> bool:
        """Whether ``case`` runs (a representative, a sampled member, or ungrouped)."""
        group = self.group_of.get(case.id)
        return group is None or group.representative is case or case.id in self.sampled

    @property
    def pruned(self) -> int:
        return sum(len(g.cases) - 1 for g in self.groups) - len(self.sampled)


def groupable(case: Case) -> bool:
    """A single-fault case of a kind grouped by crash state (:data:`PRUNED_KINDS`),
    resumed by the default policy (another policy's resume is what the case tests:
    :mod:`.policies`)."""
    return (len(case.plan.faults) == 1 and case.plan.faults[0].kind in PRUNED_KINDS
            and case.resume.policy == "default")


def plan_cases(cases: list[Case], goldens: dict[str, GoldenRun], options: PruneOptions) -> Plan:
    """Group the kill cases of ``cases`` by crash state (:func:`crash_state_groups` of
    their conversation's golden run) and draw the sample; deterministic: the same
    cases, golden marks and options give the same plan."""
    plan = Plan()
    point_group: dict[str, dict[tuple[str, str, int], int]] = {}
    marks: dict[str, list[PointGroup]] = {}
    for conv in sorted({c.conversation for c in cases if groupable(c)}):
        golden = goldens.get(conv)
        if golden is None:
            continue
        groups, why = crash_state_groups(golden, options.same)
        if why:
            plan.notes.append(f"{conv}: kill cases not grouped: {why}")
        marks[conv] = groups
        point_group[conv] = {tuple(e[1:]): i for i, g in enumerate(groups) for e in g.entries}
    by_key: dict[tuple[str, str, int], CaseGroup] = {}
    for case in cases:
        if not groupable(case) or case.conversation not in point_group:
            continue
        fault = case.plan.faults[0]
        index = point_group[case.conversation].get(fault.point.key)
        if index is None:
            index = -len(by_key) - 1  # not in the golden trace: alone (validate_case refuses it first)
        key = (case.conversation, fault.kind, index)
        group = by_key.get(key)
        if group is None:
            mark = marks[case.conversation][index].mark if index >= 0 else None
            group = by_key[key] = CaseGroup(case.conversation, fault.kind, [], mark)
            plan.groups.append(group)
        group.cases.append(case)
        plan.group_of[case.id] = group
    if options.sample > 0:  # each conversation's own sample: its derived verdicts rest on it
        rng = random.Random(options.seed)
        for conv in sorted({g.conversation for g in plan.groups}):
            members = [c.id for g in plan.groups if g.conversation == conv for c in g.cases[1:]]
            if members:
                k = min(len(members), math.ceil(options.sample * len(members)))
                plan.sampled |= set(rng.sample(members, k))
    return plan


def shard_by_crash_state(cases: list[Case], goldens: dict[str, GoldenRun], spec: str,
                         options: PruneOptions | None = None) -> list[Case]:
    """Shard ``K/N`` of ``cases`` as :func:`.enumeration.shard` takes it (every N-th from
    the K-th: disjoint, covering, deterministic), except that the kill cases of one crash
    state (:func:`plan_cases`) count as one unit and stay together. Every N-th case would
    almost never hold two points of one group, so a sharded matrix would not prune at all
    (long_run ``--shard 1/40``: 71 points -> 71 crash states, and no member to sample).
    Raises :class:`.plan.PlanError` for a malformed spec."""
    from .enumeration import shard

    shard([], spec)  # the spec's one-line error, before anything else
    k, n = (int(x) for x in spec.split("/"))
    plan = plan_cases(cases, goldens, dataclasses.replace(options or PruneOptions(), sample=0.0))
    units: list[list[Case]] = []
    placed: set[int] = set()
    for case in cases:
        group = plan.group_of.get(case.id)
        if group is None:
            units.append([case])
        elif id(group) not in placed:
            placed.add(id(group))
            units.append(group.cases)
    return [case for unit in units[k - 1::n] for case in unit]


# -- crash states as documents ---------------------------------------------------------


def state_document(ev: oracle.Evidence, model: IdentifierModel | None) -> dict[str, Any]:
    """A run's durable state as one document with its identifiers renamed as the
    oracle renames them (:func:`.oracle.evidence_document`, :class:`.normalize.Renamer`:
    the transcript and state first, then the effect rows and each provider's ledger as
    unordered rows), plus what a resume also reads: the log (seq, node, kind, lease
    epoch, whether the record decodes), the run's lease epoch, its invocations (epoch,
    whether a traceparent and a link were stored), each effect row's lease epoch and the
    model calls billed per node. Two runs are in the same state exactly when their
    documents are equal."""
    doc = oracle.evidence_document(ev)
    r = Renamer(model or IdentifierModel(), doc)
    obs = ev.observation
    effects = None if obs.effects is None else [
        {"node": e.node_id, "tool": e.tool, "key": e.key, "status": e.status, "result": e.result,
         "lease_epoch": e.lease_epoch} for e in obs.effects]
    return {
        "status": doc["status"],
        "transcript": r(doc["transcript"], ("transcript",)),
        "answer": r(doc["answer"], ("answer",)),
        "budget": r(doc["budget"], ("budget",)),
        "pending": r(doc["pending"], ("pending",)),
        "state_error": r(obs.state_error, ("state_error",)),
        "log": None if obs.log is None else [[e.seq, e.node_id, e.kind, e.lease_epoch, e.error is None] for e in obs.log],
        "lease_epoch": obs.lease_epoch,
        "invocations": None if obs.invocations is None else [
            [i.epoch, i.traceparent is not None, i.link is not None] for i in obs.invocations],
        "effects": None if effects is None else r.copy().rows(effects, ("effects",)),
        "ledgers": {kind: r.copy().rows(rows, ("ledgers", kind)) for kind, rows in doc["ledgers"].items()},
        "model_calls": dict(sorted(ev.model_calls.items())),
    }


def state_key(doc: dict[str, Any]) -> str:
    """The document as canonical JSON (the key equal states share)."""
    return json.dumps(doc, sort_keys=True, default=str)


def state_differences(a: dict[str, Any], b: dict[str, Any], limit: int = 6) -> list[str]:
    """Where two state documents differ, one line a field (``log: 3 rows vs 4 rows``;
    the values themselves when short)."""
    out = []
    for k in list(a) + [k for k in b if k not in a]:
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if isinstance(x, list) and isinstance(y, list) and len(x) != len(y):
            out.append(f"{k}: {len(x)} row(s) vs {len(y)}")
        else:
            tx, ty = (json.dumps(v, sort_keys=True, default=str) for v in (x, y))
            out.append(f"{k}: {tx[:160]} vs {ty[:160]}")
    return out[:limit]


# -- derived results -------------------------------------------------------------------


@dataclass
class Record:
    """What a case that others depend on left: the crash state after its (last) faulted
    worker, its final state, and the result."""

    crash: oracle.Evidence | None
    final: oracle.Evidence
    result: CaseResult
    #: the first faulted worker's trace up to its fault (None: not known)
    trace: list[Any] | None = None


def followed_golden(trace: list[Any] | None, golden: list[Any], case: Case) -> bool:
    """Whether a representative's worker passed, up to its fault, the same points as the
    golden run up to that point (in any order). Its members' results are derived from its
    crash state with the golden trace up to their own points; a run whose parallel
    siblings finished in another order than the golden run's (support_desk's parallel
    turns) may have acknowledged a different set by then, so its members run whole."""
    if trace is None:
        return True
    key = case.plan.faults[0].point.key
    at = next((i for i, e in enumerate(golden) if tuple(e[1:]) == key), None)
    if at is None:
        return False
    return sorted(tuple(e) for e in trace) == sorted(tuple(e) for e in golden[:at + 1])


def order_free(doc: dict[str, Any]) -> dict[str, Any]:
    """A state document with its log as the set of records it holds (node, kind, lease
    epoch, decodes), without the commit order: two resumes of one crash state may commit
    a turn's parallel siblings in either order, which no end check compares."""
    log = doc.get("log")
    if log is None:
        return doc
    return {**doc, "log": sorted([row[1:] for row in log], key=lambda row: json.dumps(row, default=str))}


def _pruned_result_class() -> type:
    from .case import CaseResult

    @dataclass
    class PrunedResult(CaseResult):
        """A kill case not run: its crash state is its representative's (the worker sent
        nothing between their points in the golden run); its verdicts are its own
        checks on that state (:func:`derive`). ``representative``: that case's id."""

        representative: str = ""

        def to_dict(self) -> dict[str, Any]:
            return {**super().to_dict(), "representative": self.representative}

    PrunedResult.__module__, PrunedResult.__qualname__ = __name__, "PrunedResult"  # pickled by this name
    return PrunedResult


_PRUNED: type | None = None


def _pruned() -> type:
    global _PRUNED
    if _PRUNED is None:
        _PRUNED = _pruned_result_class()
    return _PRUNED


def __getattr__(name: str) -> Any:
    """``PrunedResult`` (built on first use, :func:`_pruned_result_class`), so that a
    pickled derived result (the pytest plugin's xdist workers exchange results) loads."""
    if name == "PrunedResult":
        return _pruned()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def derive(case: Case, rep: Record, golden: GoldenRun) -> CaseResult:
    """The result of kill case ``case`` from its representative's record: the crash
    checks on the representative's crash state with ``case``'s own trace (the golden
    trace up to its point: a kill ends the worker there), the representative's resume
    verdicts, the end checks and invariants on its final state with ``case``'s own
    allowance of model calls in flight (:func:`.oracle.in_flight_model_calls`)."""
    pruned = _pruned()
    fault = case.plan.faults[0]
    at = next(i for i, e in enumerate(golden.trace) if tuple(e[1:]) == fault.point.key)
    trace = list(golden.trace[:at + 1])
    assert rep.crash is not None
    first = rep.result.workers[0] if rep.result.workers else {}
    ev = oracle.CrashEvidence(fault, trace, trace, first.get("returncode"), first.get("signal", 9), False,
                              rep.crash.observation, Observation(rep.result.run_id, "absent"))
    verdicts = crash_verdicts(ev)
    verdicts += [v for v in rep.result.verdicts if v.check in RESUME_CHECKS]
    allowance = oracle.in_flight_model_calls(trace)
    verdicts += oracle.end_checks(golden.evidence, rep.final, allowance, golden.identifiers)
    verdicts += invariants.end_invariants(rep.final, allowance)
    outcome = "pass" if oracle.merge(verdicts) is True else "fail"
    result = pruned(case, rep.result.subject, outcome, verdicts=verdicts, run_id=rep.result.run_id,
                     resume_trace=list(rep.result.resume_trace), representative=rep.result.case.id)
    result.reached = set(rep.result.reached)
    return result


# -- the explorer's hook ---------------------------------------------------------------


@dataclass
class _Shared:
    owner: str
    done: asyncio.Future[Record | None]


def shareable(case: Case) -> bool:
    """A single-fault case whose faulted worker ends by itself and leaves nothing of its
    kind behind (no setting of its own, no stopped worker): kill, term, cancel; resumed
    by the default policy."""
    if len(case.plan.faults) != 1 or case.resume.policy != "default":
        return False
    kind = faults.kind(case.plan.faults[0].kind)
    return not isinstance(kind, faults.CaseSetting | faults.Stops)


class CrashStates:
    """The case runner's hook while a case loop runs with pruning (:attr:`Pruner.hook`,
    :attr:`.case.CaseRun.hook`): the case reads every faulted worker's crash state whole (ledgers too) into
    ``CaseRun.crash``, asks :meth:`share_resume` before the first fault-free resume and
    calls :meth:`finished` with the final state.

    A case's :class:`Record` (its crash and final states: up to a few MB for a long run)
    is kept only while something may still read it: its group's members are not all
    derived or compared (:class:`Pruner` calls :meth:`group_over`), it owns one of the
    ``options.keep`` most recent shareable resumes of its conversation, or a sampled
    sharer is still to be compared with it. Before, every record lived until the matrix
    ended (long_run's controller: 6.9 GB after 8,424 cases, docs/benchmarks.md)."""

    def __init__(self, options: PruneOptions, plan: Plan, goldens: dict[str, GoldenRun]) -> None:
        self.options = options
        self.plan = plan
        self.goldens = goldens
        self.records: dict[str, Record] = {}
        self.shared: dict[tuple[str, str, str], _Shared] = {}
        self.owned: dict[str, tuple[str, str, str]] = {}
        self.docs: dict[str, dict[str, Any]] = {}  # case id -> its crash state's document
        #: shared resumes: sharer id -> owner id; sampled sharers: id -> owner id
        self.took: dict[str, str] = {}
        self.share_sampled: dict[str, str] = {}
        self.share_checked: list[tuple[str, str, list[str]]] = []  # (sharer, owner, differences)
        #: a sampled sharer's own resume ended elsewhere: no resume is shared any more
        self.unsound = False
        #: cases ended (their last run's result); sampled sharers not yet compared: (sharer, owner)
        self.ended: dict[str, CaseResult] = {}
        self.pending: list[tuple[str, str]] = []
        self._group_live: set[str] = set()  # records a group still reads
        self._watched: Counter[str] = Counter()  # records a sampled sharer's comparison reads
        self._owner_key: dict[str, tuple[str, str, str]] = {}  # owner -> its shareable entry
        self._recent: dict[str, dict[tuple[str, str, str], None]] = {}  # conversation -> shareable keys, oldest first

    def _doc(self, cx: CaseRun) -> dict[str, Any]:
        doc = self.docs.get(cx.case.id)
        if doc is None and cx.crash is not None:
            doc = self.docs[cx.case.id] = state_document(cx.crash, cx.golden.identifiers)
        return doc or {}

    async def share_resume(self, cx: CaseRun) -> bool:
        """Before ``cx``'s first fault-free resume: True when an equal crash state was
        resumed already (its final state, resume verdicts, trace and reached labels are
        now ``cx``'s: ``cx.final``...), False when this case resumes itself (it owns its
        crash state, or it is in the sample, or the owner's case did not pass: a failure, a
        flaky one too, is never copied; or this is a replay of the same case)."""
        if self.unsound or not self.options.share or cx.crash is None or not shareable(cx.case):
            return False
        if cx.case.id in self.owned or cx.case.id in self.took or cx.case.id in self.share_sampled:
            return False  # a replay of a failing case (run_case_replayed) resumes itself
        key = (cx.explorer.subject, cx.case.conversation, state_key(self._doc(cx)))
        entry = self.shared.get(key)
        if entry is None:
            self.shared[key] = _Shared(cx.case.id, asyncio.get_running_loop().create_future())
            self.owned[cx.case.id] = key
            return False
        # a sampled kill member runs whole; so does a seeded share of the others, and
        # each must end where the resume of the equal state ended
        drawn = random.Random(f"{self.options.seed}:{cx.case.id}").random() < self.options.sample
        if cx.case.id in self.plan.sampled or (self.options.sample > 0 and drawn):
            self.share_sampled[cx.case.id] = entry.owner
            self._watched[cx.case.id] += 1
            self._watched[entry.owner] += 1
            return False
        record = await entry.done
        if record is None:
            return False
        cx.final = record.final
        cx.result.verdicts += [v for v in record.result.verdicts if v.check in RESUME_CHECKS]
        cx.result.resume_trace = list(record.result.resume_trace)
        cx.result.reached |= {e.name for e in record.result.resume_trace if e.source == "label"}
        cx.result.workers.append({"role": "resume", "shared": record.result.case.id, "pid": None, "returncode": None,
                                  "signal": None, "seconds": 0.0, "timed_out": False, "cpu_ms": None})
        self.took[cx.case.id] = record.result.case.id
        return True

    def finished(self, cx: CaseRun, final: oracle.Evidence) -> None:
        """``cx`` read its final state: keep what others need (a representative's or a
        sampled member's crash state, an owner's resume)."""
        case_id = cx.case.id
        if case_id in self.plan.group_of:
            self._group_live.add(case_id)
        if case_id in self.owned:
            self._owner_key[case_id] = self.owned[case_id]
        if case_id in self.plan.group_of or case_id in self.owned or case_id in self.share_sampled:
            self.records[case_id] = Record(cx.crash, final, cx.result, cx.first_trace)

    def group_over(self, case_id: str) -> None:
        """``case_id``'s group no longer reads its record (its members are derived or
        compared, or it was a sampled member that has been)."""
        self._group_live.discard(case_id)
        self._release(case_id)

    def _release(self, case_id: str) -> None:
        """Drop ``case_id``'s record unless something may still read it (class docstring)."""
        if case_id in self._group_live or self._watched[case_id] > 0:
            return
        key = self._owner_key.get(case_id)
        if key is not None:
            entry = self.shared.get(key)
            if entry is not None and entry.owner == case_id:
                return  # its resume may still be shared
            del self._owner_key[case_id]
        self.records.pop(case_id, None)
        self._watched.pop(case_id, None)

    def _keep_recent(self, key: tuple[str, str, str]) -> None:
        """``key``'s resume is shareable: forget the oldest beyond ``options.keep`` of its
        conversation (a later case with a forgotten state owns it anew)."""
        recent = self._recent.setdefault(key[1], {})
        recent[key] = None
        while len(recent) > self.options.keep:
            old = next(iter(recent))
            del recent[old]
            entry = self.shared.get(old)
            if entry is not None and entry.done.done():
                del self.shared[old]
                self._release(entry.owner)

    def judged(self, result: CaseResult) -> None:
        """``result``'s run was judged (before its directory is removed, and before any
        replay): an owner's waiting sharers go on, with its record when it passed, else
        each resuming itself (its resume did not end in a final state, or a check failed:
        a failure, a flaky one too, is not copied to them). Once per owner: its replays
        change nothing here."""
        key = self.owned.get(result.case.id)
        entry = self.shared.get(key) if key is not None else None
        if entry is None or entry.owner != result.case.id or entry.done.done():
            return  # not an owner (any more: a later case may own the state now), or told already
        record = self.records.get(result.case.id)
        passed = record is not None and result.outcome == "pass"
        entry.done.set_result(record if passed else None)
        if passed:
            self._keep_recent(key)
        else:
            del self.shared[key]  # a later case with this state resumes itself

    def case_over(self, result: CaseResult) -> None:
        """After ``result``'s case ended however it ended (its replays too): its sharers
        were told (:meth:`judged`: a harness error outside ``run_case`` reaches them only
        here); a sampled sharer's final state is compared with its owner's once both ended."""
        self.judged(result)
        self.owned.pop(result.case.id, None)
        self.docs.pop(result.case.id, None)
        self.ended[result.case.id] = result
        owner = self.share_sampled.get(result.case.id)
        if owner is not None:
            self.pending.append((result.case.id, owner))
        for sharer, owner in [p for p in self.pending if p[0] in self.ended and p[1] in self.ended]:
            self.pending.remove((sharer, owner))
            self._compare(self.ended[sharer], self.ended[owner])
            for done in (sharer, owner):
                self._watched[done] -= 1
                self._release(done)
        self._release(result.case.id)

    def _compare(self, sharer: CaseResult, owner: CaseResult) -> None:
        """A sampled sharer's final state against its owner's, once both ended: counted
        only when the owner passed (a failing owner's resume was shared with no one) and
        the sharer's run is no harness error; a difference stops all sharing."""
        mine, theirs = self.records.get(sharer.case.id), self.records.get(owner.case.id)
        if mine is None or theirs is None or sharer.outcome == "harness-error" or owner.outcome != "pass":
            return
        golden = self.goldens[sharer.case.conversation]
        diffs = state_differences(order_free(state_document(theirs.final, golden.identifiers)),
                                  order_free(state_document(mine.final, golden.identifiers)))
        self.share_checked.append((sharer.case.id, owner.case.id, diffs))
        if diffs:  # its own resume ran: its verdicts stand; no resume is shared any more
            self.unsound = True
            note = (f"resume sharing disagreed: this case's crash state equals {owner.case.id}'s, but its own "
                    f"resume ended in another state: {'; '.join(diffs)}")
            sharer.error = f"{sharer.error}; {note}" if sharer.error else note


# -- running ---------------------------------------------------------------------------


def executed(results: list[CaseResult]) -> int:
    """Cases whose workers ran (not derived from a representative)."""
    return sum(1 for r in results if r.workers)


def workers_run(results: list[CaseResult]) -> int:
    """Workers the cases ran, forked or in a long-lived worker (a shared resume runs none)."""
    return sum(1 for r in results for w in r.workers if "shared" not in w)


def workers_forked(results: list[CaseResult]) -> int:
    """Worker processes the cases forked: the workers they ran, but those that ran in a
    long-lived worker (:mod:`.resident`)."""
    return sum(1 for r in results for w in r.workers if "shared" not in w and not w.get("resident"))


def _sample_said(agree: int, checked: int) -> str:
    """``sample 22/22 agree``, or that no derived verdict was checked against a run of its own."""
    return f"sample {agree}/{checked} agree" if checked else "no derived verdict sampled"


@dataclass
class PruneSummary:
    """What pruning did in one run of cases (module docstring)."""

    options: PruneOptions
    plan: Plan
    results: list[CaseResult] = field(default_factory=list)
    #: sampled members compared with their representative: (member, representative, differences)
    checked: list[tuple[str, str, list[str]]] = field(default_factory=list)
    shared: int = 0
    #: case -> the case whose resume it took
    shared_from: dict[str, str] = field(default_factory=dict)
    share_checked: list[tuple[str, str, list[str]]] = field(default_factory=list)
    #: a sampled member's crash state differed from its representative's
    unsound: bool = False
    #: members run whole, not derived, because the grouping was found unsound
    escalated: list[str] = field(default_factory=list)
    #: cases run again whole because a shared resume was found unsound (they had taken one)
    reran: list[str] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(len(g.cases) for g in self.plan.groups)

    @property
    def states(self) -> int:
        return len(self.plan.groups)

    @property
    def agree(self) -> int:
        return sum(not d for _, _, d in self.checked)

    @property
    def executed(self) -> int:
        return executed(self.results)

    @property
    def workers(self) -> int:
        return workers_run(self.results)

    def kill_counts(self) -> Counter[str]:
        ids = {c.id for g in self.plan.groups for c in g.cases}
        return Counter(r.outcome for r in self.results if r.case.id in ids)

    def lines(self) -> list[str]:
        """``kill: 1,089 points -> 214 crash states, all pass; sample 22/22 agree`` and,
        when resumes were shared, how many and how their sample went."""
        out = []
        if self.plan.groups:
            c = self.kill_counts()
            verdict = "all pass" if set(c) <= {"pass"} and c else ", ".join(
                f"{n} {'pass' if k == 'pass' else k}" for k, n in sorted(c.items()))
            kinds = "/".join(sorted({g.kind for g in self.plan.groups}))
            out.append(f"{kinds}: {self.points:,} points -> {self.states:,} crash states, {verdict}; "
                       + _sample_said(self.agree, len(self.checked)))
            for member, rep, diffs in self.checked:
                if diffs:
                    out.append(f"crash-state grouping unsound ({member} vs {rep}: {diffs[0]}): the subject wrote "
                               f"between crash points without the golden run seeing it (a background task?); "
                               f"{len(self.escalated):,} member(s) ran whole instead of taking a representative's "
                               f"verdict")
                    break
        if self.shared or self.share_checked:
            agree = sum(not d for _, _, d in self.share_checked)
            out.append(f"resumes: {self.shared:,} case(s) took the resume of an equal crash state; "
                       + _sample_said(agree, len(self.share_checked)))
            for member, owner, diffs in self.share_checked:
                if diffs:
                    took = sorted(c for c, o in self.shared_from.items() if o == owner)
                    out.append(f"resumes of one crash state differ ({member} vs {owner}: {diffs[0]}): the subject's "
                               f"resume depends on more than the state its adapter observes (durable state observe() "
                               f"leaves out, or a race); {len(took)} case(s) had taken {owner}'s resume"
                               + (f" ({', '.join(took[:3])}{', ...' if len(took) > 3 else ''})" if took else "")
                               + f"; no resume was shared after it, and the {len(self.reran):,} case(s) judged on a "
                                 f"shared resume ran again whole")
                    break
        return out + self.plan.notes

    def to_dict(self) -> dict[str, Any]:
        """The JSON report's ``pruning``: options, counts, the groups, each pruned case's
        representative, the samples and their differences, the shared resumes."""
        whole = {r.case.id for r in self.results if r.workers} | self.plan.sampled
        pruned = {c.id: g.representative.id for g in self.plan.groups for c in g.cases[1:] if c.id not in whole}
        return {
            "kinds": list(PRUNED_KINDS), "sample_share": self.options.sample, "seed": self.options.seed,
            "points": self.points, "crash_states": self.states, "pruned": pruned,
            "sample": [{"case": m, "representative": r, "agree": not d, "differences": d} for m, r, d in self.checked],
            "unsound": self.unsound, "escalated": list(self.escalated), "reran": list(self.reran),
            "groups": [g.to_dict() for g in self.plan.groups if len(g.cases) > 1],
            "shared_resumes": self.shared, "executed": self.executed, "workers": self.workers,
            "share_sample": [{"case": m, "owner": o, "agree": not d, "differences": d} for m, o, d in self.share_checked],
            "summary": self.lines(), "notes": list(self.plan.notes),
        }


class Sink(Protocol):
    """What the strategy reports to: the case loop (:class:`.runner.CaseLoop`)."""

    def emit(self, result: CaseResult) -> None:
        """``result`` is final: the loop's result for its case."""

    def has(self, case_id: str) -> bool:
        """Whether ``case_id``'s result is final already."""


class Pruner:
    """The pruning strategy of a case loop (module docstring): which cases run
    (:meth:`runs`), what each case that ran settles once it is over (:meth:`over`:
    derived members, sampled members compared, derived passes held until their
    conversation's sample is compared), which run whole after the first round
    (:meth:`left_over`) and which again after a shared resume was found unsound
    (:meth:`reruns`). ``hook`` is what the case runner reads crash states into and
    shares resumes through (None when neither pruning nor sharing is on); ``summary``
    what the report says. Results go to the loop (:class:`Sink`)."""

    def __init__(self, options: PruneOptions, cases: list[Case], goldens: dict[str, GoldenRun]) -> None:
        self.options, self.goldens = options, goldens
        self.plan = plan = plan_cases(cases, goldens, options) if options.prune else Plan()
        self.summary = PruneSummary(options, plan)
        self.hook = CrashStates(options, plan, goldens) if (options.prune or options.share) else None
        self.waiting: dict[str, CaseResult] = {}  # sampled members whose representative is not done
        self.fallback: list[Case] = []  # members of a representative that left no record: they run
        # a conversation's derived passes wait for its sample: one disagreement anywhere and
        # they run whole instead (escalation), as does every member derived after it
        self.unchecked = Counter(plan.group_of[m].conversation for m in plan.sampled)
        self.held: dict[str, list[CaseResult]] = {}
        # a group's records are read until its representative ended and every sampled member
        # was compared with it (CrashStates.group_over lets them go)
        self.sampled_left = Counter({g.representative.id: sum(m.id in plan.sampled for m in g.cases[1:])
                                     for g in plan.groups})

    def runs(self, case: Case) -> bool:
        """Whether ``case`` runs in the first round (:meth:`Plan.runs`)."""
        return self.plan.runs(case)

    def over(self, result: CaseResult, out: Sink) -> None:
        """A case that ran is over (its replays too): the hook hears it; an ungrouped
        case's result is final; a sampled member's is compared with its representative
        once that one is over; a representative's settles its group's members."""
        if self.hook is not None:
            self.hook.case_over(result)
        group = self.plan.group_of.get(result.case.id)
        if group is None:
            out.emit(result)
        elif result.case is not group.representative:
            self._member_over(result, group, out)
        else:
            out.emit(result)
            self._representative_over(result, group, out)

    def _member_over(self, result: CaseResult, group: CaseGroup, out: Sink) -> None:
        rep = group.representative
        if not out.has(rep.id):
            self.waiting[result.case.id] = result
            return
        self._compare(result, rep.id, out)
        self._sampled_over(result, rep.id, out)

    def _sampled_over(self, member: CaseResult, rep: str, out: Sink) -> None:
        """A sampled member was compared (or cannot be): its result is final, and its
        conversation's held passes go once its whole sample is."""
        out.emit(member)
        conv = member.case.conversation
        self.unchecked[conv] -= 1
        if self.unchecked[conv] <= 0:
            self._release(conv, out)
        if self.hook is not None:
            self.hook.group_over(member.case.id)
            self.sampled_left[rep] -= 1
            if self.sampled_left[rep] <= 0 and out.has(rep):
                self.hook.group_over(rep)

    def _representative_over(self, result: CaseResult, group: CaseGroup, out: Sink) -> None:
        rep = group.representative
        record = self.hook.records.get(rep.id) if self.hook is not None else None
        usable = (record is not None and record.crash is not None and result.outcome not in ("harness-error", "flaky")
                  and followed_golden(record.trace, self.goldens[rep.conversation].trace, rep))
        for member in group.cases[1:]:
            if member.id in self.plan.sampled:
                if member.id in self.waiting:
                    sampled = self.waiting.pop(member.id)
                    if usable:
                        self._compare(sampled, rep.id, out)
                    self._sampled_over(sampled, rep.id, out)
            elif self.summary.unsound:
                self._escalate(member)
            elif usable:
                assert record is not None
                derived = derive(member, record, self.goldens[member.conversation])
                if derived.outcome != "pass":  # a failure is shown by a run of its own (and replayed)
                    self.fallback.append(member)
                elif self.unchecked[member.conversation] > 0:
                    self.held.setdefault(member.conversation, []).append(derived)
                else:
                    out.emit(derived)
            else:
                self.fallback.append(member)
        if self.hook is not None and self.sampled_left[rep.id] <= 0:
            self.hook.group_over(rep.id)

    def _escalate(self, case: Case) -> None:
        self.summary.escalated.append(case.id)
        self.fallback.append(case)

    def _release(self, conversation: str, out: Sink) -> None:
        """``conversation``'s held derived passes: final, or run whole after an
        unsound grouping."""
        for derived in self.held.pop(conversation, []):
            if self.summary.unsound:
                self._escalate(derived.case)
            else:
                out.emit(derived)

    def _compare(self, member: CaseResult, rep: str, out: Sink) -> None:
        """A sampled member's crash state against its representative's; a difference
        marks the grouping unsound (no member is derived any more: the held ones run
        whole)."""
        assert self.hook is not None
        mine, theirs = self.hook.records.get(member.case.id), self.hook.records.get(rep)
        if mine is None or mine.crash is None or theirs is None or theirs.crash is None \
                or member.outcome == "harness-error":
            return
        golden = self.goldens[member.case.conversation]
        if not followed_golden(mine.trace, golden.trace, member.case):
            return  # its siblings finished in another order: a crash state of another interleaving
        diffs = state_differences(state_document(theirs.crash, golden.identifiers),
                                  state_document(mine.crash, golden.identifiers))
        self.summary.checked.append((member.case.id, rep, diffs))
        if diffs:  # its own run's verdicts stand; no member is derived any more
            note = (f"crash-state grouping unsound: {member.case.id} was grouped with {rep} (the golden run sent "
                    f"nothing between their points) but its crash state differs: {'; '.join(diffs)}; the "
                    f"members not yet derived run whole")
            member.error = f"{member.error}; {note}" if member.error else note
            if not self.summary.unsound:
                self.summary.unsound = True
                for conv in list(self.held):
                    self._release(conv, out)

    def left_over(self, out: Sink) -> list[Case]:
        """After the first round: sampled members whose representative never ran
        (stopped) stand alone, held passes go; returns the members that run whole now
        (their representative left no usable record, their derived result failed, or the
        grouping was unsound), taken out of their groups."""
        for result in list(self.waiting.values()):
            out.emit(result)
        for conv in list(self.held):
            self._release(conv, out)
        for case in self.fallback:
            self.plan.group_of.pop(case.id, None)
        return list(self.fallback)

    def reruns(self, cases: list[Case], final: Callable[[str], CaseResult | None]) -> list[Case] | None:
        """After a shared resume was found unsound for this subject: every case judged on
        one (and every member derived from such a representative's final state, ``final``
        giving each case's result so far), taken out of its group, to run again whole;
        None when no shared resume was unsound."""
        if self.hook is None or not self.hook.unsound:
            return None
        took = set(self.hook.took)
        again = [c for c in cases if c.id in took or (
            c.id in self.plan.group_of and self.plan.group_of[c.id].representative.id in took
            and (r := final(c.id)) is not None and not r.workers)]
        self.summary.reran = [c.id for c in again]
        for case in again:
            self.plan.group_of.pop(case.id, None)
        return again

    def finish(self, results: list[CaseResult]) -> PruneSummary:
        """The summary of the loop that ended with ``results`` (case order)."""
        if self.hook is not None:
            self.summary.shared = len(self.hook.took)
            self.summary.shared_from = dict(self.hook.took)
            self.summary.share_checked = self.hook.share_checked
        self.summary.results = results
        return self.summary


def options_of(prune: bool = True, sample: float = DEFAULT_SAMPLE, seed: int = 0) -> PruneOptions:
    """The CLI's knobs as options: ``--no-prune`` (neither grouping nor shared resumes),
    ``--prune-sample``, ``--seed``."""
    return dataclasses.replace(PruneOptions() if prune else OFF, sample=sample, seed=seed)
