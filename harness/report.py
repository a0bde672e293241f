"""Reports of a matrix run: the summary table (rich), failure details, the JSON file.

The JSON report (``--report PATH``) holds every case: id, plan, outcome, the first
failed check and its diff, every verdict, how each worker ended, timings and the
replay command. Its schema is ``MatrixReport.to_dict``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

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
    table.add_row("total", *[""] * len(report.kinds), str(totals[1]), str(totals[2]))
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True) + "\n")
