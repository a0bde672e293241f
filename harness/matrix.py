"""Run a whole matrix: golden runs, enumeration, cases in parallel, one report.

:func:`run_matrix` is what ``crashmatrix run`` calls, importable and typed. Cases run
``jobs`` at a time (default: twice the number of cores; docs/benchmarks.md); each reports through ``on_result``
as it finishes, so the caller can draw progress.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import PlanError
from .explorer import (
    DEFAULT_KINDS, DEFAULT_SOURCES, CaseResult, Explorer, GoldenRun, Options, double_fault_cases, enumerate_cases,
    shard, validate_case,
)
from .plan import Case
from . import registry
from .session import open_session


@dataclass
class MatrixReport:
    """Everything a matrix run produced. ``seconds``: wall time of the cases only
    (golden runs and service start excluded); ``setup_seconds``: the rest."""

    workload: str
    subject: str
    kinds: tuple[str, ...]
    sources: tuple[str, ...]
    goldens: dict[str, GoldenRun]
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    setup_seconds: float = 0.0
    jobs: int = 1

    @property
    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "harness-error": 0}
        for r in self.results:
            out[r.outcome] += 1
        return out

    @property
    def cases_per_second(self) -> float:
        return len(self.results) / self.seconds if self.seconds > 0 else 0.0

    @property
    def exit_code(self) -> int:
        """0 every case passed; 1 some case failed an oracle check; 3 harness errors only."""
        c = self.counts
        if c["fail"]:
            return 1
        if c["harness-error"]:
            return 3
        return 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON report: :func:`.report.matrix_dict`'s shape, with the run's wall
        clock (``summary.seconds``, ``setup_seconds``, ``cases_per_second``), the jobs and
        each golden run's id, points and seconds."""
        from .report import matrix_dict

        golden = {c: {"run_id": g.run_id, "points": len(g.trace), "seconds": round(g.seconds, 4)}
                  for c, g in sorted(self.goldens.items())}
        out = matrix_dict(self.workload, self.subject, self.kinds, self.sources, [r.to_dict() for r in self.results], golden)
        out["jobs"] = self.jobs
        out["summary"].update(seconds=round(self.seconds, 3), setup_seconds=round(self.setup_seconds, 3),
                              cases_per_second=round(self.cases_per_second, 2))
        return out


async def run_matrix(
    workload: str = "checkout",
    subject: str = "reference",
    *,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    sources: tuple[str, ...] = DEFAULT_SOURCES,
    conversations: tuple[str, ...] | None = None,
    cases: list[Case] | None = None,
    jobs: int | None = None,
    dsn: str | None = None,
    options: Options | None = None,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    depth: int = 1,
    sample: int | None = None,
    seed: int = 0,
    shard_spec: str | None = None,
) -> MatrixReport:
    """Start services, run golden runs, then the matrix (or the given ``cases``).

    Raises ``ServiceError``/``RegistryError`` before any case runs when services or
    names are wrong, and ``PlanError`` when a given case does not fit the golden trace.
    ``on_start(n)`` is called with the number of cases once they are enumerated (and
    again for the second level when ``depth`` is 2).

    ``depth=2`` adds double faults: after the single-fault cases ran, each is extended
    with a second fault at every point of its resume's trace (``sample`` of them, drawn
    with ``seed``). ``shard_spec`` ``"K/N"`` keeps the K-th of N disjoint shards.
    """
    if depth not in (1, 2):
        raise PlanError(f"depth={depth!r} must be 1 or 2")
    # a case mostly waits (fsync, IPC); twice the cores in flight measured fastest
    jobs = jobs or 2 * (os.cpu_count() or 1)
    wl_obj = registry.workload(workload)
    registry.subject(subject)
    for conv in conversations or ():
        if conv not in wl_obj.conversations:
            raise PlanError(f"conversation={conv!r} is not one of {', '.join(wl_obj.conversations)}")
    if shard_spec:
        shard(list(range(1)), shard_spec)  # validates K/N before anything starts
    wants_awaits = "await" in sources or any(f.point.source == "await" for c in cases or [] for f in c.plan.faults)
    if wants_awaits and not (options and options.await_points):
        options = dataclasses.replace(options or Options(), await_points=True)
    t0 = time.monotonic()
    wants_net = "net" in kinds if cases is None else any(f.kind == "net" for c in cases for f in c.plan.faults)
    async with open_session(subject, workload, dsn=dsn, options=options) as explorer:
        if wants_net:  # an unreachable fault proxy is a ServiceError now (exit 2), not one per case
            await explorer.fault_proxy.client()
        wl = explorer.workload
        wanted = conversations or (tuple(sorted({c.conversation for c in cases})) if cases else wl.conversations)
        goldens = {}
        for conv in wanted:
            goldens[conv] = await explorer.golden(conv)
        if cases is None:
            cases = enumerate_cases(workload, goldens, kinds, sources)
        else:
            from .netfaults import check_links

            for case in cases:
                validate_case(case, goldens)
                check_links(case, tuple(wl.providers))
        if shard_spec:
            cases = shard(cases, shard_spec)
        report = MatrixReport(workload, subject, kinds, sources, goldens, jobs=jobs)
        if on_start:
            on_start(len(cases))
        t1 = time.monotonic()
        report.results = await run_cases(explorer, cases, goldens, jobs, on_result)
        if depth == 2:
            doubles = double_fault_cases(report.results, kinds, sample=sample, seed=seed)
            if on_start:
                on_start(len(doubles))
            report.results += await run_cases(explorer, doubles, goldens, jobs, on_result)
        report.seconds = time.monotonic() - t1
    report.setup_seconds = time.monotonic() - t0 - report.seconds
    return report


async def run_cases(
    explorer: Explorer, cases: list[Case], goldens: dict[str, GoldenRun], jobs: int,
    on_result: Callable[[CaseResult], None] | None = None, *, stop: Callable[[CaseResult], bool] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` on ``explorer``'s session, ``jobs`` at a time, each against the
    golden run of its conversation; results in case order. ``on_result`` sees each as
    it finishes; once ``stop(result)`` returns True no further case starts (those in
    flight finish and are returned)."""
    stopped = False
    queue: asyncio.Queue[tuple[int, Case]] = asyncio.Queue()
    for item in enumerate(cases):
        queue.put_nowait(item)
    results: list[CaseResult | None] = [None] * len(cases)

    async def worker() -> None:
        nonlocal stopped
        while not stopped:
            try:
                i, case = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result = await explorer.run_case(case, goldens[case.conversation])
            results[i] = result
            if on_result:
                on_result(result)
            if stop is not None and stop(result):
                stopped = True

    await asyncio.gather(*(worker() for _ in range(min(jobs, max(1, len(cases))))))
    return [r for r in results if r is not None]
