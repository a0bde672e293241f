"""The crashmatrix pytest plugin: one test becomes the crash matrix of a workload.

Registered as the ``pytest11`` entry point ``crashmatrix`` (``-p no:crashmatrix``
disables it). A test written as::

    import pytest

    @pytest.mark.crashmatrix("checkout", subject="reference", conversations=["conv1"])
    def test_checkout(crashmatrix_case):
        crashmatrix_case.check()

is expanded at collection into one item per case of the matrix, with the case id as its
test id: with no kinds set, the cases ``crashmatrix run`` runs for the same workload and
seed (:mod:`.defaults`: kill, term and cancel at every crash point of the golden traces,
plus the sampled kinds and resume policies); with kinds set, those at every point; e.g.
``test_checkout[conv1/kill@tool.request.after[turn-4.tool-0]#1]``. Running an item runs
its case (fork, fault, resume, oracle) on live services; ``check()`` fails the item with
the check that failed, a small diff, the crash point with its source location, and the
replay command. A test that never calls ``check()`` is checked after its body returns,
so no matrix item passes without its oracle. A failing case is run again
(``--crashmatrix-replay-failures N``, default 1); one whose replay passes fails its item
as flaky, with both outcomes.

This module holds the hooks, fixtures and the case handle; the plugin's other jobs
live beside it: settings (options, ini keys, environment, marker; their precedence) in
:mod:`.plugin_settings`, the process's services and the ``crashmatrix_harness`` handle
in :mod:`.plugin_services`, the golden traces collection reads in
:mod:`.plugin_goldens`, the cases run ahead of their items in :mod:`.plugin_prefetch`,
and the JSON report built from case records in :mod:`.report` (:func:`.report.plugin_report`).

==================  ==================================  ==================================  ======
setting             command line / ini key              environment                         marker
==================  ==================================  ==================================  ======
workload            --crashmatrix-workload              CRASHMATRIX_WORKLOAD                yes
subject             --crashmatrix-subject               CRASHMATRIX_SUBJECT                 yes
kinds               --crashmatrix-kinds                 CRASHMATRIX_KINDS                   yes
kind_sample         --crashmatrix-kind-sample           CRASHMATRIX_KIND_SAMPLE             yes
sources             --crashmatrix-sources               CRASHMATRIX_SOURCES                 yes
conversations       --crashmatrix-conversations         CRASHMATRIX_CONVERSATIONS           yes
shard               --crashmatrix-shard                 CRASHMATRIX_SHARD                   yes
seed                --crashmatrix-seed                  CRASHMATRIX_SEED                    yes
replay_failures     --crashmatrix-replay-failures       CRASHMATRIX_REPLAY_FAILURES         yes
report (JSON)       --crashmatrix-report                CRASHMATRIX_REPORT                  no
html                --crashmatrix-html                  CRASHMATRIX_HTML                    no
cache_dir           --crashmatrix-cache-dir             CRASHMATRIX_CACHE_DIR               no
jobs                --crashmatrix-jobs                  CRASHMATRIX_JOBS                    no
==================  ==================================  ==================================  ======

(ini keys are the option names without the dashes and with ``_``:
``crashmatrix_kinds``; precedence ini < environment < command line < marker.)

**Collection** needs the golden traces; they are cached on disk
(:mod:`.goldencache`, keyed by workload, subject and the code hash of their sources), so
a warm collection starts no service, and pytest-xdist workers, which each collect, get
identical ids: the first to need a trace computes it under a file lock, the others wait
and read it. **Services**: one PostgreSQL for the run (xdist workers share one, started
by the first under a file lock: :mod:`.services.sharedpg`; docs/benchmarks.md measured it against
one per worker), one session (providers, zygote) per process, subject and workload, all
started on first use and stopped when pytest ends. The items' cases run ahead of them
in the CLI's case loop, ``jobs`` at a time, kill cases pruned by crash state
(:mod:`.plugin_prefetch`); xdist workers share the ``jobs``, each running a share of
every matrix by crash state and exchanging results with the others.
**Seed**: one seed drives every random choice (Hypothesis's draws in :mod:`.fuzz`, the
embedded fault proxy's toxicity rolls); when none is given the controller draws one,
shows it in the pytest header, and hands it to xdist workers.

**Reports**: ``--crashmatrix-report PATH`` (JSON: every case with its plan, verdicts,
failed check, diff, replay command, timings, crash-point location and replays; schema
in :func:`.report.plugin_report`) and ``--crashmatrix-html PATH`` (the heatmap,
:mod:`.html_report`), written by the controller after the run, xdist or not; a run
stopped early (Ctrl-C, ``-x``, ``--maxfail``) writes what ran, marked ``"complete":
false`` with the reason. JUnit (``--junitxml``) gets the case id as the test id, the
failure's first line as its message, and the case id, outcome (``flaky`` included),
every run's outcome, failed check and replay command as test properties. An item whose
case tested nothing (``not-run``: its fault changed nothing; ``not-applicable``: its
resume policy needs what the adapter does not declare) is a skip with the reason,
never a failure or a pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .errors import CrashmatrixError
from .plan import Case
from .plugin_goldens import CollectionGoldens, collected_cases
from .plugin_prefetch import (JOBS_PER_SHARE, Batch, Exchange, share_workers, wait, worker_index, worker_jobs,
                              xdist_run_dir)
from .plugin_services import Harnesses, Services
from .plugin_settings import SETTINGS, MatrixSettings, resolve_settings

if TYPE_CHECKING:  # the explorer (asyncpg, aiohttp) is imported on first use: every
    # pytest run in an environment with crashmatrix installed loads this module
    import concurrent.futures

    from .case import CaseResult

    from .golden import GoldenRun
    from .live import LiveHarness
    from .services.postgres import PostgresService

__all__ = ["CaseParam", "Harnesses", "MatrixCase", "MatrixKey", "MatrixSettings", "case_param_id", "matrix",
           "record_case", "resolve_settings", "seed_was_given"]


def seed_was_given(config: pytest.Config) -> bool:
    """True when the run's seed came from the ini file, the environment or the command
    line, not drawn (:func:`.plugin_settings.resolve_settings`)."""
    return _state(config).settings.origin.get("seed") != "drawn for this run"


# -- per-process state ------------------------------------------------------------------


@dataclass(frozen=True)
class MatrixKey:
    """What identifies one expanded matrix in the reports."""

    test: str
    workload: str
    subject: str
    kinds: tuple[str, ...]
    sources: tuple[str, ...]
    conversations: tuple[str, ...]
    shard: str | None


@dataclass(frozen=True)
class CaseParam:
    """The parameter of one matrix item (``request.param`` of ``crashmatrix_case``):
    the case, its subject, its matrix, and how often a failure of it is replayed."""

    case: Case
    subject: str
    matrix: MatrixKey
    replay_failures: int = 1


class State:
    """The plugin's per-process state (``config.stash``): the session's settings, the
    process's :class:`~.plugin_services.Services`, the golden traces collection read
    (:class:`~.plugin_goldens.CollectionGoldens`), the case records the controller
    reports, and the case loops of this process's matrices."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = resolve_settings(config)
        workerinput = getattr(config, "workerinput", None)
        self.services = Services(self.settings.seed, workerinput.get("testrunuid") if workerinput else None,
                                 pg_services=self.settings.services, pg_image=self.settings.pg_image)
        cache_dir = (Path(self.settings.cache_dir) if self.settings.cache_dir
                     else Path(config.rootpath) / ".crashmatrix_cache")
        self.goldens = CollectionGoldens(self.services, cache_dir)
        #: reports of matrix items, collected in the controller (or the only process)
        self.records: list[dict[str, Any]] = []
        #: a serial run's items per matrix test (node id -> ``(item node id, param)`` in
        #: pytest's order), each matrix's run by a :class:`~.plugin_prefetch.Batch` once
        #: its first item runs
        self.matrices: dict[str, list[tuple[str, CaseParam]]] | None = None
        self.batches: dict[str, Batch] = {}
        self.ran_ahead: set[str] = set()
        #: in an xdist worker that runs a share of each matrix: ``(K, N)``; under
        #: xdist, the number of shares N (0: each item runs its own case); per matrix
        #: test its exchange and, in a share's worker, the share of each case id
        self.share: tuple[int, int] | None = None
        self.shares = 0
        self.exchanges: dict[str, tuple[Exchange, dict[str, int]]] = {}
        #: under xdist, the directory the workers exchange results in (the controller
        #: removes it at the end)
        self.run_dir: Path | None = None
        #: in the controller: each xdist worker's pruning lines (``gw0: kill: ...``)
        self.worker_pruning: list[str] = []
        #: how this process ran its cases (``N cases in flight``, ``one case at a time:
        #: why``), set when its run loop starts; the controller's ``workers_ahead`` maps
        #: each xdist worker to its own
        self.ahead = ""
        #: cases in flight in this process (its share of the run's under xdist)
        self.jobs = 0
        #: live harnesses opened before the items ran (by collection, on a cold cache)
        self.opened_at_items = 0
        self.workers_ahead: dict[str, str] = {}

    @property
    def cache_dir(self) -> Path:
        return self.goldens.cache_dir

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Run the matrix items' cases ahead of them in the CLI's case loop
        (:mod:`.plugin_prefetch`): serially, each marked test's selected items in one
        loop, started at its first item; under xdist, the first
        :func:`~.plugin_prefetch.share_workers` workers each run a share of every
        matrix by crash state, started now (whatever items xdist sends them), with
        their part of ``jobs`` (:func:`~.plugin_prefetch.worker_jobs`), and the others'
        items take their results; with ``jobs`` 1, each item runs its own case. How it
        ran goes to the controller in ``workeroutput``."""
        if session.config.option.collectonly:
            return
        jobs = total = run_jobs(self.settings)
        workerinput = getattr(self.config, "workerinput", None)
        entries = [(item.nodeid, item.callspec.params["crashmatrix_case"]) for item in session.items
                   if isinstance(getattr(item, "callspec", None) and item.callspec.params.get("crashmatrix_case"),
                                 CaseParam)]
        if workerinput is not None:
            count, worker = workerinput.get("workercount", 1), workerinput.get("workerid", "")
            self.shares = share_workers(total, count, self.settings.share_workers)
            index = worker_index(worker, count)
            jobs = worker_jobs(total, self.shares, index) if index < self.shares else 0
        self.jobs = jobs
        self.opened_at_items = self.services.opened
        if not self.shares and jobs <= 1:  # serially with jobs 1, or under xdist with no shares
            self.ahead = f"one case at a time (jobs {total})"
        elif entries:
            self.matrices = {}
            for n, p in entries:
                self.matrices.setdefault(p.matrix.test, []).append((n, p))
            if workerinput is None:
                self.ahead = f"each matrix in one case loop, {jobs} cases in flight, kill cases pruned by crash state"
            else:
                self.run_dir = xdist_run_dir(workerinput.get("testrunuid", ""))
                if index < self.shares:
                    self.share = (index, self.shares)
                    for test in list(self.matrices):  # a share runs whatever items xdist sends this worker
                        self.batches[test] = self._batch(self.matrices.pop(test))
                    self.ahead = (f"share {index + 1}/{self.shares} of each matrix by crash state in one case loop, "
                                  f"{jobs} cases in flight")
                else:
                    self.ahead = f"no share, its items took the results of the {self.shares} share(s)"
        if workerinput is not None:
            self.config.workeroutput["crashmatrix_ahead"] = self.ahead  # type: ignore[attr-defined]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect each matrix item's record (in the controller: xdist workers send
        theirs with their reports)."""
        records = getattr(report, "crashmatrix", None)
        if not records or report.when != "call" or hasattr(self.config, "workerinput"):
            return
        self.records += [{**r, "pytest_outcome": report.outcome} for r in records]

    def live_golden(self, subject: str, workload: str, conversation: str) -> tuple[LiveHarness, GoldenRun]:
        """The live harness of ``subject`` on ``workload`` and its golden run of
        ``conversation`` (started and run on first use)."""
        harness = self.services.harness(subject, workload)
        return harness, harness.golden(conversation)

    def submit(self, param: CaseParam, harness: LiveHarness, golden: GoldenRun) -> concurrent.futures.Future[CaseResult]:
        """Start ``param``'s case on ``harness``'s loop, failures replayed
        (:func:`.matrix.run_case_replayed`); returns its future."""
        from .matrix import run_case_replayed

        assert harness.explorer is not None
        return harness.submit(run_case_replayed(harness.explorer, param.case, golden, param.replay_failures))

    def pruning_lines(self) -> list[str]:
        """What this process's case loops' pruning says
        (:meth:`~.plugin_prefetch.Batch.summary_lines`), each prefixed with its matrix
        test when there are several."""
        many = len(self.batches) > 1
        return [f"{test}: {line}" if many else line for test, batch in self.batches.items()
                for line in batch.summary_lines()]

    def take(self, nodeid: str, param: CaseParam) -> tuple[CaseResult, dict[str, Any] | None] | None:
        """The result of item ``nodeid``'s case run ahead of it (by its matrix's
        :class:`~.plugin_prefetch.Batch`, or in an xdist worker another worker's,
        :class:`~.plugin_prefetch.Exchange`), or None: the item runs its case itself.
        With it, what the report needs of the session that ran it when that was
        another process's (:meth:`_batch`'s ``meta``: its releases and golden points;
        None when it ran here)."""
        if self.matrices is None:
            return None
        test = param.matrix.test
        if self.shares and self.share is None:  # a worker without a share: every share's results
            if test not in self.exchanges:
                self.exchanges[test] = (self._exchange(test), {})
            exchange = self.exchanges[test][0]
            shares = range(self.shares)
        else:
            batch = self.batches.get(test)
            if batch is None:
                batch = self.batches[test] = self._batch(self.matrices.pop(test, []))
            if param.case.id in batch:
                result = batch.take(param.case.id)
                if result is None:
                    return None
                self.ran_ahead.add(nodeid)
                return result, None
            exchange, owners = self.exchanges.get(test, (None, {}))
            owner = owners.get(param.case.id)
            if exchange is None or owner is None or self.share is None or owner == self.share[0]:
                return None
            shares = range(owner, owner + 1)
        taken = exchange.wait(param.case.id, shares)
        if taken is not None:
            self.ran_ahead.add(nodeid)
        return taken

    def _exchange(self, test: str) -> Exchange:
        """The :class:`~.plugin_prefetch.Exchange` of marked test ``test``'s matrix."""
        assert self.run_dir is not None
        return Exchange(self.run_dir / hashlib.sha1(test.encode()).hexdigest()[:16])

    def _share(self, test: str, cases: list[Case], goldens: dict[str, GoldenRun]) -> tuple[list[Case], Exchange]:
        """In an xdist worker: this worker's share of ``cases`` (the matrix of marked
        test ``test``) by crash state (:func:`.pruning.shard_by_crash_state`), and the
        matrix's :class:`~.plugin_prefetch.Exchange`, claimed for that share; which share
        each case is in is kept for :meth:`take`."""
        from .pruning import shard_by_crash_state

        assert self.share is not None and self.run_dir is not None
        k, n = self.share
        owners = {c.id: j for j in range(n) for c in shard_by_crash_state(cases, goldens, f"{j + 1}/{n}")}
        exchange = self._exchange(test)
        exchange.claim(k)
        self.exchanges[test] = (exchange, owners)
        return [c for c in cases if owners.get(c.id) == k], exchange

    def _batch(self, items: list[tuple[str, CaseParam]]) -> Batch:
        """Start the case loop of one matrix's items (:func:`.runner.run_loop`, as
        ``crashmatrix run`` runs a matrix: its lanes and spare lanes, kill cases grouped
        by crash state with a seeded sample run whole, from the run's seed); a
        conversation whose golden run cannot run or does not match the collected trace
        is left out (its items fail with the reason). Resumes are not shared here: the
        case loop may run a case again after an unsound shared resume, and an item's
        outcome, once reported, stands."""
        from .pruning import options_of
        from .runner import run_loop

        cases, goldens, harness = [], {}, None
        for _, param in items:
            case = param.case
            if case.conversation not in goldens:
                try:
                    harness, goldens[case.conversation] = self.live_golden(param.subject, case.workload,
                                                                           case.conversation)
                except CrashmatrixError:
                    goldens[case.conversation] = None
                    continue
                if self.goldens.mismatch(param.subject, case.workload, case.conversation, goldens[case.conversation]):
                    goldens[case.conversation] = None
            if goldens[case.conversation] is not None:
                cases.append(case)
        unique = list({c.id: c for c in cases}.values())
        live = {c: g for c, g in goldens.items() if g is not None}
        exchange = None
        if self.share is not None and items:
            unique, exchange = self._share(items[0][1].matrix.test, unique, live)
        batch = Batch(c.id for c in unique)
        if harness is None or harness.explorer is None or not unique:
            batch.ended()
            if exchange is not None:  # ended even when nothing ran here: the other
                exchange.ended(self.share[0])  # type: ignore[index]  # workers' items need not wait
            return batch

        if exchange is not None:  # what the report needs of this session, for the other workers' items
            meta = {"releases": harness.releases(), "golden_points": {c: len(g.trace) for c, g in live.items()}}

        def emit(result: CaseResult) -> None:
            batch.emit(result.case.id, result)
            if exchange is not None:
                exchange.put(result.case.id, (result, meta))

        options = dataclasses.replace(options_of(True, seed=self.settings.seed), share=False)
        loop = harness.submit(run_loop(harness.explorer, unique, live, self.jobs, emit, options=options,
                                       replay_failures=items[0][1].replay_failures,
                                       spare=0 if self.settings.jobs else self.jobs))
        if exchange is not None:
            share = self.share[0]  # type: ignore[index]
            loop.add_done_callback(lambda _: exchange.ended(share))
        batch.attach(loop)
        return batch


_STATE_KEY = pytest.StashKey[State]()


def _state(config: pytest.Config) -> State:
    return config.stash[_STATE_KEY]


# -- the case handle ----------------------------------------------------------------------


class MatrixCase:
    """What a matrix test receives as ``crashmatrix_case``: one case, not yet run.

    ``case`` (a :class:`~.plan.Case`), ``subject``, ``id`` (the case id). :meth:`run`
    runs it once, a failure replayed (later calls return the same
    :class:`~.case.CaseResult`; ``outcome`` ``flaky`` when a replay disagreed);
    :meth:`check` runs it and fails the test unless every check was valid."""

    def __init__(self, param: CaseParam, state: State, item: pytest.Item) -> None:
        self.param = param
        self.case = param.case
        self.subject = param.subject
        self.matrix = param.matrix
        self._state = state
        self._item = item
        self.result: CaseResult | None = None
        self.checked = False
        self._record: dict[str, Any] = {}

    @property
    def id(self) -> str:
        return self.case.id

    def run(self) -> CaseResult:
        """Run the case on this process's live harness (services start on first use)."""
        if self.result is not None:
            return self.result
        state, case, nodeid = self._state, self.case, self._item.nodeid
        taken = state.take(nodeid, self.param)  # a result run ahead passed the same golden checks
        if taken is None:
            try:
                harness, golden = state.live_golden(self.subject, case.workload, case.conversation)
            except CrashmatrixError as exc:
                pytest.fail(f"crashmatrix: {self.subject} on {case.workload}: {exc}", pytrace=False)
            mismatch = state.goldens.mismatch(self.subject, case.workload, case.conversation, golden)
            if mismatch:
                pytest.fail(mismatch, pytrace=False)
            taken = wait(state.submit(self.param, harness, golden)), None
        self.result, meta = taken
        m = self.matrix
        self._record = record_case(self._item, self.result, test=m.test, kinds=m.kinds, sources=m.sources,
                                   conversations=m.conversations, shard=m.shard,
                                   ran_ahead=nodeid in state.ran_ahead, meta=meta)
        props = self._item.user_properties
        props += [("crashmatrix_case", self.id), ("crashmatrix_subject", self.subject),
                  ("crashmatrix_outcome", self.result.outcome), ("crashmatrix_replay", self.result.replay)]
        if self.result.replays:
            props.append(("crashmatrix_outcomes", ",".join(self._record["outcomes"])))
        if self._record["failed_check"]:
            props.append(("crashmatrix_failed_check", self._record["failed_check"]))
        if getattr(self.result, "representative", ""):  # a kill case judged on an equal crash state
            props.append(("crashmatrix_representative", self.result.representative))  # type: ignore[attr-defined]
        return self.result

    def check(self) -> CaseResult:
        """Run the case (if not yet) and fail the test unless it passed: the message's
        first line names the case, the failed check (``FLAKY`` and every run's outcome
        when a replay disagreed) and the replay command; then every failed check with
        details and a small diff, the crash point's location, and how each worker ended
        (:func:`.report.failure_text`). A case that tested nothing (not run: its fault
        could not take effect; not applicable: its policy needs what the adapter does
        not declare) is skipped with the reason."""
        from .matrix import NON_EVENTS
        from .report import failure_text

        result = self.run()
        self.checked = True
        if result.outcome in NON_EVENTS:  # it tested nothing: a skip with the reason, never a failure or a pass
            # its error says which, then why ("not run: at POINT, ...", "not applicable: ...")
            pytest.skip(f"crashmatrix: {result.error or result.outcome.replace('-', ' ') + ': no reason recorded'}")
        if result.outcome != "pass":
            pytest.fail(failure_text(self._record), pytrace=False)
        return result


_RECORDS_KEY = pytest.StashKey[list]()
_CASE_KEY = pytest.StashKey[MatrixCase]()


def record_case(
    item: pytest.Item, result: CaseResult, *, test: str, kinds: Sequence[str], sources: Sequence[str],
    conversations: Sequence[str] | None = None, shard: str | None = None, ran_ahead: bool = False,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keep ``result`` for the reports: a :func:`.report.case_record` (with the crash
    point's source location) plus the item's node id, ``ran_ahead`` (its case was
    started before its item ran: :mod:`.plugin_prefetch`) and the matrix it belongs to
    (``test``: the marked or property test's node id), with the golden run's points and
    the releases under test from this process's live harness, or from ``meta`` when
    another xdist worker's session ran the case (``{"releases": ..., "golden_points":
    {conversation: n}}``). Travels to the xdist controller with the item's report.
    Returns the record."""
    from .report import case_record
    from .sources import point_location

    state = _state(item.config)
    case = result.case
    point = case.plan.faults[0].point
    location = point_location(point.name, point.source, state.goldens.sources(result.subject, case.workload))
    record = case_record(result, location)
    record["nodeid"] = item.nodeid
    record["ran_ahead"] = ran_ahead
    if meta is None:
        harness = state.services.harness(result.subject, case.workload)
        meta = {"releases": harness.releases(),
                "golden_points": {case.conversation: len(harness.golden(case.conversation).trace)}}
    record["matrix"] = {
        "test": test, "workload": case.workload, "subject": result.subject, "kinds": list(kinds),
        "sources": list(sources), "conversations": list(conversations or (case.conversation,)), "shard": shard,
        "golden_points": {case.conversation: meta["golden_points"][case.conversation]},
        "releases": meta["releases"],
    }
    item.stash.setdefault(_RECORDS_KEY, []).append(record)
    return record


def case_param_id(case: Case) -> str:
    """The pytest id of a matrix item: the case id without its workload
    (``conv1/kill@tool.request.after[turn-4.tool-0]#1``), stable across runs and edits
    that do not move crash points."""
    return case.id.split("/", 1)[1]


def matrix(workload: str = "checkout", **kwargs: Any) -> pytest.MarkDecorator:
    """The ``crashmatrix`` marker as a decorator: ``@matrix("checkout", subject=...,
    kinds=("kill",), sources=("label",), conversations=("conv1",), shard="1/4",
    seed=7)``. Arguments are checked at collection (:func:`.plugin_settings.marker_kwargs`)."""
    return pytest.mark.crashmatrix(workload, **kwargs)


# -- hooks --------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    """One option group; every setting as ``--crashmatrix-KEY`` and its ini twin
    ``crashmatrix_KEY``, sharing one help constant."""
    group = parser.getgroup("crashmatrix", "crashmatrix: crash matrices of durable agent runtimes")
    for s in SETTINGS:
        metavar = {"kinds": "KIND,...", "sources": "SOURCE,...", "conversations": "CONV,...", "shard": "K/N",
                   "seed": "N"}.get(s.key, s.key.upper())
        group.addoption(s.option, dest=s.ini, default=None, metavar=metavar, help=s.help)
        parser.addini(s.ini, s.help, type="string", default="")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the marker, resolve the session's settings (a bad one is a one-line
    usage error), and the xdist hooks when xdist is installed. First, so that
    ``--hypothesis-profile=crashmatrix-nightly`` finds the profile registered
    (:mod:`.fuzz` registers them) when Hypothesis's plugin loads it."""
    profile = config.getoption("--hypothesis-profile", None) if config.pluginmanager.hasplugin("hypothesispytest") else None
    if isinstance(profile, str) and profile.startswith("crashmatrix-"):
        from . import fuzz  # noqa: F401  (registers the crashmatrix-* profiles)

    config.addinivalue_line(
        "markers",
        "crashmatrix(workload, subject=, kinds=, kind_sample=, sources=, conversations=, shard=, seed=, replay_failures=): "
        "expand the test into "
        "the crash matrix of the workload on the subject; the test takes the crashmatrix_case fixture.")
    try:
        state = State(config)
    except CrashmatrixError as exc:
        raise pytest.UsageError(f"crashmatrix: {exc}") from None
    config.stash[_STATE_KEY] = state
    config.pluginmanager.register(state, "crashmatrix-state")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "crashmatrix-xdist")


class _XdistHooks:
    """Registered only when pytest-xdist is installed (its hook names are unknown
    otherwise)."""

    @pytest.hookimpl
    def pytest_configure_node(self, node: Any) -> None:
        state = _state(node.config)
        node.workerinput["crashmatrix_seed"] = state.settings.seed
        state.run_dir = xdist_run_dir(node.workerinput.get("testrunuid", ""))

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Keep how the worker ran its cases (for the terminal summary)."""
        ahead = (getattr(node, "workeroutput", None) or {}).get("crashmatrix_ahead")
        worker = str(node.workerinput.get("workerid", "?"))
        if ahead:
            _state(node.config).workers_ahead[worker] = ahead
        for line in (getattr(node, "workeroutput", None) or {}).get("crashmatrix_pruning") or []:
            _state(node.config).worker_pruning.append(f"{worker}: {line}")


def run_jobs(settings: MatrixSettings) -> int:
    """The run's cases in flight: ``jobs`` when set, else twice the cores (as
    ``crashmatrix run``); under xdist the share workers divide it (:func:`.plugin_prefetch.worker_jobs`)."""
    return settings.jobs or 2 * (os.cpu_count() or 1)


def _xdist_workers(config: pytest.Config) -> int | None:
    """The number of xdist workers this controller starts (``-n``, capped by
    ``--maxprocesses``); 0 without xdist (or in a worker); None when xdist distributes
    without ``-n`` (``--tx`` specs)."""
    option = config.option
    if hasattr(config, "workerinput") or getattr(option, "dist", "no") == "no":
        return 0
    n = getattr(option, "numprocesses", None)
    if not isinstance(n, int) or n <= 0:
        return None
    cap = getattr(option, "maxprocesses", None)
    return min(n, cap) if isinstance(cap, int) and cap > 0 else n


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop this process's services if the session did not (a usage error before it
    started; idempotent)."""
    state = config.stash.get(_STATE_KEY, None)
    if state is not None:
        state.services.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The seed (and how to reuse it); the run's default kinds, sources, shard and
    replays (what a ``crashmatrix`` marker that sets none of its own runs); the cache
    directory."""
    s = _state(config).settings
    lines = [f"crashmatrix: seed={s.seed} (reuse with --crashmatrix-seed={s.seed}); {s.origin.get('seed')}"]
    shape = s.matrix()
    sampled = [f"{name}={n}" for name, n in shape.sampled_kinds + shape.sampled_policies]
    lines.append(f"crashmatrix: defaults (a marker's own settings win): kinds={','.join(s.kinds)} "
                 f"sources={','.join(s.sources)}"
                 + (f" sampled={','.join(sampled)} (seed {s.sample_seed})" if sampled else "")
                 + (f" shard={s.shard}" if s.shard else "") + f" replay-failures={s.replay_failures}"
                 + f" cache={_state(config).cache_dir}")
    jobs, workers = run_jobs(s), _xdist_workers(config)
    shares = share_workers(jobs, workers, s.share_workers) if workers else 0
    if shares:
        each = sorted({worker_jobs(jobs, shares, k) for k in range(shares)}, reverse=True)
        lines.append(f"crashmatrix: jobs={jobs} cases in flight, run by {shares} of {workers} xdist workers "
                     f"({' or '.join(map(str, each))} each, a share of each matrix by crash state"
                     + (", the other workers' items take their results)" if shares < workers else ")"))
    elif workers:
        lines.append(f"crashmatrix: jobs={jobs}, each of the {workers} xdist workers' items runs its own case")
    elif workers is None:
        lines.append(f"crashmatrix: jobs={jobs} cases in flight, run by the first xdist workers (a share of each "
                     f"matrix each, --crashmatrix-share-workers or one per {JOBS_PER_SHARE} jobs)")
    elif not hasattr(config, "workerinput"):
        lines.append(f"crashmatrix: jobs={jobs} cases in flight (each matrix's cases run ahead of its items in "
                     f"crashmatrix run's case loop, kill cases pruned by crash state)" if jobs > 1 else
                     "crashmatrix: jobs=1, each item runs its own case")
    return lines


def _collect_error(metafunc: pytest.Metafunc, message: str) -> pytest.Collector.CollectError:
    return pytest.Collector.CollectError(f"{metafunc.definition.nodeid}: crashmatrix: {message}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Expand a test marked ``crashmatrix`` into its matrix: settings resolved with
    the marker, golden traces from the cache (computed under its lock when missing),
    :meth:`.defaults.DefaultMatrix.cases` (``crashmatrix run``'s default matrix when no
    kinds are set, samples drawn with :attr:`.plugin_settings.MatrixSettings.sample_seed`),
    the shard; one item per case, ids from
    :func:`case_param_id`. Errors are collection errors of one line."""
    marker = metafunc.definition.get_closest_marker("crashmatrix")
    wants_case = "crashmatrix_case" in metafunc.fixturenames
    if marker is None:
        if wants_case:
            raise _collect_error(metafunc, "the crashmatrix_case fixture needs the @pytest.mark.crashmatrix marker")
        return
    if not wants_case:
        raise _collect_error(metafunc, "a test marked crashmatrix must take the crashmatrix_case fixture")
    state = _state(metafunc.config)
    from .plan import Resume
    from .settings import RunSettings

    try:
        s = resolve_settings(metafunc.config, marker)
        shape = s.matrix()  # crashmatrix run's default matrix when no kinds are set (defaults.py)
        run = RunSettings.of(s.workload, s.subject, kinds=shape.kinds, sources=s.sources, matrix=shape,
                             conversations=s.conversations or None, seed=s.sample_seed, shard=s.shard,
                             replay_failures=s.replay_failures, jobs=s.jobs, resume=Resume.parse(s.resume))
        names = run.names  # a build pair's builds checked too
        conversations = names.conversations or tuple(names.workload_object.conversations)
        entries = state.goldens.traces(s.workload, s.subject, conversations)
    except CrashmatrixError as exc:
        raise _collect_error(metafunc, str(exc)) from None
    from .enumeration import shard

    from .builds import label_cases

    try:
        cases = label_cases(collected_cases(s.workload, entries, shape, s.sources, run.resume, run.seed), names.upgrade)
    except CrashmatrixError as exc:
        raise _collect_error(metafunc, str(exc)) from None
    if run.shard:
        cases = shard(cases, run.shard)
    key = MatrixKey(metafunc.definition.nodeid, s.workload, s.subject, shape.all_kinds, s.sources, conversations,
                    s.shard)
    metafunc.parametrize("crashmatrix_case", [CaseParam(c, s.subject, key, s.replay_failures) for c in cases],
                         ids=[case_param_id(c) for c in cases], indirect=True, scope="function")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[Any]:
    """After a matrix test's body returns, check its case if the body did not."""
    result = yield
    handle = pyfuncitem.stash.get(_CASE_KEY, None)
    if handle is not None and not handle.checked:
        handle.check()  # the body returned without checking: the oracle still decides
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Attach the item's case records to its call report (``report.crashmatrix``)."""
    report = yield
    records = item.stash.get(_RECORDS_KEY, None)
    if records and call.when == "call":
        report.crashmatrix = records  # travels to the xdist controller with the report
    return report


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """End the matrices' case loops (cancelled when the run stopped early: ``-x``,
    Ctrl-C; else let finish: an xdist worker's share may still be awaited); write the JSON
    and HTML reports (the controller, or the only process), marked incomplete when the
    run stopped early; stop this process's services. Here and not at unconfigure: an
    xdist worker is ended soon after it reports its session finished, before its
    unconfigure hooks would run. Last, so session-scoped fixtures that use the harness
    are torn down first."""
    config = session.config
    state = _state(config)
    try:
        stopped = _stopped_early(session, exitstatus)
        for batch in state.batches.values():
            batch.close(cancel=stopped is not None)
        if hasattr(config, "workerinput"):  # sent with the worker's end, for the terminal summary
            config.workeroutput["crashmatrix_pruning"] = state.pruning_lines()  # type: ignore[attr-defined]
            if state.shares and state.share is None:  # did it need a session of its own, and why?
                at_collection = state.opened_at_items
                for_items = state.services.opened - at_collection
                why = ([f"{at_collection} to compute golden traces at collection"] if at_collection else []) + \
                    ([f"{for_items} for items that ran their own cases"] if for_items else [])
                state.ahead += (", harness sessions of its own: " + ", ".join(why) if why else
                                ", no harness session of its own")
                config.workeroutput["crashmatrix_ahead"] = state.ahead  # type: ignore[attr-defined]
        else:
            _write_reports(state, stopped)
    finally:
        state.services.close()
        if state.run_dir is not None and not hasattr(config, "workerinput"):  # once every worker is done
            shutil.rmtree(state.run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # the run's directory too, once empty (with a
                state.run_dir.parent.rmdir()  # user's DSN no server's owner removes it)


def _stopped_early(session: pytest.Session, exitstatus: int) -> str | None:
    """Why the run ended before running every item (Ctrl-C, ``-x``/``--maxfail``), or None."""
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "interrupted (KeyboardInterrupt)"
    why = session.shouldstop or session.shouldfail
    return str(why) if why else None


def _write_reports(state: State, stopped: str | None) -> None:
    from .report import plugin_report, write_data

    s = state.settings
    if not (s.report or s.html) or (not state.records and stopped is None):
        return  # a run stopped before any case ended still says so: its reports hold no case
    from .html_report import write_html

    data = plugin_report(state.records, s.seed, complete=stopped is None, reason=stopped)
    if s.report:
        write_data(data, Path(s.report))
    if s.html:
        write_html(data, Path(s.html))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line: cases passed, failed, flaky, harness errors, the seed, the report paths;
    then the release of each runtime under test (:func:`.sources.releases_line`)."""
    from .matrix import FAILING
    from .report import counts_line, program_hint

    state = config.stash.get(_STATE_KEY, None)
    if state is None or not state.records or hasattr(config, "workerinput"):
        return
    line = f"crashmatrix: {counts_line(state.records)}; seed {state.settings.seed}"
    for label, path in (("report", state.settings.report), ("html", state.settings.html)):
        if path:
            line += f"; {label}: {path}"
    terminalreporter.write_line(line)
    if any(r["outcome"] in FAILING for r in state.records) and (hint := program_hint()):
        terminalreporter.write_line(f"crashmatrix: {hint}")
    for text in state.pruning_lines() + state.worker_pruning:
        terminalreporter.write_line(f"crashmatrix: {text}")
    from .sources import releases_line

    shown = {releases_line(r["matrix"].get("releases") or {}) for r in state.records}
    for text in sorted(t for t in shown if t is not None):
        terminalreporter.write_line(f"crashmatrix: {text}")
    ways = sorted(set(state.workers_ahead.values()))
    if ways:
        ran = (f"each of {len(state.workers_ahead)} xdist workers ran {ways[0]}" if len(ways) == 1 else
               "xdist workers ran " + ", ".join(f"{w}: {how}" for w, how in sorted(state.workers_ahead.items())))
        ahead = sum(r.get("ran_ahead", False) for r in state.records)
        terminalreporter.write_line(f"crashmatrix: {ran}; {ahead} of {len(state.records)} cases ran ahead of "
                                    "their items")


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def crashmatrix_seed(pytestconfig: pytest.Config) -> int:
    """The run's seed (``--crashmatrix-seed``; shown in the pytest header)."""
    return _state(pytestconfig).settings.seed


@pytest.fixture(scope="session")
def crashmatrix_postgres(pytestconfig: pytest.Config) -> PostgresService:
    """The run's PostgreSQL (:class:`~.services.postgres.PostgresService`; ``.dsn``), the
    one every harness session of the process uses (xdist workers share it:
    :class:`~.services.matrixpg.MatrixPostgres`)."""
    return _state(pytestconfig).services.pg()


@pytest.fixture(scope="session")
def crashmatrix_faultproxy(pytestconfig: pytest.Config) -> str:
    """Base URL of a Toxiproxy-compatible fault proxy API: ``$TOXIPROXY_URL``, else
    the embedded one, seeded with the run's seed; per xdist worker."""
    return _state(pytestconfig).services.faultproxy_url()


@pytest.fixture(scope="session")
def crashmatrix_harness(pytestconfig: pytest.Config) -> Harnesses:
    """Live harness sessions on this process's services (:class:`~.plugin_services.Harnesses`):
    ``.harness(subject, workload)`` gives an open :class:`~.live.LiveHarness` (golden
    runs, ``run_case``); ``.run_case(case, subject)``, ``.golden(...)``, ``.seed``."""
    return Harnesses(_state(pytestconfig).services)


@pytest.fixture
def crashmatrix_case(request: pytest.FixtureRequest) -> MatrixCase:
    """The case of one matrix item (:class:`MatrixCase`); only for tests marked
    ``crashmatrix``, which are parametrized with it at collection."""
    param = getattr(request, "param", None)
    if not isinstance(param, CaseParam):
        raise pytest.UsageError("crashmatrix_case is only available in tests marked @pytest.mark.crashmatrix")
    handle = MatrixCase(param, _state(request.config), request.node)
    request.node.stash[_CASE_KEY] = handle
    return handle
