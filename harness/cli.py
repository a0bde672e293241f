"""The ``crashmatrix`` command line (typer + rich).

Exit codes (distinct per failure class, as TigerBeetle's simulator does; ``selftest``
maps "a mutant missed" to 1 as well):

- 0: every case passed;
- 1: at least one case failed an oracle check;
- 2: bad input: unknown workload or subject, malformed case id or plan, unreachable DSN
  (one line on stderr);
- 3: harness errors (a fault that never fired, a worker that vanished) and no oracle
  failure;
- 130: interrupted (Ctrl-C); services are stopped and data directories removed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import CrashmatrixError, HarnessError
from .explorer import DEFAULT_KINDS, DEFAULT_SOURCES, Options
from .plan import FAULT_KINDS, POINT_SOURCES, Case, FaultPlan

app = typer.Typer(
    name="crashmatrix",
    help="Crash-consistency harness for durable agent runtimes: kill, SIGTERM and cancel a "
    "workload at every crash point, resume it, and check it against the golden run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)


def _split(value: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise typer.BadParameter(f"{option}={value!r}: each item must be one of {', '.join(allowed)}")
    return items


def _fail(exc: BaseException) -> int:
    err.print(f"crashmatrix: error: {exc}", markup=False, highlight=False, soft_wrap=True)
    return 3 if isinstance(exc, HarnessError) else 2


def _run_async(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


@app.command()
def run(
    workload: Annotated[str, typer.Argument(help="Workload to run: a registered name (crashmatrix list) or module:WORKLOAD.")] = "checkout",
    subject: Annotated[str, typer.Option(help="Subject: a registered name (runtime adapter, or mutant 'defect:NAME') or module:AdapterClass.")] = "reference",
    kinds: Annotated[str, typer.Option(help=f"Comma-separated fault kinds: {', '.join(FAULT_KINDS)}.")] = ",".join(DEFAULT_KINDS),
    sources: Annotated[str, typer.Option(help="Comma-separated crash-point sources: step (node boundaries the adapter reports), label (crashpoint() calls), await (every suspension in the subject's packages).")] = ",".join(DEFAULT_SOURCES),
    conversation: Annotated[Optional[list[str]], typer.Option(help="Only this conversation (repeatable). Default: all.")] = None,
    jobs: Annotated[int, typer.Option(min=0, help="Cases in flight at once; 0: twice the number of cores.")] = 0,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report (every case, verdicts, replay commands) here.")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the HTML report (heatmap of crash points x fault kinds; one file, no network) here.")] = None,
    dsn: Annotated[Optional[str], typer.Option(help="PostgreSQL DSN to use instead of an embedded server (also: $CRASHMATRIX_PG_DSN).")] = None,
    worker_timeout: Annotated[float, typer.Option(help="Seconds a worker may run before it is SIGKILLed and the case fails.")] = 60.0,
    term_grace: Annotated[float, typer.Option(help="Seconds a worker may drain after SIGTERM before it is SIGKILLed.")] = 10.0,
    max_failures_shown: Annotated[int, typer.Option(help="Failing cases printed in detail.")] = 20,
    plan: Annotated[Optional[Path], typer.Option(help="Run exactly this fault plan (JSON, schema in crashmatrix.harness.plan) on the one --conversation given.")] = None,
    shard: Annotated[Optional[str], typer.Option(help="Run shard K/N of the matrix (disjoint, deterministic), e.g. 2/4 for the second of four CI jobs.")] = None,
    depth: Annotated[int, typer.Option(min=1, max=2, help="2: add double faults, a second fault at each point of each case's own resume (crash during recovery).")] = 1,
    sample: Annotated[Optional[int], typer.Option(min=1, help="With --depth 2: run this many double-fault cases, drawn with --seed (CI profile: 200; nightly: omit to run all).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random choice: double-fault sampling, the embedded fault proxy's jitter, slicer sizes and toxicity rolls.")] = 0,
) -> None:
    """Run the golden runs, then the kill/term/cancel matrix; print a summary table.

    Exit codes: 0 every case passed; 1 oracle failures; 2 bad input (one line on
    stderr); 3 harness errors only; 130 interrupted.
    """
    from .matrix import run_matrix
    from .report import print_failures, print_summary, write_json

    cases = None
    try:
        kinds_t = _split(kinds, FAULT_KINDS, "--kinds")
        sources_t = _split(sources, POINT_SOURCES, "--sources")
        if plan is not None:
            if not conversation or len(conversation) != 1:
                raise typer.BadParameter("--plan needs exactly one --conversation")
            try:
                text = plan.read_text()
            except OSError as exc:
                raise typer.BadParameter(f"--plan {plan}: {exc.strerror}") from None
            cases = [Case(workload, conversation[0], FaultPlan.from_json(text))]
            if not cases[0].plan.faults:
                raise typer.BadParameter(f"--plan {plan}: the plan has no fault")
    except (typer.BadParameter, CrashmatrixError) as exc:
        raise typer.Exit(_fail(exc)) from None
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
        if getattr(result, "outcome") != "pass":
            state["failed"] = int(state["failed"]) + 1  # type: ignore[call-overload]
        progress.update(state["task"], advance=1, failed=state["failed"])  # type: ignore[arg-type]

    try:
        from . import registry

        registry.workload(workload)
        registry.subject(subject)
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    console.print(f"crashmatrix: starting services for {workload} on {subject} ...")
    try:
        result = _run_async(run_matrix(
            workload, subject, kinds=kinds_t, sources=sources_t,
            conversations=tuple(conversation) if conversation else None, cases=cases, jobs=jobs or None, dsn=dsn,
            options=Options(worker_timeout=worker_timeout, term_grace=term_grace, proxy_seed=seed),
            on_start=on_start, on_result=on_result, depth=depth, sample=sample, seed=seed, shard_spec=shard,
        ))
    except CrashmatrixError as exc:
        progress.stop()
        raise typer.Exit(_fail(exc)) from None
    except KeyboardInterrupt:
        progress.stop()
        err.print("crashmatrix: interrupted; services stopped")
        raise typer.Exit(130) from None
    progress.stop()
    from .matrix import MatrixReport

    assert isinstance(result, MatrixReport)
    print_failures(console, result.results, max_failures_shown)
    print_summary(console, result)
    if report is not None:
        write_json(result, report)
        console.print(f"report: {report}")
    _write_html(result, html)
    raise typer.Exit(result.exit_code)


@app.command()
def replay(
    case_id: Annotated[str, typer.Argument(help="Case id as printed, e.g. 'checkout/conv1/kill@log.append.before\\[turn-4.tool-0]#1'.")],
    subject: Annotated[str, typer.Option(help="Subject the case ran on.")] = "reference",
    dsn: Annotated[Optional[str], typer.Option(help="PostgreSQL DSN instead of an embedded server.")] = None,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report here.")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the HTML report here.")] = None,
) -> None:
    """Re-run one case (its golden run first) and print what each check saw."""
    from .matrix import MatrixReport, run_matrix
    from .report import write_json

    try:
        case = Case.parse(case_id)
        result = _run_async(run_matrix(case.workload, subject, cases=[case], jobs=1, dsn=dsn))
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    assert isinstance(result, MatrixReport)
    for r in result.results:
        color = {"pass": "green", "fail": "red"}.get(r.outcome, "yellow")
        console.print(f"[{color}]{r.outcome.upper()}[/{color}] {escape(r.case.id)} (subject {escape(r.subject)}, run {r.run_id}, {r.seconds:.2f} s)", soft_wrap=True)
        for w in r.workers:
            how = f"signal {w['signal']}" if w["signal"] is not None else f"exit {w['returncode']}"
            console.print(f"  worker {w['role']}: pid {w['pid']}, {how}, {w['seconds']:.3f} s" + (" (timed out)" if w["timed_out"] else "")
                          + (f"; toxic removed {w['healed']}" if w.get("healed") else ""), markup=False, soft_wrap=True)
        if r.error:
            console.print(f"  harness error: {r.error}", markup=False, soft_wrap=True)
        for v in r.verdicts:
            mark = {True: "[green]valid[/green]", False: "[red]invalid[/red]", None: "[yellow]unknown[/yellow]"}[v.valid]
            console.print(f"  {v.phase:5} {escape(v.check):34} {mark}  ", end="")
            console.print(v.details, markup=False, highlight=False, soft_wrap=True)
            for line in v.diff[:20]:
                console.print(f"        {line}", markup=False, soft_wrap=True)
    if report is not None:
        write_json(result, report)
    _write_html(result, html)
    raise typer.Exit(result.exit_code)


@app.command()
def selftest(
    mutant: Annotated[Optional[list[str]], typer.Option(help="Only this mutant of the catalogue, NAME or defect:NAME (repeatable). Default: all; `crashmatrix list` names them.")] = None,
    fast: Annotated[bool, typer.Option(help="CI profile: each mutant's own smallest conversation set, likely catchers first, stop at its first catch; the baseline runs the catching cases.")] = False,
    jobs: Annotated[int, typer.Option(min=0, help="Cases in flight at once; 0: twice the number of cores.")] = 0,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report (every mutant and baseline, first catch, check, seconds, replay commands) here.")] = None,
    dsn: Annotated[Optional[str], typer.Option(help="PostgreSQL DSN to use instead of an embedded server (also: $CRASHMATRIX_PG_DSN).")] = None,
    worker_timeout: Annotated[float, typer.Option(help="Seconds a worker may run before it is SIGKILLed and the case fails.")] = 60.0,
) -> None:
    """Run the mutant catalogue and the clean runtime: say which defects were caught.

    Each mutant (a reference runtime with one known defect planted) runs the matrix with
    the fault kinds its metadata names; it is caught when a case fails a check it names.
    The clean runtime it is a variant of must pass the same cases. Exit codes: 0 every
    mutant caught and the clean runtime clean; 1 a mutant missed or a clean case failed;
    2 bad input; 3 a harness error left something unjudged; 130 interrupted.
    """
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
                                             options=Options(worker_timeout=worker_timeout), on_outcome=on_outcome,
                                             on_case=on_case))
    except CrashmatrixError as exc:
        raise typer.Exit(_fail(exc)) from None
    except KeyboardInterrupt:
        err.print("crashmatrix: interrupted; services stopped")
        raise typer.Exit(130) from None
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


@app.command("list")
def list_names() -> None:
    """List registered subjects (with mutants) and workloads."""
    from . import registry

    console.print("subjects: " + ", ".join(registry.subject_names()))
    console.print("workloads: " + ", ".join(registry.workload_names()))


def main() -> None:
    """Console-script entry point."""
    app(prog_name="crashmatrix")


if __name__ == "__main__":
    main()
