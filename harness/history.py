"""Histories as data: a worker's crash-point trace and the events it reports.

A worker (:mod:`.worker`) writes its report as JSON lines to a per-job file, with
``os.write`` on an ``O_APPEND`` descriptor, so a line written just before a SIGKILL
survives it (docs/design.md, "Processes"). The lines are the events below, each a
JSON object whose first key is ``"event"``::

    {"event": "fired", "fault": FAULT, "trace": [ENTRY, ...], "t": float}
    {"event": "end", "status": str, "trace": [ENTRY, ...], "error": str, "traceback": str,
     "marks": [MARK, ...], "io_note": str}
    {"event": "passed", "at": ENTRY}
    {"event": "accepted", "t": float}
    {"event": "signalled", "signal": str, "at": int, "t": float}
    {"event": "healed", "at": ENTRY | "worker-end", "t": float}
    {"event": "heal-error", "error": str}
    {"event": "fault-error", "error": str}

``FAULT`` is :meth:`.plan.Fault.to_dict`; ``ENTRY`` is a trace entry,
``[source, name, task, occurrence]`` (:class:`TraceEntry`); ``t`` is wall-clock
seconds (``time.time()``). ``fired`` is written *before* the fault acts (a fault that
did not fire is a harness error, never a pass), at most once, after at most an
``accepted``; ``end`` when the adapter returned or raised (``error`` and
``traceback`` only then; ``marks``, one :class:`.iostate.IoMark` a trace entry, only
from a worker that measured its I/O, ``Job.record_io``; ``io_note`` when it could
not); ``accepted`` when the subject acknowledged the run (``RunContext.accepted``: its
request is stored); ``passed`` for each crash point the worker passes after its fault
fired (its progress: :class:`Silence`); ``signalled`` when the worker's own fault signal had been delivered
(a ``term`` fault's SIGTERM: ``at`` is the length of the trace once ``kill`` returned,
so every entry from index ``at`` on came after the delivery, whatever the subject's
handler recorded); ``healed`` / ``heal-error`` when a lasting fault (a ``net`` toxic)
was removed or could not be; ``fault-error`` when a fault fired but could not land (the
harness's failure: the worker exits 70).

:meth:`WorkerReport.from_file` is the one reader: a torn last line (a kill in the
middle of a write) is dropped, and an unknown event is kept as :class:`Other`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union


class TraceEntry(NamedTuple):
    """One crash point a worker passed: ``source`` (``step``, ``label``, ``await``),
    ``name``, logical ``task`` and ``occurrence`` (1 for the task's first time at the
    name). A tuple, so ``source, name, task, occ = entry`` and comparisons with plain
    tuples keep working."""

    source: str
    name: str
    task: str
    occurrence: int

    @property
    def key(self) -> tuple[str, str, int]:
        """``(name, task, occurrence)``, as :attr:`.plan.CrashPoint.key`."""
        return (self.name, self.task, self.occurrence)

    def label(self) -> str:
        """``NAME[TASK]#OCCURRENCE``, as in a case id."""
        return f"{self.name}[{self.task}]#{self.occurrence}"


Trace = list[TraceEntry]


def labels_of(trace: Trace) -> set[str]:
    """The labelled points' names of ``trace`` (what coverage counts)."""
    return {e[1] for e in trace if e[0] == "label"}
"""A worker's trace, in the order the points were reached."""


_ENTRIES: dict[tuple[Any, ...], TraceEntry] = {}
_ENTRIES_LIMIT = 1_000_000


def as_trace(entries: Iterable[Sequence[Any]]) -> Trace:
    """Entries as :class:`TraceEntry` (from JSON lists, plain tuples or entries), each
    one shared by every trace that holds an equal entry: a matrix's traces pass the same
    few thousand points over and over, and long_run's 8,424 cases kept ~1,400 entries
    each (docs/benchmarks.md, "Where the controller's memory goes"). Raises ``TypeError``
    for an entry that is not four fields, or whose fields are not hashable."""
    out: Trace = []
    known = _ENTRIES
    for e in entries:
        key = tuple(e)
        entry = known.get(key)
        if entry is None:
            entry = e if type(e) is TraceEntry else TraceEntry(*key)
            if len(known) >= _ENTRIES_LIMIT:  # a controller that outlives many workloads
                known.clear()
            known[key] = entry
        out.append(entry)
    return out


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event) + "\n").encode()


FIRED_PREFIX = b'{"event": "fired"'
"""How a ``fired`` line starts (``json.dumps`` of :meth:`Fired.to_dict`: the ``event``
key first); what :func:`has_fired` looks for."""


@dataclass(frozen=True)
class Fired:
    """The worker reached its fault's point and is about to act: ``fault`` (the plan's
    fault, as :meth:`.plan.Fault.to_dict`), ``trace`` up to and including the point,
    ``t`` wall-clock seconds."""

    fault: dict[str, Any]
    trace: Trace
    t: float | None = None
    event = "fired"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "fault": self.fault, "trace": self.trace, "t": self.t}


@dataclass(frozen=True)
class End:
    """The adapter returned ``status`` or raised (``status`` ``"error"``, with ``error``
    and ``traceback``); ``trace`` is the worker's whole trace."""

    status: str
    trace: Trace
    error: str | None = None
    traceback: str | None = None
    #: the worker's I/O at each point of ``trace`` (a golden run's, ``Job.record_io``):
    #: :class:`.iostate.IoMark` fields as lists; None when not measured
    marks: list[list[int]] | None = None
    #: why a worker asked to measure its I/O could not (:class:`.iostate.Unavailable`)
    io_note: str | None = None
    event = "end"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.event, "status": self.status, "trace": self.trace}
        if self.error is not None:
            out["error"] = self.error
        if self.traceback is not None:
            out["traceback"] = self.traceback
        if self.marks is not None:
            out["marks"] = self.marks
        if self.io_note is not None:
            out["io_note"] = self.io_note
        return out


@dataclass(frozen=True)
class Passed:
    """A crash point the worker passed after its fault fired (``at``, an entry): its
    progress, which the controller watches to tell a worker that carries on from one
    stuck after its fault (:class:`Silence`)."""

    at: TraceEntry
    event = "passed"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "at": self.at}


@dataclass(frozen=True)
class Accepted:
    """The subject acknowledged the run (``RunContext.accepted``); ``t`` wall-clock s."""

    t: float | None = None
    event = "accepted"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "t": self.t}


@dataclass(frozen=True)
class Signalled:
    """The worker's fault signal (``signal``, e.g. ``"SIGTERM"``) was delivered to it:
    ``at`` trace entries had been recorded by then (the entries from index ``at`` on
    came after it); ``t`` wall-clock seconds."""

    signal: str
    at: int
    t: float | None = None
    event = "signalled"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "signal": self.signal, "at": self.at, "t": self.t}


@dataclass(frozen=True)
class Healed:
    """A lasting fault was removed: ``at`` the heal point reached (an entry) or
    ``"worker-end"``; ``t`` wall-clock seconds."""

    at: TraceEntry | str
    t: float | None = None
    event = "healed"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "at": self.at, "t": self.t}

    def where(self) -> str:
        """``NAME[TASK]#N`` or ``worker-end``."""
        return self.at if isinstance(self.at, str) else self.at.label()


@dataclass(frozen=True)
class _ErrorEvent:
    error: str
    event = ""

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "error": self.error}


class HealError(_ErrorEvent):
    """A lasting fault could not be removed by the worker (the controller removes it)."""

    event = "heal-error"


class FaultError(_ErrorEvent):
    """A fault fired but did not land (the fault proxy refused the toxic): a harness
    error, never the subject's."""

    event = "fault-error"


@dataclass(frozen=True)
class Other:
    """A line with an event this build does not know (kept, never dropped)."""

    data: dict[str, Any]

    @property
    def event(self) -> str:
        return str(self.data.get("event"))

    def to_dict(self) -> dict[str, Any]:
        return self.data


WorkerEvent = Union[Fired, End, Passed, Accepted, Signalled, Healed, HealError, FaultError, Other]


def encode(event: WorkerEvent) -> bytes:
    """The JSON line of ``event`` (what the worker writes)."""
    return _line(event.to_dict())


def decode(data: dict[str, Any]) -> WorkerEvent:
    """One event from its JSON object; :class:`Other` for an unknown or malformed one."""
    kind = data.get("event")
    try:
        if kind == "fired":
            return Fired(data["fault"], as_trace(data["trace"]), data.get("t"))
        if kind == "end":
            return End(data["status"], as_trace(data["trace"]), data.get("error"), data.get("traceback"),
                       data.get("marks"), data.get("io_note"))
        if kind == "passed":
            return Passed(TraceEntry(*data["at"]))
        if kind == "accepted":
            return Accepted(data.get("t"))
        if kind == "signalled":
            return Signalled(str(data["signal"]), int(data["at"]), data.get("t"))
        if kind == "healed":
            at = data["at"]
            return Healed(at if isinstance(at, str) else TraceEntry(*at), data.get("t"))
        if kind == "heal-error":
            return HealError(data["error"])
        if kind == "fault-error":
            return FaultError(data["error"])
    except (KeyError, TypeError, ValueError):
        pass
    return Other(data)


@dataclass
class WorkerReport:
    """Everything one worker reported, in order (``events``), with the parts the
    controller reads: the first ``fired`` (a worker arms at most one fault), the last
    ``end``, the first ``signalled``, every ``healed``, ``heal-error`` and ``fault-error``."""

    events: list[WorkerEvent] = field(default_factory=list)

    @classmethod
    def from_file(cls, path: str) -> WorkerReport:
        """Read a worker's result file; a missing file is an empty report, a torn or
        undecodable line is dropped (a kill in the middle of a write)."""
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return cls()
        events = []
        for line in lines:
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                events.append(decode(data))
        return cls(events)

    @property
    def fired(self) -> Fired | None:
        return next((e for e in self.events if isinstance(e, Fired)), None)

    @property
    def end(self) -> End | None:
        ends = [e for e in self.events if isinstance(e, End)]
        return ends[-1] if ends else None

    @property
    def accepted(self) -> bool:
        """Whether the subject acknowledged the run in this worker."""
        return any(isinstance(e, Accepted) for e in self.events)

    @property
    def signalled(self) -> Signalled | None:
        """The first delivery of the worker's own fault signal (``term``), or None."""
        return next((e for e in self.events if isinstance(e, Signalled)), None)

    @property
    def healed(self) -> list[Healed]:
        return [e for e in self.events if isinstance(e, Healed)]

    @property
    def heal_errors(self) -> list[HealError]:
        return [e for e in self.events if isinstance(e, HealError)]

    @property
    def fault_errors(self) -> list[FaultError]:
        return [e for e in self.events if isinstance(e, FaultError)]

    def names(self) -> list[str]:
        """The events' names in order (``["fired", "end"]``)."""
        return [e.event for e in self.events]

    def trace(self) -> Trace:
        """The worker's whole trace: the ``end``'s; else, for a worker that died after its
        fault (killed, or dead of a signal after a drain), the trace up to the fault and
        every point it reported passing after it (:class:`Passed`); else empty."""
        if self.end is not None:
            return self.end.trace
        if self.fired is None:
            return []
        return self.fired.trace + [e.at for e in self.events if isinstance(e, Passed)]


def has_fired(path: str) -> bool:
    """Whether the worker of ``path`` reported ``fired`` (a complete line that starts
    with :data:`FIRED_PREFIX`; an ``accepted`` line may come before it). Cheap enough to
    poll: the file holds a few lines until the fault fires."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return False
    at = (b"\n" + data).find(b"\n" + FIRED_PREFIX)
    return at >= 0 and data.find(b"\n", at) >= 0


class Silence:
    """How long a worker has been silent since its fault fired: neither a new line in
    its event file (a :class:`Passed` point, its end) nor an exit. The controller polls
    :meth:`check` once the fault fired; a worker silent for ``after`` seconds is stuck
    (the oracle's ``worker.stuck``). Only the file's size is read while polling."""

    def __init__(self, path: str, after: float) -> None:
        self.path = path
        self.after = after
        self.size = -1
        self.since: float | None = None  # when the file last grew (or watching began)
        self.progressed = False  # it grew after watching began: the worker passed a point or ended

    def start(self, now: float) -> None:
        """Begin (or begin again, after a stopped worker was woken) counting from ``now``."""
        self.size = self._size()
        self.since = now

    def check(self, now: float) -> bool:
        """Whether the worker has been silent for ``after`` seconds (call after :meth:`start`)."""
        size = self._size()
        if size != self.size:
            self.size, self.since, self.progressed = size, now, True
            return False
        return self.since is not None and now - self.since >= self.after

    def silent_s(self, now: float) -> float:
        return now - self.since if self.since is not None else 0.0

    def last_point(self) -> str | None:
        """The last crash point the worker passed (``NAME[TASK]#N``): its last ``passed``
        line, else the point its fault fired at; None when neither is in the file."""
        report = WorkerReport.from_file(self.path)
        passed = [e for e in report.events if isinstance(e, Passed)]
        if passed:
            return passed[-1].at.label()
        fired = report.fired
        return fired.trace[-1].label() if fired is not None and fired.trace else None

    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
