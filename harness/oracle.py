"""The oracle: checks that compare a case's outcome with its golden run.

Verdicts are three-valued, as Jepsen's checkers are: ``valid`` (True), ``invalid``
(False) or ``unknown`` (None: the check raised; the error is attached, never a pass).
Merged, invalid beats unknown beats valid. Every check names what it compared and, on
failure, the offending rows and counts, with a small diff.

Checks at the **crash state** (read after the fault, before any resume):

- ``log.clean_prefix``: contiguous ``seq`` from 1, every record decodes, every parent
  was recorded earlier, no node id twice;
- ``effects.commit_with_record``: an effect is ``succeeded`` or ``failed`` exactly when
  the record of the node that made it exists (they commit in one transaction);
- ``log.acknowledged_durable``: every node whose append the worker's own trace
  acknowledged (it passed ``log.append.after`` for that node before it died) has its
  record in the log: an acknowledged append is durable, never a few turns behind
  (not applicable when the adapter exposes no log);
- ``run.acknowledged_durable``: once the subject acknowledged the run (a worker's
  ``RunContext.accepted``, or the label ``run.accepted``), it exists after any crash (docs/design.md, invariants: "an
  acknowledged run exists after any crash"; LangGraph issue 8764);
- the fault kind's own checks, defined in its module (:mod:`.faults`):
  ``cancel.left_unknown`` (:mod:`.faults.cancel`: no effect is left ``started``; a cancel
  that landed during a tool request left that node's effect ``unknown``),
  ``term.drained`` (:mod:`.faults.term`: no node launched after the signal was recorded,
  the worker exited 0 by itself, the run is ``paused``, or completed, or handed to a
  person, or exactly as it was before the worker if the SIGTERM came before the worker
  took it), ``pause.zombie_fenced`` (:mod:`.faults.pause`: once another worker took the
  lease and finished the run, the woken zombie changed nothing durable),
  ``net.resumable`` (:mod:`.faults.net`: a broken link leaves the run resumable),
  ``db-outage.resumable`` (:mod:`.faults.db_outage`: a database away for a while leaves
  the run resumable).

Checks at the **end** (after the last resume), against the golden run, ids normalised by
first appearance (:mod:`.normalize`):

- ``run.status``: the same terminal status;
- ``state.equal``: the same final answer, budget and (empty) frontier;
- ``transcript.exact``: no message duplicated or missing, same order;
- ``effects.ledger_equal``: the subject's effect ledger equal row for row (tool,
  normalised key, status, result), none left ``started`` or ``unknown``;
- ``provider.<kind>.ledger_equal``: each provider's own ledger equal (nothing applied
  twice, nothing lost);
- ``model.calls_billed``: per node, calls billed at most the golden count plus the calls
  the worker's own trace shows in flight when a fault landed (the node had called the
  model and its record was not appended).

- ``trace.continues`` (where the adapter reports invocations): each resumed invocation
  starts its span with a link to the invocation it continues
  (:mod:`crashmatrix.harness.trace_check`).

Not checked here: wall-clock budgets (never compared).
"""

from __future__ import annotations

import difflib
import json
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .adapter import Observation
from .checks import Check, Verdict, compose, merge, run_check  # noqa: F401  Verdict, merge, run_check: re-exported
from .crashpoint import LOG_APPEND_AFTER, MODEL_CALL_BEFORE, RUN_ACCEPTED
from .history import End, Trace
from .normalize import Difference, IdentifierModel, Place, Renamer, learn
from .plan import Fault
from .trace_check import CONTINUES, check_trace_continues

VOLATILE_PROVIDER_FIELDS = frozenset({"seq", "attempts", "created_at", "updated_at", "run_id", "metadata", "worker"})
FAILED_PROVIDER_STATUSES = frozenset({"declined", "failed", "rejected", "error"})
"""Provider row statuses of an effect that did not take place."""


@dataclass
class Evidence:
    """What the oracle compares at the end of a run (golden or faulted)."""

    observation: Observation
    ledgers: dict[str, list[dict[str, Any]]]
    model_calls: dict[str, int]
    #: the model provider's rows for the run (each billed call and the answer it got)
    model_rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CrashEvidence:
    """What the oracle sees right after a fault: the fault, the worker's trace up to it
    and after it, how the worker ended, and the durable state."""

    fault: Fault
    trace_at_fault: Trace
    trace_full: Trace
    exit_returncode: int | None
    exit_signal: int | None
    timed_out: bool
    observation: Observation
    #: the durable state before the faulted worker started (``absent`` for the first
    #: worker of a case); None when the explorer did not look (only ``term`` needs it)
    before: Observation | None = None
    #: the worker's ``end`` report (None: it died without one)
    end: End | None = None
    #: a stopped worker's (pause): the durable state and the providers' ledgers just
    #: before it was woken
    woke: Evidence | None = None
    #: whether the stopped worker's run was taken over while it slept (False: its
    #: adapter declares that it never takes a run from a live owner)
    taken_over: bool = True
    #: the providers' own ledgers of the run at the crash state (effect providers, not
    #: the model's bill), read when the fault kind asks (``FaultKind.reads_ledgers``)
    ledgers: dict[str, list[dict[str, Any]]] | None = None
    #: whether some worker of the case had acknowledged the run by the crash state
    acknowledged: bool = False
    #: where in ``trace_full`` the worker's own SIGTERM was delivered (a ``term``
    #: fault: its ``signalled`` report, :class:`.history.Signalled`); None: not reported
    signalled_at: int | None = None



# -- crash-state checks ----------------------------------------------------------------

CLEAN_PREFIX = Check("log.clean_prefix", "checkpoint validity", "torn log", "crash",
                     "contiguous seq from 1, every record decodes, parents recorded earlier, no node twice")
COMMIT_WITH_RECORD = Check("effects.commit_with_record", "effect resolution", "effect without its record", "crash",
                           "an effect is succeeded or failed exactly when the record of its node exists")
ACKNOWLEDGED_DURABLE = Check("log.acknowledged_durable", "checkpoint validity", "lost acknowledged record", "crash",
                             "every append the worker's trace acknowledged is in the crash state's log")
ACKNOWLEDGED_RUN = Check("run.acknowledged_durable", "acknowledged runs are durable", "run lost", "crash",
                         "a run the subject acknowledged exists after any crash")


def check_clean_prefix(obs: Observation, name: str = "log.clean_prefix", phase: str = "crash") -> Verdict:
    """``log.clean_prefix``: contiguous seq from 1, every record decodes, parents recorded
    earlier, no node twice. The same of the final log is the end invariant
    ``log.clean_final`` (:mod:`.invariants`)."""
    if obs.log is None:
        return Verdict(name, phase, True, "not applicable: the adapter exposes no log")
    problems = []
    seen: set[str] = set()
    expected = 1
    for i, entry in enumerate(obs.log, start=1):
        if entry.seq != expected:  # each gap or repeat once: the records after it follow on from it
            what = "a gap" if entry.seq > expected else "a seq repeated or out of order"
            problems.append(f"seq {entry.seq} at position {i} (expected {expected}: {what})")
        expected = entry.seq + 1
        if entry.error:
            problems.append(f"seq {entry.seq} node {entry.node_id}: {entry.error}")
        if entry.node_id in seen:
            problems.append(f"node {entry.node_id} recorded twice")
        for p in entry.parents:
            if p not in seen:
                problems.append(f"seq {entry.seq} node {entry.node_id}: parent {p} not recorded before it")
        seen.add(entry.node_id)
    if problems:
        return Verdict(name, phase, False, f"{len(problems)} problem(s): " + "; ".join(problems[:5]))
    return Verdict(name, phase, True, f"{len(obs.log)} records, contiguous")


def check_commit_with_record(obs: Observation) -> Verdict:
    """``effects.commit_with_record``: final effect status exactly when the node's record exists."""
    name = "effects.commit_with_record"
    if obs.effects is None or obs.log is None:
        return Verdict(name, "crash", True, "not applicable")
    recorded = {e.node_id for e in obs.log}
    problems = []
    for eff in obs.effects:
        final = eff.status in ("succeeded", "failed")
        if final and eff.node_id not in recorded:
            problems.append(f"effect {eff.tool} of {eff.node_id} is {eff.status} but the node has no record")
        if eff.node_id in recorded and not final:
            problems.append(f"node {eff.node_id} is recorded but its effect {eff.tool} is {eff.status}")
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    return Verdict(name, "crash", True, f"{len(obs.effects)} effect rows agree with the log")


def check_acknowledged_durable(ev: CrashEvidence) -> Verdict:
    """``log.acknowledged_durable``: each node the worker's whole trace shows past
    ``log.append.after`` (its append returned) has a record in the crash state's log.

    The logical task of the point is the node id (docs/design.md, "Crash points"); a retried
    append of a record already there also passes the label and is also durable. Source:
    a store that acknowledges before the write is durable (records flushed by a
    background task) loses the acknowledged tail on a kill, which no end check sees
    when the lost nodes are tool calls a probe resolves again."""
    name = "log.acknowledged_durable"
    if ev.observation.log is None:
        return Verdict(name, "crash", True, "not applicable: the adapter exposes no log")
    acknowledged = list(dict.fromkeys(task for _, point, task, _ in ev.trace_full if point == LOG_APPEND_AFTER))
    recorded = {e.node_id for e in ev.observation.log}
    lost = [task for task in acknowledged if task not in recorded]
    if lost:
        return Verdict(name, "crash", False,
                       f"{len(lost)} of {len(acknowledged)} acknowledged append(s) not in the log: {', '.join(lost[:8])}")
    return Verdict(name, "crash", True, f"{len(acknowledged)} acknowledged append(s), all in the log")


def check_acknowledged_run(ev: CrashEvidence) -> Verdict:
    """``run.acknowledged_durable``: a run the subject acknowledged exists in the crash
    state (status not ``absent``). Acknowledged: some worker of the case called
    ``RunContext.accepted`` (its request is stored, a caller would be told "accepted")
    by the crash, or this worker's trace passed the label ``run.accepted``
    (:data:`.crashpoint.RUN_ACCEPTED`, for a subject that reports through crash points only).
    Source: LangGraph issue 8764, an accepted run silently dropped."""
    name = "run.acknowledged_durable"
    accepted = ev.acknowledged or any(e[1] == RUN_ACCEPTED for e in ev.trace_full)
    if not accepted:
        return Verdict(name, "crash", True, "not acknowledged yet (the adapter reports acceptance with ctx.accepted())")
    if ev.observation.status == "absent":
        return Verdict(name, "crash", False, "the subject acknowledged the run, and after the crash it does not exist "
                                             f"({ev.observation.state_error or 'absent'}): an accepted request was lost")
    return Verdict(name, "crash", True, f"acknowledged, and there: status {ev.observation.status}")


def generic_crash_checks(ev: CrashEvidence) -> list[Verdict]:
    """The crash-state checks of every fault, whatever its kind (the kind's own follow
    them: :func:`.verdicts.crash_verdicts`)."""
    return compose([
        (CLEAN_PREFIX, lambda: check_clean_prefix(ev.observation)),
        (COMMIT_WITH_RECORD, lambda: check_commit_with_record(ev.observation)),
        (ACKNOWLEDGED_DURABLE, lambda: check_acknowledged_durable(ev)),
        (ACKNOWLEDGED_RUN, lambda: check_acknowledged_run(ev)),
    ])


# -- end checks ----------------------------------------------------------------------

UNORDERED: tuple[Place, ...] = (("effects",), ("ledgers", "*"))
"""The row lists of an oracle document whose order carries no meaning (the subject's
effect ledger, each provider's ledger: two effects in flight at once land in either
order)."""


def evidence_document(ev: Evidence) -> dict[str, Any]:
    """What the end checks compare, as one JSON-like document (:mod:`.normalize`):
    ``status``, ``transcript``, ``answer``, ``budget``, ``pending``, ``effects`` (the
    subject's effect ledger: node, tool, key, status, result; None when it has none) and
    ``ledgers`` (provider kind -> rows without :data:`VOLATILE_PROVIDER_FIELDS`)."""
    obs = ev.observation
    state = obs.state or {}
    effects = None if obs.effects is None else [
        {"node": e.node_id, "tool": e.tool, "key": e.key, "status": e.status, "result": e.result} for e in obs.effects]
    ledgers = {kind: [{k: v for k, v in row.items() if k not in VOLATILE_PROVIDER_FIELDS} for row in rows]
               for kind, rows in sorted(ev.ledgers.items())}
    return {"status": obs.status, "transcript": state.get("transcript", []), "answer": state.get("answer"),
            "budget": state.get("budget"), "pending": state.get("pending"), "effects": effects, "ledgers": ledgers}


def learn_identifiers(first: Evidence, second: Evidence, fields: tuple[str, ...] = ()
                      ) -> tuple[IdentifierModel, list[Difference]]:
    """The identifiers of a conversation, from its two golden runs, and every difference
    between them that is not a renaming of identifiers (:func:`.normalize.learn`).
    ``fields``: field names an adapter or a declared service says hold identifiers."""
    return learn(evidence_document(first), evidence_document(second), fields=fields, unordered=UNORDERED)


@dataclass
class _Normalised:
    status: str
    transcript: list[Any]
    answer: Any
    budget: Any
    pending: Any
    effects: list[dict[str, Any]]
    ledgers: dict[str, list[dict[str, Any]]]
    state_error: str | None
    #: the renamer of each provider ledger (raw identifier -> label: ``seen``)
    renamers: dict[str, Renamer] = field(default_factory=dict)


def _normalise(ev: Evidence, model: IdentifierModel) -> _Normalised:
    """The run's document with its identifiers renamed in a canonical order: the
    transcript and final state first; then the effect ledger's rows, and each provider's
    ledger, each continuing the transcript's numbering (so a charge the run never
    recorded stays visible) but not each other's (so an extra effect row or an extra
    mail does not shift the payment ledger's labels: a failure shows where it is)."""
    doc = evidence_document(ev)
    r = Renamer(model, doc)
    transcript = r(doc["transcript"], ("transcript",))
    answer = r(doc["answer"], ("answer",))
    budget = r(doc["budget"], ("budget",))
    pending = r(doc["pending"], ("pending",))
    effects = r.copy().rows(doc["effects"] or [], ("effects",))
    renamers = {kind: r.copy() for kind in doc["ledgers"]}
    ledgers = {kind: renamers[kind].rows(rows, ("ledgers", kind)) for kind, rows in doc["ledgers"].items()}
    return _Normalised(doc["status"], transcript, answer, budget, pending, effects, ledgers,
                       ev.observation.state_error, renamers)


_Cache = OrderedDict[int, tuple["weakref.ref[Evidence]", IdentifierModel, _Normalised]]

_GOLDEN_DOCS: _Cache = OrderedDict()
"""The golden runs' normalised documents, by ``id`` of their evidence (held weakly: a
finished matrix's goldens are not kept): one golden run is compared with every case of
its conversation, and normalising it was half the oracle's CPU."""
_GOLDEN_DOCS_LIMIT = 64
_CASE_DOCS: _Cache = OrderedDict()
"""The cases' normalised final documents, the same way: a pruned matrix's cases that
share a resume (:mod:`.pruning`) share its final evidence object, and each is compared
with the golden run (about half the default matrix's end checks are of a shared final).
The least recently used go first; a sharer is judged shortly after its owner."""
_CASE_DOCS_LIMIT = 256


def _normalised(cache: _Cache, limit: int, ev: Evidence, model: IdentifierModel) -> _Normalised:
    """:func:`_normalise` of ``ev``, made once per evidence object and model (both by
    identity; the evidence of a run is not changed once observed, and the normalised
    document is only read) while it stays among the ``limit`` last used in ``cache``."""
    key = id(ev)
    hit = cache.get(key)
    if hit is not None and hit[0]() is ev and hit[1] is model:
        cache.move_to_end(key)
        return hit[2]
    normalised = _normalise(ev, model)
    cache[key] = (weakref.ref(ev), model, normalised)
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)
    return normalised


def _normalised_golden(golden: Evidence, model: IdentifierModel) -> _Normalised:
    """:func:`_normalise` of a golden run, made once per evidence object and model."""
    return _normalised(_GOLDEN_DOCS, _GOLDEN_DOCS_LIMIT, golden, model)


def _normalised_case(case: Evidence, model: IdentifierModel) -> _Normalised:
    """:func:`_normalise` of a case's final evidence, made once per evidence object and
    model (cases sharing a resume share it)."""
    return _normalised(_CASE_DOCS, _CASE_DOCS_LIMIT, case, model)


_IDENTIFYING = ("role", "op", "node", "node_id", "tool", "name", "key", "ref", "status")
"""Fields shown first when a row or message is printed in a diff: what it is."""


def _line(value: Any) -> str:
    """One row or message as one JSON line, identifying fields first."""
    if isinstance(value, dict):
        ordered = {k: value[k] for k in _IDENTIFYING if k in value}
        ordered.update((k, value[k]) for k in sorted(value, key=str) if k not in ordered)
        return json.dumps(ordered, default=str)
    return json.dumps(value, sort_keys=True, default=str)


def _lines(value: Any) -> list[str]:
    """A value as diff lines: a list one item a line (a row, a message), else indented JSON."""
    if isinstance(value, list):
        return [_line(v) for v in value]
    return json.dumps(value, indent=1, sort_keys=True, default=str).splitlines()


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _changes(old: Any, new: Any, width: int = 60) -> str:
    """What differs between two rows, field by field: ``key 'key-1' -> 'key-2'; status
    'succeeded' -> 'started'`` (nested fields dotted; long values cut)."""
    a, b = _leaves(old), _leaves(new)
    parts = []
    for k in list(a) + [k for k in b if k not in a]:
        if a.get(k, "<none>") != b.get(k, "<none>"):
            x, y = (_clip(json.dumps(v, default=str), width) for v in (a.get(k, "<none>"), b.get(k, "<none>")))
            parts.append(f"{k} {x} -> {y}")
    return "; ".join(parts)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _what(row: Any) -> str:
    if not isinstance(row, dict):
        return "value"
    shown = [f"{k} {row[k]}" for k in _IDENTIFYING[:6] if k in row and isinstance(row[k], str)]
    return ", ".join(shown[:3]) or "row"


PAIR_CHARS = 400
"""How much of two rows :func:`_pairs` compares: their first characters, where
:func:`_line` puts what identifies them."""


def _pairs(a: list[str], b: list[str], olds: list[int], news: list[int]) -> list[tuple[int, int]]:
    """Each changed golden row ``a[i]`` (``i`` in ``olds``) paired with the most similar
    case row ``b[j]`` still unpaired (``j`` taken out of ``news``), when their similarity
    (``difflib``'s ratio of the first :data:`PAIR_CHARS` characters) is over 0.6. The
    cheap upper bounds (``real_quick_ratio``, ``quick_ratio``) skip a candidate that cannot
    beat the best so far: a failing case of a long transcript spent seconds of the
    controller here (every pair's full ratio, twice), the matrix stalled behind it."""
    pairs = []
    for i in olds:
        best, best_ratio = None, 0.6
        for j in news:
            m = difflib.SequenceMatcher(None, a[i][:PAIR_CHARS], b[j][:PAIR_CHARS], autojunk=False)
            if m.real_quick_ratio() <= best_ratio or m.quick_ratio() <= best_ratio:
                continue
            ratio = m.ratio()
            if ratio > best_ratio:
                best, best_ratio = j, ratio
        if best is not None:
            pairs.append((i, best))
            news.remove(best)
    return pairs


def _diff(golden: Any, actual: Any, limit: int = 24) -> list[str]:
    """A small diff (golden -> case) that always shows what differs: rows or messages one
    a line; a row changed in place is shown as the fields that changed (``~ op charge,
    key key-2: status 'succeeded' -> 'started'``), a row only in one run whole
    (``-``/``+``, identifying fields first). At most ``limit`` lines; unchanged rows are
    left out first."""
    if not (isinstance(golden, list) and isinstance(actual, list)):
        a, b = _lines(golden), _lines(actual)
        out = [line for line in difflib.unified_diff(a, b, "golden", "case", n=1, lineterm="")][2:]
    else:
        a, b = [_line(v) for v in golden], [_line(v) for v in actual]
        out = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if tag == "equal":
                out += ["  " + _clip(line, 160) for line in a[i1:i2]]
                continue
            olds, news = list(range(i1, i2)), list(range(j1, j2))
            pairs = _pairs(a, b, olds[:limit], news)
            paired = {i for i, _ in pairs}
            out += [f"~ {_what(golden[i])}: {_changes(golden[i], actual[j])}" for i, j in pairs]
            out += ["- " + _clip(a[i], 240) for i in olds if i not in paired]
            out += ["+ " + _clip(b[j], 240) for j in news]
    if len(out) > limit:
        changed = [line for line in out if line[:1] in "+-~"]
        out = changed[:limit] + ([f"... ({len(changed) - limit} more changed lines)"] if len(changed) > limit else [])
    return out


def applied_effect(row: dict[str, Any]) -> bool:
    """Whether a provider ledger row is an effect that took place (not a declined charge,
    not a model bill, not a request the provider refused)."""
    return (row.get("op") != "completion" and row.get("status") not in FAILED_PROVIDER_STATUSES
            and (row.get("http_status") or 200) < 400)


def _explain_duplicates(kind: str, golden_rows: list[dict[str, Any]], case_rows: list[dict[str, Any]],
                        key_nodes: dict[str, str]) -> str:
    """What an extra provider row means, in words: ``mail: message applied twice where the
    golden run applied it once: keys key-2 and key-5 (the key changed between attempts),
    tool call turn-5.tool-0``. Rows are renamed; effects with the same fields but their
    identifiers are one effect applied again."""
    def effect(row: dict[str, Any]) -> str:
        bare = {k: v for k, v in row.items() if k not in ("key", "ref", "result", "http_status")}
        return json.dumps(bare, sort_keys=True, default=str)

    golden_count: Counter[str] = Counter(effect(r) for r in golden_rows if applied_effect(r))
    by_effect: dict[str, list[dict[str, Any]]] = {}
    for r in case_rows:
        if applied_effect(r):
            by_effect.setdefault(effect(r), []).append(r)
    parts = []
    for what, rows in by_effect.items():
        if len(rows) > golden_count.get(what, 0) and len(rows) > 1:
            keys = [str(r.get("key")) for r in rows]
            times = {2: "twice", 3: "three times"}.get(len(rows), f"{len(rows)} times")
            was = {0: "never applied it", 1: "applied it once"}.get(golden_count.get(what, 0),
                                                                   f"applied it {golden_count.get(what, 0)} times")
            text = f"{kind}: {rows[0].get('op', 'effect')} applied {times} where the golden run {was}: keys {', '.join(keys)}"
            if len(set(keys)) > 1:
                text += " (the key changed between attempts)"
            nodes = sorted({key_nodes[k] for k in keys if k in key_nodes})
            if nodes:
                text += f", tool call {', '.join(nodes)}"
            parts.append(text)
    return "; ".join(parts)


def _provider_anomaly(details: str) -> str:
    if "more row" in details or "applied twice" in details or "times where" in details:
        return "duplicated effect"
    if "fewer row" in details:
        return "lost effect"
    return "effect differs"


def _transcript_anomaly(details: str) -> str:
    if "duplicated" in details:
        return "duplicated message"
    if "missing" in details:
        return "lost message"
    return "reordered messages"


RUN_STATUS = Check("run.status", "prefix continuation", "diverged status", "end", "the same terminal status")
STATE_EQUAL = Check("state.equal", "prefix continuation", "diverged state", "end",
                    "the same final answer, budget and (empty) frontier")
TRANSCRIPT_EXACT = Check("transcript.exact", "prefix continuation", "duplicated or lost message", "end",
                         "no message duplicated or missing, same order", refine=_transcript_anomaly)
EFFECTS_LEDGER_EQUAL = Check("effects.ledger_equal", "effect exactly-once", "effect ledger differs", "end",
                             "the subject's effect ledger equal row for row, none left started or unknown")
PROVIDER_LEDGER_EQUAL = Check("provider.<kind>.ledger_equal", "effect exactly-once", "effect differs", "end",
                              "each provider's own ledger equal: nothing applied twice, nothing lost",
                              refine=_provider_anomaly)
CALLS_BILLED = Check("model.calls_billed", "prefix continuation", "re-paid model call", "end",
                     "per node, calls billed at most the golden count plus those in flight at a fault")

_DECLARED_ONLY = IdentifierModel()
"""The model of a matrix without a learned one: only the declared places."""


def _status_verdict(g: _Normalised, c: _Normalised) -> Verdict:
    """``run.status``: the case ends in the golden run's terminal status."""
    if g.status == c.status:
        return Verdict("run.status", "end", True, f"status {c.status}")
    return Verdict("run.status", "end", False, f"status {c.status!r}, golden {g.status!r}")


def _state_verdict(g: _Normalised, c: _Normalised) -> Verdict:
    """``state.equal``: the same final answer, budget and frontier (pending nodes);
    fails when the case's final state cannot be rebuilt."""
    if c.state_error:
        return Verdict("state.equal", "end", False, f"the final state cannot be rebuilt: {c.state_error}")
    gs = {"answer": g.answer, "budget": g.budget, "pending": g.pending}
    cs = {"answer": c.answer, "budget": c.budget, "pending": c.pending}
    if gs == cs:
        return Verdict("state.equal", "end", True, "answer, budget and frontier equal")
    fields = [k for k in gs if gs[k] != cs[k]]
    return Verdict("state.equal", "end", False, f"final state differs in {', '.join(fields)}", _diff(gs, cs))


def _transcript_verdict(g: _Normalised, c: _Normalised) -> Verdict:
    """``transcript.exact``: no message duplicated or missing, and the same order."""
    gc = Counter(json.dumps(m, sort_keys=True) for m in g.transcript)
    cc = Counter(json.dumps(m, sort_keys=True) for m in c.transcript)
    dup = cc - gc
    missing = gc - cc
    if not dup and not missing and g.transcript == c.transcript:
        return Verdict("transcript.exact", "end", True, f"{len(c.transcript)} messages")
    parts = []
    if dup:
        parts.append(f"{sum(dup.values())} duplicated/unexpected message(s)")
    if missing:
        parts.append(f"{sum(missing.values())} missing message(s)")
    if not parts:
        parts.append("messages reordered")
    return Verdict("transcript.exact", "end", False, ", ".join(parts), _diff(g.transcript, c.transcript))


def _effects_verdict(g: _Normalised, c: _Normalised, case: Evidence) -> Verdict:
    """``effects.ledger_equal``: the subject's effect ledger equal row for row, none
    left ``started`` or ``unknown`` (valid, not applicable, when ``case`` observed no
    effects ledger)."""
    if case.observation.effects is None:
        return Verdict("effects.ledger_equal", "end", True, "not applicable: the subject has no effects ledger")
    left = [e for e in c.effects if e["status"] in ("started", "unknown")]
    if g.effects == c.effects and not left:
        return Verdict("effects.ledger_equal", "end", True, f"{len(c.effects)} rows equal")
    details = f"{len(c.effects)} rows, golden {len(g.effects)}"
    if left:
        details += f"; left unresolved: {', '.join(e['node'] + ' ' + e['status'] for e in left)}"
    return Verdict("effects.ledger_equal", "end", False, details, _diff(g.effects, c.effects))


def _provider_verdict(kind: str, name: str, g: _Normalised, c: _Normalised, case: Evidence) -> Verdict:
    """``provider.<kind>.ledger_equal`` (``name``): provider ``kind``'s own ledger equal
    row for row; a failure names the duplicated keys and their tool calls when it can."""
    gl, cl = g.ledgers.get(kind, []), c.ledgers.get(kind, [])
    if gl == cl:
        return Verdict(name, "end", True, f"{len(cl)} rows equal")
    extra = len(cl) - len(gl)
    what = (f"{extra} more row(s) than golden (applied twice?)" if extra > 0
            else f"{-extra} fewer row(s) than golden (lost?)" if extra < 0 else "rows differ")
    seen = c.renamers[kind].seen if kind in c.renamers else {}
    key_nodes = {seen[e.key]: e.node_id for e in case.observation.effects or [] if e.key in seen}
    why = _explain_duplicates(kind, gl, cl, key_nodes)
    return Verdict(name, "end", False, why or f"{kind} ledger: {what}", _diff(gl, cl))


def _billed_verdict(golden: Evidence, case: Evidence, allowance: dict[str, int]) -> Verdict:
    """``model.calls_billed``: per node, the case billed at most the golden run's count
    plus ``allowance`` (node -> calls in flight at a fault)."""
    over = []
    for node in sorted(set(golden.model_calls) | set(case.model_calls)):
        limit = golden.model_calls.get(node, 0) + allowance.get(node, 0)
        if case.model_calls.get(node, 0) > limit:
            over.append(f"{node}: billed {case.model_calls[node]}, at most {limit} allowed")
    if over:
        # the allowance is one call per model.call.before label a faulted worker left
        # unanswered: a retry inside one label bills more calls than it counts
        return Verdict("model.calls_billed", "end", False, "; ".join(over) + (
            " (a call in flight at a fault is allowed once per model.call.before label: label every billed "
            "call, since a retry loop inside one label, an HTTP client's or a framework's, bills twice)"))
    total, gtotal = sum(case.model_calls.values()), sum(golden.model_calls.values())
    return Verdict("model.calls_billed", "end", True, f"{total} calls billed (golden {gtotal}, in flight at faults {sum(allowance.values())})")


def end_checks(golden: Evidence, case: Evidence, allowance: dict[str, int],
               identifiers: IdentifierModel | None = None) -> list[Verdict]:
    """Every end check, comparing ``case`` with ``golden`` up to a renaming of the
    identifiers ``identifiers`` names (learned from the golden pair,
    :func:`learn_identifiers`; None: only the declared places). ``allowance``: node ->
    model calls that were in flight when a fault landed."""
    model = identifiers or _DECLARED_ONLY
    g, c = _normalised_golden(golden, model), _normalised_case(case, model)
    out: list[Verdict] = []
    out += compose([(RUN_STATUS, lambda: _status_verdict(g, c)), (STATE_EQUAL, lambda: _state_verdict(g, c)),
                    (TRANSCRIPT_EXACT, lambda: _transcript_verdict(g, c)),
                    (EFFECTS_LEDGER_EQUAL, lambda: _effects_verdict(g, c, case))])
    for kind in sorted(set(g.ledgers) | set(c.ledgers)):
        name = f"provider.{kind}.ledger_equal"
        out.append(PROVIDER_LEDGER_EQUAL.run(partial(_provider_verdict, kind, name, g, c, case), name))
    out.append(CALLS_BILLED.run(lambda: _billed_verdict(golden, case, allowance)))
    if case.observation.invocations is not None:
        out.append(CONTINUES.run(lambda: check_trace_continues(case.observation)))
    return out


def in_flight_model_calls(trace: Trace) -> dict[str, int]:
    """Model calls the faulted worker made whose reply it did not record, per node, by
    the time it ended (``trace`` is its whole trace: a kill ends it at the fault, a
    cancel lands at the next await, a term after the drain, a broken link after the
    runtime's retries): each ``model.call.before`` counts one call, and a node whose
    record was appended used one of them. Each may be billed once more (on resume, or by
    a call repeated after a lost answer)."""
    started: dict[str, int] = {}
    appended: set[str] = set()
    for _, name, task, _ in trace:
        if name == MODEL_CALL_BEFORE:
            started[task] = started.get(task, 0) + 1
        elif name == LOG_APPEND_AFTER:
            appended.add(task)
    out = {node: n - (node in appended) for node, n in started.items()}
    return {node: n for node, n in out.items() if n > 0}
