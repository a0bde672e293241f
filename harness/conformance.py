"""The open resume-conformance table: every installed durable runtime x (property, fault
kind), each cell a count of cases and the replay line of its first failure
(docs/conformance.md is the committed table, docs/checks.md explains each property).

``crashmatrix conformance [--out DIR] [--runtime NAME ...] [--conversation C ...]
[--shard K/N]`` runs, for each runtime of :data:`RUNTIMES` whose packages are
installed, the checkout workload in its *keyed* flavour (the tools' idempotency keys from
the runtime's own stable ids: what a careful team writes) over every fault kind the
runtime can take, and writes ``conformance.md`` and ``conformance.json`` to ``DIR``
(default ``docs/``). A runtime that is not installed is listed as such, never guessed;
one the command did not reach (stopped by a signal, or still to come when a row is
written) is listed as ``not run``. The table is rewritten after every row, so a run that
is stopped keeps the rows it finished.

A cell (runtime, property, kind) counts the cases of that kind whose verdicts include a
check of that property (:func:`.checks.property_of`): ``failed/judged``. A case
that ended in a harness error counts in no cell and is reported in its row's ``harness
errors``. So "effect exactly-once / kill: 0/245" reads "in 245 kill cases, no effect was
applied twice or lost". Each failing cell names its first failing case's replay line;
each cell keeps a *sample* (the first case it judged and whether that case broke the
property), which ``tests/integration/test_conformance.py`` replays to check that the
committed table is not stale; each row names the versions measured, and the table its
date and command. Kill cases are pruned by crash state as in ``crashmatrix run``
(:mod:`.pruning`): a pruned case's verdicts are derived from its group's representative.

``--shard K/N`` keeps the K-th of N disjoint, deterministic shards of each runtime's
matrix (:func:`.enumeration.shard`), a reduced but honest sample whose command line the
page states. The whole table is the nightly ci/ job.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .checks import property_of
from .properties import PROPERTIES

RW = "crashmatrix.scenarios.realworld"
AD = "crashmatrix.harness.adapters"
CONVERSATIONS = ("conv1",)
"""The conversations a table runs unless told otherwise (``--conversation``)."""
SCHEMA = 1
"""``conformance.json``'s ``version``."""
RESUMABILITY = "resumability"


@dataclass(frozen=True)
class Runtime:
    """One row of the table: ``name`` (a short id, the ``--runtime`` choice), ``label``
    (what the table shows), ``subject`` and ``workload`` (registry names or importable
    ``module:attr``; the keyed flavour), ``kinds`` (the fault kinds the runtime can
    take), ``packages`` (distributions whose versions the row reports; the first one
    must be installed for the row to run), ``sources`` (crash-point sources),
    ``servers`` (servers the harness runs for it, name -> the release it pins) and
    ``note`` (why a kind is left out)."""

    name: str
    label: str
    subject: str
    workload: str
    kinds: tuple[str, ...]
    packages: tuple[str, ...]
    sources: tuple[str, ...] = ("step", "label")
    servers: tuple[tuple[str, str], ...] = ()
    note: str = ""

    def installed(self) -> bool:
        """Whether the row's first package is installed in this interpreter."""
        try:
            importlib.metadata.version(self.packages[0])
            return True
        except importlib.metadata.PackageNotFoundError:
            return False

    def versions(self) -> dict[str, str]:
        """Distribution (or server) -> installed version, ``not installed`` for one
        that is missing."""
        out = {}
        for p in self.packages:
            try:
                out[p] = importlib.metadata.version(p)
            except importlib.metadata.PackageNotFoundError:
                out[p] = "not installed"
        return {**out, **dict(self.servers)} if self.installed() else out


def _restate_release() -> str:
    from .services.restate import RESTATE_VERSION

    return RESTATE_VERSION


CAPABILITY_KINDS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("kill", "term")), ("cancel", ("cancel", "cancel-edge")), ("cancel-api", ("cancel-api",)),
    ("cancel-final", ()), ("leases", ("pause", "db-restart")), ("restore", ("restore",)))
"""The fault kinds a runtime's row runs, by the capability each needs
(:meth:`.adapter.Adapter.capabilities`; None: every runtime), in the table's order."""
NO_API = "no cancel-api: the runtime offers no cancel of a run by id"
FINAL_CANCEL = ("no cancel-api: the runtime's cancel is final (a cancelled run cannot be resumed; its cancel-api "
                "cases end at the cancel, judged by cancel.final and cancel.clean_stop outside this table)")
NO_LEASES = "no pause or db-restart: no lease the harness can steal on its PostgreSQL"


def adapter_class(subject: str) -> type:
    """The adapter class of a subject (a registry name or ``module:Class``), imported,
    never made (the runtime itself is not imported). Raises ``RegistryError``."""
    from . import registry

    return registry.load(registry.SUBJECTS.get(subject, subject))


def kinds_and_note(subject: str, why: str = "") -> tuple[tuple[str, ...], str]:
    """The fault kinds a subject's row runs and the note saying why the others are left
    out, both from its adapter's declarations (:data:`CAPABILITY_KINDS`); ``why``: the
    runtime's own words, first in the note."""
    caps = adapter_class(subject).capabilities()
    kinds = tuple(k for need, ks in CAPABILITY_KINDS if need is None or need in caps for k in ks)
    clauses = [why] if why else []
    if "cancel" in caps and "cancel-api" not in caps:
        clauses.append(FINAL_CANCEL if "cancel-final" in caps else NO_API)
    if "leases" not in caps:
        clauses.append(NO_LEASES)
    return kinds, "; ".join(clauses)


def _runtime(name: str, label: str, subject: str, workload: str, packages: tuple[str, ...], *,
             servers: tuple[tuple[str, str], ...] = (), why: str = "") -> Runtime:
    kinds, note = kinds_and_note(subject, why)
    return Runtime(name, label, subject, workload, kinds, packages, servers=servers, note=note)


RUNTIMES: tuple[Runtime, ...] = (
    _runtime("reference", "crashmatrix reference runtime", "reference", "checkout", ("crashmatrix",)),
    _runtime("langgraph", "LangGraph (SQLite saver, sync durability)", f"{AD}.langgraph:LangGraphSqliteSyncAdapter",
             f"{RW}.langgraph_checkout:KEYED", ("langgraph", "langgraph-checkpoint-sqlite"),
             why="the graph runs in a thread (invoke): a cancel cannot reach it"),
    _runtime("langgraph-aio", "LangGraph (async SQLite saver, sync durability)",
             f"{AD}.langgraph:LangGraphAioSqliteSyncAdapter", f"{RW}.langgraph_checkout:KEYED",
             ("langgraph", "langgraph-checkpoint-sqlite")),
    _runtime("dbos", "DBOS (SQLite)", f"{AD}.dbos:DBOSSqliteAdapter", f"{RW}.dbos_checkout:KEYED", ("dbos",)),
    _runtime("burr", "Apache Burr (SQLite persister)", f"{AD}.burr:BurrAdapter", f"{RW}.burr_checkout:KEYED",
             ("apache-burr",)),
    _runtime("pydantic-ai", "Pydantic AI durable execution (DBOS, SQLite)", "pydantic-ai-sqlite",
             f"{RW}.pydantic_ai_checkout:KEYED", ("pydantic-ai-slim", "dbos")),
    _runtime("openai-agents", "OpenAI Agents SDK on DBOS (SQLite)", "openai-agents-sqlite",
             f"{RW}.openai_agents_checkout:KEYED", ("openai-agents", "dbos-openai-agents", "dbos")),
    _runtime("llamaindex", "LlamaIndex Workflows (context snapshots)", "llamaindex",
             f"{RW}.llamaindex_checkout:KEYED", ("llama-index-workflows",)),
    _runtime("restate", "Restate (restate-server, Python SDK)", f"{AD}.restate:RestateAdapter",
             f"{RW}.restate_checkout:KEYED", ("restate-sdk",), servers=(("restate-server", ""),),
             why="the journal is the server's own, not the harness's PostgreSQL"),
    _runtime("absurd", "Absurd (PostgreSQL durable tasks)", f"{AD}.absurd:AbsurdAdapter", f"{RW}.absurd_checkout:KEYED",
             ("absurd-sdk", "absurdctl")),
    _runtime("prefect", "Prefect 3 (result persistence, SQLite server)", f"{AD}.prefect:PrefectAdapter",
             f"{RW}.prefect_checkout:KEYED", ("prefect",)),
    _runtime("crewai", "CrewAI Flows (@persist, SQLite)", f"{AD}.crewai:CrewAIAdapter", f"{RW}.crewai_checkout:KEYED",
             ("crewai",)),
)
"""Every runtime the table knows, in the order it shows them. Restate's server release
is filled in by :func:`runtime_versions` (the one the harness fetches)."""


def runtime_versions(runtime: Runtime) -> dict[str, str]:
    """:meth:`Runtime.versions`, with each server's pinned release filled in."""
    out = runtime.versions()
    if "restate-server" in out:
        out["restate-server"] = _restate_release()
    return out


@dataclass
class Cell:
    """One (property, kind) cell of a row: ``judged`` cases whose verdicts include a
    check of the property, ``failed`` of them broke it, ``first_failure`` (replay line)
    and ``first_failure_case`` (case id) of the first that did, and ``sample`` /
    ``sample_failed``: the first case judged and whether it broke the property (what the
    committed table's check replays)."""

    judged: int = 0
    failed: int = 0
    first_failure: str | None = None
    first_failure_case: str | None = None
    sample: str | None = None
    sample_failed: bool | None = None


@dataclass
class Row:
    """One runtime's results: ``status`` ``ran`` / ``not installed`` / ``error`` /
    ``not run``; ``cases`` results tabulated (a golden run that breaks an invariant is
    one, of kind ``golden``); ``cells`` property -> kind -> :class:`Cell`."""

    runtime: Runtime
    status: str
    versions: dict[str, str] = field(default_factory=dict)
    cases: int = 0
    harness_errors: int = 0
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    planned: int = 0
    #: the first case that ended in a harness error: its replay line and its error's
    #: first line (None: there was none)
    first_harness_error: str | None = None
    harness_error_reason: str | None = None

    @property
    def failing_cells(self) -> int:
        return sum(1 for kinds in self.cells.values() for c in kinds.values() if c.failed)

    @property
    def cell_count(self) -> int:
        return sum(len(kinds) for kinds in self.cells.values())

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": asdict(self.runtime), "status": self.status, "versions": self.versions,
                "cases": self.cases, "planned": self.planned, "harness_errors": self.harness_errors,
                "error": self.error, "seconds": round(self.seconds, 1),
                "first_harness_error": self.first_harness_error, "harness_error_reason": self.harness_error_reason,
                "cells": {p: {k: asdict(c) for k, c in kinds.items()} for p, kinds in self.cells.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """The inverse of :meth:`to_dict` (a ``KeyError``/``TypeError`` on another shape)."""
        rt = d["runtime"]
        runtime = Runtime(**{**rt, **{k: tuple(rt[k]) for k in ("kinds", "packages", "sources")},
                             "servers": tuple(tuple(s) for s in rt.get("servers", ()))})
        cells = {p: {k: Cell(**c) for k, c in kinds.items()} for p, kinds in d["cells"].items()}
        return cls(runtime, d["status"], dict(d["versions"]), d["cases"], d["harness_errors"], cells, d["error"],
                   d["seconds"], d.get("planned", 0), d.get("first_harness_error"), d.get("harness_error_reason"))


def fault_kind(result: Any) -> str:
    """The kind of a result's first fault (``golden`` for a golden run's result)."""
    faults = result.case.plan.faults
    return faults[0].kind if faults else "golden"


def tabulate(runtime: Runtime, results: Iterable[Any], versions: dict[str, str] | None = None) -> Row:
    """A row from a matrix's case results (objects with ``outcome``, ``case`` (its
    ``id`` and ``plan.faults``), ``verdicts`` (each with ``check`` and ``valid``) and
    ``replay``: :class:`.case.CaseResult`). A verdict that is not valid (invalid or
    unknown) breaks its property; a harness error counts only in ``harness_errors``."""
    row = Row(runtime, "ran", dict(versions) if versions is not None else runtime_versions(runtime))
    for r in results:
        row.cases += 1
        if r.outcome == "harness-error":
            row.harness_errors += 1
            if row.first_harness_error is None:
                row.first_harness_error = r.replay
                row.harness_error_reason = (r.error or "no error recorded").strip().splitlines()[0][:300]
            continue
        if r.outcome in ("not-run", "not-applicable"):  # it tested nothing: judged on nothing, in no cell
            continue
        kind = fault_kind(r)
        # the runner records resumability only when it fails (run.ends, resume.runs):
        # every faulted case that came to an end was judged on it
        broke: dict[str, bool] = {RESUMABILITY: False} if kind != "golden" else {}
        for v in r.verdicts:
            p = property_of(v.check)
            broke[p] = broke.get(p, False) or v.valid is not True
        for p, bad in broke.items():
            cell = row.cells.setdefault(p, {}).setdefault(kind, Cell())
            cell.judged += 1
            if cell.sample is None:
                cell.sample, cell.sample_failed = r.case.id, bad
            if bad:
                cell.failed += 1
                if cell.first_failure is None:
                    cell.first_failure, cell.first_failure_case = r.replay, r.case.id
    return row


async def run_row(runtime: Runtime, *, conversations: tuple[str, ...] = CONVERSATIONS, jobs: int | None = None,
                  shard_spec: str | None = None, on_result: Callable[[Any], None] | None = None) -> Row:
    """Run one runtime's matrix and tabulate it. Never raises for the runtime's own
    trouble: a service that does not start or a golden run that cannot be made is the
    row's ``error`` (its first line). ``CancelledError`` propagates (the caller writes
    what it has)."""
    from .errors import CrashmatrixError
    from .matrix import run_matrix

    if not runtime.installed():
        return Row(runtime, "not installed", runtime.versions())
    t0 = time.monotonic()
    try:
        report = await run_matrix(runtime.workload, runtime.subject, kinds=runtime.kinds, sources=runtime.sources,
                                  conversations=conversations, jobs=jobs, on_result=on_result, shard_spec=shard_spec,
                                  replay_failures=0)
    except CrashmatrixError as exc:
        return Row(runtime, "error", runtime_versions(runtime), error=str(exc).splitlines()[0],
                   seconds=time.monotonic() - t0)
    row = tabulate(runtime, [*report.golden_results, *report.results])
    row.planned = report.planned
    row.seconds = time.monotonic() - t0
    return row


def command_line(names: list[str] | None = None, conversations: tuple[str, ...] = CONVERSATIONS,
                 shard_spec: str | None = None, out: str | None = None, jobs: int = 0) -> str:
    """The ``crashmatrix conformance`` line that makes a table with these options
    (defaults left out), quoted for POSIX shells."""
    cmd = ["crashmatrix", "conformance"]
    if out is not None:
        cmd += ["--out", out]
    for n in names or []:
        cmd += ["--runtime", n]
    for c in conversations if tuple(conversations) != CONVERSATIONS else ():
        cmd += ["--conversation", c]
    if shard_spec:
        cmd += ["--shard", shard_spec]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    return shlex.join(cmd)


def check_shard(spec: str, runtimes: Iterable[Runtime]) -> None:
    """Raise ``InvalidArgument`` unless ``spec`` (``K/N``) is a valid shard whose N is
    prime to every runtime's number of fault kinds. The matrix lists each point's cases
    kind by kind and a shard keeps every N-th case (:func:`.enumeration.shard`), so an N
    that shares a factor with the kinds would keep some kinds only."""
    import math

    from .errors import InvalidArgument
    from .enumeration import shard

    shard([], spec)
    n = int(spec.split("/")[1])
    for rt in runtimes:
        if math.gcd(n, len(rt.kinds)) != 1:
            raise InvalidArgument(f"--shard {spec}: N={n} shares a factor with the {len(rt.kinds)} fault kinds of "
                                  f"{rt.name}, so its shard would hold some kinds only; pick N prime to "
                                  f"{', '.join(str(k) for k in sorted({len(r.kinds) for r in RUNTIMES}))} (e.g. 11)")


def check_conversations(conversations: Iterable[str]) -> None:
    """Raise ``InvalidArgument`` naming a conversation the checkout workload does not
    have (every row's workload has the reference checkout's conversations)."""
    from . import registry
    from .errors import InvalidArgument

    known = registry.workload("checkout").conversations
    for conv in conversations:
        if conv not in known:
            raise InvalidArgument(f"--conversation {conv!r} is not one of {', '.join(known)}")


def kinds_shown(rows: list[Row]) -> list[str]:
    """The fault kinds any row can take, in the fault registry's order; then ``golden``
    when a row's golden run broke an invariant (its conversation's cases were not run)."""
    from . import faults

    golden = any("golden" in kinds for r in rows for kinds in r.cells.values())
    return [k for k in faults.names() if any(k in r.runtime.kinds for r in rows)] + ["golden"] * golden


def cell_text(row: Row, prop: str, kind: str) -> str:
    """A cell as the table shows it: ``-`` where the runtime cannot take the kind or the
    row did not run, ``·`` where no case of the kind was judged on the property (its checks
do not apply to that kind), ``0/N`` when none of N cases broke it, ``**F/N**``."""
    if row.status != "ran" or kind not in (*row.runtime.kinds, "golden"):
        return "-"
    c = row.cells.get(prop, {}).get(kind)
    if c is None:
        return "·"
    return f"**{c.failed}/{c.judged}**" if c.failed else f"0/{c.judged}"


def headline(rows: list[Row]) -> str:
    """``R rows ran of T (...); C cells, F failing`` for the page and the CLI."""
    ran = [r for r in rows if r.status == "ran"]
    cells = sum(r.cell_count for r in ran)
    failing = sum(r.failing_cells for r in ran)
    others = ", ".join(f"{sum(1 for r in rows if r.status == s)} {s}" for s in ("not installed", "error", "not run")
                       if any(r.status == s for r in rows))
    return (f"{len(ran)} of {len(rows)} runtimes ran" + (f" ({others})" if others else "")
            + f"; {cells} cells, {failing} failing; {sum(r.cases for r in ran)} cases, "
            f"{sum(r.harness_errors for r in ran)} harness errors")


def _note(r: Row) -> str:
    if r.status == "not installed":
        return f"not installed here (`pip install 'crashmatrix[{r.runtime.name}]'`)"
    if r.status == "not run":
        return "not run: the command was stopped before this row"
    if r.status == "error":
        return f"error: {r.error}"
    return r.runtime.note


def to_markdown(rows: list[Row], command: str, date: str, conversations: tuple[str, ...] = CONVERSATIONS,
                shard_spec: str | None = None, seconds: float | None = None) -> str:
    """The table as Markdown: what was run (``command``, ``date``, wall time
    ``seconds``), a runtimes section (versions, cases, status), then one section per
    property that any row judged: runtimes x fault kinds, and the first failure of each
    failing cell."""
    kinds = kinds_shown(rows)
    sample = f", shard {shard_spec} of each runtime's matrix" if shard_spec else ""
    took = f" in {seconds / 60:.0f} min of wall time" if seconds is not None else ""
    out = ["# Resume conformance", "",
           f"Generated {date} by `{command}`{took}: the checkout workload in its keyed flavour (idempotency keys from "
           f"each runtime's own stable ids), conversation{'s' if len(conversations) > 1 else ''} "
           f"{', '.join(conversations)}{sample}, crash points at steps and labels, every fault kind the runtime "
           "can take. A cell is `failed/judged`: the cases of that fault kind whose verdicts include a check of "
           "that property, and how many of them broke it (bold when any did); `-` where the runtime cannot take "
           "the kind, `·` where no case of the kind was judged on the property (its checks do not apply to "
           "that kind). docs/checks.md explains each property and anomaly; docs/findings.md says whether a gap is "
           "the runtime's documented behaviour or a bug.", "", f"**{headline(rows)}.**", ""]
    if shard_spec:
        k, n = shard_spec.split("/")
        out += [f"This is a reduced sample: shard {k} of {n} keeps every {n}th case of each runtime's matrix (points "
                "in trace order, each point's cases kind by kind; N is prime to every row's number of kinds, so "
                f"each kind is sampled alike). The nightly ci job runs the whole table "
                "(`crashmatrix conformance --conversation conv1 --conversation conv2 --conversation conv3 "
                "--conversation conv4`: ci/).", ""]
    out += ["## Runtimes", "", "| runtime | status | versions | cases | harness errors | seconds | note |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        order = dict.fromkeys(p for p in (*r.runtime.packages, *r.versions) if p in r.versions)
        versions = ", ".join(f"{k} {r.versions[k]}" for k in order)
        cases = f"{r.cases}" if r.status == "ran" else "-"
        out.append(f"| {r.runtime.label} (`{r.runtime.name}`) | {r.status} | {versions} | {cases} | "
                   f"{r.harness_errors if r.status == 'ran' else '-'} | "
                   f"{f'{r.seconds:.0f}' if r.status in ('ran', 'error') else '-'} | {_note(r)} |")
    errors = [f"- {r.runtime.label} ({r.harness_errors}): `{r.first_harness_error}`: {r.harness_error_reason}"
              for r in rows if r.status == "ran" and r.first_harness_error]
    if errors:
        out += ["", "A case that ended in a harness error (the harness could not make its fault take effect, or "
                "lost a worker) is judged on nothing and counted in no cell. The first of each row:", "", *errors]
    for prop, meaning in PROPERTIES.items():
        if not any(prop in r.cells for r in rows):
            continue
        out += ["", f"## {prop}", "", f"{meaning[0].upper()}{meaning[1:]}.", "",
                "| runtime | " + " | ".join(kinds) + " |", "| --- |" + " --- |" * len(kinds)]
        failures = []
        for r in rows:
            out.append(f"| {r.runtime.label} | " + " | ".join(cell_text(r, prop, k) for k in kinds) + " |")
            for k in kinds:
                c = r.cells.get(prop, {}).get(k)
                if c is not None and c.first_failure and r.status == "ran":
                    failures.append(f"- {r.runtime.label}, {k}: `{c.first_failure}`")
        if failures:
            out += ["", "First failure of each failing cell:", "", *failures]
    return "\n".join(out) + "\n"


def write(rows: list[Row], out_dir: Path, command: str, conversations: tuple[str, ...] = CONVERSATIONS,
          shard_spec: str | None = None, date: str | None = None, seconds: float | None = None) -> tuple[Path, Path]:
    """Write ``conformance.md`` and ``conformance.json`` into ``out_dir`` (made if
    missing); returns their paths. ``seconds``: the command's wall time so far. The page
    is rendered from the rows as the JSON holds them (seconds rounded), so
    :func:`load` and :func:`to_markdown` give it back."""
    date = date or datetime.date.today().isoformat()
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "conformance.md", out_dir / "conformance.json"
    dicts = [r.to_dict() for r in rows]
    took = None if seconds is None else round(seconds)
    md.write_text(to_markdown([Row.from_dict(d) for d in dicts], command, date, conversations, shard_spec, took),
                  encoding="utf-8")
    js.write_text(json.dumps({"version": SCHEMA, "date": date, "command": command, "conversations": list(conversations),
                              "shard": shard_spec, "seconds": took, "rows": dicts}, indent=1, sort_keys=True) + "\n",
                  encoding="utf-8")
    return md, js


def load(path: Path) -> tuple[dict[str, Any], list[Row]]:
    """A written ``conformance.json``: its header (date, command, conversations, shard)
    and its rows. Raises ``InvalidArgument`` naming the file for another shape."""
    from .errors import InvalidArgument

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != SCHEMA:
            raise InvalidArgument(f"{path}: version={data.get('version')!r}, expected {SCHEMA}")
        return {k: v for k, v in data.items() if k != "rows"}, [Row.from_dict(r) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise InvalidArgument(f"{path}: not a conformance table ({type(exc).__name__}: {exc})") from None


def runtimes_named(names: list[str] | None) -> list[Runtime]:
    """The runtimes ``names`` asks for (all when empty), in table order; raises
    ``InvalidArgument`` naming an unknown one."""
    from .errors import InvalidArgument

    known = {r.name: r for r in RUNTIMES}
    bad = [n for n in names or [] if n not in known]
    if bad:
        raise InvalidArgument(f"--runtime {bad[0]!r} is not one of {', '.join(known)}")
    return [r for r in RUNTIMES if r.name in names] if names else list(RUNTIMES)
