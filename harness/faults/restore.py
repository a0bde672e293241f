"""``restore``: move the run back in time through the runtime's own API (time travel,
a fork, an operator's restore) after it went past the point, and judge what the run
does with a world that went on.

Every other kind moves a run forward (it dies, a worker resumes it). Runtimes also move
runs backward: LangGraph invokes a thread from an earlier ``checkpoint_id`` (time
travel, which forks the thread), DBOS forks a workflow from a step
(``DBOS.fork_workflow``), an operator restores a run. What can go wrong: the restored
checkpoint resumes into a state that never existed together with the world's state:
a payment made again, an approval spent twice.

A case, at point P of the golden run:

1. the worker stops itself at P (SIGSTOP); the controller asks the runtime where the
   run is (:meth:`.adapter.Adapter.restore_point`: its latest checkpoint, Q) and wakes
   the worker, which runs the run to its end;
2. once the crash state was read and checked, the controller reads the world (the run's
   state, the providers' ledgers, the model's bills), then restores the run to Q, or
   forks it from Q, through the runtime's API (:meth:`.adapter.Adapter.restore_run`),
   reads the state it restored, and resumes the run it names (the same run, or the
   fork) by id until it ends;
3. the kind's checks, then the end checks on the case's run (restored in place: it must
   end as the golden run did, its model answers after Q billed once more at most; a
   fork: the original must be as it was).

The checks (docs/checks.md): ``restore.effect_reapplied`` (the effects the run made
after Q are not sent to their providers again when the runtime promises to replay its
record, ``Adapter.restore_effects == "replays recorded"``; exactly once more when it
promises a fresh attempt), ``restore.approval_respent`` (an interrupt answer given after
Q is not consumed again without the interrupt being asked again),
``restore.state_possible`` (the restored transcript is a prefix of the run's own: a
state that existed), ``restore.model_rebilled`` (no model answer recorded at Q is billed
again) and ``restore.fork_original`` (a fork leaves the original run as it was).

Q is the checkpoint the run was at when P was passed; the golden trace locates it at the
last ``log.append.after`` at or before P (the append that made it durable), so the model
calls the trace shows after it are the ones a restore may bill again. A point before the
run's first checkpoint gives no Q: the case restores nothing and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..crashpoint import LOG_APPEND_AFTER, MODEL_CALL_BEFORE
from ..errors import HarnessError
from ..checks import Check
from ..oracle import Verdict, applied_effect, run_check
from ._base import FaultKind, Stops, register, signal_self

if TYPE_CHECKING:
    from ..adapter import Observation
    from ..explorer import CaseRun, WorkerRun
    from ..history import Trace
    from ..oracle import Evidence
    from ..plan import Fault
    from ..worker import Recorder


RESTORE_WAIT_S = 15.0
"""Seconds the controller waits for each restore call of the runtime (bounded by
``Options.worker_timeout`` too); longer is a harness error naming the call, not a hang."""

EFFECT_REAPPLIED = Check("restore.effect_reapplied", "restore", "effect re-applied after restore", "end",
                         "an effect made between the restore point and the fault is not sent again, unless the "
                         "runtime promises a fresh attempt (then exactly once more)").name
APPROVAL_RESPENT = Check("restore.approval_respent", "restore", "approval re-spent", "end",
                         "an answer given after the restore point is not consumed again without being asked again").name
STATE_POSSIBLE = Check("restore.state_possible", "restore", "restored state never existed", "end",
                       "the transcript after the restore is a prefix of a run that could exist").name
MODEL_REBILLED = Check("restore.model_rebilled", "restore", "model answer billed twice", "end",
                       "no model answer is billed twice unless the runtime promises a fresh attempt").name
FORK_ORIGINAL = Check("restore.fork_original", "restore", "fork changed the original", "end",
                      "a fork leaves the original run's outcome as it was").name
CHECKS = (EFFECT_REAPPLIED, APPROVAL_RESPENT, STATE_POSSIBLE, MODEL_REBILLED, FORK_ORIGINAL)
"""The kind's checks, in the order a case reports them."""


def _supports(adapter: object) -> bool:
    """Whether ``adapter``'s runtime can move a run back (capability ``restore``)."""
    from ..adapter import capabilities_of

    return "restore" in capabilities_of(adapter)


@register
class Restore(Stops, FaultKind):
    """Restore (or fork) the run to the checkpoint it was at when the point was passed,
    once it ran to its end; resume what the runtime names; judge."""

    name = "restore"
    rank = 8
    listing_order = 10
    why_not_run = "the run had no checkpoint yet when the point was passed: nothing to restore to"
    wakes_intact = True

    def not_applicable(self, adapter: object) -> str | None:
        if _supports(adapter):
            return None
        name = getattr(adapter, "name", None) or type(adapter).__name__
        why = getattr(adapter, "restore_not_applicable", None)
        return (f"restore needs the runtime's own restore or fork of a run: {name} declares none"
                + (f" ({why})" if why else " (Adapter.restore_point, restore_run, restore_effects: docs/adapters.md)"))

    def act(self, recorder: Recorder, fault: Fault) -> None:
        signal_self(signal.SIGSTOP)

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:
        ex = cx.explorer
        if not _supports(ex.adapter):  # run_case made such a case not applicable: a guard
            raise HarnessError(f"restore: {ex.subject} declares no restore API of its runtime")
        point = await _bounded(ex, "restore_point", ex.adapter.restore_point(ex.case_env, cx.run_id))
        fired = w.report.fired.trace if w.report.fired is not None else []
        cx.kind_state[self.name] = {"point": point, "at": len(fired)}
        if getattr(ex.workload, "operator_script", None) is not None:  # the answers the run had at its point
            cx.kind_state[self.name]["answers"] = await cx.observe()
        w.entry["restore_point"] = point

    async def settle(self, cx: CaseRun, w: WorkerRun, obs: Observation) -> str:
        ex = cx.explorer
        state = cx.kind_state.get(self.name) or {}
        point = state.get("point")
        if point is None:
            cx.result.verdicts.append(Verdict(EFFECT_REAPPLIED, "end", True, "not applicable: the run had no "
                                              "checkpoint when the point was passed, nothing to restore to"))
            return obs.status
        w.entry["took_effect"] = True  # the run goes back in time whatever its first worker did
        full = w.report.end.trace if w.report.end is not None else (w.report.fired.trace if w.report.fired else [])
        again = rebillable(full, state["at"], getattr(ex.adapter, "restore_point_label", LOG_APPEND_AFTER))
        before = await ex.evidence(cx.run_id)
        cont = await _bounded(ex, "restore_run", ex.adapter.restore_run(ex.case_env, cx.run_id, point))
        fork = cont != cx.run_id
        w.entry["restored"] = {"point": point, "run": cont, "fork": fork}
        restored = await ex.adapter.observe(ex.case_env, cont)
        cx.result.verdicts.append(run_check(STATE_POSSIBLE, "end", lambda: check_state_possible(
            before.observation, restored, point)))
        workers_before, allowed_before = len(cx.result.workers), dict(cx.allowance)
        if fork:
            run = dataclasses.replace(cx, run_id=cont, done=False, resumes=0, allowance={})
            await run.drive(w.index + 1, restored.status)
            refused = dict(run.allowance)
        else:
            await cx.drive(w.index + 1, restored.status)
            refused = {node: n - allowed_before.get(node, 0) for node, n in cx.allowance.items()
                       if n > allowed_before.get(node, 0)}
        # the workers that resumed after the restore (two at once under `concurrent`), and
        # the model calls the resume policy allowed for a resumer refused mid-node
        resumers = max(1, sum(1 for entry in cx.result.workers[workers_before:] if entry.get("role") == "resume"))
        final = await ex.evidence(cont)
        if not fork:  # the runtime runs the steps after Q again: one more bill each
            for node, n in rebill_allowance(before.model_calls, final.model_calls, again).items():
                cx.allowance[node] = cx.allowance.get(node, 0) + n
        promise = str(getattr(ex.adapter, "restore_effects", None))
        original = before if not fork else None
        verdicts = [
            run_check(EFFECT_REAPPLIED, "end", lambda: check_effects(
                promise, before.ledgers, final.ledgers, fork, cx.golden.applied, resumers)),
            run_check(MODEL_REBILLED, "end", lambda: check_model_rebilled(
                original.model_calls if original is not None else {}, final.model_calls, again, refused)),
        ]
        script = getattr(ex.workload, "operator_script", None)
        if script is not None:
            at_point = state.get("answers") or restored
            verdicts.append(run_check(APPROVAL_RESPENT, "end", lambda: check_approvals(
                at_point, final.observation, cx.result.resume_trace)))
        if fork:
            now = await ex.evidence(cx.run_id)
            verdicts.append(run_check(FORK_ORIGINAL, "end", lambda: check_fork_original(before, now, cont)))
        cx.result.verdicts += verdicts
        cx.done = True
        return (await cx.observe()).status


async def _bounded(ex: Any, what: str, call: Any) -> Any:
    """Await one controller-side restore call, at most :data:`RESTORE_WAIT_S` (and the
    worker timeout). Raises :class:`HarnessError` naming the call when it takes longer."""
    bound = min(RESTORE_WAIT_S, ex.options.worker_timeout)
    try:
        return await asyncio.wait_for(call, bound)
    except asyncio.TimeoutError:
        raise HarnessError(f"restore: {ex.subject}'s {what} did not return within {bound:g} s") from None


def rebillable(trace: Trace, at: int, label: str = LOG_APPEND_AFTER) -> dict[str, int]:
    """Per node, the model calls of ``trace`` (a worker's whole trace) after the
    checkpoint current at its ``at``-th entry (the point: the last ``label`` among the
    first ``at`` entries, the append that made the runtime's checkpoint durable; none:
    the run's start): what a restore to that checkpoint runs again, each billed once
    more at most."""
    q = max((i for i, e in enumerate(trace[:at]) if e[1] == label), default=-1)
    return dict(Counter(e[2] for e in trace[q + 1:] if e[1] == MODEL_CALL_BEFORE))


def rebill_allowance(before: dict[str, int], after: dict[str, int], again: dict[str, int]) -> dict[str, int]:
    """The model calls a restore may bill again, per node, as the end checks' allowance:
    ``again`` (:func:`rebillable`), and for the nodes the run billed only after the
    restore (a runtime that names the steps it runs again anew: LangGraph numbers its
    supersteps on from the copy), what is left of ``again``'s total, node by node."""
    out = dict(again)
    left = sum(again.values()) - sum(max(0, min(after.get(n, 0) - before.get(n, 0), k)) for n, k in again.items())
    for node in sorted(n for n in after if n not in before and n not in again):
        take = min(after[node], max(0, left))
        if take:
            out[node], left = take, left - take
    return out


def _transcript(obs: Observation) -> list[Any] | None:
    state = obs.state or {}
    value = state.get("transcript")
    return list(value) if isinstance(value, list) else None


def check_state_possible(before: Observation, restored: Observation, point: str) -> Verdict:
    """``restore.state_possible``: the transcript the runtime restored (``restored``) is
    a prefix of the one the run had before the restore (``before``): a state the run
    passed through, not one that never existed together with what it did. Valid, saying
    so, when the subject exposes no transcript."""
    had, now = _transcript(before), _transcript(restored)
    if had is None or now is None:
        return Verdict(STATE_POSSIBLE, "end", True, "not applicable: the subject exposes no transcript "
                                                    f"(restored to {point}, status {restored.status!r})")
    if now == had[:len(now)]:
        return Verdict(STATE_POSSIBLE, "end", True, f"restored to {point}: the first {len(now)} of the run's "
                                                    f"{len(had)} messages")
    first = next((i for i, (a, b) in enumerate(zip(had, now)) if a != b), min(len(had), len(now)))
    return Verdict(STATE_POSSIBLE, "end", False,
                   f"restored to {point}, the transcript is not a prefix of the run's: message {first} differs "
                   f"({len(now)} messages restored, the run had {len(had)})",
                   [f"- {json.dumps(m, sort_keys=True, default=str)[:200]}" for m in had[first:first + 2]]
                   + [f"+ {json.dumps(m, sort_keys=True, default=str)[:200]}" for m in now[first:first + 2]])


def _requests(ledgers: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, str], int]:
    """(provider, key) -> requests the provider saw for the effect (``attempts``, 1 for
    a row without one), effects only (no model bill, nothing refused)."""
    out: dict[tuple[str, str], int] = {}
    for provider, rows in ledgers.items():
        for row in rows:
            if applied_effect(row):
                out[(provider, str(row.get("key")))] = int(row.get("attempts") or 1)
    return out


def check_effects(promise: str, before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]],
                  fork: bool, golden_applied: dict[str, int], resumers: int = 1) -> Verdict:
    """``restore.effect_reapplied``: the providers' effects before the restore
    (``before``: the run's ledgers) and once the restored run or the fork ended
    (``after``: that run's). ``promise`` is the adapter's ``restore_effects``:

    * ``"replays recorded"``: no request reaches a provider again: no effect row is
      added, none is sent again (``attempts`` grows: a provider's deduplication hid a
      request the runtime should have answered from its record);
    * ``"fresh attempt"``: each effect is sent at most once more by each of the
      ``resumers`` (the workers that resumed after the restore: one, or two at once
      under the ``concurrent`` policy, whose refused resumer may have sent it before its
      refusal; a row's ``attempts`` grows by that much at most, or a new row, once per
      effect), and no more new effects than the golden run made (``golden_applied``,
      per provider).

    A fork's ledgers are its own (its run id): every row is new, judged against the
    promise the same way."""
    was, now = _requests(before if not fork else {}), _requests(after)
    added = {k: n for k, n in now.items() if k not in was}
    resent = {k: n - was[k] for k, n in now.items() if k in was and n > was[k]}
    what = ", ".join([f"{p} {k[:12]} new" for (p, k) in list(added)[:4]]
                     + [f"{p} {k[:12]} sent {d} more" for (p, k), d in list(resent.items())[:4]])
    if promise == "replays recorded":
        if not added and not resent:
            return Verdict(EFFECT_REAPPLIED, "end", True, f"{len(now)} effect(s), none sent again after the restore "
                                                          "(the runtime replays its record, as it promises)")
        return Verdict(EFFECT_REAPPLIED, "end", False,
                       f"the runtime promises to replay its record after a restore, yet {len(added)} effect(s) were "
                       f"applied again and {len(resent)} sent again to their provider: {what}")
    twice = {k: d for k, d in resent.items() if d > resumers} | {k: n for k, n in added.items() if n > resumers}
    per_provider = Counter(p for p, _ in added)
    over = {p: n for p, n in per_provider.items() if n > golden_applied.get(p, 0)}
    if twice or over:
        return Verdict(EFFECT_REAPPLIED, "end", False,
                       f"a fresh attempt sends each effect once more at most"
                       + (f" (by each of {resumers} resumers)" if resumers > 1 else "") + ": "
                       + "; ".join([f"{p} {k[:12]} sent {d} more time(s)" for (p, k), d in twice.items()]
                                   + [f"{p}: {n} new effect(s), the whole golden run made {golden_applied.get(p, 0)}"
                                      for p, n in over.items()]))
    return Verdict(EFFECT_REAPPLIED, "end", True,
                   f"fresh attempt: {len(added)} effect(s) applied anew, {len(resent)} sent once more"
                   + (f" ({what})" if what else ""))


def check_model_rebilled(before: dict[str, int], after: dict[str, int], again: dict[str, int],
                         refused: dict[str, int] | None = None) -> Verdict:
    """``restore.model_rebilled``: model calls billed after the restore (``after`` minus
    ``before``, per node; a fork's are all its own, ``before`` empty) only for the nodes
    the restore runs again, at most as often as the faulted worker's trace called them
    after the checkpoint (``again``, :func:`rebillable`; nodes named anew share what is
    left of it: :func:`rebill_allowance`), plus the calls the resume policy allowed after
    the restore (``refused``, per node: a ``concurrent`` resumer refused mid-node left
    its call unrecorded, as ``model.calls_billed`` allows)."""
    allowed = rebill_allowance(before, after, again)
    for node, n in (refused or {}).items():
        allowed[node] = allowed.get(node, 0) + n
    over = []
    for node in sorted(set(after)):
        extra = after.get(node, 0) - before.get(node, 0)
        if extra > allowed.get(node, 0):
            over.append(f"{node}: billed {extra} more, {allowed.get(node, 0)} after the restore point")
    if over:
        return Verdict(MODEL_REBILLED, "end", False,
                       "model answers recorded at the restore point billed again: " + "; ".join(over[:6]))
    extra = sum(after.values()) - sum(before.values())
    return Verdict(MODEL_REBILLED, "end", True,
                   f"{extra} model call(s) billed after the restore, all after its point ({sum(again.values())} "
                   "there)")


def _answers(obs: Observation) -> Counter[str]:
    from ..human import _records

    out: Counter[str] = Counter()
    for message in _transcript(obs) or []:
        for rec in _records(message):
            out[str(rec.get("interrupt"))] += 1
    return out


def check_approvals(restored: Observation, final: Observation, resumed: Trace) -> Verdict:
    """``restore.approval_respent``: each interrupt answer the run holds at its end
    (recorded in ``final``'s transcript) and did not hold at the point it was restored
    to (``restored``: the state read while the worker was stopped there) was asked
    again: the workers after the restore handed an answer to that interrupt
    (``human.answer.before`` in the logical task ``human-<node>-<ordinal>`` of
    ``resumed``, the last resume's trace)."""
    from ..human import ANSWER_BEFORE

    kept, ended = _answers(restored), _answers(final)
    asked = Counter(e[2] for e in resumed if e[1] == ANSWER_BEFORE)
    respent = []
    for interrupt, n in ended.items():
        node, _, ordinal = interrupt.rpartition("#")
        extra = n - kept.get(interrupt, 0)
        if extra > asked.get(f"human-{node}-{ordinal}", 0):
            respent.append(f"{interrupt}: consumed {extra} time(s) after the restore, asked "
                           f"{asked.get(f'human-{node}-{ordinal}', 0)}")
    if respent:
        return Verdict(APPROVAL_RESPENT, "end", False,
                       "an answer given after the restore point consumed again without the interrupt asked again: "
                       + "; ".join(respent))
    return Verdict(APPROVAL_RESPENT, "end", True, f"{sum(ended.values())} answer(s) recorded, "
                                                  f"{sum(kept.values())} held at the restore point, the rest asked again")


def _world(ev: Evidence) -> dict[str, Any]:
    state = ev.observation.state or {}
    return {"status": ev.observation.status, "transcript": state.get("transcript"), "answer": state.get("answer"),
            "effects": sorted(_requests(ev.ledgers).items()), "model": sorted(ev.model_calls.items())}


def check_fork_original(before: Evidence, now: Evidence, fork: str) -> Verdict:
    """``restore.fork_original``: the original run's status, transcript, answer, the
    requests its effects made and its model bills, before the fork (``before``) and
    once the fork ``fork`` ended (``now``), are equal."""
    was, is_ = _world(before), _world(now)
    changed = [k for k in was if was[k] != is_[k]]
    if not changed:
        return Verdict(FORK_ORIGINAL, "end", True, f"the original run is as it was (status {is_['status']!r}) after "
                                                   f"the fork {fork} ended")
    return Verdict(FORK_ORIGINAL, "end", False, f"the fork {fork} changed the original run: {', '.join(changed)}",
                   [f"~ {k}: {str(was[k])[:160]} -> {str(is_[k])[:160]}" for k in changed])
