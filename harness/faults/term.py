"""``term``: SIGTERM at the point; the subject must drain (docs/design.md, "Fault
kinds, precisely").

The worker sends SIGTERM to itself and carries on, and reports when the signal was
delivered (``signalled``: how long its trace was once ``kill`` returned, whatever the
subject's handler records and whenever it runs it). A runtime that drains has installed
its own handler, labels ``drain.begin``, launches no node after the delivery nor after
``drain.begin`` (``node.launch``; a node in flight may finish),
lets the running nodes finish and record their output, and exits 0 with the run
``paused``. The controller gives the worker ``Options.term_grace`` seconds after the
``fired`` report before it SIGKILLs it (a failed drain). Crash checks:
``term.drained`` (nothing launched after the signal, a clean exit, the run at rest) and
``term.in_flight_recorded`` (the nodes in flight at the signal finished and recorded).
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

from ..checks import Check, compose
from ..oracle import Verdict
from ._base import Drains, FaultKind, ObservesBefore, register, signal_self
from ..crashpoint import DRAIN_BEGIN, LOG_APPEND_AFTER, NODE_LAUNCH

if TYPE_CHECKING:
    from ..adapter import Observation
    from ..oracle import CrashEvidence
    from ..plan import Fault
    from ..worker import Recorder


DRAINED = Check("term.drained", "drain", "failed drain", "crash",
                "after SIGTERM no node launched, the worker exited 0 by itself, the run paused or ended",
                refine=lambda details: "launch after drain" if "launched after" in details else None)
IN_FLIGHT_RECORDED = Check("term.in_flight_recorded", "drain", "in-flight work dropped", "crash",
                           "every node in flight at SIGTERM was recorded before the worker exited")


@register
class Term(Drains, ObservesBefore, FaultKind):
    """SIGTERM the worker at the point; it must drain."""

    name = "term"
    rank = 1
    listing_order = 1

    def act(self, recorder: Recorder, fault: Fault) -> None:
        """SIGTERM this worker, then report the delivery (:class:`.history.Signalled`):
        a signal a process sends itself is delivered before ``kill`` returns, so every
        point recorded from then on came after it. The lock is taken only after the
        kill: the subject's Python-level handler may record a label (take the lock)
        before this line runs."""
        from ..history import Signalled

        signal_self(signal.SIGTERM)
        with recorder.lock:
            at = len(recorder.trace)
        recorder.emit(Signalled("SIGTERM", at, time.time()))

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return compose([(DRAINED, lambda: check_term_drained(ev)),
                        (IN_FLIGHT_RECORDED, lambda: check_in_flight_recorded(ev))])

    def allowance(self, ev: CrashEvidence) -> dict[str, int]:
        """A drain that had its grace period lets the nodes in flight finish and record
        their answers: none may be paid for again. Only a worker SIGKILLed at the end of
        the grace period (a failed drain, judged as a kill) leaves calls in flight."""
        return super().allowance(ev) if ev.timed_out or ev.exit_signal is not None else {}


def check_term_drained(ev: CrashEvidence) -> Verdict:
    """``term.drained``: no node launched after the signal was delivered
    (:func:`launched_after_signal`) nor after ``drain.begin``, exit 0, run ``paused`` (or
    completed, or handed to a person; or untouched, :func:`untouched_by_worker`, if the
    drain came before the worker took it)."""
    name = DRAINED.name
    problems = []
    launched = launched_after_signal(ev)
    if launched:
        problems.append(f"{len(launched)} node(s) launched after SIGTERM was delivered: {', '.join(launched)}")
    names = [entry[1] for entry in ev.trace_full]
    if DRAIN_BEGIN not in names:
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
        launched = [e[2] for e in ev.trace_full if e[1] == NODE_LAUNCH]
        if launched:
            problems.append(f"run status is {status!r} as before the worker, yet it launched {', '.join(launched)}")
    elif status not in ("paused", "completed", "needs_human"):  # waiting for a person is a rest state too
        problems.append(f"run status is {status!r}, not 'paused'")
    elif status == "completed" and pending:
        problems.append(f"run says completed with pending nodes {pending}")
    if problems:
        return Verdict(name, "crash", False, "; ".join(problems))
    return Verdict(name, "crash", True, f"drained, status {status}")


def signal_index(ev: CrashEvidence) -> int:
    """Where in ``ev.trace_full`` the SIGTERM was delivered: the worker's own report
    (``signalled``, :attr:`.oracle.CrashEvidence.signalled_at`), else the fault's point
    (the worker signals itself right after reaching it)."""
    return ev.signalled_at if ev.signalled_at is not None else len(ev.trace_at_fault)


def launched_after_signal(ev: CrashEvidence) -> list[str]:
    """The logical tasks labelled ``node.launch`` after the SIGTERM's delivery
    (:func:`signal_index`) or after the subject's ``drain.begin``, whichever comes
    first, in trace order. A node launched before either and still running may finish
    (``term.in_flight_recorded``); a launch after the delivery is one whatever the
    subject's labels say (a handler that asyncio runs a loop iteration later,
    ``loop.add_signal_handler``, lets a scheduler launch in between)."""
    start = signal_index(ev)
    names = [e[1] for e in ev.trace_full]
    if DRAIN_BEGIN in names:
        start = min(start, names.index(DRAIN_BEGIN) + 1)
    return [e[2] for e in ev.trace_full[start:] if e[1] == NODE_LAUNCH]


def in_flight_at(trace: list[Any]) -> list[str]:
    """The logical tasks launched (``node.launch``) and not yet recorded
    (``log.append.after``) in ``trace``, in launch order."""
    launched: dict[str, None] = {}
    recorded: set[str] = set()
    for _, name, task, _ in trace:
        if name == NODE_LAUNCH:
            launched[task] = None
        elif name == LOG_APPEND_AFTER:
            recorded.add(task)
    return [t for t in launched if t not in recorded]


def check_in_flight_recorded(ev: CrashEvidence) -> Verdict:
    """``term.in_flight_recorded``: the drain kept seed 002's promise, "lets the
    in-flight ones finish and append their records": every node launched and not yet
    recorded when SIGTERM landed (the fault's point) passed ``log.append.after`` before
    the worker exited. A drain that cancels its in-flight nodes and exits 0 passes
    ``term.drained`` (nothing new launched) but loses their work, which a resume redoes
    and pays for again. When the grace period ended first the worker was SIGKILLed: the
    case says so (``term.drained`` fails), this check does not judge it. A node whose
    effect waits for a person (run ``needs_human``, its effect ``unknown``) is not in
    flight any more: it handed itself over. Not applicable to a subject that labels no
    ``node.launch``."""
    name = IN_FLIGHT_RECORDED.name
    if not any(e[1] == NODE_LAUNCH for e in ev.trace_full):
        return Verdict(name, "crash", True, "not applicable: the subject labels no node.launch")
    flying = in_flight_at(ev.trace_at_fault)
    if not flying:
        return Verdict(name, "crash", True, "no node in flight at the signal")
    if ev.timed_out:
        return Verdict(name, "crash", True, f"not judged: the grace period ended first ({len(flying)} node(s) in flight)")
    recorded = {e[2] for e in ev.trace_full if e[1] == LOG_APPEND_AFTER}
    # a node that handed its effect to a person (the run stopped needs_human, the effect
    # left unknown for them: an approval wait) ended as it would without the signal
    handed = ({e.node_id for e in ev.observation.effects or [] if e.status == "unknown"}
              if ev.observation.status == "needs_human" else set())
    dropped = [t for t in flying if t not in recorded and t not in handed]
    if dropped:
        return Verdict(name, "crash", False,
                       f"{len(dropped)} of {len(flying)} node(s) in flight at SIGTERM were not recorded before the worker "
                       f"exited (the drain dropped their work): {', '.join(dropped)}")
    return Verdict(name, "crash", True, f"{len(flying)} node(s) in flight at SIGTERM, all recorded before the worker exited")


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
