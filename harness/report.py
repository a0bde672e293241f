"""Reports of a matrix run: the summary table (rich), failure details, the JSON file.

The JSON report (``--report PATH``) holds every case: id, plan, outcome, the first
failed check and its diff, every verdict, how each worker ended, timings and the
replay command. Its schema is ``MatrixReport.to_dict``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .explorer import CaseResult
from .matrix import MatrixReport


def summary_table(report: MatrixReport) -> Table:
    """Cases by crash point (rows) and fault kind (columns): ``passed/total``, with
    failed and harness-error counts."""
    cells: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # pass, fail, herr, total
    names: list[str] = []
    for r in report.results:
        fault = r.case.plan.faults[0]
        name = fault.point.name if len(r.case.plan.faults) == 1 else f"{fault.point.name} (+ a 2nd fault)"
        if name not in names:
            names.append(name)
        cell = cells[(name, fault.kind)]
        cell[3] += 1
        cell[{"pass": 0, "fail": 1, "harness-error": 2}[r.outcome]] += 1
    table = Table(title=escape(f"{report.workload} on {report.subject}: cases by crash point and fault kind (passed/total)"))
    table.add_column("crash point")
    for kind in report.kinds:
        table.add_column(kind, justify="right")
    table.add_column("failed", justify="right")
    table.add_column("harness errors", justify="right")
    totals = [0, 0, 0, 0]
    for name in names:
        row = [escape(name)]
        failed = herr = 0
        for kind in report.kinds:
            p, f, h, t = cells.get((name, kind), [0, 0, 0, 0])
            row.append(f"{p}/{t}" if t else "-")
            failed += f
            herr += h
            for i, v in enumerate((p, f, h, t)):
                totals[i] += v
        row += [f"[red]{failed}[/red]" if failed else "0", f"[yellow]{herr}[/yellow]" if herr else "0"]
        table.add_row(*row)
    table.add_section()
    per_kind = []
    for kind in report.kinds:
        passed = sum(c[0] for (_, k), c in cells.items() if k == kind)
        total = sum(c[3] for (_, k), c in cells.items() if k == kind)
        per_kind.append(f"{passed}/{total}" if total else "-")
    table.add_row("total", *per_kind, str(totals[1]), str(totals[2]))
    return table


def print_failures(console: Console, results: list[CaseResult], limit: int = 20) -> None:
    """Each failing case: the check that failed, details, a small diff, the replay line."""
    bad = [r for r in results if r.outcome != "pass"]
    for r in bad[:limit]:
        console.print(f"[bold red]{r.outcome.upper()}[/bold red] {escape(r.case.id)}  [dim](subject {escape(r.subject)}, run {r.run_id})[/dim]", soft_wrap=True)
        if r.error:
            console.print(f"  harness error: {r.error}", markup=False, soft_wrap=True)
        for v in r.failed:
            console.print(f"  {v.phase} check {v.check}: {v.word}: {v.details}", markup=False, soft_wrap=True)
            for line in v.diff[:12]:
                console.print(f"    {line}", markup=False, soft_wrap=True)
        console.print(f"  replay: {r.replay}", markup=False, soft_wrap=True)
    if len(bad) > limit:
        console.print(f"... and {len(bad) - limit} more failing case(s); see the JSON report")


def print_summary(console: Console, report: MatrixReport) -> None:
    """The summary table and one line of counts and throughput."""
    console.print(summary_table(report))
    c = report.counts
    console.print(
        f"{len(report.results)} cases: [green]{c['pass']} passed[/green], "
        f"[red]{c['fail']} failed[/red], [yellow]{c['harness-error']} harness errors[/yellow] "
        f"in {report.seconds:.1f} s ({report.cases_per_second:.1f} cases/s, {report.jobs} jobs; "
        f"setup and golden runs {report.setup_seconds:.1f} s)",
        soft_wrap=True,
    )


def write_json(report: MatrixReport, path: Path) -> None:
    """Write ``report.to_dict()`` to ``path`` as JSON (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n")


# -- case records: the dict form shared by the pytest plugin, the JSON and HTML reports --


def case_record(result: CaseResult, location: str | None = None) -> dict[str, Any]:
    """A case as plain data: :meth:`CaseResult.to_dict` plus ``location`` (the source
    location of the first fault's crash point, None when not known)."""
    return {**result.to_dict(), "location": location}


def _worker_line(w: dict[str, Any]) -> str:
    how = f"signal {w['signal']}" if w.get("signal") is not None else f"exit {w.get('returncode')}"
    return f"{w.get('role')} pid {w.get('pid')} {how} {w.get('seconds', 0):.2f} s" + (" (timed out)" if w.get("timed_out") else "")


def failure_text(record: dict[str, Any], diff_lines: int = 12) -> str:
    """The message of a case that did not pass (a :func:`case_record`).

    First line (what JUnit shows as the failure message): the case id, what failed
    and the replay command. Then the crash point and its source location, each failed
    check with its details and up to ``diff_lines`` lines of diff, how each worker
    ended, the run id and the plan as JSON, and the replay command again."""
    import json

    failed = [v for v in record.get("verdicts", []) if v.get("verdict") != "valid"]
    if record.get("outcome") == "harness-error":
        what = f"harness error: {(record.get('error') or '').splitlines()[0] if record.get('error') else '?'}"
    else:
        what = "failed " + ", ".join(dict.fromkeys(v["check"] for v in failed)) if failed else "failed"
    lines = [f"{record['id']} {what} (subject {record['subject']}); replay: {record['replay']}"]
    faults = record.get("plan", {}).get("faults", [])
    for i, f in enumerate(faults):
        p = f["point"]
        where = f", at {record['location']}" if i == 0 and record.get("location") else ""
        role = "in the first worker" if i == 0 else f"in resume {i}"
        lines.append(f"  fault {i + 1}: {f['kind']} at {p['source']} point {p['name']} of task {p['task']}, "
                     f"occurrence {p['occurrence']} ({role}){where}")
    if record.get("error"):
        lines += ["  " + line for line in record["error"].splitlines()]
    for v in failed:
        lines.append(f"  {v['phase']} check {v['check']}: {v['verdict']}: {v['details']}")
        lines += [f"    {line}" for line in v.get("diff", [])[:diff_lines]]
        if len(v.get("diff", [])) > diff_lines:
            lines.append(f"    ... {len(v['diff']) - diff_lines} more diff line(s) in the JSON report")
    if record.get("workers"):
        lines.append("  workers: " + "; ".join(_worker_line(w) for w in record["workers"]))
    lines.append(f"  run {record.get('run_id')}; plan: {json.dumps(record.get('plan'), sort_keys=True)}")
    lines.append(f"  replay: {record['replay']}")
    return "\n".join(lines)


def matrix_dict(
    workload: str, subject: str, kinds: list[str] | tuple[str, ...], sources: list[str] | tuple[str, ...],
    cases: list[dict[str, Any]], golden: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """A matrix as plain data from case records, in :meth:`MatrixReport.to_dict`'s
    shape (``summary.seconds`` is the sum of the cases' own seconds: cases run in
    several processes have no common wall clock)."""
    counts = {"pass": 0, "fail": 0, "harness-error": 0}
    for c in cases:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    return {
        "workload": workload, "subject": subject, "kinds": list(kinds), "sources": list(sources),
        "summary": {**counts, "cases": len(cases), "seconds": round(sum(c.get("seconds", 0) for c in cases), 3)},
        "golden": golden, "cases": cases,
    }
