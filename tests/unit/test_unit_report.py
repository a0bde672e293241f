"""The run table (harness/report.py) from hand-built results."""

from __future__ import annotations

from rich.console import Console

from crashmatrix.harness.explorer import CaseResult
from crashmatrix.harness.matrix import MatrixReport
from crashmatrix.harness.plan import Case
from crashmatrix.harness.report import case_dict, summary_table


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


def test_await_point_names_are_shown_whole_on_a_narrow_terminal() -> None:
    """Await points of one function differ only in their last characters; cut to the
    column's width, three rows once read the same."""
    names = [f"crashmatrix.reference_runtime.executor:Execution.run_effect_with_probe@{i}" for i in (1, 2, 3)]
    results = [_result(f"checkout/conv1/{kind}@{name}[turn-4.tool-0]#1", "pass")
               for name in names for kind in ("kill", "cancel")]
    report = MatrixReport("checkout", "reference", ("kill", "term", "cancel"), ("await",), {}, results)
    console = Console(width=80, record=True)
    console.print(summary_table(report))
    # a row's first cell, folded over lines: join each row's lines (counts only on the first)
    cells: list[str] = []
    for line in console.export_text().splitlines():
        if not line.startswith("│"):
            continue
        first, *rest = (c.strip() for c in line.split("│")[1:-1])
        if any(rest):
            cells.append(first)
        else:
            cells[-1] += first
    assert cells[:3] == names, cells
    assert all(len(line) <= 80 for line in console.export_text().splitlines())


def test_flaky_cases_get_their_own_column_and_exit_1() -> None:
    flaky = _result("checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1", "flaky")
    flaky.replays = [_result("checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1", "pass")]
    results = [flaky, _result("checkout/conv1/kill@log.append.after[turn-1]#1", "pass")]
    report = MatrixReport("checkout", "reference", ("kill",), ("label",), {}, results)
    assert report.counts == {"pass": 1, "fail": 0, "flaky": 1, "harness-error": 0, "not-run": 0} and report.exit_code == 1
    console = Console(width=160, record=True)
    console.print(summary_table(report))
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in console.export_text().splitlines() if line.startswith("│")}
    assert rows["tool.request.after"] == ["0/1", "0", "1", "0"] and rows["total"] == ["1/2", "0", "1", "0"]
    record = case_dict(flaky)
    assert record["outcome"] == "flaky" and record["outcomes"] == ["fail", "pass"] and len(record["replays"]) == 1
