"""Crash points, faults, fault plans and case ids: the data every other part shares.

A **crash point** is a place in a run where a fault can land, named so that the same
place has the same name in every run (docs/design.md, "Crash points"):

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
     "faults": [{"kind": KIND,            # a registered kind: fault_kinds(), `crashmatrix list kinds`
                 "point": {"source": "step" | "label" | "await", "name": str,
                           "task": str, "occurrence": int >= 1},
                 "net": {...},            # with kind "net" only, see NetToxic
                 "window_ms": int}]}      # with kind "db-outage" only (default 1000)

A ``net`` fault adds a toxic to one link at its point and removes it at its heal
(:class:`NetToxic`)::

    "net": {"link": "db" | PROVIDER_KIND,            # e.g. "payment", "model"
            "toxic": "reset_peer" | "timeout" | "limit_data" | "latency" | ...,
            "attributes": {NAME: int, ...},          # Toxiproxy's units; absent ones are 0
            "stream": "downstream" | "upstream",     # default downstream (answers)
            "heal": null | POINT}                    # null: at the end of that worker

(Version 1 still: the ``net`` field is additive, and every version-1 plan written
before it reads unchanged.)

A **case** is one workload conversation under one plan. Its id is readable, stable and
parseable (a pytest id, a replay argument)::

    checkout/conv3/kill@effect.started.after[turn-4.tool-0]#1

that is ``WORKLOAD/CONVERSATION/KIND@NAME[TASK]#OCCURRENCE``, faults joined with ``+``;
a case of a build pair (crash under build A, resume under build B: :mod:`.builds`) ends
in ``/upgrade:A>B``::

    checkout/conv1/kill@log.append.after[turn-4]#1/upgrade:reference>reference-next

The source is implied by the name (``step.*`` names are steps, names with ``:`` and
``@`` are await points, the rest labels). A ``net`` fault's kind carries its link and
toxic, the attributes that are not 0 and a non-default stream in parentheses, and a heal
point after ``~`` (none: the end of the worker)::

    checkout/conv1/net:db.reset_peer@log.append.before[turn-4]#1~db.reconnect[db]#1
    checkout/conv1/net:payment.timeout(timeout=200)@tool.request.before[turn-4.tool-0]#1

A ``db-outage`` fault's kind carries its window (PostgreSQL unreachable that long from
the point on, while the worker runs: :mod:`.faults.db_outage`)::

    checkout/conv1/kill@log.append.after[turn-3]#1+db-outage(1500ms)@log.append.before[turn-5]#1

A case may carry a **resume policy** (:class:`Resume`; how the workers after the first
fault resume, as production does it: :mod:`.policies`), as a last component of its id;
none is the subject's default (resumers get the run id, one after another, with the
input unless the adapter declares it expects none)::

    checkout/conv1/kill@log.append.before[turn-4]#1/concurrent      # 2 resumers at once
    checkout/conv1/kill@log.append.before[turn-4]#1/concurrent=3
    checkout/conv1/kill@log.append.before[turn-4]#1/recurring       # the fault in every worker
    checkout/conv1/kill@log.append.before[turn-4]#1/discovery       # no run id: the runtime's sweep
    checkout/conv1/kill@log.append.before[turn-4]#1/input-once      # input to the first worker only
    checkout/conv1/kill@log.append.before[turn-4]#1/redelivery      # input to every worker
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import PlanError
from .fault_registry import names as fault_kinds

PLAN_VERSION = 1

POINT_SOURCES = ("step", "label", "await")
DEFAULT_KINDS = ("kill", "term", "cancel")
"""The fault kinds a matrix runs at every point when none are named (``crashmatrix run``,
the plugin)."""
SAMPLED_KINDS = ("pause", "db-restart", "net", "cancel-edge", "cancel-api")
"""The fault kinds the default matrix (:mod:`.defaults`: ``crashmatrix run``, ``run_matrix``,
the pytest plugin) adds when no kinds are named, each as a seeded
sample of :data:`DEFAULT_KIND_SAMPLE` cases (the kinds that find recovery bugs,
a paused zombie, a lost acknowledgement, a restarted database, a cancelled task, a
cancel the runtime's own API acknowledged, at a bounded cost; ``cancel-api`` is not
applicable to an adapter without a cancel API). ``--kinds`` names kinds to run whole instead."""
SAMPLED_POLICIES = ("concurrent", "warm-worker", "same-worker")
"""The resume policies the default matrix (:mod:`.defaults`) adds when no kinds or resume
policy are named: :data:`DEFAULT_KIND_SAMPLE` cases each, resumed that way (kill cases resumed by
two workers at once: a queue that redelivers, overlapping recovery passes;
docs/adapters.md "Resume policies"; kill cases resumed in a worker that has just run
the conversation whole: what one run leaves in a production worker's process;
cancel cases resumed in the process the cancellation struck: what the runtime kept of
the run in memory). The other policies ask what not every correct runtime offers (a crash-loop
bound, recovery without the run id, input read from its own store), so they run only
when named."""
DEFAULT_WORKLOADS = ("checkout", "support_desk")
"""What ``crashmatrix run`` runs when no workload is named, one after the other: checkout
and the workload with production's shapes (docs/runtime.md "support_desk")."""
DEFAULT_KIND_SAMPLE = 24
"""Cases per sampled kind and policy in the default matrix (``--kind-sample``; the
plugin's ``kind_sample``)."""
DEFAULT_SOURCES = ("step", "label")
"""The crash-point sources of a matrix when none are named."""
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
    "noop": (),
}
"""Toxiproxy's toxic types and their integer attributes, in its order (spec §2.2: ms,
except ``slicer.delay`` in µs; ``limit_data.bytes``; ``bandwidth.rate`` in KB/s). The
same table as the fault proxy's registry (a unit test keeps them equal)."""
NET_STREAMS = ("downstream", "upstream")
OUTAGE_WINDOW_MS = 1000
"""A ``db-outage`` fault's window when its plan gives none: PostgreSQL unreachable for
1 s, shorter than the reconnect deadline a runtime that rides out a brief outage keeps
(the reference runtime's is 5 s)."""
MAX_OUTAGE_WINDOW_MS = 600_000
"""The longest window a plan may give (the case deadline, ``--worker-timeout``, bounds it
further: :func:`.faults.db_outage.check_windows`)."""
_LINK_RE = re.compile(r"[a-z][a-z0-9_-]*")


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
class NetToxic:
    """What a ``net`` fault does: Toxiproxy toxic ``toxic`` on ``link`` from the fault's
    point until ``heal``.

    ``link``: ``"db"`` (the subject's PostgreSQL) or a provider kind of the workload;
    ``attributes``: ``(name, int)`` pairs, every attribute of the type in
    :data:`TOXIC_ATTRIBUTES` order (given as a dict, absent ones are 0, Toxiproxy's
    default); ``stream``: ``"downstream"`` (answers, server to subject) or
    ``"upstream"`` (requests); ``heal``: the crash point, in the same worker, where the
    toxic is removed (say the runtime's first retry, ``db.reconnect[db]#1``), or None:
    at the end of that worker. Raises :class:`PlanError` naming the bad field.
    """

    link: str
    toxic: str
    attributes: tuple[tuple[str, int], ...] = ()
    stream: str = "downstream"
    heal: CrashPoint | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.link, str) or not _LINK_RE.fullmatch(self.link):
            raise PlanError(f"net.link={self.link!r} must be 'db' or a provider kind (lower-case letters, digits, - and _)")
        if self.toxic not in TOXIC_ATTRIBUTES:
            raise PlanError(f"net.toxic={self.toxic!r} must be one of {', '.join(TOXIC_ATTRIBUTES)}")
        if self.stream not in NET_STREAMS:
            raise PlanError(f"net.stream={self.stream!r} must be one of {', '.join(NET_STREAMS)}")
        given = dict(self.attributes.items() if isinstance(self.attributes, dict) else self.attributes)
        names = TOXIC_ATTRIBUTES[self.toxic]
        for name, value in given.items():
            if name not in names:
                raise PlanError(f"net.attributes.{name} is not an attribute of {self.toxic} "
                                f"(it has {', '.join(names) or 'none'})")
            if not isinstance(value, int) or isinstance(value, bool):
                raise PlanError(f"net.attributes.{name}={value!r} must be an integer")
        object.__setattr__(self, "attributes", tuple((n, given.get(n, 0)) for n in names))
        if self.heal is not None and not isinstance(self.heal, CrashPoint):
            raise PlanError(f"net.heal={self.heal!r} must be a crash point or null (the end of the worker)")

    @property
    def attrs(self) -> dict[str, int]:
        """The attributes as Toxiproxy's JSON takes them."""
        return dict(self.attributes)

    def label(self) -> str:
        """``LINK.TOXIC`` plus ``(name=value,...)`` for non-zero attributes and an upstream stream."""
        opts = [f"{n}={v}" for n, v in self.attributes if v != 0]
        if self.stream != "downstream":
            opts.append(f"stream={self.stream}")
        return f"{self.link}.{self.toxic}" + (f"({','.join(opts)})" if opts else "")

    def to_dict(self) -> dict[str, Any]:
        return {"link": self.link, "toxic": self.toxic, "attributes": self.attrs, "stream": self.stream,
                "heal": self.heal.to_dict() if self.heal else None}

    @classmethod
    def from_dict(cls, data: Any, where: str = "net") -> NetToxic:
        if not isinstance(data, dict):
            raise PlanError(f"{where} must be an object, got {type(data).__name__}")
        unknown = set(data) - {"link", "toxic", "attributes", "stream", "heal"}
        if unknown:
            raise PlanError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")
        for f in ("link", "toxic"):
            if f not in data:
                raise PlanError(f"{where}.{f} is missing")
        attributes = data.get("attributes", {})
        if not isinstance(attributes, dict):
            raise PlanError(f"{where}.attributes must be an object of integers")
        heal = data.get("heal")
        try:
            return cls(data["link"], data["toxic"], tuple(attributes.items()), data.get("stream", "downstream"),
                       None if heal is None else CrashPoint.from_dict(heal, f"{where}.heal"))
        except PlanError as exc:
            text = str(exc)
            raise PlanError(text.replace("net.", f"{where}.", 1) if text.startswith("net.") else text) from None


@dataclass(frozen=True)
class Fault:
    """A fault ``kind`` landing at ``point``; a ``net`` fault also carries its toxic, a
    ``db-outage`` fault its window (``window_ms``: how long PostgreSQL stays unreachable,
    1 to :data:`MAX_OUTAGE_WINDOW_MS`; default :data:`OUTAGE_WINDOW_MS`)."""

    kind: str
    point: CrashPoint
    net: NetToxic | None = None
    window_ms: int | None = None

    def __post_init__(self) -> None:
        kinds = fault_kinds()
        if self.kind not in kinds:
            raise PlanError(f"fault.kind={self.kind!r} must be one of {', '.join(kinds)}")
        if (self.kind == "net") != (self.net is not None):
            raise PlanError("fault.net is required with kind 'net' (its link and toxic: net:LINK.TOXIC@...)"
                            if self.kind == "net" else f"fault.net is only for kind 'net', not {self.kind!r}")
        if self.kind == "db-outage":
            if self.window_ms is None:
                object.__setattr__(self, "window_ms", OUTAGE_WINDOW_MS)
            w = self.window_ms
            if not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= MAX_OUTAGE_WINDOW_MS:
                raise PlanError(f"fault.window_ms={w!r} must be an integer from 1 to {MAX_OUTAGE_WINDOW_MS} (milliseconds)")
        elif self.window_ms is not None:
            raise PlanError(f"fault.window_ms is only for kind 'db-outage', not {self.kind!r}")
        heal = self.net.heal if self.net else None
        if heal is not None and heal.key[:2] == self.point.key[:2] and heal.occurrence <= self.point.occurrence:
            raise PlanError(f"fault.net.heal={heal.label()} must come after the fault's point {self.point.label()}")

    def label(self) -> str:
        if self.net is not None:
            heal = f"~{self.net.heal.label()}" if self.net.heal else ""
            return f"net:{self.net.label()}@{self.point.label()}{heal}"
        if self.window_ms is not None:
            return f"{self.kind}({self.window_ms}ms)@{self.point.label()}"
        return f"{self.kind}@{self.point.label()}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "point": self.point.to_dict()}
        if self.net is not None:
            out["net"] = self.net.to_dict()
        if self.window_ms is not None:
            out["window_ms"] = self.window_ms
        return out


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
            unknown = set(f) - {"kind", "point", "net", "window_ms"}
            if unknown:
                raise PlanError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")
            if "kind" not in f:
                raise PlanError(f"{where}.kind is missing")
            if f["kind"] not in fault_kinds():
                raise PlanError(f"{where}.kind={f['kind']!r} must be one of {', '.join(fault_kinds())}")
            if (f["kind"] == "net") != (f.get("net") is not None):
                raise PlanError(f"{where}.net is required with kind 'net'" if f["kind"] == "net"
                                else f"{where}.net is only for kind 'net', not {f['kind']!r}")
            point = CrashPoint.from_dict(f.get("point"), f"{where}.point")
            net = NetToxic.from_dict(f["net"], f"{where}.net") if f.get("net") is not None else None
            try:
                out.append(Fault(f["kind"], point, net, f.get("window_ms")))
            except PlanError as exc:
                raise PlanError(str(exc).replace("fault.", f"{where}.", 1)) from None
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


RESUME_POLICIES = ("default", "concurrent", "recurring", "discovery", "input-once", "redelivery", "warm-worker",
                   "same-worker", "other-executor")
"""Resume policies (:mod:`.policies`): ``default`` is the subject's (by id, one resumer
at a time, input as the adapter declares)."""
MAX_CONCURRENT = 16
"""The most resumers a concurrent policy starts at once."""
_RESUME_RE = re.compile(r"(?P<policy>[a-z-]+)(?:=(?P<workers>[0-9]+))?")


@dataclass(frozen=True)
class Resume:
    """A case's resume policy: ``policy`` one of :data:`RESUME_POLICIES`; ``workers``
    the resumers a ``concurrent`` policy starts at once (2 to :data:`MAX_CONCURRENT`).
    Raises :class:`PlanError` naming the bad field."""

    policy: str = "default"
    workers: int = 2

    def __post_init__(self) -> None:
        if self.policy not in RESUME_POLICIES:
            raise PlanError(f"resume={self.policy!r} must be one of {', '.join(RESUME_POLICIES)}")
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or not 2 <= self.workers <= MAX_CONCURRENT:
            raise PlanError(f"resume workers={self.workers!r} must be an integer from 2 to {MAX_CONCURRENT}")
        if self.policy != "concurrent" and self.workers != 2:
            raise PlanError(f"resume={self.policy}={self.workers}: only 'concurrent' takes a number of workers")

    def label(self) -> str:
        """The id component: ``""`` for the default, ``concurrent=3`` (``concurrent`` for
        2), else the policy's name."""
        if self.policy == "default":
            return ""
        if self.policy == "concurrent" and self.workers != 2:
            return f"concurrent={self.workers}"
        return self.policy

    @classmethod
    def parse(cls, text: str) -> Resume:
        """``POLICY`` or ``concurrent=N`` (an id component, a CLI value); raises
        :class:`PlanError`."""
        m = _RESUME_RE.fullmatch(text.strip())
        if m is None:
            raise PlanError(f"resume={text!r} must be one of {', '.join(RESUME_POLICIES)} (or concurrent=N)")
        workers = m["workers"]
        if workers is not None and m["policy"] != "concurrent":
            raise PlanError(f"resume={text!r}: only 'concurrent' takes a number of workers")
        return cls(m["policy"], int(workers) if workers is not None else 2)


@dataclass(frozen=True)
class Case:
    """One workload conversation under one fault plan and resume policy, on one subject;
    ``upgrade``: the labels ``A>B`` of a build pair it crashes and resumes under (None:
    one build)."""

    workload: str
    conversation: str
    plan: FaultPlan
    resume: Resume = field(default_factory=Resume)
    upgrade: str | None = None

    def __post_init__(self) -> None:
        for field_name in ("workload", "conversation"):
            value = getattr(self, field_name)
            if not _is_id(value):
                raise PlanError(f"case.{field_name}={value!r} must be a non-empty name without []#/+ or whitespace")
        if self.upgrade is not None and not _UPGRADE_RE.fullmatch(self.upgrade):
            raise PlanError(f"case.upgrade={self.upgrade!r} must be two build labels, A>B")

    @property
    def id(self) -> str:
        policy = self.resume.label()
        tail = f"/upgrade:{self.upgrade}" if self.upgrade else ""
        return f"{self.workload}/{self.conversation}/{self.plan.label()}" + (f"/{policy}" if policy else "") + tail

    @classmethod
    def parse(cls, case_id: str) -> Case:
        """Parse a case id (see module docstring); raises :class:`PlanError`."""
        parts = case_id.split("/", 2)
        if len(parts) != 3 or not all(parts):
            raise PlanError(f"case id {case_id!r} must look like WORKLOAD/CONVERSATION/KIND@NAME[TASK]#N")
        workload, conversation, faults = parts
        faults, sep, builds = faults.partition("/upgrade:")
        upgrade = builds if sep else None
        if sep and not _UPGRADE_RE.fullmatch(builds):
            raise PlanError(f"case id {case_id!r}: its builds {builds!r} must look like upgrade:A>B")
        resume = Resume()
        if "/" in faults:
            faults, _, policy = faults.partition("/")
            try:
                resume = Resume.parse(policy)
            except PlanError as exc:
                raise PlanError(f"{exc} (in case id {case_id!r})") from None
            if resume.policy == "default":
                raise PlanError(f"case id {case_id!r}: the default resume policy is written as no component")
        if faults == "golden":
            return cls(workload, conversation, FaultPlan(), resume, upgrade)
        out = []
        for text in faults.split("+"):
            if text.startswith("net:"):
                out.append(_parse_net_fault(text, case_id))
                continue
            m = _FAULT_RE.fullmatch(text)
            if m is None:
                raise PlanError(f"fault {text!r} in case id {case_id!r} must look like KIND@NAME[TASK]#N")
            kind, name, task, occ, window = m.group("kind", "name", "task", "occ", "window")
            if kind not in fault_kinds():
                raise PlanError(f"fault kind {kind!r} in case id {case_id!r} must be one of {', '.join(fault_kinds())}")
            try:
                out.append(Fault(kind, CrashPoint(source_of(name), name, task, int(occ)),
                                 window_ms=int(window) if window is not None else None))
            except PlanError as exc:
                raise PlanError(f"{exc} (in case id {case_id!r})") from None
        return cls(workload, conversation, FaultPlan(tuple(out)), resume, upgrade)


_UPGRADE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*>[A-Za-z0-9][A-Za-z0-9_.-]*")
_FAULT_RE = re.compile(r"(?P<kind>[a-z-]+)(?:\((?P<window>[0-9]+)ms\))?@(?P<name>[^\[\]#/+\s]+)\[(?P<task>[^\[\]#/+\s]+)\]#(?P<occ>[1-9][0-9]*)")

_POINT = r"(?P<{p}name>[^\[\]#/+\s]+)\[(?P<{p}task>[^\[\]#/+\s]+)\]#(?P<{p}occ>[1-9][0-9]*)"
_NET_FAULT_RE = re.compile(
    r"net:(?P<link>[a-z][a-z0-9_-]*)\.(?P<toxic>[a-z_]+)(?:\((?P<opts>[a-z_]+=[a-z0-9-]+(?:,[a-z_]+=[a-z0-9-]+)*)\))?"
    "@" + _POINT.format(p="") + "(?:~" + _POINT.format(p="h") + ")?"
)
_INT_RE = re.compile(r"-?[0-9]+")


def _parse_net_fault(text: str, case_id: str) -> Fault:
    """``net:LINK.TOXIC[(k=v,...)]@NAME[TASK]#N[~NAME[TASK]#N]`` (module docstring)."""
    m = _NET_FAULT_RE.fullmatch(text)
    if m is None:
        raise PlanError(f"fault {text!r} in case id {case_id!r} must look like "
                        f"net:LINK.TOXIC(name=value,...)@NAME[TASK]#N~HEAL_NAME[TASK]#N")
    attributes: dict[str, int] = {}
    stream = "downstream"
    for opt in (m["opts"] or "").split(",") if m["opts"] else ():
        key, _, value = opt.partition("=")
        if key == "stream":
            stream = value
        elif _INT_RE.fullmatch(value):
            attributes[key] = int(value)
        else:
            raise PlanError(f"fault {text!r} in case id {case_id!r}: {key}={value!r} must be an integer")
    heal = (CrashPoint(source_of(m["hname"]), m["hname"], m["htask"], int(m["hocc"])) if m["hname"] else None)
    net = NetToxic(m["link"], m["toxic"], tuple(attributes.items()), stream, heal)
    return Fault("net", CrashPoint(source_of(m["name"]), m["name"], m["task"], int(m["occ"])), net)
