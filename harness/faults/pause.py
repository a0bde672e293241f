"""``pause``: the worker stops itself (SIGSTOP) at the point; while it sleeps the next
workers take its run over and finish it; then it wakes (SIGCONT) as a zombie
(docs/design.md, "Run ownership").

A paused worker stands for a GC pause, a VM migration or a process frozen by its host:
it wakes with a stale lease after another worker took the run. Whatever it does next
must be refused. Its successor is the worker the plan's next fault is armed in (a
crash during the takeover) or a fault-free resume, and the case's workers run until
the run is terminal before the zombie wakes (an adapter that declares it never takes a
run from a live owner, ``Adapter.takes_over_live_owner``, gets no takeover: the worker
wakes as the owner, goes on, and the zombie checks say not applicable). Crash checks: ``pause.zombie_fenced`` (the
durable state did not change after it woke) and ``pause.zombie_effects`` (no provider
applied an effect for it after it woke: its lease had been taken, so whatever it sent
was a second application of a call the run had already made, or one it never asked
for; a fenced store cannot see it, the provider's own ledger does).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from ..adapter import FENCED
from ..checks import Check, compose
from ..oracle import Verdict
from ._base import FaultKind, Stops, register, signal_self

if TYPE_CHECKING:
    from ..adapter import Observation
    from ..case import CaseRun, WorkerRun
    from ..oracle import CrashEvidence
    from ..plan import Fault
    from ..worker import Recorder


ZOMBIE_FENCED = Check("pause.zombie_fenced", "fencing", "zombie write", "crash",
                      "once another worker took the lease and finished the run, the woken zombie changed nothing durable")
ZOMBIE_EFFECTS = Check("pause.zombie_effects", "fencing", "zombie effect", "crash",
                       "no provider applied anything for the zombie after its lease was taken")


@register
class Pause(Stops, FaultKind):
    """SIGSTOP the worker at the point; its run is taken over; it wakes as a zombie."""

    name = "pause"
    rank = 3
    listing_order = 3
    short = "paus"
    why_not_run = ("no other worker took the run over while this one was stopped (a runtime that never takes a run from "
                   "a live owner), and the woken worker finished it")
    role = "zombie"
    wakes_intact = True
    reads_ledgers = True

    def act(self, recorder: Recorder, fault: Fault) -> None:
        signal_self(signal.SIGSTOP)

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:
        if not cx.explorer.adapter.takes_over_live_owner:  # it would refuse every successor
            w.taken_over = False
            w.woke = await cx.explorer.evidence(cx.run_id)
            return
        await cx.drive(w.index + 1, "paused")
        await cx.explorer.quiesce(w.job.worker_id, database=False)  # the zombie's session stays
        w.woke = await cx.explorer.evidence(cx.run_id)

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        assert ev.woke is not None, "pause: the state before the zombie woke was not read"
        woke = ev.woke
        if not ev.taken_over:
            why = ("not applicable: the adapter declares it never takes a run from a live owner "
                   "(Adapter.takes_over_live_owner), so the stopped worker woke as the owner and went on")
            return [ZOMBIE_FENCED.verdict(True, why), ZOMBIE_EFFECTS.verdict(True, why)]
        return compose([(ZOMBIE_FENCED, lambda: check_zombie_fenced(woke.observation, ev.observation, ev.end)),
                        (ZOMBIE_EFFECTS, lambda: check_zombie_effects(woke.ledgers, ev.ledgers or {}))])


def check_zombie_fenced(before: Observation, after: Observation, zombie_end: Any) -> Verdict:
    """``pause.zombie_fenced``: after a paused worker's lease was taken over and the run
    resumed elsewhere, the zombie woke up (SIGCONT); nothing it did may reach the
    durable state: log, effect rows and run status are exactly as before it woke.
    ``zombie_end``: its :class:`~.history.End` report, or None (it died)."""
    name = ZOMBIE_FENCED.name
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
    if zombie_end is not None and not zombie_end.error and zombie_end.status != FENCED:
        return Verdict(name, "crash", True, f"nothing the zombie did changed the durable state (it ended "
                                            f"{zombie_end.status!r} by itself)")
    how = (zombie_end.error or zombie_end.status) if zombie_end is not None else "no report"
    return Verdict(name, "crash", True, f"the zombie's writes were refused ({how})")


def check_zombie_effects(before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]]) -> Verdict:
    """``pause.zombie_effects``: no provider applied anything for the run after the
    zombie woke (every other worker of the case had ended, so a new row in a provider's
    own ledger is the zombie's). ``before`` / ``after``: provider kind -> the run's
    ledger rows (:mod:`crashmatrix.scenarios.providers.ledger`: ``seq``, ``op``,
    ``key``, ``ref``, ``attempts``...) just before it woke and after it ended. A request
    the provider deduplicated by its key (``attempts`` grew, no row) applied nothing
    and is reported, not failed."""
    name = ZOMBIE_EFFECTS.name
    if not after and not before:
        return Verdict(name, "crash", True, "not applicable: the workload has no effect provider")
    applied, repeated = [], 0
    for kind in sorted(set(before) | set(after)):
        known = {row.get("seq"): row for row in before.get(kind, [])}
        for row in after.get(kind, []):
            old = known.get(row.get("seq"))
            if old is None:
                applied.append(f"{kind} {row.get('op')} {str(row.get('key'))[:12]} ({row.get('ref')})")
            elif (row.get("attempts") or 0) > (old.get("attempts") or 0):
                repeated += 1
    dedup = f"; {repeated} repeated request(s) deduplicated by key" if repeated else ""
    if applied:
        return Verdict(name, "crash", False, f"{len(applied)} effect(s) applied for the zombie after its lease was "
                                             f"taken: {', '.join(applied[:6])}{dedup}")
    return Verdict(name, "crash", True, f"no provider applied anything for the zombie{dedup}")
