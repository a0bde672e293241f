"""Run the matrices of the subjects nobody here wrote and tabulate them (docs/findings.md).

::

    python -m crashmatrix.scenarios.realworld.findings --out DIR
        [--only langgraph|langgraph-func|langgraph-aio|langgraph-aio-func|dbos|restate|absurd|prefect|crewai]
        [--backend sqlite|postgres] [--durability sync|async|exit] [--flavour naive|keyed]
        [--suite kill|cancel|await|term|drain|pause|db-restart|net] [--conversation conv1 ...] [--repeat N]
        [--repeat-conversation conv1 ...] [--jobs 2]
    python -m crashmatrix.scenarios.realworld.findings --table DIR     # the Markdown tables only

One *row* is a runtime x backend x durability x tool flavour x *suite*; a suite is a
fault kind set on a point source set (:data:`SUITES`): ``kill`` (SIGKILL at every step
and label), ``cancel`` (the run's anyio scope cancelled at every step and label),
``await`` (kill and cancel at every await point in the runtime's own packages),
``term`` (SIGTERM at every step boundary: what the runtime does with it), ``drain``
(SIGTERM at every step and label, with the runtime's own drain wired to the signal).
``pause`` (freeze the worker, let another steal the lease, wake the zombie),
``db-restart`` (crash PostgreSQL at the point) and ``net`` (the network section) apply
where the runtime has what they need. Not every row makes sense (:func:`applicable`):
the thread-driven LangGraph adapters have no await points and cannot be cancelled, DBOS
has no durability modes and no drain; the runtimes of :data:`SERVED` (Restate, Absurd,
Prefect, CrewAI) have one backend each and no drain. Leases on the harness's PostgreSQL
(``pause``, ``db-restart``) and a cancel that reaches the run (``cancel``, await points)
are read from each row's adapter (:func:`capabilities`): of these runtimes only Absurd
declares leases.

For each row: one golden run per conversation, then every case once; then the *racy*
cases (:func:`racy_case`: in LangGraph rows every case at a checkpointer point, and in
:attr:`Row.racy` rows every case of the ``--repeat-conversation`` conversations, default
``conv1``) run again, ``--repeat`` times in all (default 3 for LangGraph, 1 for DBOS),
and the cases whose outcome changed between runs are *unstable*. Per row it
records the matrix size, outcomes, failed cases by check, the first failing case's
replay command, cases per second, and (read from the providers' ledgers after each case)
how many model calls, charges and mails were billed or applied beyond the golden run.
Each row is written to ``DIR/<row>.json`` as soon as it is done, and a row already there
is not run again, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import Counter
from crashmatrix.harness.crashpoint import LOG_APPEND_AFTER, LOG_APPEND_BEFORE
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crashmatrix.harness.enumeration import enumerate_cases
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.explorer import Explorer, Options
from crashmatrix.harness.golden import GoldenRun
from crashmatrix.harness.matrix import run_cases
from crashmatrix.harness.pruning import OFF
from crashmatrix.harness.session import open_session

LG = "crashmatrix.harness.adapters.langgraph"
DB = "crashmatrix.harness.adapters.dbos"
LG_WL = "crashmatrix.scenarios.realworld.langgraph_checkout"
DB_WL = "crashmatrix.scenarios.realworld.dbos_checkout"
CONVERSATIONS = ("conv1", "conv2", "conv3", "conv4")

SERVED = {
    # runtime -> (adapter, workload module, its one backend): subjects with no
    # durability modes and no drain, one row per flavour and suite (docs/findings.md)
    "restate": ("crashmatrix.harness.adapters.restate:RestateAdapter",
                "crashmatrix.scenarios.realworld.restate_checkout", "restate-server"),
    "absurd": ("crashmatrix.harness.adapters.absurd:AbsurdAdapter",
               "crashmatrix.scenarios.realworld.absurd_checkout", "postgres"),
    "prefect": ("crashmatrix.harness.adapters.prefect:PrefectAdapter",
                "crashmatrix.scenarios.realworld.prefect_checkout", "sqlite"),
    "crewai": ("crashmatrix.harness.adapters.crewai:CrewAIAdapter",
               "crashmatrix.scenarios.realworld.crewai_checkout", "sqlite"),
}
RUNTIMES = ("langgraph", "langgraph-func", "langgraph-aio", "langgraph-aio-func", "dbos", *SERVED)
SUITES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kill": (("kill",), ("step", "label")),
    "cancel": (("cancel",), ("step", "label")),
    "await": (("kill", "cancel"), ("await",)),
    "term": (("term",), ("step",)),
    "drain": (("term",), ("step", "label")),
    "pause": (("pause",), ("step", "label")),
    "db-restart": (("db-restart",), ("step", "label")),
    "net": (("net",), ("label",)),
}


@dataclass(frozen=True)
class Row:
    """One matrix of the findings: ``runtime`` (:data:`RUNTIMES`), ``backend``
    (``sqlite``/``postgres``), ``durability`` (``sync``/``async``/``exit``; ``-`` for
    DBOS, which records every step's output before the next step), ``flavour``
    (``naive``/``keyed``), ``suite`` (:data:`SUITES`)."""

    runtime: str
    backend: str
    durability: str
    flavour: str
    suite: str

    @property
    def subject(self) -> str:
        if self.runtime in SERVED:
            return SERVED[self.runtime][0]
        if self.runtime == "dbos":
            return f"{DB}:DBOS{self.backend.capitalize()}Adapter"
        aio = "Aio" if "aio" in self.runtime else ""
        func = "Functional" if self.runtime.endswith("func") else ""
        drain = "Drain" if self.suite == "drain" else ""
        return f"{LG}:LangGraph{aio}{func}{self.backend.capitalize()}{self.durability.capitalize()}{drain}Adapter"

    @property
    def workload(self) -> str:
        if self.runtime in SERVED:
            return f"{SERVED[self.runtime][1]}:{self.flavour.upper()}"
        return f"{DB_WL if self.runtime == 'dbos' else LG_WL}:{self.flavour.upper()}"

    @property
    def key(self) -> str:
        return f"{self.runtime}.{self.backend}.{self.durability}.{self.flavour}.{self.suite}"

    @property
    def racy(self) -> bool:
        """Rows where LangGraph's background saves race the nodes (findings 3 and 4),
        or where a cancel lands among background tasks: repeated by default."""
        if self.runtime == "dbos" or self.runtime in SERVED or self.suite == "term":
            return False
        return self.durability == "async" or "func" in self.runtime or self.suite in ("cancel", "await")


def capabilities(row: Row) -> frozenset[str]:
    """What ``row``'s adapter declares it can be tested for (:meth:`.Adapter.capabilities`:
    its class imported, never made, the runtime not imported)."""
    from crashmatrix.harness.registry import load

    return load(row.subject).capabilities()


def applicable(row: Row) -> str | None:
    """Why ``row`` is left out of the findings, or None when it is run."""
    if row.suite in ("pause", "db-restart") and "leases" not in capabilities(row):
        return "no lease the harness can steal, or no PostgreSQL to restart (the reference runtime and Absurd have both)"
    if row.suite == "net" and row.runtime not in SERVED:
        return "the network section is run on the served runtimes"
    if row.runtime in SERVED:
        return "no drain to wire (none of these runtimes offers one)" if row.suite == "drain" else None
    if row.suite in ("cancel", "await") and "cancel" not in capabilities(row):
        return "the graph runs in a thread (invoke): no await points, a cancel cannot reach it"
    if row.suite == "drain" and (row.runtime == "dbos" or "func" in row.runtime):
        return "no drain to wire (DBOS has none; LangGraph's RunControl is exercised on the StateGraph)"
    if row.suite == "drain" and row.runtime != "langgraph-aio":
        return "drain is exercised on the async StateGraph"
    if row.suite == "await" and row.durability == "async" and not row.runtime.endswith("func"):
        return ("await points are not reproducible under `async` durability: the background checkpoint "
                "puts race the next superstep (2-6 of 26 logical tasks differ between three golden runs)")
    return None


def rows(runtimes: tuple[str, ...] = RUNTIMES, backends: tuple[str, ...] = ("sqlite", "postgres"),
         durabilities: tuple[str, ...] = ("sync", "async", "exit"), flavours: tuple[str, ...] = ("naive", "keyed"),
         suites: tuple[str, ...] = tuple(SUITES)) -> list[Row]:
    """Every applicable row of the given dimensions, in table order."""
    out = []
    for suite in suites:
        for runtime in runtimes:
            for backend in ((SERVED[runtime][2],) if runtime in SERVED else backends):
                for durability in (("-",) if runtime == "dbos" or runtime in SERVED else durabilities):
                    for flavour in flavours:
                        row = Row(runtime, backend, durability, flavour, suite)
                        if applicable(row) is None:
                            out.append(row)
    return out


def _extra(evidence: Any, golden: GoldenRun) -> dict[str, int]:
    """Model calls billed, charges and mails applied beyond the golden run's."""
    out = {"model": sum(evidence.model_calls.values()) - sum(golden.evidence.model_calls.values())}
    for kind in ("payment", "mail"):
        out[kind] = len(evidence.ledgers.get(kind, [])) - len(golden.evidence.ledgers.get(kind, []))
    return out


async def _run_all(explorer: Explorer, cases: list[Any], goldens: dict[str, GoldenRun],
                   jobs: int) -> list[tuple[CaseResult, dict[str, int]]]:
    """Each case (:func:`~crashmatrix.harness.matrix.run_cases`), with what it billed
    and applied beyond its golden run (zeros for a harness error)."""
    results = await run_cases(explorer, cases, goldens, jobs)
    out = []
    for r in results:
        extra = {"model": 0, "payment": 0, "mail": 0}
        if r.outcome != "harness-error":
            extra = _extra(await explorer.evidence(r.run_id), goldens[r.case.conversation])
        out.append((r, extra))
    return out


SAVER_LABELS = ("checkpoint.put.before", "checkpoint.put.after", LOG_APPEND_BEFORE, LOG_APPEND_AFTER)


def racy_case(row: Row, case: Any, repeat_conversations: tuple[str, ...]) -> bool:
    """The cases a row repeats: in LangGraph rows every case at a point of the
    checkpointer (its labels, its await points, a ``checkpoint-s<step>`` task: these race
    the next node even under ``sync`` durability), and in :attr:`Row.racy` rows every case
    of ``repeat_conversations``."""
    point = case.plan.faults[0].point
    if row.runtime.startswith("langgraph") and (point.name in SAVER_LABELS or point.task.startswith("checkpoint-s")
                                  or ".checkpoint." in point.name):
        return True
    return row.racy and case.conversation in repeat_conversations


async def run_row(row: Row, conversations: tuple[str, ...], jobs: int, repeat: int,
                  repeat_conversations: tuple[str, ...] = ("conv1",),
                  previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one row: every case once, then its racy cases (:func:`racy_case`) ``repeat - 1``
    more times, where flips are counted; returns its JSON record. With ``previous`` (a
    record of the same row run once), only the repeats run, and the record is extended."""
    kinds, sources = SUITES[row.suite]
    t0 = time.monotonic()
    # every case whole: a row counts how often a racy case flips, which a case derived
    # from its crash state's representative would hide
    options = Options(await_points="await" in sources, prune=OFF)
    async with open_session(row.subject, row.workload, options=options) as explorer:
        goldens = {conv: await explorer.golden(conv) for conv in conversations}
        cases = enumerate_cases(row.workload, goldens, kinds, sources)
        setup = time.monotonic() - t0
        t1 = time.monotonic()
        first = None if previous else await _run_all(explorer, cases, goldens, jobs)
        again = [i for i, c in enumerate(cases) if racy_case(row, c, repeat_conversations)] if repeat > 1 else []
        attempts_again = [await _run_all(explorer, [cases[i] for i in again], goldens, jobs) for _ in range(repeat - 1)]
        seconds = time.monotonic() - t1
    if previous is None:
        assert first is not None
        rec = _record(row, kinds, sources, conversations, goldens, cases, first)
        first_outcome = {r.case.id: r.outcome for r, _ in first}
        ran = len(cases)
    else:
        rec = dict(previous)
        failing = set(previous["failing"])
        errors = {e.split(": ", 1)[0] for e in previous["harness_errors"]}
        first_outcome = {c.id: "fail" if c.id in failing else "harness-error" if c.id in errors else "pass"
                         for c in cases}
        ran = 0
        rec["rechecked_seconds"] = round(seconds, 1)
    per_case = {cases[i].id: [first_outcome[cases[i].id]] + [a[j][0].outcome for a in attempts_again]
                for j, i in enumerate(again)}
    unstable = [cid for cid, o in per_case.items() if len(set(o)) > 1]
    runs = [[o[k] for o in per_case.values()] for k in range(repeat)] if again else []
    rec.update({
        "repeats": repeat if again else 1,
        "repeated_conversations": sorted({cases[i].conversation for i in again}),
        "repeated_cases": len(again),
        # among the repeated cases, run by run
        "fail_counts": [run.count("fail") for run in runs],
        "harness_error_counts": [run.count("harness-error") for run in runs],
        "unstable": unstable,
        "flips": {cid: per_case[cid] for cid in unstable},
    })
    ran += len(again) * (repeat - 1)
    if previous is None:
        rec.update({"seconds": round(seconds, 1), "setup_seconds": round(setup, 1),
                    "cases_per_second": round(ran / seconds, 2) if seconds else 0.0})
    return rec


def _record(row: Row, kinds: tuple[str, ...], sources: tuple[str, ...], conversations: tuple[str, ...],
            goldens: dict[str, GoldenRun], cases: list[Any],
            first: list[tuple[CaseResult, dict[str, int]]]) -> dict[str, Any]:
    """The row's record from its first run of every case."""
    by_check: Counter[str] = Counter()
    for r, _ in first:
        for check in sorted({v.check for v in r.failed}):
            by_check[check] += 1
    failing = [r for r, _ in first if r.outcome == "fail"]
    return {
        "row": asdict(row), "key": row.key, "subject": row.subject, "workload": row.workload,
        "kinds": list(kinds), "sources": list(sources), "conversations": list(conversations),
        "golden_points": {c: len(g.trace) for c, g in goldens.items()},
        "cases": len(cases), "outcomes": dict(Counter(r.outcome for r, _ in first)), "by_check": dict(by_check),
        "first_failing": failing[0].case.id if failing else None,
        "first_failing_replay": failing[0].replay if failing else None,
        "failing": [r.case.id for r in failing],
        "failures": [{"id": r.case.id, "checks": [{"check": v.check, "details": v.details, "diff": v.diff[:16]}
                                                  for v in r.failed]} for r in failing[:40]],
        "extra": {k: sum(e[k] for _, e in first) for k in ("model", "payment", "mail")},
        "cases_with_extra": {k: sum(1 for _, e in first if e[k] > 0) for k in ("model", "payment", "mail")},
        "harness_errors": [f"{r.case.id}: {r.error}" for r, _ in first if r.outcome == "harness-error"],
        "worker_cpu_ms": _cpu_medians([r for r, _ in first]),
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }


def _cpu_medians(results: list[CaseResult]) -> dict[str, float | None]:
    """Median CPU ms of the cases' start and resume workers (from their rusage)."""
    out: dict[str, float | None] = {}
    for role in ("start", "resume"):
        ms = [w["cpu_ms"] for r in results for w in r.workers if w.get("role") == role and w.get("cpu_ms") is not None]
        out[role] = round(statistics.median(ms), 1) if ms else None
    return out


def _short_check(name: str) -> str:
    return name.replace("provider.", "").replace(".ledger_equal", "")


def markdown(records: list[dict[str, Any]]) -> str:
    """The findings table: one line per row record."""
    head = ("| runtime | backend | durability | flavour | suite | convs | cases | fail | failed by check | "
            "extra charges / mails / model calls | racy cases: fails per run (unstable of repeated) | first failing case |\n"
            "|---|---|---|---|---|---|---:|---:|---|---|---|---|\n")
    lines = []
    for rec in records:
        r = rec["row"]
        o = rec["outcomes"]
        checks = ", ".join(f"{_short_check(k)} {v}" for k, v in sorted(rec["by_check"].items())) or "-"
        herr = f" (+{o['harness-error']} harness errors)" if o.get("harness-error") else ""
        e = rec["extra"]
        if rec["repeats"] > 1:
            rep = (f"x{rec['repeats']}: {'/'.join(map(str, rec['fail_counts']))} "
                   f"({len(rec['unstable'])} of {rec['repeated_cases']})")
        else:
            rep = "-"
        convs = ",".join(c[4:] for c in rec["conversations"])
        first = rec["first_failing"]
        first_cell = f"`{first.split('/', 2)[1]}/{first.split('/', 2)[2]}`" if first else "-"
        lines.append(
            f"| {r['runtime']} | {r['backend']} | {r['durability']} | {r['flavour']} | {r['suite']} | {convs} | "
            f"{rec['cases']} | {o.get('fail', 0)}{herr} | {checks} | {e['payment']} / {e['mail']} / {e['model']} | "
            f"{rep} | {first_cell} |")
    return head + "\n".join(lines) + "\n"


def summary(records: list[dict[str, Any]]) -> str:
    """One table that shows the differences: a line per runtime x backend x durability,
    a column per suite x flavour, cells ``failed/cases`` (``*``: some cases flipped
    between repeats; the conversations a cell covers are the row records')."""
    cols: list[tuple[str, str]] = [(suite, fl) for suite in SUITES for fl in ("naive", "keyed")]
    cells: dict[tuple[str, str, str], dict[tuple[str, str], str]] = {}
    present: set[tuple[str, str]] = set()
    for rec in records:
        r = rec["row"]
        line = (r["runtime"], r["backend"], r["durability"])
        col = (r["suite"], r["flavour"])
        if col in cells.get(line, {}):
            continue  # the record with more conversations came first (load order)
        mark = "*" if rec.get("unstable") else ""
        herr = rec["outcomes"].get("harness-error", 0)
        cells.setdefault(line, {})[col] = (f"{rec['outcomes'].get('fail', 0)}/{rec['cases']}{mark}"
                                           + (f" +{herr}e" if herr else ""))
        present.add(col)
    cols = [c for c in cols if c in present]
    head = "| runtime | backend | durability | " + " | ".join(f"{s} {f}" for s, f in cols) + " |\n"
    head += "|---|---|---|" + "---:|" * len(cols) + "\n"
    body = "".join(f"| {' | '.join(line)} | " + " | ".join(cells[line].get(c, "") for c in cols) + " |\n"
                   for line in cells)
    return head + body


def replays(records: list[dict[str, Any]]) -> str:
    """The replay command of each row's first failing case, one per line."""
    return "\n".join(f"{rec['first_failing_replay']}" for rec in records if rec.get("first_failing_replay")) + "\n"


def load(out: Path) -> list[dict[str, Any]]:
    """Every row record in ``out``, in table order."""
    order = {row.key: i for i, row in enumerate(rows())}
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    return sorted(recs, key=lambda rec: (order.get(rec["key"], len(order)), -len(rec["conversations"])))


async def main_async(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    selected = rows(
        tuple(args.only) if args.only else RUNTIMES, tuple(args.backend) if args.backend else ("sqlite", "postgres"),
        tuple(args.durability) if args.durability else ("sync", "async", "exit"),
        tuple(args.flavour) if args.flavour else ("naive", "keyed"), tuple(args.suite) if args.suite else tuple(SUITES))
    conversations = tuple(args.conversation or CONVERSATIONS)
    for row in selected:
        # a row run on fewer conversations is another record (rows.key + the conversations)
        tag = "" if conversations == CONVERSATIONS else "." + "+".join(conversations)
        path = out / f"{row.key}{tag}.json"
        repeat = args.repeat if args.repeat is not None else (3 if row.runtime.startswith("langgraph") else 1)
        previous = json.loads(path.read_text()) if path.exists() else None
        if previous is not None and not (args.recheck and previous["repeats"] == 1 and repeat > 1):
            continue
        rec = await run_row(row, conversations, args.jobs, repeat,
                            tuple(args.repeat_conversation or ("conv1",)), previous)
        path.write_text(json.dumps(rec, indent=1))
        print(f"{row.key}: {rec['cases']} cases x{repeat} {rec['outcomes']} fails {rec['fail_counts']} "
              f"unstable {len(rec['unstable'])} {rec['by_check']} extra={rec['extra']} "
              f"{rec['cases_per_second']}/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default="findings")
    p.add_argument("--table", metavar="DIR", help="print the table of the rows saved in DIR and exit")
    p.add_argument("--only", action="append", choices=RUNTIMES)
    p.add_argument("--backend", action="append", choices=("sqlite", "postgres"))
    p.add_argument("--durability", action="append", choices=("sync", "async", "exit"))
    p.add_argument("--flavour", action="append", choices=("naive", "keyed"))
    p.add_argument("--suite", action="append", choices=tuple(SUITES))
    p.add_argument("--conversation", action="append", choices=CONVERSATIONS)
    p.add_argument("--repeat", type=int, default=None,
                   help="runs of the racy cases in all (default: 3 for LangGraph rows, 1 for DBOS)")
    p.add_argument("--repeat-conversation", action="append", choices=CONVERSATIONS,
                   help="in racy rows, conversations whose every case is repeated (default: conv1)")
    p.add_argument("--recheck", action="store_true",
                   help="for saved rows run only once: run their racy cases again and add the flips")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    if args.table:
        records = load(Path(args.table))
        print(summary(records))
        print(markdown(records))
        print("```sh\n" + replays(records) + "```")
        return 0
    t0 = time.monotonic()
    asyncio.run(main_async(args))
    print(markdown(load(Path(args.out))))
    print(f"total {time.monotonic() - t0:.0f} s; rows in {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
