"""Crash points, faults, fault plans and case ids: the data every other part shares.

A **crash point** is a place in a run where a fault can land, named so that the same
place has the same name in every run (DESIGN.md, "Crash points"):

- ``source``: ``"step"`` (a node boundary the adapter reports: ``step.before``,
  ``step.after``), ``"label"`` (a ``crashpoint("...")`` call) or ``"await"`` (a task
  suspension; named ``module:Qualname@ordinal``);
- ``name``: the label, never a line number;
- ``task``: the logical task (node id) whose work reached the point;
- ``occurrence``: 1 for the first time ``task`` reached ``name``, 2 for the second...

A **fault plan** is an ordered list of faults, each a kind at a crash point. Fault *i*
is armed in the *i*-th worker of the case: the first in the worker that starts the run,
the second in the first resume (a crash during recovery), and so on. It crosses
process boundaries as JSON (``FaultPlan.to_json`` / ``FaultPlan.from_json``), never as a
pickle. Schema, version 1::

    {"version": 1,
     "faults": [{"kind": "kill" | "term" | "cancel" | "pause" | "db-restart",
                 "point": {"source": "step" | "label" | "await", "name": str,
                           "task": str, "occurrence": int >= 1}}]}

A **case** is one workload conversation under one plan. Its id is readable, stable and
parseable (a pytest id, a replay argument)::

    checkout/conv3/kill@effect.started.after[turn-4.tool-0]#1

that is ``WORKLOAD/CONVERSATION/KIND@NAME[TASK]#OCCURRENCE``, faults joined with ``+``.
The source is implied by the name (``step.*`` names are steps, names with ``:`` and
``@`` are await points, the rest labels).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import PlanError

PLAN_VERSION = 1
FAULT_KINDS = ("kill", "term", "cancel", "pause", "db-restart")
"""Fault kinds this build injects (DESIGN.md, "Fault kinds, precisely")."""
POINT_SOURCES = ("step", "label", "await")


@dataclass(frozen=True, order=True)
class CrashPoint:
    """One crash point: ``source``, ``name``, logical ``task`` and ``occurrence`` (>= 1)."""

    source: str
    name: str
    task: str
    occurrence: int = 1

    def __post_init__(self) -> None:
        if self.source not in POINT_SOURCES:
            raise PlanError(f"point.source={self.source!r} must be one of {', '.join(POINT_SOURCES)}")
        if not _is_id(self.name):
            raise PlanError(f"point.name={self.name!r} must be a non-empty label without []#/+ or whitespace")
        if not _is_id(self.task):
            raise PlanError(f"point.task={self.task!r} must be a non-empty id without []#/+ or whitespace")
        if source_of(self.name) != self.source:
            raise PlanError(
                f"point.source={self.source!r} does not match point.name={self.name!r} "
                f"(a case id carries the source in the name: step.* names are steps, "
                f"module:function@N names are await points, the rest labels)"
            )
        if not isinstance(self.occurrence, int) or isinstance(self.occurrence, bool) or self.occurrence < 1:
            raise PlanError(f"point.occurrence={self.occurrence!r} must be an integer >= 1")

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.name, self.task, self.occurrence)

    def label(self) -> str:
        """``NAME[TASK]#OCCURRENCE``."""
        return f"{self.name}[{self.task}]#{self.occurrence}"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "task": self.task, "occurrence": self.occurrence}

    @classmethod
    def from_dict(cls, data: Any, where: str = "point") -> CrashPoint:
        if not isinstance(data, dict):
            raise PlanError(f"{where} must be an object, got {type(data).__name__}")
        unknown = set(data) - {"source", "name", "task", "occurrence"}
        if unknown:
            raise PlanError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")
        for f in ("source", "name", "task"):
            if f not in data:
                raise PlanError(f"{where}.{f} is missing")
        return cls(data["source"], data["name"], data["task"], data.get("occurrence", 1))


def _is_id(text: object) -> bool:
    return isinstance(text, str) and bool(text) and not any(c in "[]#/+" or c.isspace() for c in text)


def source_of(name: str) -> str:
    """The point source implied by a point name (see module docstring)."""
    if name.startswith("step."):
        return "step"
    if ":" in name and "@" in name:
        return "await"
    return "label"


@dataclass(frozen=True)
class Fault:
    """A fault ``kind`` landing at ``point``."""

    kind: str
    point: CrashPoint

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise PlanError(f"fault.kind={self.kind!r} must be one of {', '.join(FAULT_KINDS)}")

    def label(self) -> str:
        return f"{self.kind}@{self.point.label()}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "point": self.point.to_dict()}


@dataclass(frozen=True)
class FaultPlan:
    """An ordered list of faults. The empty plan is the golden run."""

    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "faults": [f.to_dict() for f in self.faults]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> FaultPlan:
        """Validate and load a plan; raises :class:`PlanError` naming the bad field."""
        if not isinstance(data, dict):
            raise PlanError(f"plan must be a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if version != PLAN_VERSION:
            raise PlanError(f"plan.version={version!r} is not supported (this build reads version {PLAN_VERSION})")
        unknown = set(data) - {"version", "faults"}
        if unknown:
            raise PlanError(f"plan has unknown field(s) {', '.join(sorted(unknown))}")
        faults = data.get("faults")
        if not isinstance(faults, list):
            raise PlanError("plan.faults must be a list")
        out = []
        for i, f in enumerate(faults):
            where = f"plan.faults[{i}]"
            if not isinstance(f, dict):
                raise PlanError(f"{where} must be an object")
            unknown = set(f) - {"kind", "point"}
            if unknown:
                raise PlanError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")
            if "kind" not in f:
                raise PlanError(f"{where}.kind is missing")
            if f["kind"] not in FAULT_KINDS:
                raise PlanError(f"{where}.kind={f['kind']!r} must be one of {', '.join(FAULT_KINDS)}")
            out.append(Fault(f["kind"], CrashPoint.from_dict(f.get("point"), f"{where}.point")))
        return cls(tuple(out))

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def label(self) -> str:
        return "+".join(f.label() for f in self.faults) or "golden"


@dataclass(frozen=True)
class Case:
    """One workload conversation under one fault plan, on one subject."""

    workload: str
    conversation: str
    plan: FaultPlan

    def __post_init__(self) -> None:
        for field_name in ("workload", "conversation"):
            value = getattr(self, field_name)
            if not _is_id(value):
                raise PlanError(f"case.{field_name}={value!r} must be a non-empty name without []#/+ or whitespace")

    @property
    def id(self) -> str:
        return f"{self.workload}/{self.conversation}/{self.plan.label()}"

    @classmethod
    def parse(cls, case_id: str) -> Case:
        """Parse a case id (see module docstring); raises :class:`PlanError`."""
        parts = case_id.split("/", 2)
        if len(parts) != 3 or not all(parts):
            raise PlanError(f"case id {case_id!r} must look like WORKLOAD/CONVERSATION/KIND@NAME[TASK]#N")
        workload, conversation, faults = parts
        if faults == "golden":
            return cls(workload, conversation, FaultPlan())
        out = []
        for text in faults.split("+"):
            m = _FAULT_RE.fullmatch(text)
            if m is None:
                raise PlanError(f"fault {text!r} in case id {case_id!r} must look like KIND@NAME[TASK]#N")
            kind, name, task, occ = m.group("kind", "name", "task", "occ")
            if kind not in FAULT_KINDS:
                raise PlanError(f"fault kind {kind!r} in case id {case_id!r} must be one of {', '.join(FAULT_KINDS)}")
            out.append(Fault(kind, CrashPoint(source_of(name), name, task, int(occ))))
        return cls(workload, conversation, FaultPlan(tuple(out)))


_FAULT_RE = re.compile(r"(?P<kind>[a-z-]+)@(?P<name>[^\[\]#/+\s]+)\[(?P<task>[^\[\]#/+\s]+)\]#(?P<occ>[1-9][0-9]*)")
