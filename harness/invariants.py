"""Invariants: checks that need no golden run (docs/design.md, "The oracle").

The end checks compare a case with its golden run, so a defect present in every run,
the golden one included (a tool node that charges twice per call), becomes the baseline
and passes them. The invariants below hold for any run on its own; the explorer checks
them on each golden run (a golden run that breaks one is a defect of the subject, never
a baseline: the conversation's cases are not run) and at the end of every case.

- ``effects.applied_once`` (effect exactly-once): in each provider's ledger, at most one
  applied effect per operation and idempotency key, and at most one per operation and
  logical task (the tool call that made it) where the provider recorded the task; at
  most one per operation named by one row of the subject's effect ledger (a row is one
  tool call: its key and its result name what it applied); and,
  for an operation of which the run's durable record (transcript, final state, effect
  ledger) names at least one applied effect by its key or provider id, every applied
  effect of that operation is named there (an effect applied but absent from the record
  was applied twice, or is lost to the run). Not applicable to a provider whose effects
  the record never names (a tool whose result carries no id).
- ``effects.resolved`` (effect resolution): a run that ended ``completed``, ``failed`` or
  ``limit_exceeded`` leaves no effect of its ledger ``started`` or ``unknown`` (a run
  waiting for a person, ``needs_human``, may: the person resolves it).
- ``model.answers_recorded`` (billed answers are durable): every model answer the model
  provider billed for a run that ended is in its durable record (one of its tool-call ids,
  or, for a runtime whose record keeps none of the provider's ids, one of its tool calls by
  name and arguments; an answer without calls: its text), except the calls the faulted workers' traces
  show in flight when a fault landed (``allowance``, per node). A reply kept only in
  memory is lost to every resume, and paid again.

- ``log.clean_final`` (the log stays clean): the final log, after the last resume, is
  what ``log.clean_prefix`` requires of every crash state (contiguous seq from 1, every
  record decodes, parents recorded earlier, no node twice): a resume that appends past a
  hole (a seq reserved in memory by a cancelled attempt and never written) leaves a log
  that replay, export and the next rehydrate read as torn, though every crash state was
  clean.

``run.acknowledged_durable`` (acknowledged runs are durable) is the crash-state twin,
in :mod:`.oracle`: once a worker's trace passed ``run.accepted``, the run exists.

Each returns a :class:`~crashmatrix.harness.oracle.Verdict`; none raises for the run's own
faults (a check that raises is ``unknown``: :func:`crashmatrix.harness.oracle.run_check`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .checks import Check, compose
from .oracle import Evidence, Verdict, applied_effect as _applied, check_clean_prefix

APPLIED_ONCE = Check("effects.applied_once", "effect exactly-once", "duplicated effect", "invariant",
                     "at most one applied effect per operation and key, per task, per effect-ledger row",
                     refine=lambda details: "effect without its record" if "not recorded" in details else None)
RESOLVED = Check("effects.resolved", "effect resolution", "effect left started/unknown", "invariant",
                 "a run that ended leaves no effect started or unknown")
ANSWERS_RECORDED = Check("model.answers_recorded", "prefix continuation", "lost answer", "invariant",
                         "every answer the model provider billed is in the run's record, or was in flight at a fault")
CLEAN_FINAL = Check("log.clean_final", "checkpoint validity", "torn log", "invariant",
                    "the final log is a clean prefix: contiguous seq from 1, parents earlier, no node twice")

ENDED = ("completed", "failed", "limit_exceeded", "needs_human")
"""Statuses of a run that ended: the answers it paid for must be in its record."""
RESOLVED_REQUIRED = ("completed", "failed", "limit_exceeded")


def _record_text(ev: Evidence) -> tuple[set[str], str]:
    """The atoms and the text of the run's durable record: its rebuilt state and its
    effect ledger (keys, results)."""
    return _atoms_of([ev.observation.state or {}, [[e.key, e.result] for e in ev.observation.effects or []]])


def _atoms_of(value: Any) -> tuple[set[str], str]:
    """Every string and integer inside ``value`` (dict keys too), and its strings joined."""
    atoms: set[str] = set()
    texts: list[str] = []

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                atoms.add(str(k))
                visit(v)
        elif isinstance(value, list | tuple):
            for v in value:
                visit(v)
        elif isinstance(value, str):
            atoms.add(value)
            texts.append(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            atoms.add(str(value))

    visit(value)
    return atoms, "\n".join(texts)


def _named(value: Any, atoms: set[str], text: str) -> bool:
    if value is None:
        return False
    ident = str(value)
    return ident in atoms or (len(ident) >= 6 and ident in text)


def check_applied_once(ev: Evidence) -> Verdict:
    """``effects.applied_once`` (module docstring)."""
    name = "effects.applied_once"
    problems: list[str] = []
    atoms, text = _record_text(ev)
    for kind, rows in sorted(ev.ledgers.items()):
        applied = [r for r in rows if _applied(r)]
        by_key: dict[tuple[Any, Any], int] = {}
        by_task: dict[tuple[Any, Any], list[Any]] = {}
        for r in applied:
            if r.get("key") is not None:
                by_key[(r.get("op"), r["key"])] = by_key.get((r.get("op"), r["key"]), 0) + 1
            if r.get("task"):
                by_task.setdefault((r.get("op"), r["task"]), []).append(r.get("key"))
        problems += [f"{kind}: {op} with key {key} applied {n} times" for (op, key), n in by_key.items() if n > 1]
        problems += [f"{kind}: {op} applied {len(keys)} times by tool call {task} (keys {', '.join(map(str, keys))})"
                     for (op, task), keys in by_task.items() if len(keys) > 1]
        # one tool call, one effect: an effect row of the subject (one per tool call) that
        # names two applied effects of one operation, by key or in its result
        for e in ev.observation.effects or []:
            e_atoms, e_text = _atoms_of([e.key, e.result])
            for op in sorted({str(r.get("op")) for r in applied}):
                mine = [r for r in applied if str(r.get("op")) == op
                        and (_named(r.get("key"), e_atoms, e_text) or _named(r.get("ref"), e_atoms, e_text))]
                if len(mine) > 1:
                    problems.append(f"{kind}: {len(mine)} {op}(s) applied for one tool call, {e.node_id} "
                                    f"(keys {', '.join(str(r.get('key')) for r in mine)})")
        for op in sorted({str(r.get("op")) for r in applied}):
            of_op = [r for r in applied if str(r.get("op")) == op]
            named = [r for r in of_op if _named(r.get("key"), atoms, text) or _named(r.get("ref"), atoms, text)]
            if named and len(named) < len(of_op):
                lost = [str(r.get("ref") or r.get("key")) for r in of_op if r not in named]
                problems.append(f"{kind}: {len(of_op)} {op}(s) applied for the run, {len(named)} named in its durable "
                                f"record; applied but not recorded: {', '.join(lost)}")
    if problems:
        return Verdict(name, "end", False, "; ".join(problems))
    total = sum(1 for rows in ev.ledgers.values() for r in rows if _applied(r))
    return Verdict(name, "end", True, f"{total} applied effect(s); none applied twice under one key, by one tool "
                                      "call or for one effect record of the run (a retry under a new key is the "
                                      "ledger checks' to see)")


def check_resolved(ev: Evidence) -> Verdict:
    """``effects.resolved`` (module docstring)."""
    name = "effects.resolved"
    obs = ev.observation
    if obs.effects is None:
        return Verdict(name, "end", True, "not applicable: the subject has no effects ledger")
    if obs.status not in RESOLVED_REQUIRED:
        return Verdict(name, "end", True, f"not applicable: the run is {obs.status!r}")
    left = [f"{e.tool} of {e.node_id} {e.status}" for e in obs.effects if e.status in ("started", "unknown")]
    if left:
        return Verdict(name, "end", False, f"the run is {obs.status} with {len(left)} effect(s) unresolved: {', '.join(left)}")
    return Verdict(name, "end", True, f"{len(obs.effects)} effect(s), all resolved")


def _call_in_record(call: dict[str, Any], atoms: set[str]) -> bool:
    """Whether a tool call of a billed answer is in the record by what it asks rather
    than by its id: its tool name and every string and integer of its arguments. A
    runtime may replace the model's tool-call ids with its own (Temporal-style
    deterministic ids: docs/checks.md) and still keep the
    answer. ``arguments`` is a mapping or its JSON text (the OpenAI wire form)."""
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return False
    name = call.get("name")
    if not isinstance(name, str) or name not in atoms:
        return False
    wanted, _ = _atoms_of(args if args is not None else {})
    return wanted <= atoms


def check_answers_recorded(ev: Evidence, allowance: dict[str, int]) -> Verdict:
    """``model.answers_recorded`` (module docstring). ``allowance``: node -> answers
    that may be missing because their call was in flight when a fault landed."""
    name = "model.answers_recorded"
    obs = ev.observation
    if obs.state is None:
        return Verdict(name, "end", True, "not applicable: the run's state could not be rebuilt")
    if obs.status not in ENDED:
        return Verdict(name, "end", True, f"not applicable: the run is {obs.status!r}")
    if not ev.model_rows:
        return Verdict(name, "end", True, "no model answer billed")
    atoms, text = _record_text(ev)

    def call_ids(row: dict[str, Any]) -> list[Any]:
        reply = row.get("result") or {}
        return [c.get("id") for c in reply.get("tool_calls") or [] if isinstance(c, dict) and c.get("id")]

    # a runtime that keeps the provider's tool-call ids is judged by them (a missing one is
    # a lost answer, even if another answer asked for the same call); one that keeps none
    # of them mints its own, and its answers are found by what their calls ask
    keeps_ids = any(_named(c, atoms, text) for row in ev.model_rows for c in call_ids(row))
    missing: dict[str, list[str]] = {}
    for row in ev.model_rows:
        reply = row.get("result") or {}
        calls = call_ids(row)
        content = reply.get("content")
        if calls and keeps_ids:
            recorded = any(_named(c, atoms, text) for c in calls)
        elif calls:
            recorded = any(_call_in_record(c, atoms) for c in reply.get("tool_calls") or [] if isinstance(c, dict))
            recorded = recorded or (isinstance(content, str) and bool(content.strip()) and content in text)
        elif isinstance(content, str) and content.strip():
            recorded = content in atoms or content in text
        else:
            recorded = True  # an empty answer leaves nothing to look for
        if not recorded:
            missing.setdefault(str(row.get("node_id")), []).append(str(row.get("ref") or row.get("call")))
    over = {node: ids for node, ids in missing.items() if len(ids) > allowance.get(node, 0)}
    if over:
        parts = [f"{node}: {len(ids)} billed answer(s) not in the record ({', '.join(ids)}), "
                 f"{allowance.get(node, 0)} in flight at faults" for node, ids in sorted(over.items())]
        return Verdict(name, "end", False, "; ".join(parts))
    return Verdict(name, "end", True, f"{len(ev.model_rows)} billed answer(s) in the record or in flight at a fault")


def end_invariants(ev: Evidence, allowance: dict[str, int] | None = None) -> list[Verdict]:
    """Every end invariant of one run (golden: ``allowance`` empty)."""
    allowance = allowance or {}
    return compose([
        (APPLIED_ONCE, lambda: check_applied_once(ev)),
        (RESOLVED, lambda: check_resolved(ev)),
        (ANSWERS_RECORDED, lambda: check_answers_recorded(ev, allowance)),
        (CLEAN_FINAL, lambda: check_clean_prefix(ev.observation, "log.clean_final", "end")),
    ])


def summary(verdicts: Iterable[Verdict]) -> str:
    """``effects.applied_once: ...; effects.resolved: ...`` for the failing ones."""
    return "; ".join(f"{v.check}: {v.details}" for v in verdicts if v.valid is not True)
