"""Reports of a matrix run: the summary table (rich), failure details, the JSON file,
and the pytest plugin's report built from its case records.

The JSON report (``--report PATH``) holds every case: id, plan, outcome, the first
failed check and its diff, every verdict, how each worker ended, timings, the replay
command, and for a failing case each replay's outcome (``outcomes``, ``replays``; a
case whose replay disagrees is ``flaky``). Its schema is ``MatrixReport.to_dict``; the
plugin's is :func:`plugin_report`. A run stopped early (Ctrl-C, SIGTERM) writes the
cases that finished with ``"complete": false`` and the ``reason``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .case import CaseResult, replay_command
from .golden import golden_failure
from .plan import Resume
from .matrix import FAILING, NON_EVENTS, OUTCOME_WORDS, OUTCOMES, MatrixReport

_COLUMN = {"pass": 0, "fail": 1, "flaky": 2, "harness-error": 3}


def short(kind: str) -> str:
    """``kind``'s column header in the narrow table (:func:`summary_table` with
    ``narrow``; ``FaultKind.short``, else the name), explained under it by :func:`legend`."""
    from .fault_registry import find

    return getattr(find(kind), "short", "") or kind


def summary_table(report: MatrixReport, narrow: bool = False) -> Table:
    """Cases by crash point (rows) and fault kind (columns): ``passed/total``, with
    failed, flaky (only when some case is) and harness-error counts; cases that tested
    nothing (not run, not applicable) are out of ``total`` and counted in a column of
    their own, shown when some case is one (``-`` in a cell whose every case is). Crash-point names
    are shown whole (folded over lines when the terminal is narrow): await points of one
    function differ only in their last characters (``module:Class.method@2``).
    ``narrow``: the layout for a terminal the full one does not fit (80 columns): the
    fault kinds' columns only, headed by :func:`short` (:func:`legend` explains them),
    a cell coloured when a case in it failed (red), was flaky (magenta) or hit a harness
    error (yellow); no vertical rules, one space between columns; the total row and the
    legend in its caption. The counts the wide table has in columns of their own are the
    summary's line under it."""
    cells, names, nothing = _tally(report)
    flaky_column = any(r.outcome == "flaky" for r in report.results)
    table = _empty_table(report, narrow, flaky_column, bool(nothing))
    totals = [0, 0, 0, 0, 0]
    for name in names:
        row = [escape(name)]
        failed = flaky = herr = 0
        for kind in report.kinds:
            p, f, fl, h, t = cells.get((name, kind), [0, 0, 0, 0, 0])
            cell = f"{p}/{t}" if t else "-"
            if narrow:  # the count columns are left out: a cell says what did not pass in colour
                cell = f"[red]{cell}[/red]" if f else f"[magenta]{cell}[/magenta]" if fl else \
                    f"[yellow]{cell}[/yellow]" if h else cell
            row.append(cell)
            failed, flaky, herr = failed + f, flaky + fl, herr + h
            for i, v in enumerate((p, f, fl, h, t)):
                totals[i] += v
        if not narrow:
            row.append(f"[red]{failed}[/red]" if failed else "0")
            if flaky_column:
                row.append(f"[magenta]{flaky}[/magenta]" if flaky else "0")
            row.append(f"[yellow]{herr}[/yellow]" if herr else "0")
            if nothing:
                row.append(str(nothing.get(name, 0)))
        table.add_row(*row)
    table.add_section()
    per_kind = []
    for kind in report.kinds:
        passed = sum(c[0] for (_, k), c in cells.items() if k == kind)
        total = sum(c[4] for (_, k), c in cells.items() if k == kind)
        per_kind.append(f"{passed}/{total}" if total else "-")
    if narrow:  # the totals under the table, so that they do not widen its columns
        table.caption = escape("total: " + ", ".join(f"{short(k)} {c}" for k, c in zip(report.kinds, per_kind))
                               + "\n" + legend(table))
        table.caption_justify = "left"
        return table
    table.add_row("total", *per_kind, str(totals[1]), *([str(totals[2])] if flaky_column else []), str(totals[3]),
                  *([str(sum(nothing.values()))] if nothing else []))
    return table


def _tally(report: MatrixReport) -> tuple[dict[tuple[str, str], list[int]], list[str], dict[str, int]]:
    """The counts :func:`summary_table` shows: ``(cells, names, nothing)``, ``cells``
    keyed by ``(crash point row name, fault kind)`` holding ``[passed, failed, flaky,
    harness errors, total]``, ``names`` the row names in first-seen order, ``nothing``
    the cases per row name that tested nothing (out of ``total``)."""
    cells: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])  # pass, fail, flaky, herr, total
    names: list[str] = []
    nothing: dict[str, int] = {}  # crash point -> cases that tested nothing
    for r in report.results:
        fault = r.case.plan.faults[0]
        name = fault.point.name if len(r.case.plan.faults) == 1 else f"{fault.point.name} (+ a 2nd fault)"
        if name not in names:
            names.append(name)
        cell = cells[(name, fault.kind)]
        if r.outcome in NON_EVENTS:  # tested nothing: neither passed nor failed, out of the total
            nothing[name] = nothing.get(name, 0) + 1
            continue
        cell[4] += 1
        if r.outcome in _COLUMN:
            cell[_COLUMN[r.outcome]] += 1
    return cells, names, nothing


def _empty_table(report: MatrixReport, narrow: bool, flaky_column: bool, has_nothing: bool) -> Table:
    """:func:`summary_table`'s table with its title and columns, no rows yet: the
    narrow layout (short headers, no count columns) or the wide one, with a flaky
    column when ``flaky_column`` and a not-run column when ``has_nothing``."""
    title = f"{report.workload} on {report.subject}: cases by crash point and fault kind (passed/total)"
    if not report.complete:
        title += f"; INCOMPLETE ({report.reason})"
    if narrow:
        table = Table(title=escape(title), box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False,
                      show_edge=False)
        table.add_column("crash point", overflow="fold", min_width=12)
        for kind in report.kinds:
            table.add_column(short(kind), justify="right", overflow="fold")
    else:
        table = Table(title=escape(title))
        table.add_column("crash point", overflow="fold", min_width=22)
        for kind in report.kinds:
            table.add_column(kind, justify="right", no_wrap=True)
        table.add_column("failed", justify="right", no_wrap=True)
        if flaky_column:
            table.add_column("flaky", justify="right", no_wrap=True)
        table.add_column("harness errors", justify="right", no_wrap=True)
        if has_nothing:
            table.add_column("not run / n.a.", justify="right", no_wrap=True)
    return table


def legend(table: Table) -> str:
    """What a narrow :func:`summary_table`'s cells and short headers stand for (its
    caption's last line)."""
    headers = [str(c.header) for c in table.columns]
    from .fault_registry import names

    words = [f"{short(k)} {k}" for k in names() if short(k) != k and short(k) in headers]
    return ("cells: passed/total (red: a case failed, magenta: flaky, yellow: a harness error; counts below)"
            + ("; " + ", ".join(words) if words else ""))


def fits(console: Console, table: Table) -> bool:
    """Whether ``table`` renders within ``console``'s width without shrinking a column."""
    wide = Console(width=10_000, record=True, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
    try:
        wide.print(table)
        return max((len(line.rstrip()) for line in wide.export_text().splitlines()), default=0) <= console.width
    finally:
        wide.file.close()


def print_table(console: Console, report: MatrixReport) -> None:
    """:func:`summary_table` as wide as it needs, or, when that does not fit
    ``console``'s width, narrow (the totals and the :func:`legend` under it)."""
    table = summary_table(report)
    if fits(console, table):
        console.print(table)
        return
    console.print(summary_table(report, narrow=True))


def outcomes_line(outcomes: list[str]) -> str:
    """How the runs of one case ended, in words: ``failed on the first run, passed on
    replay 1`` (``outcomes``: the first run's, then each replay's)."""
    words = {"pass": "passed", "fail": "failed", "harness-error": "hit a harness error"}
    parts = [f"{words.get(o, o)} on {'the first run' if i == 0 else f'replay {i}'}" for i, o in enumerate(outcomes)]
    return ", ".join(parts)


def _how_replayed(r: CaseResult) -> str:
    if r.outcome == "flaky":
        return (f"  flaky: {outcomes_line(['fail', *(x.outcome for x in r.replays)])}: the verdict differs "
                "between runs of the same case (a race in the subject, or what an earlier job left in a long-lived "
                "worker's process: the note below says when it ran in one)")
    if r.replays:
        return f"  reproduced: failed on the first run and on {len(r.replays)} replay(s)"
    return ""


def warm_process_note(result: CaseResult) -> str | None:
    """For a failing case whose workers ran in a long-lived process after other jobs
    (:mod:`.resident`), or whose resume ran in the process its fault struck
    (``same-worker``), what that means for its replay, and what those workers left
    running when their job returned; None otherwise. The first is left out when a replay
    failed the same way with no worker after other jobs (then nothing those jobs left
    explains it)."""

    def after_others(r: CaseResult) -> list[dict[str, Any]]:
        # a same-worker case's resume ran after its own start, in a process of its own
        return [w for w in r.workers if w.get("resident") and w.get("jobs_before") and not w.get("same")]

    warm = after_others(result)
    if any(rep.outcome == "fail" and not after_others(rep) for rep in result.replays):
        warm = []  # a replay failed with no worker after other jobs: not state those jobs left
    left = sorted({item for w in result.workers for item in w.get("left", ())})
    notes = []
    if any(w.get("same") for w in result.workers):
        elsewhere = dataclasses.replace(result.case, resume=Resume())
        notes.append(f"its first resume ran in the process the fault struck: if the same fault resumed in another "
                     f"process passes ({replay_command(elsewhere, result.subject)}), the runtime resumed from what "
                     f"it kept of the run in memory")
    if warm and result.case.resume.policy != "warm-worker":
        most = max(int(w["jobs_before"]) for w in warm)
        warm_case = dataclasses.replace(result.case, resume=Resume("warm-worker"))
        notes.append(f"ran in a long-lived worker after {most} other job(s) of this matrix: a replay that passes "
                     f"alone points at state those runs left in the process; to resume it in a worker that has "
                     f"just run the conversation: {replay_command(warm_case, result.subject)}")
    tasks = [item for item in left if not item.startswith("timer ")]
    timers = len(left) - len(tasks)
    if tasks:  # a task a job left may have raced its successor; a pending timer (a pool's
        # cache expiry, say) is what a forked worker's exit drops too: counted, not named
        notes.append("its worker's job returned with these still running, ended by the harness: "
                     + ", ".join(tasks[:4]) + (f" (and {timers} timer(s); the worker records name them)" if timers else ""))
    return "; ".join(notes) or None


def print_failures(console: Console, results: list[CaseResult], limit: int = 20) -> None:
    """Each failing case (:data:`.matrix.FAILING`, golden runs that broke an invariant
    included): the check that failed, details, a small diff, the replay line; at most
    ``limit`` of them. Then, apart, the cases that tested nothing (not run, not
    applicable: :func:`print_non_events`), so they never push a failure out of the list."""
    bad = [r for r in results if r.outcome in FAILING]
    for r in bad[:limit]:
        color = "magenta" if r.outcome == "flaky" else "red"
        console.print(f"[bold {color}]{r.outcome.upper()}[/bold {color}] {escape(r.case.id)}  [dim](subject {escape(r.subject)}, run {r.run_id})[/dim]", soft_wrap=True)
        how = _how_replayed(r)
        if how:
            console.print(how, markup=False, soft_wrap=True)
        if r.error:
            label = "harness error" if r.outcome == "harness-error" else "note"
            console.print(f"  {label}: {r.error}", markup=False, soft_wrap=True)
        for v in r.failed:
            console.print(f"  {v.phase} check {v.check}: {v.word}: {v.details}", markup=False, soft_wrap=True)
            for line in v.diff[:12]:
                console.print(f"    {line}", markup=False, soft_wrap=True)
        console.print(f"  replay: {r.replay}", markup=False, soft_wrap=True)
        warm = warm_process_note(r)
        if warm:
            console.print(f"  {warm}", markup=False, soft_wrap=True)
    if len(bad) > limit:
        console.print(f"... and {len(bad) - limit} more failing case(s); see the JSON report")
    if bad and (hint := program_hint()):
        console.print(hint, markup=False, soft_wrap=True)
    print_non_events(console, results)


def program_hint() -> str:
    """A line for the replay lines when ``crashmatrix`` on ``$PATH`` is not this
    installation's (a venv not activated, as the README installs it): where this one's
    command is. Empty when PATH finds it, or when this installation has no script (run
    as ``python -m``)."""
    script = Path(sys.executable).with_name("crashmatrix")
    found = shutil.which("crashmatrix")
    if not script.is_file() or (found is not None and os.path.realpath(found) == os.path.realpath(script)):
        return ""
    where = "is not on PATH" if found is None else f"on PATH is another installation's ({found})"
    return f"(the replay lines say crashmatrix, which {where}: this one is {script})"


def non_event_groups(results: list[CaseResult]) -> list[dict[str, Any]]:
    """The cases that tested nothing (:data:`.matrix.NON_EVENTS`), grouped by outcome and
    by what made them so: a not-run case by its first fault's kind, a not-applicable one
    by its resume policy. Each group: ``{"outcome", "by"`` (``"kind"`` or ``"policy"``),
    ``"name"`` (the kind or policy), ``"count"``, ``"reason"`` (the first case's
    ``error``, its case-specific crash point left out for not-run: the group's reason),
    ``"cases"`` (their ids, in order)}; not-run groups first, each outcome's groups in
    the order their first case comes."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        if r.outcome not in NON_EVENTS:
            continue
        run = r.outcome == "not-run"
        name = r.case.plan.faults[0].kind if run and r.case.plan.faults else r.case.resume.policy
        g = groups.setdefault((r.outcome, name), {"outcome": r.outcome, "by": "kind" if run else "policy",
                                                  "name": name, "count": 0, "reason": _non_event_reason(r),
                                                  "cases": []})
        g["count"] += 1
        g["cases"].append(r.case.id)
    return sorted(groups.values(), key=lambda g: NON_EVENTS.index(g["outcome"]))


def _non_event_reason(r: CaseResult) -> str:
    """Why ``r`` tested nothing, without the case's own crash point (the group's reason)."""
    from .coverage import not_run_reason

    if r.outcome == "not-run" and r.case.plan.faults:
        return not_run_reason(r.case.plan.faults[0].kind)
    return (r.error or "no reason recorded").removeprefix("not applicable: ")


def print_non_events(console: Console, results: list[CaseResult], show: int = 3) -> None:
    """The cases that tested nothing, after the failures: a section per outcome ("not
    run", "not applicable"), a line per fault kind or resume policy with the count, the
    reason and the first ``show`` case ids."""
    groups = non_event_groups(results)
    for outcome in NON_EVENTS:
        mine = [g for g in groups if g["outcome"] == outcome]
        if not mine:
            continue
        total = sum(g["count"] for g in mine)
        words = "not run" if outcome == "not-run" else "not applicable"
        console.print(f"[bold yellow]{words.upper()}[/bold yellow] {total} case(s) (not counted as failed or passed):",
                      soft_wrap=True)
        for g in mine:
            ids = ", ".join(g["cases"][:show]) + (f", ... {g['count'] - show} more" if g["count"] > show else "")
            console.print(f"  {g['by']} {g['name']}: {g['count']} case(s): {g['reason']} ({ids})", markup=False,
                          soft_wrap=True)


def print_summary(console: Console, report: MatrixReport) -> None:
    """The summary table and one line of counts and throughput (and, for a run stopped
    early, a line saying so)."""
    if report.results:
        print_table(console, report)
    for g in (r for r in report.golden_results if r.outcome != "pass"):
        what = golden_failure([v.check for v in g.failed])
        console.print(f"[red]golden run of {escape(g.case.conversation)} {what}[/red]: "
                      f"{escape(', '.join(v.check for v in g.failed))} (no case of it was run)")
    c = report.counts
    console.print(
        f"{len(report.results)} cases: "
        + ", ".join(f"[{_COLOURS[o]}]{p}[/{_COLOURS[o]}]" if o in _COLOURS else p for o, p in count_phrases(c))
        + f" in {report.seconds:.1f} s ({report.cases_per_second:.1f} cases/s, {report.jobs} jobs"
        + (f" + up to {report.spare_jobs} while the cores idled" if report.spare_jobs else "") + "; "
        f"setup and golden runs {report.setup_seconds:.1f} s)",
        soft_wrap=True,
    )
    if c["flaky"]:
        console.print(f"[magenta]{c['flaky']} flaky case(s)[/magenta]: failed, then passed on a replay of the same "
                      "case on the same session; a race in the subject (counted as failures, exit 1)", soft_wrap=True)
    if not report.complete:
        console.print(f"[bold yellow]incomplete[/bold yellow]: {escape(report.reason or 'stopped')}; "
                      f"{len(report.results)} of {report.planned} case(s) ran", soft_wrap=True)


def write_json(report: MatrixReport, path: Path) -> None:
    """Write ``report.to_dict()`` to ``path`` as JSON (parents created)."""
    write_data(report.to_dict(), path)


def write_data(data: dict[str, Any], path: Path) -> None:
    """Write a JSON report (a dict) to ``path``: indented, keys sorted, parents created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


# -- case records: the dict form shared by the pytest plugin, the JSON and HTML reports --


def _replay_dict(r: CaseResult) -> dict[str, Any]:
    first = r.failed[0] if r.failed else None
    return {"outcome": r.outcome, "failed_check": first.check if first else None, "error": r.error,
            "verdicts": [v.to_dict() for v in r.failed], "seconds": round(r.seconds, 4), "run_id": r.run_id}


def case_dict(result: CaseResult) -> dict[str, Any]:
    """A case as plain data: :meth:`CaseResult.to_dict` (the first run's verdicts) plus
    ``outcomes`` (the first run's outcome, then each replay's: ``["fail", "pass"]`` for
    a flaky case) and ``replays`` (each replay's outcome, first failed check, error,
    failed verdicts, seconds and run id)."""
    first = "fail" if result.outcome == "flaky" else result.outcome
    return {**result.to_dict(), "outcomes": [first, *(r.outcome for r in result.replays)],
            "replays": [_replay_dict(r) for r in result.replays]}


def case_record(result: CaseResult, location: str | None = None) -> dict[str, Any]:
    """:func:`case_dict` plus ``location`` (the source location of the first fault's
    crash point, None when not known): the pytest plugin's record of a case."""
    return {**case_dict(result), "location": location}


def _worker_line(w: dict[str, Any]) -> str:
    how = f"signal {w['signal']}" if w.get("signal") is not None else f"exit {w.get('returncode')}"
    return f"{w.get('role')} pid {w.get('pid')} {how} {w.get('seconds', 0):.2f} s" + (" (timed out)" if w.get("timed_out") else "")


def failure_text(record: dict[str, Any], diff_lines: int = 12) -> str:
    """The message of a case that did not pass (a :func:`case_record`).

    First line (what JUnit shows as the failure message): the case id, what failed
    and the replay command. Then the crash point and its source location, each failed
    check with its details and up to ``diff_lines`` lines of diff, how each worker
    ended, the run id and the plan as JSON, and the replay command again."""
    failed = [v for v in record.get("verdicts", []) if v.get("verdict") != "valid"]
    if record.get("outcome") == "harness-error":
        what = f"harness error: {(record.get('error') or '').splitlines()[0] if record.get('error') else '?'}"
    else:
        what = "failed " + ", ".join(dict.fromkeys(v["check"] for v in failed)) if failed else "failed"
        if record.get("outcome") == "flaky":
            what = f"FLAKY: {what} on the first run; {outcomes_line(record.get('outcomes', []))}"
    lines = [f"{record['id']} {what} (subject {record['subject']}); replay: {record['replay']}"]
    if record.get("outcome") == "flaky":
        lines.append("  the verdict differs between runs of the same case on the same session: a race in the "
                     "subject (a failure, not a deterministic one)")
    elif record.get("replays"):
        lines.append(f"  reproduced: failed on the first run and on {len(record['replays'])} replay(s)")
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
    for i, rep in enumerate(record.get("replays", []), 1):
        checks = ", ".join(dict.fromkeys(v["check"] for v in rep.get("verdicts", [])))
        lines.append(f"  replay {i}: {rep['outcome']}" + (f" ({checks})" if checks else "")
                     + (f"; {rep['error'].splitlines()[0]}" if rep.get("error") else "") + f", run {rep.get('run_id')}")
    if record.get("workers"):
        lines.append("  workers: " + "; ".join(_worker_line(w) for w in record["workers"]))
    lines.append(f"  run {record.get('run_id')}; plan: {json.dumps(record.get('plan'), sort_keys=True)}")
    lines.append(f"  replay: {record['replay']}")
    return "\n".join(lines)


def matrix_dict(
    workload: str, subject: str, kinds: list[str] | tuple[str, ...], sources: list[str] | tuple[str, ...],
    cases: list[dict[str, Any]], golden: dict[str, dict[str, Any]], *, complete: bool = True,
    reason: str | None = None, planned: int | None = None,
) -> dict[str, Any]:
    """A matrix as plain data from case records, in :meth:`MatrixReport.to_dict`'s
    shape (``summary.seconds`` is the sum of the cases' own seconds: cases run in
    several processes have no common wall clock). ``summary`` counts every outcome of
    :data:`.matrix.OUTCOMES`; ``complete`` False (with ``reason``, and ``planned``,
    the cases meant to run) marks a run stopped before its end."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for c in cases:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    out = {
        "workload": workload, "subject": subject, "kinds": list(kinds), "sources": list(sources),
        "summary": {**counts, "cases": len(cases), "seconds": round(sum(c.get("seconds", 0) for c in cases), 3)},
        "golden": golden, "cases": cases, "complete": complete,
    }
    if not complete:
        out["reason"] = reason
        out["planned"] = planned
    return out


def plugin_report(records: list[dict[str, Any]], seed: int, *, complete: bool = True,
                  reason: str | None = None) -> dict[str, Any]:
    """The pytest plugin's JSON report from its case records (:func:`case_record` plus
    ``nodeid`` and ``matrix``: the record's test, workload, subject, kinds, sources,
    conversations, shard and golden points): ``{"version": 1, "seed": int,
    "complete": bool, "matrices": [matrix]}`` (``reason`` too when not complete: the
    run was interrupted), each matrix shaped as :func:`matrix_dict` plus ``test`` (the
    marked test's node id), ``conversations``, ``shard`` and ``releases`` (the runtime's
    installed release per build: :func:`.sources.subject_releases`); each case as
    :func:`case_record` plus ``nodeid``."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for rec in records:
        m = rec["matrix"]
        groups.setdefault((m["test"], m["workload"], m["subject"]), []).append(rec)
    matrices = []
    for (test, workload, subject), recs in groups.items():
        m = recs[0]["matrix"]
        cases = [{k: v for k, v in r.items() if k not in ("matrix", "pytest_outcome")} for r in recs]
        points = {}
        for r in recs:
            points.update(r["matrix"].get("golden_points", {}))
        d = matrix_dict(workload, subject, m["kinds"], m["sources"], cases,
                        {c: {"points": n} for c, n in sorted(points.items())})
        d.update(test=test, conversations=m["conversations"], shard=m["shard"], releases=m.get("releases") or {})
        matrices.append(d)
    out: dict[str, Any] = {"version": 1, "seed": seed, "complete": complete, "matrices": matrices}
    if not complete:
        out["reason"] = reason
    return out


def counts_line(records: list[dict[str, Any]]) -> str:
    """``N cases: a passed, b failed, c flaky, d harness errors`` of case records, then
    ``, e not run`` and ``, f not applicable`` when there are any (never counted failed)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return f"{len(records)} cases: " + ", ".join(p for _, p in count_phrases(counts))


_COLOURS = {"pass": "green", "fail": "red", "flaky": "magenta", "harness-error": "yellow"}
"""The terminal summary's colour of each outcome every run counts."""


def count_phrases(counts: dict[str, int], *, always: tuple[str, ...] = ("pass", *FAILING)
                  ) -> list[tuple[str, str]]:
    """``(outcome, "N word")`` in :data:`.matrix.OUTCOMES` order (words:
    :data:`.matrix.OUTCOME_WORDS`): each outcome of ``always`` (default: pass and the
    failing ones, 0 included), every other one only when ``counts`` has any (the
    non-events: a run where every fault took effect does not mention them)."""
    return [(o, f"{counts.get(o, 0)} {OUTCOME_WORDS[o]}") for o in OUTCOMES if o in always or counts.get(o)]
