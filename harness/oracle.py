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
- ``cancel.left_unknown`` (cancel faults): no effect is left ``started``; a cancel that
  landed during a tool request left that node's effect ``unknown``;
- ``term.drained`` (term faults): no node launched after the signal was recorded, the
  worker exited 0 by itself, the run is ``paused`` (or ``completed`` if the drain
  finished the last node, or ``needs_human`` if an in-flight node handed it to a person,
  or exactly as it was before the worker if the SIGTERM came before the worker took it
  (a first worker may have submitted it: ``pending``, nothing recorded));
- ``pause.zombie_fenced`` (pause faults): once another worker took the lease and
  finished the run, the woken zombie changed nothing durable.

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .adapter import Observation
from .normalize import Normalizer
from .plan import Fault

TraceEntry = tuple[str, str, str, int]
VOLATILE_PROVIDER_FIELDS = frozenset({"seq", "attempts", "created_at", "updated_at", "run_id", "metadata", "worker"})


@dataclass
class Verdict:
    """One check's outcome. ``valid``: True, False (invalid) or None (unknown)."""

    check: str
    phase: str
    valid: bool | None
    details: str = ""
    diff: list[str] = field(default_factory=list)

    @property
    def word(self) -> str:
        return {True: "valid", False: "invalid", None: "unknown"}[self.valid]

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "phase": self.phase, "verdict": self.word, "details": self.details, "diff": self.diff}


def merge(verdicts: list[Verdict]) -> bool | None:
    """Invalid beats unknown beats valid; no verdicts at all is valid."""
    if any(v.valid is False for v in verdicts):
        return False
    if any(v.valid is None for v in verdicts):
        return None
    return True


@dataclass
class Evidence:
    """What the oracle compares at the end of a run (golden or faulted)."""

    observation: Observation
    ledgers: dict[str, list[dict[str, Any]]]
    model_calls: dict[str, int]


@dataclass
class CrashEvidence:
    """What the oracle sees right after a fault: the fault, the worker's trace up to it
    and after it, how the worker ended, and the durable state."""

    fault: Fault
    trace_at_fault: list[TraceEntry]
    trace_full: list[TraceEntry]
    exit_returncode: int | None
    exit_signal: int | None
    timed_out: bool
    observation: Observation
    #: the durable state before the faulted worker started (``absent`` for the first
    #: worker of a case); None when the explorer did not look (only ``term`` needs it)
    before: Observation | None = None


def _run(check: str, phase: str, fn: Callable[[], Verdict]) -> Verdict:
    try:
        return fn()
    except Exception as exc:  # a check that raises is unknown, never a pass
        return Verdict(check, phase, None, f"check raised {type(exc).__name__}: {exc}")


def _diff(golden: Any, actual: Any, limit: int = 24) -> list[str]:
    a = json.dumps(golden, indent=1, sort_keys=True, default=str).splitlines()
    b = json.dumps(actual, indent=1, sort_keys=True, default=str).splitlines()
    lines = list(difflib.unified_diff(a, b, "golden", "case", n=1, lineterm=""))
    return lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit else [])


# -- crash-state checks ----------------------------------------------------------------


def check_clean_prefix(obs: Observation) -> Verdict:
    """``log.clean_prefix``: contiguous seq from 1, every record decodes, parents recorded earlier, no node twice."""
    name = "log.clean_prefix"
    if obs.log is None:
        return Verdict(name, "crash", True, "not applicable: the adapter exposes no log")
    problems = []
    seen: set[str] = set()
    for i, entry in enumerate(obs.log, start=1):
        if entry.seq != i:
            problems.append(f"seq {entry.seq} at position {i} (expected {i}: the log has a gap)")
        if entry.error:
            problems.append(f"seq {entry.seq} node {entry.node_id}: {entry.error}")
        if entry.node_id in seen:
            problems.append(f"node {entry.node_id} recorded twice")
        for p in entry.parents:
            if p not in seen:
                problems.append(f"seq {entry.seq} node {entry.node_id}: parent {p} not recorded before it")
        seen.add(entry.node_id)
    if problems:
        return Verdict(name, "crash", False, f"{len(problems)} problem(s): " + "; ".join(problems[:5]))
    return Verdict(name, "crash", True, f"{len(obs.log)} records, contiguous")


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

    The logical task of the point is the node id (DESIGN.md, "Crash points"); a retried
    append of a record already there also passes the label and is also durable. Source:
    a store that acknowledges before the write is durable (records flushed by a
    background task) loses the acknowledged tail on a kill, which no end check sees
    when the lost nodes are tool calls a probe resolves again."""
    name = "log.acknowledged_durable"
    if ev.observation.log is None:
        return Verdict(name, "crash", True, "not applicable: the adapter exposes no log")
    acknowledged = list(dict.fromkeys(task for _, point, task, _ in ev.trace_full if point == "log.append.after"))
    recorded = {e.node_id for e in ev.observation.log}
    lost = [task for task in acknowledged if task not in recorded]
    if lost:
        return Verdict(name, "crash", False,
                       f"{len(lost)} of {len(acknowledged)} acknowledged append(s) not in the log: {', '.join(lost[:8])}")
    return Verdict(name, "crash", True, f"{len(acknowledged)} acknowledged append(s), all in the log")


def check_cancel_left_unknown(ev: CrashEvidence) -> Verdict:
    """``cancel.left_unknown``: no effect left ``started``; a cancel during a tool request left it ``unknown``."""
    name = "cancel.left_unknown"
    if ev.observation.effects is None:
        return Verdict(name, "crash", True, "not applicable: the adapter exposes no effects ledger")
    effects = ev.observation.effects
    problems = [f"effect {e.tool} of {e.node_id} left started after the cancellation" for e in effects if e.status == "started"]
    point = ev.fault.point
    if point.name == "tool.request.before":
        mine = [e for e in effects if e.node_id == point.task]
        for e in mine:
            if e.status != "unknown":
                problems.append(f"cancel landed during the request of {e.tool} ({e.node_id}) but its effect is {e.status}, not unknown")
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    return Verdict(name, "crash", True, "no effect left started")


def check_term_drained(ev: CrashEvidence) -> Verdict:
    """``term.drained``: nothing launched after the signal, exit 0, run ``paused`` (or
    completed, or handed to a person; or untouched, :func:`untouched_by_worker`, if the
    drain came before the worker took it)."""
    name = "term.drained"
    problems = []
    names = [entry[1] for entry in ev.trace_full]
    if "drain.begin" in names:
        after = ev.trace_full[names.index("drain.begin") + 1:]
        launched = [f"{e[2]}" for e in after if e[1] == "node.launch"]
        if launched:
            problems.append(f"{len(launched)} node(s) launched after SIGTERM was recorded: {', '.join(launched)}")
    else:
        problems.append("the subject never recorded the SIGTERM (no drain.begin in its trace)")
    if ev.timed_out:
        problems.append("the worker outlived the grace period and was SIGKILLed (failed drain)")
    elif ev.exit_signal is not None:
        problems.append(f"the worker died of signal {ev.exit_signal} instead of draining")
    elif ev.exit_returncode != 0:
        problems.append(f"the worker exited {ev.exit_returncode}, not 0")
    status = ev.observation.status
    pending = (ev.observation.state or {}).get("pending")
    if ev.before is not None and untouched_by_worker(ev.before, ev.observation):
        launched = [e[2] for e in ev.trace_full if e[1] == "node.launch"]
        if launched:
            problems.append(f"run status is {status!r} as before the worker, yet it launched {', '.join(launched)}")
    elif status not in ("paused", "completed", "needs_human"):  # waiting for a person is a rest state too
        problems.append(f"run status is {status!r}, not 'paused'")
    elif status == "completed" and pending:
        problems.append(f"run says completed with pending nodes {pending}")
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    return Verdict(name, "crash", True, f"drained, status {status}")


def untouched_by_worker(before: Observation, after: Observation) -> bool:
    """Whether a worker left the run's durable state as it found it: the same status,
    lease epoch, log and effects; or, for a run that did not exist, submitted and nothing
    more (``pending``, no epoch taken, no record, no effect)."""
    def durable(o: Observation) -> tuple[Any, ...]:
        return (o.status, o.lease_epoch or 0, [(e.seq, e.node_id) for e in o.log or []],
                sorted((e.key, e.status) for e in o.effects or []))

    if before.status == "absent" and after.status == "pending":
        return not after.log and not after.effects and not after.lease_epoch
    return durable(before) == durable(after)


def check_zombie_fenced(before: Observation, after: Observation, zombie_end: dict[str, Any] | None) -> Verdict:
    """``pause.zombie_fenced``: after a paused worker's lease was taken over and the run
    resumed elsewhere, the zombie woke up (SIGCONT); nothing it did may reach the
    durable state: log, effect rows and run status are exactly as before it woke."""
    name = "pause.zombie_fenced"
    problems = []
    if (before.log or []) != (after.log or []):
        extra = [f"{e.node_id}@epoch{e.lease_epoch}" for e in (after.log or []) if e not in (before.log or [])]
        problems.append(f"the log changed after the zombie woke: {', '.join(extra) or 'rows differ'}")
    if sorted(map(repr, before.effects or [])) != sorted(map(repr, after.effects or [])):
        problems.append("effect rows changed after the zombie woke")
    if before.status != after.status:
        problems.append(f"run status changed from {before.status!r} to {after.status!r} after the zombie woke")
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    how = (zombie_end or {}).get("error") or (zombie_end or {}).get("status") or "no report"
    return Verdict(name, "crash", True, f"the zombie's writes were refused ({how})")


def crash_checks(ev: CrashEvidence) -> list[Verdict]:
    """Every crash-state check that applies to this fault."""
    out = [
        _run("log.clean_prefix", "crash", lambda: check_clean_prefix(ev.observation)),
        _run("effects.commit_with_record", "crash", lambda: check_commit_with_record(ev.observation)),
        _run("log.acknowledged_durable", "crash", lambda: check_acknowledged_durable(ev)),
    ]
    if ev.fault.kind == "cancel":
        out.append(_run("cancel.left_unknown", "crash", lambda: check_cancel_left_unknown(ev)))
    if ev.fault.kind == "term":
        out.append(_run("term.drained", "crash", lambda: check_term_drained(ev)))
    return out


# -- end checks ----------------------------------------------------------------------


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


def _normalise(ev: Evidence) -> _Normalised:
    n = Normalizer()
    obs = ev.observation
    state = obs.state or {}
    transcript = n(state.get("transcript", []))
    answer = n(state.get("answer"))
    # rows in an order that does not depend on the keys' or results' raw values (a
    # naive runtime's keys are random per attempt: sorting on them numbered the same two
    # rows differently from one replay to the next); the raw key only breaks full ties
    def order(e: Any) -> tuple[Any, ...]:
        result = json.dumps(n.copy()(e.result), sort_keys=True, default=str)
        return (e.node_id, e.tool, e.status, result, e.key)

    effects = [
        n({"node": e.node_id, "tool": e.tool, "key": e.key, "status": e.status, "result": e.result})
        for e in sorted(obs.effects or [], key=order)
    ]
    # each provider's ledger continues the numbering of the transcript and the effects
    # (so a charge the run never recorded stays visible) but not of the other ledgers
    # (so an extra mail does not shift the payment ledger's labels)
    ledgers = {}
    for kind, rows in sorted(ev.ledgers.items()):
        nk = n.copy()
        ledgers[kind] = [nk({k: v for k, v in row.items() if k not in VOLATILE_PROVIDER_FIELDS}) for row in rows]
    return _Normalised(obs.status, transcript, answer, state.get("budget"), state.get("pending"), effects, ledgers, obs.state_error)


def end_checks(golden: Evidence, case: Evidence, allowance: dict[str, int]) -> list[Verdict]:
    """Every end check, comparing ``case`` with ``golden``. ``allowance``: node ->
    model calls that were in flight when a fault landed."""
    g, c = _normalise(golden), _normalise(case)
    out: list[Verdict] = []

    def status() -> Verdict:
        if g.status == c.status:
            return Verdict("run.status", "end", True, f"status {c.status}")
        return Verdict("run.status", "end", False, f"status {c.status!r}, golden {g.status!r}")

    def state() -> Verdict:
        if c.state_error:
            return Verdict("state.equal", "end", False, f"the final state cannot be rebuilt: {c.state_error}")
        gs = {"answer": g.answer, "budget": g.budget, "pending": g.pending}
        cs = {"answer": c.answer, "budget": c.budget, "pending": c.pending}
        if gs == cs:
            return Verdict("state.equal", "end", True, "answer, budget and frontier equal")
        fields = [k for k in gs if gs[k] != cs[k]]
        return Verdict("state.equal", "end", False, f"final state differs in {', '.join(fields)}", _diff(gs, cs))

    def transcript() -> Verdict:
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

    def effects() -> Verdict:
        if case.observation.effects is None:
            return Verdict("effects.ledger_equal", "end", True, "not applicable: the subject has no effects ledger")
        left = [e for e in c.effects if e["status"] in ("started", "unknown")]
        if g.effects == c.effects and not left:
            return Verdict("effects.ledger_equal", "end", True, f"{len(c.effects)} rows equal")
        details = f"{len(c.effects)} rows, golden {len(g.effects)}"
        if left:
            details += f"; left unresolved: {', '.join(e['node'] + ' ' + e['status'] for e in left)}"
        return Verdict("effects.ledger_equal", "end", False, details, _diff(g.effects, c.effects))

    out += [_run("run.status", "end", status), _run("state.equal", "end", state),
            _run("transcript.exact", "end", transcript), _run("effects.ledger_equal", "end", effects)]

    for kind in sorted(set(g.ledgers) | set(c.ledgers)):
        name = f"provider.{kind}.ledger_equal"

        def provider(kind: str = kind, name: str = name) -> Verdict:
            gl, cl = g.ledgers.get(kind, []), c.ledgers.get(kind, [])
            if gl == cl:
                return Verdict(name, "end", True, f"{len(cl)} rows equal")
            extra = len(cl) - len(gl)
            what = (f"{extra} more row(s) than golden (applied twice?)" if extra > 0
                    else f"{-extra} fewer row(s) than golden (lost?)" if extra < 0 else "rows differ")
            return Verdict(name, "end", False, f"{kind} ledger: {what}", _diff(gl, cl))

        out.append(_run(name, "end", provider))

    def billed() -> Verdict:
        over = []
        for node in sorted(set(golden.model_calls) | set(case.model_calls)):
            limit = golden.model_calls.get(node, 0) + allowance.get(node, 0)
            if case.model_calls.get(node, 0) > limit:
                over.append(f"{node}: billed {case.model_calls[node]}, at most {limit} allowed")
        if over:
            return Verdict("model.calls_billed", "end", False, "; ".join(over))
        total, gtotal = sum(case.model_calls.values()), sum(golden.model_calls.values())
        return Verdict("model.calls_billed", "end", True, f"{total} calls billed (golden {gtotal}, in flight at faults {sum(allowance.values())})")

    out.append(_run("model.calls_billed", "end", billed))
    if case.observation.invocations is not None:
        from .trace_check import check_trace_continues

        out.append(_run("trace.continues", "end", lambda: check_trace_continues(case.observation)))
    return out


def in_flight_model_calls(trace: list[TraceEntry]) -> dict[str, int]:
    """Model calls the faulted worker made whose reply it did not record, per node, by
    the time it ended (``trace`` is its whole trace: a kill ends it at the fault, a
    cancel lands at the next await, a term after the drain, a broken link after the
    runtime's retries): each ``model.call.before`` counts one call, and a node whose
    record was appended used one of them. Each may be billed once more (on resume, or by
    a call repeated after a lost answer)."""
    started: dict[str, int] = {}
    appended: set[str] = set()
    for _, name, task, _ in trace:
        if name == "model.call.before":
            started[task] = started.get(task, 0) + 1
        elif name == "log.append.after":
            appended.add(task)
    out = {node: n - (node in appended) for node, n in started.items()}
    return {node: n for node, n in out.items() if n > 0}
