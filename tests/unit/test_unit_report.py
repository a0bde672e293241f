"""The run table (harness/report.py) from hand-built results."""

from __future__ import annotations

from rich.console import Console

from crashmatrix.harness.case import CaseResult
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
    assert report.counts == {"pass": 1, "fail": 0, "flaky": 1, "harness-error": 0, "not-run": 0,
                             "not-applicable": 0} and report.exit_code == 1
    console = Console(width=160, record=True)
    console.print(summary_table(report))
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in console.export_text().splitlines() if line.startswith("│")}
    assert rows["tool.request.after"] == ["0/1", "0", "1", "0"] and rows["total"] == ["1/2", "0", "1", "0"]
    record = case_dict(flaky)
    assert record["outcome"] == "flaky" and record["outcomes"] == ["fail", "pass"] and len(record["replays"]) == 1


def _not_run(case_id: str) -> CaseResult:
    r = _result(case_id, "pass")
    r.workers = [{"role": "start", "took_effect": False}]
    from crashmatrix.harness.coverage import mark_not_run

    mark_not_run(r)
    return r


def _not_applicable(case_id: str, why: str) -> CaseResult:
    r = _result(case_id, "not-applicable")
    r.error = f"not applicable: {why}"
    return r


def _matrix_with_non_events(failures: int, not_run: int) -> MatrixReport:
    """``not_run`` db-restart cases that changed nothing, finished first, then
    ``failures`` real failures, then two discovery cases that are not applicable."""
    results = [_not_run(f"checkout/conv1/db-restart@log.append.after[turn-{i}]#1") for i in range(1, not_run + 1)]
    results += [_result(f"checkout/conv1/kill@log.append.after[turn-{i}]#1", "fail") for i in range(1, failures + 1)]
    results += [_not_applicable(f"checkout/conv1/kill@log.append.after[turn-{i}]#1/discovery",
                                "discovery needs the runtime's own recovery") for i in (1, 2)]
    return MatrixReport("checkout", "reference", ("kill", "db-restart"), ("label",), {}, results)


def test_not_run_and_not_applicable_are_counted_apart_and_never_fail_the_run() -> None:
    from crashmatrix.harness.matrix import FAILING

    report = _matrix_with_non_events(failures=0, not_run=25)
    assert report.counts["not-run"] == 25 and report.counts["not-applicable"] == 2 and report.counts["fail"] == 0
    assert report.exit_code == 0  # nothing failed: tested nothing is not a failure
    assert not [r for r in report.results if r.outcome in FAILING]
    summary = report.to_dict()["summary"]
    assert (summary["not-run"], summary["not-applicable"], summary["fail"]) == (25, 2, 0)
    assert _matrix_with_non_events(failures=1, not_run=25).exit_code == 1


def test_real_failures_are_listed_first_and_non_events_apart_with_their_reason() -> None:
    from crashmatrix.harness.report import non_event_groups, print_failures

    report = _matrix_with_non_events(failures=2, not_run=25)
    console = Console(width=400, record=True)
    print_failures(console, report.results, limit=2)
    text = console.export_text()
    lines = text.splitlines()
    fails = [i for i, line in enumerate(lines) if line.startswith("FAIL ")]
    assert len(fails) == 2 and "more failing" not in text  # 25 not-run cases push no failure out
    assert "NOT RUN 25 case(s)" in text and "NOT APPLICABLE 2 case(s)" in text
    assert max(fails) < next(i for i, line in enumerate(lines) if line.startswith("NOT RUN"))
    assert "kind db-restart: 25 case(s): the db-restart fault fired but could not take effect" in text
    assert "most likely the worker did not use the harness's PostgreSQL after the point" in text
    assert "policy discovery: 2 case(s): discovery needs the runtime's own recovery" in text
    groups = non_event_groups(report.results)
    assert [(g["outcome"], g["by"], g["name"], g["count"]) for g in groups] == [
        ("not-run", "kind", "db-restart", 25), ("not-applicable", "policy", "discovery", 2)]
    assert report.to_dict()["non_events"] == groups


def test_the_counts_line_and_the_html_name_non_events_apart() -> None:
    from crashmatrix.harness.html_report import render_html
    from crashmatrix.harness.report import counts_line

    report = _matrix_with_non_events(failures=1, not_run=3)
    records = [case_dict(r) for r in report.results]
    assert counts_line(records) == "6 cases: 0 passed, 1 failed, 0 flaky, 0 harness errors, 3 not run, 2 not applicable"
    page = render_html(report.to_dict())
    assert "1 failed, 0 flaky, 0 harness errors, 3 not run, 2 not applicable" in page
    assert "not run (3; tested nothing, not counted as failed)" in page
    assert "policy discovery: 2 case(s): discovery needs the runtime&#x27;s own recovery" in page


def test_the_table_keeps_cases_that_tested_nothing_out_of_passed_total() -> None:
    report = _matrix_with_non_events(failures=1, not_run=2)
    report.results.append(_result("checkout/conv1/db-restart@log.append.after[turn-9]#1", "pass"))
    console = Console(width=200, record=True)
    console.print(summary_table(report))
    text = console.export_text()
    assert "not run / n.a." in text
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    # kill: 1 failed of 1 (the 2 not applicable out of it); db-restart: 1 passed of 1 (2 not run out of it)
    assert rows["log.append.after"] == ["0/1", "1/1", "1", "0", "4"], rows
    assert rows["total"] == ["0/1", "1/1", "1", "0", "4"], rows


def test_a_wide_matrix_is_narrow_and_whole_at_80_columns() -> None:
    """Eight fault kinds do not fit 80 columns as the wide table: the narrow one does,
    with every header whole (no ``canc…``), no column squeezed to nothing, every crash
    point on one line, and a legend for its short headers."""
    from crashmatrix.harness.report import print_table, short

    kinds = ("kill", "term", "cancel", "pause", "db-restart", "net", "cancel-edge", "cancel-api")
    points = ("node.launch", "model.call.before", "step.before", "step.after", "log.append.before", "log.append.after")
    results = []
    for point in points:
        for kind in kinds:
            fault = "net:payment.timeout(timeout=200)" if kind == "net" else kind
            for i in range(1, 12):
                outcome = "not-applicable" if kind == "cancel-api" else "fail" if (kind, i) == ("kill", 3) else "pass"
                results.append(_result(f"wl/conv1/{fault}@{point}[model-{i}]#1", outcome))
    report = MatrixReport("crashmatrix_workload:WORKLOAD", "crashmatrix_adapter:SubjectAdapter", kinds,
                          ("step", "label"), {}, results)
    console = Console(width=80, record=True)
    print_table(console, report)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "…" not in text
    header = next(line for line in lines if line.startswith("crash point"))
    assert header.split()[2:] == ["kill", "term", *(short(k) for k in kinds[2:])], header
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.split() and line.split()[0] in points}
    assert rows["step.after"] == ["10/11", "11/11", "11/11", "11/11", "11/11", "11/11", "11/11", "-"], rows
    assert set(rows) == set(points)  # each crash point whole, on its own line
    caption = text[text.index("total:"):].replace("\n", " ")
    assert "total: kill 60/66, term 66/66, cncl 66/66" in caption and "capi -" in caption, caption
    assert "cncl cancel" in text and "capi cancel-api" in text and "passed/total" in text
    wide = Console(width=200, record=True)
    print_table(wide, report)
    wide_text = wide.export_text()
    assert "cancel-edge" in wide_text and "harness errors" in wide_text  # wide where it fits


def test_what_a_long_lived_workers_job_left_names_its_tasks_and_counts_its_timers() -> None:
    """A task a job left running is named in a failure's note; a pending timer (a kept
    connection pool's statement-cache expiry) is what a forked worker's exit drops too,
    counted only; a job that left only timers gets no note."""
    from crashmatrix.harness.report import warm_process_note

    result = _result("checkout/conv1/cancel@step.after[turn-1]#1", "fail")
    result.workers = [{"role": "start", "resident": True, "jobs_before": 0,
                       "left": ["timer asyncpg.connection:_StatementCache._on_entry_expired",
                                "task myruntime.lease:renew", "timer asyncpg.connection:_StatementCache._on_entry_expired"]}]
    assert warm_process_note(result) == ("its worker's job returned with these still running, ended by the harness: "
                                         "task myruntime.lease:renew (and 1 timer(s); the worker records name them)")
    result.workers[0]["left"] = ["timer asyncpg.connection:_StatementCache._on_entry_expired"]
    assert warm_process_note(result) is None


def test_the_long_lived_worker_hint_is_left_out_when_a_replay_failed_in_a_fresh_one() -> None:
    """A failing case that ran in a long-lived worker after other jobs gets the hint that
    state those jobs left may explain it, unless one of its replays failed the same way
    with no worker after other jobs."""
    from crashmatrix.harness.report import warm_process_note

    case = "checkout/conv1/cancel@step.after[turn-1]#1"
    result = _result(case, "fail")
    result.workers = [{"role": "start", "resident": True, "jobs_before": 5}]
    assert "ran in a long-lived worker after 5 other job(s)" in (warm_process_note(result) or "")
    warm_again = _result(case, "fail")
    warm_again.workers = [{"role": "start", "resident": True, "jobs_before": 7}]
    result.replays = [warm_again]
    assert "ran in a long-lived worker after 5 other job(s)" in (warm_process_note(result) or "")
    fresh = _result(case, "fail")
    fresh.workers = [{"role": "start", "resident": True, "jobs_before": 0}]
    result.replays = [warm_again, fresh]
    assert warm_process_note(result) is None


def test_program_hint_names_this_installation_s_command_when_path_does_not(monkeypatch, tmp_path):
    import sys
    from pathlib import Path

    from crashmatrix.harness.report import program_hint

    script = Path(sys.executable).with_name("crashmatrix")
    if not script.is_file():  # run as python -m from a tree with no installed script: nothing to point at
        assert program_hint() == ""
        return
    monkeypatch.setenv("PATH", str(tmp_path))
    assert program_hint() == f"(the replay lines say crashmatrix, which is not on PATH: this one is {script})"
    other = tmp_path / "crashmatrix"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert f"another installation's ({other})" in program_hint()
    monkeypatch.setenv("PATH", str(script.parent))
    assert program_hint() == ""
