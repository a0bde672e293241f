"""The run table (harness/report.py) from hand-built results."""

from __future__ import annotations

from rich.console import Console

from crashmatrix.harness.explorer import CaseResult
from crashmatrix.harness.matrix import MatrixReport
from crashmatrix.harness.plan import Case
from crashmatrix.harness.report import summary_table


def _result(case_id: str, outcome: str) -> CaseResult:
    return CaseResult(Case.parse(case_id), "reference", outcome)


def test_total_row_counts_each_fault_kind() -> None:
    results = [
        _result("checkout/conv1/kill@log.append.after[turn-1]#1", "pass"),
        _result("checkout/conv1/kill@log.append.after[turn-2]#1", "fail"),
        _result("checkout/conv1/cancel@log.append.after[turn-1]#1", "pass"),
        _result("checkout/conv1/kill@tool.request.after[turn-1.tool-0]#1", "harness-error"),
    ]
    report = MatrixReport("checkout", "reference", ("kill", "term", "cancel"), ("label",), {}, results)
    console = Console(width=160, record=True)
    console.print(summary_table(report))
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in console.export_text().splitlines() if line.startswith("│")}
    assert rows["log.append.after"] == ["1/2", "-", "1/1", "1", "0"]
    assert rows["tool.request.after"] == ["0/1", "-", "-", "0", "1"]
    assert rows["total"] == ["1/3", "-", "1/1", "1", "1"]
