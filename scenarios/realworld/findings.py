"""Run the LangGraph and DBOS kill matrices and tabulate them (docs/findings.md).

::

    python -m crashmatrix.scenarios.realworld.findings --out findings.json [--repeat 3]
        [--only langgraph|dbos] [--conversation conv1] [--jobs 2]

For each runtime x backend x durability x tool flavour: one golden run of the
conversation, then every crash point of its trace x ``kill``. Per matrix it records the
matrix size, outcomes, failed cases by check, the first failing case's replay command,
cases per second, and (read from the providers' ledgers after each case) how many model
calls, charges and mails were billed or applied beyond the golden run. ``--repeat N``
runs the in-process-SQLite LangGraph matrices N times and reports the cases whose
outcome changed between repeats (points that race LangGraph's background savers).
Prints a Markdown table; writes everything to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from crashmatrix.harness.explorer import CaseResult, Explorer, enumerate_cases
from crashmatrix.harness.session import open_session

LG = "crashmatrix.harness.adapters.langgraph"
DB = "crashmatrix.harness.adapters.dbos"
LG_WL = "crashmatrix.scenarios.realworld.langgraph_checkout"
DB_WL = "crashmatrix.scenarios.realworld.dbos_checkout"


@dataclass(frozen=True)
class Combo:
    runtime: str  # "langgraph" | "langgraph-func" | "dbos"
    backend: str
    durability: str  # "sync" | "async" | "exit" | "-" (DBOS: every step output before the next step)
    flavour: str
    subject: str
    workload: str

    @property
    def label(self) -> str:
        return f"{self.runtime} {self.backend} {self.durability} {self.flavour}"


def combos(only: str | None) -> list[Combo]:
    out = []
    if only in (None, "langgraph"):
        for api, prefix in (("graph", "LangGraph"), ("functional", "LangGraphFunctional")):
            for backend in ("sqlite", "postgres"):
                for durability in ("sync", "async", "exit"):
                    if api == "functional" and backend == "postgres" and durability != "sync":
                        continue  # the functional API on PostgreSQL: sync only (time)
                    cls = f"{prefix}{backend.capitalize()}{durability.capitalize()}Adapter"
                    for flavour in ("naive", "keyed"):
                        out.append(Combo("langgraph" if api == "graph" else "langgraph-func", backend, durability,
                                         flavour, f"{LG}:{cls}", f"{LG_WL}:{flavour.upper()}"))
    if only in (None, "dbos"):
        for backend in ("sqlite", "postgres"):
            for flavour in ("naive", "keyed"):
                out.append(Combo("dbos", backend, "-", flavour, f"{DB}:DBOS{backend.capitalize()}Adapter",
                                 f"{DB_WL}:{flavour.upper()}"))
    return out


def _rows(ledger: list[dict[str, Any]]) -> int:
    return len(ledger)


async def run_combo(combo: Combo, conversation: str, jobs: int) -> dict[str, Any]:
    t0 = time.monotonic()
    async with open_session(combo.subject, combo.workload) as explorer:
        golden = await explorer.golden(conversation)
        cases = enumerate_cases(combo.workload, {conversation: golden}, ("kill",), ("step", "label"))
        g_model = sum(golden.evidence.model_calls.values())
        g_rows = {k: _rows(v) for k, v in golden.evidence.ledgers.items()}
        results: list[tuple[CaseResult, dict[str, int]]] = []
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for c in cases:
            queue.put_nowait(c)
        t1 = time.monotonic()

        async def worker(ex: Explorer) -> None:
            while not queue.empty():
                case = queue.get_nowait()
                r = await ex.run_case(case, golden)
                extra = {"model": 0, "payment": 0, "mail": 0}
                if r.outcome != "harness-error":
                    ev = await ex.evidence(r.run_id)
                    extra["model"] = sum(ev.model_calls.values()) - g_model
                    for k in ("payment", "mail"):
                        extra[k] = _rows(ev.ledgers.get(k, [])) - g_rows.get(k, 0)
                results.append((r, extra))

        await asyncio.gather(*(worker(explorer) for _ in range(jobs)))
        seconds = time.monotonic() - t1
    results.sort(key=lambda x: cases.index(x[0].case))
    by_check: Counter[str] = Counter()
    for r, _ in results:
        for check in sorted({v.check for v in r.failed}):
            by_check[check] += 1
    outcomes = Counter(r.outcome for r, _ in results)
    first = next((r for r, _ in results if r.outcome == "fail"), None)
    errors = [f"{r.case.id}: {r.error}" for r, _ in results if r.outcome == "harness-error"]
    return {
        "combo": combo.__dict__, "label": combo.label, "conversation": conversation,
        "golden_points": len(golden.trace), "cases": len(results), "outcomes": dict(outcomes),
        "by_check": dict(by_check), "first_failing": first.case.id if first else None,
        "first_failing_replay": first.replay if first else None,
        "failing_points": [r.case.plan.faults[0].point.label() for r, _ in results if r.outcome == "fail"],
        "outcome_by_case": {r.case.id: r.outcome for r, _ in results},
        "failures": [{"id": r.case.id, "checks": [{"check": v.check, "details": v.details, "diff": v.diff[:16]}
                                                  for v in r.failed]}
                     for r, _ in results if r.outcome == "fail"],
        "extra": {k: sum(e[k] for _, e in results) for k in ("model", "payment", "mail")},
        "cases_with_extra": {k: sum(1 for _, e in results if e[k] > 0) for k in ("model", "payment", "mail")},
        "harness_errors": errors[:5],
        "seconds": round(seconds, 2), "setup_seconds": round(time.monotonic() - t0 - seconds, 2),
        "cases_per_second": round(len(results) / seconds, 2) if seconds else 0.0,
    }


def markdown(runs: list[dict[str, Any]]) -> str:
    head = ("| runtime | backend | durability | flavour | cases | pass | fail | failed by check | "
            "extra charges / mails / model calls | unstable over repeats | first failing case |\n"
            "|---|---|---|---|---:|---:|---:|---|---|---|---|\n")
    lines = []
    for run in runs:
        c = run["combo"]
        checks = ", ".join(f"{k.replace('provider.', '').replace('.ledger_equal', '')} {v}"
                           for k, v in sorted(run["by_check"].items())) or "-"
        o = run["outcomes"]
        unstable = run.get("unstable")
        first = run["first_failing"]
        first_cell = f"`{first.split('/', 2)[2]}`" if first else "-"
        unstable_cell = "-" if unstable is None else f"{len(unstable)} of {run['cases']} ({run['repeats']} runs)"
        e = run["extra"]
        lines.append(
            f"| {c['runtime']} | {c['backend']} | {c['durability']} | {c['flavour']} | {run['cases']} | "
            f"{o.get('pass', 0)} | {o.get('fail', 0)}{' (+' + str(o['harness-error']) + ' harness errors)' if o.get('harness-error') else ''} | "
            f"{checks} | {e['payment']} / {e['mail']} / {e['model']} | "
            f"{unstable_cell} | {first_cell} |")
    return head + "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for combo in combos(args.only):
        repeats = args.repeat if combo.runtime.startswith("langgraph") and combo.backend == "sqlite" else 1
        attempts = []
        for _ in range(repeats):
            run = await run_combo(combo, args.conversation, args.jobs)
            attempts.append(run)
            print(f"{combo.label}: {run['cases']} cases {run['outcomes']} {run['by_check']} "
                  f"extra={run['extra']} {run['cases_per_second']}/s", flush=True)
        run = dict(attempts[0])
        if repeats > 1:
            ids = run["outcome_by_case"].keys()
            run["unstable"] = sorted(i for i in ids if len({a["outcome_by_case"].get(i) for a in attempts}) > 1)
            run["repeats"] = repeats
            run["fail_counts_over_repeats"] = [a["outcomes"].get("fail", 0) for a in attempts]
        runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="findings.json")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--only", choices=("langgraph", "dbos"))
    p.add_argument("--conversation", default="conv1")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    runs = asyncio.run(main_async(args))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"runs": runs, "seconds": round(time.monotonic() - t0, 1)}, f, indent=1)
    print(markdown(runs))
    print(f"total {time.monotonic() - t0:.0f} s; details in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
