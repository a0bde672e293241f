"""The crashmatrix pytest plugin: one test becomes the crash matrix of a workload.

Registered as the ``pytest11`` entry point ``crashmatrix`` (``-p no:crashmatrix``
disables it). A test written as::

    import pytest

    @pytest.mark.crashmatrix("checkout", subject="reference", conversations=["conv1"])
    def test_checkout(crashmatrix_case):
        crashmatrix_case.check()

is expanded at collection into one item per case of the matrix (every crash point of
the golden traces x every fault kind), with the case id as its test id, e.g.
``test_checkout[conv1/kill@tool.request.after[turn-4.tool-0]#1]``. Running an item runs
its case (fork, fault, resume, oracle) on live services; ``check()`` fails the item with
the check that failed, a small diff, the crash point with its source location, and the
replay command. A test that never calls ``check()`` is checked after its body returns,
so no matrix item passes without its oracle.

**Settings**, each an option, an ini key, an environment variable and (for those that
make sense per test) a marker argument; precedence ini < environment < command line <
marker, implemented once in :func:`resolve_settings` (as pytest-timeout does):

==================  ==========================  ==========================  ======
setting             command line / ini key      environment                 marker
==================  ==========================  ==========================  ======
workload            --crashmatrix-workload      CRASHMATRIX_WORKLOAD        yes
subject             --crashmatrix-subject       CRASHMATRIX_SUBJECT         yes
kinds               --crashmatrix-kinds         CRASHMATRIX_KINDS           yes
sources             --crashmatrix-sources       CRASHMATRIX_SOURCES         yes
conversations       --crashmatrix-conversations CRASHMATRIX_CONVERSATIONS   yes
shard               --crashmatrix-shard         CRASHMATRIX_SHARD           yes
seed                --crashmatrix-seed          CRASHMATRIX_SEED            yes
report (JSON)       --crashmatrix-report        CRASHMATRIX_REPORT          no
html                --crashmatrix-html          CRASHMATRIX_HTML            no
cache_dir           --crashmatrix-cache-dir     CRASHMATRIX_CACHE_DIR       no
jobs                --crashmatrix-jobs          CRASHMATRIX_JOBS            no
==================  ==========================  ==========================  ======

(ini keys are the option names without the dashes and with ``_``:
``crashmatrix_kinds``.)

**Collection** needs the golden traces; they are cached on disk
(:mod:`.goldencache`, keyed by workload, subject and the code hash of their sources), so
a warm collection starts no service, and pytest-xdist workers, which each collect, get
identical ids: the first to need a trace computes it under a file lock, the others wait
and read it. **Services**: one PostgreSQL for the run (xdist workers share one, started
by the first under a file lock: :mod:`.sharedpg`; docs/benchmarks.md measured it against
one per worker), one session (providers, zygote) per process, subject and workload, all
started on first use and stopped when pytest ends. In a run without xdist, the coming
items' cases run ahead, ``jobs`` at a time (:class:`Prefetcher`), as the CLI's do. **Seed**: one seed drives
every random choice (Hypothesis's draws in :mod:`.fuzz`, the embedded fault proxy's
toxicity rolls); when none is given the controller draws one, shows it in the pytest
header, and hands it to xdist workers.

**Reports**: ``--crashmatrix-report PATH`` (JSON: every case with its plan, verdicts,
failed check, diff, replay command, timings and crash-point location; schema in
:func:`build_report`) and ``--crashmatrix-html PATH`` (the heatmap, :mod:`.html_report`),
written by the controller after the run, xdist or not. JUnit (``--junitxml``) gets the
case id as the test id, the failure's first line as its message, and the case id,
outcome, failed check and replay command as test properties.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .errors import CrashmatrixError, InvalidArgument
from .plan import FAULT_KINDS, POINT_SOURCES, Case

if TYPE_CHECKING:  # the explorer (asyncpg, aiohttp) is imported on first use: every
    # pytest run in an environment with crashmatrix installed loads this module
    from .explorer import CaseResult, GoldenRun

# -- settings ---------------------------------------------------------------------------

HELP_WORKLOAD = "Workload a crashmatrix test runs when its marker names none (default: checkout)."
HELP_SUBJECT = ("Subject: a registered runtime adapter, a mutant 'defect:NAME', or package.module:AdapterClass "
                "(default: reference).")
HELP_KINDS = (f"Comma-separated fault kinds of the matrix: {', '.join(FAULT_KINDS)} "
              "(kill: SIGKILL; term: SIGTERM and drain; cancel: anyio cancel scope; pause: SIGSTOP, another "
              "worker takes over, SIGCONT; db-restart: PostgreSQL crashed and restarted; net: the network section, "
              "a toxic on a link in use at labelled points). Default: kill,term,cancel.")
HELP_SOURCES = ("Comma-separated crash-point sources: step (node boundaries the adapter reports), label "
                "(crashpoint() calls), await (every suspension in the subject's packages). Default: step,label.")
HELP_CONVERSATIONS = "Comma-separated conversations of the workload to run (default: all of them)."
HELP_SHARD = ("Keep shard K/N of every matrix (disjoint, deterministic: every N-th case from the K-th), "
              "e.g. 2/4 for the second of four CI jobs.")
HELP_SEED = ("Seed of every random choice (Hypothesis draws, toxicity rolls). Default: a fresh one per run, "
             "shown in the header.")
HELP_REPORT = "Write the JSON report (every case, plan, verdicts, diff, replay command, timings) to this path."
HELP_HTML = "Write the HTML report (heatmap of crash points x fault kinds; one file, no network) to this path."
HELP_CACHE_DIR = "Directory of the golden-trace cache (default: .crashmatrix_cache in the rootdir)."
HELP_JOBS = ("Cases in flight at once in a run without xdist (the coming items' cases run ahead); default: "
             "twice the number of cores. Under xdist each worker runs one case at a time.")


def _words(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, Sequence):
        return tuple(str(v).strip() for v in value)
    raise InvalidArgument(f"{value!r} must be a comma-separated string or a list")


def _choices(allowed: tuple[str, ...]) -> Callable[[Any], tuple[str, ...]]:
    def parse(value: Any) -> tuple[str, ...]:
        items = _words(value)
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            raise InvalidArgument(f"{value!r}: each item must be one of {', '.join(allowed)}")
        return items
    return parse


def _kinds(value: Any) -> tuple[str, ...]:
    from . import plan  # FAULT_KINDS read at call time: kinds added later are accepted

    return _choices(plan.FAULT_KINDS)(value)


def _shard(value: Any) -> str:
    from .explorer import shard

    spec = str(value).strip()
    shard([], spec)  # raises PlanError naming the spec
    return spec


def _integer(minimum: int, words: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise InvalidArgument(f"{value!r} must be {words}")
        return number
    return parse


_seed = _integer(0, "a non-negative integer")
_jobs = _integer(1, "an integer >= 1")


def _name(value: Any) -> str:
    text = str(value).strip()
    if not text:
        raise InvalidArgument("must not be empty")
    return text


@dataclass(frozen=True)
class Setting:
    """One plugin setting: its ``key``, help constant (shared by the option and its ini
    twin), parser, default, and whether a marker may set it."""

    key: str
    help: str
    parse: Callable[[Any], Any]
    default: Any
    marker: bool

    @property
    def option(self) -> str:
        return "--crashmatrix-" + self.key.replace("_", "-")

    @property
    def ini(self) -> str:
        return "crashmatrix_" + self.key

    @property
    def env(self) -> str:
        return "CRASHMATRIX_" + self.key.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting("workload", HELP_WORKLOAD, _name, "checkout", True),
    Setting("subject", HELP_SUBJECT, _name, "reference", True),
    Setting("kinds", HELP_KINDS, _kinds, ("kill", "term", "cancel"), True),
    Setting("sources", HELP_SOURCES, _choices(POINT_SOURCES), ("step", "label"), True),
    Setting("conversations", HELP_CONVERSATIONS, _words, None, True),
    Setting("shard", HELP_SHARD, _shard, None, True),
    Setting("seed", HELP_SEED, _seed, None, True),
    Setting("report", HELP_REPORT, _name, None, False),
    Setting("html", HELP_HTML, _name, None, False),
    Setting("cache_dir", HELP_CACHE_DIR, _name, None, False),
    Setting("jobs", HELP_JOBS, _jobs, None, False),
)
MARKER_KEYS = tuple(s.key for s in SETTINGS if s.marker)


@dataclass(frozen=True)
class MatrixSettings:
    """The resolved settings of a session (no marker) or of one marked test."""

    workload: str
    subject: str
    kinds: tuple[str, ...]
    sources: tuple[str, ...]
    conversations: tuple[str, ...] | None
    shard: str | None
    seed: int
    report: str | None
    html: str | None
    cache_dir: str | None
    jobs: int | None
    origin: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


def marker_kwargs(marker: pytest.Mark | None) -> dict[str, Any]:
    """The marker's arguments as settings (``workload`` may be positional). Raises
    :class:`InvalidArgument` for an unknown argument or too many positional ones."""
    if marker is None:
        return {}
    kwargs = dict(marker.kwargs)
    if len(marker.args) > 1:
        raise InvalidArgument(f"@crashmatrix takes the workload as its only positional argument, got {marker.args!r}")
    if marker.args:
        kwargs["workload"] = marker.args[0]
    unknown = sorted(set(kwargs) - set(MARKER_KEYS))
    if unknown:
        raise InvalidArgument(f"@crashmatrix got unknown argument(s) {', '.join(unknown)}; "
                              f"known: {', '.join(MARKER_KEYS)}")
    return kwargs


def resolve_settings(config: pytest.Config, marker: pytest.Mark | None = None) -> MatrixSettings:
    """Every setting from, in increasing precedence: the ini file, the environment, the
    command line, the test's ``crashmatrix`` marker. The one place precedence lives.

    Raises :class:`InvalidArgument` naming the setting, where it came from and what was
    wrong (``crashmatrix_kinds (ini)='kil': each item must be one of ...``)."""
    from_marker = marker_kwargs(marker)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for s in SETTINGS:
        raw, where = None, "default"
        ini_value = config.getini(s.ini)
        if ini_value not in (None, "", []):
            raw, where = ini_value, f"{s.ini} (ini)"
        env_value = os.environ.get(s.env)
        if env_value:
            raw, where = env_value, f"{s.env} (environment)"
        cli_value = config.getoption(s.ini, None)
        if cli_value is not None:
            raw, where = cli_value, f"{s.option} (command line)"
        if s.key in from_marker:
            raw, where = from_marker[s.key], f"{s.key}= (marker)"
        if raw is None:
            values[s.key] = s.default
        else:
            try:
                values[s.key] = s.parse(raw)
            except CrashmatrixError as exc:
                raise InvalidArgument(f"{where}={raw!r}: {exc}") from None
        origin[s.key] = where
    if values["seed"] is None:
        values["seed"] = _session_seed(config)
        origin["seed"] = "drawn for this run"
    return MatrixSettings(**values, origin=origin)


_SEED_KEY = pytest.StashKey[int]()


def _session_seed(config: pytest.Config) -> int:
    """The run's seed when none is set: the controller's (handed to xdist workers in
    ``workerinput``), else drawn once per run."""
    if _SEED_KEY not in config.stash:
        workerinput = getattr(config, "workerinput", None)
        if workerinput and "crashmatrix_seed" in workerinput:
            config.stash[_SEED_KEY] = int(workerinput["crashmatrix_seed"])
        else:
            config.stash[_SEED_KEY] = random.Random().getrandbits(32)
    return config.stash[_SEED_KEY]


def seed_was_given(config: pytest.Config) -> bool:
    """True when the run's seed came from the ini file, the environment or the command
    line, not drawn (:func:`resolve_settings`)."""
    return _state(config).settings.origin.get("seed") != "drawn for this run"


# -- per-process state: services, sessions, caches, results ------------------------------


class Services:
    """The live services of this process (one pytest process or one xdist worker):
    one PostgreSQL (``$CRASHMATRIX_PG_DSN`` if set; else embedded, registered with a
    watchdog of its own; in xdist workers one embedded server shared by the run's
    workers, :mod:`.sharedpg`), one :class:`~.live.LiveHarness` per subject and
    workload, and, on request, the embedded fault proxy. Everything starts on first
    use. ``close()`` stops the harnesses, then the fault proxy, PostgreSQL (the shared
    one when its last user leaves) and the watchdog."""

    def __init__(self, seed: int, run_key: str | None = None) -> None:
        self.seed = seed
        #: set in xdist workers (the run's ``testrunuid``): their PostgreSQL is shared
        self.run_key = run_key
        self._shared: Any = None
        self._lock = threading.RLock()
        self._workdir: Path | None = None
        self._watchdog: Any = None
        self.postgres: Any = None
        self._harnesses: dict[tuple[str, str], Any] = {}
        self._failed: dict[tuple[str, str], CrashmatrixError] = {}
        self._restarts = 0
        self._faultproxy: Any = None

    def pg(self) -> Any:
        """The process's :class:`~.services.postgres.PostgresService` (started on first
        call). Raises :class:`~.errors.ServiceError`."""
        import tempfile

        from .services.postgres import start_postgres
        from .services.watchdog import Watchdog

        with self._lock:
            if self.postgres is None:
                if self._watchdog is None:
                    self._watchdog = Watchdog.start()
                    self._workdir = Path(tempfile.mkdtemp(prefix="crashmatrix-pytest-"))
                    self._watchdog.watch_path(self._workdir)
                if self.run_key and not os.environ.get("CRASHMATRIX_PG_DSN"):
                    from .sharedpg import SharedPostgres

                    self._shared = SharedPostgres(self.run_key, self._watchdog)
                    self.postgres = self._shared.acquire()
                else:
                    self.postgres = start_postgres(self._workdir / "pg", watchdog=self._watchdog)
            return self.postgres

    def _restartable_pg(self) -> Any:
        from .services.postgres import start_postgres

        assert self._workdir is not None
        with self._lock:
            self._restarts += 1
            n = self._restarts
        return start_postgres(self._workdir / f"pg-restart-{n}", watchdog=self._watchdog)

    def harness(self, subject: str, workload: str) -> Any:
        """The open :class:`~.live.LiveHarness` of ``subject`` on ``workload``. Raises
        :class:`~.errors.ServiceError` (or the registry's error) when it cannot start;
        the error is kept, so later calls fail at once instead of starting again."""
        from .explorer import Options
        from .live import LiveHarness

        with self._lock:
            key = (subject, workload)
            if key in self._failed:
                raise self._failed[key]
            if key not in self._harnesses:
                try:
                    pg = self.pg()
                    restartable = pg.restartable or self._shared is not None
                    self._harnesses[key] = LiveHarness(
                        subject, workload, dsn=pg.dsn, restartable_pg=self._restartable_pg if restartable else None,
                        options=Options(proxy_seed=self.seed),
                    ).open()
                except CrashmatrixError as exc:
                    self._failed[key] = exc
                    raise
            return self._harnesses[key]

    def faultproxy_url(self) -> str:
        """``$TOXIPROXY_URL`` if set, else the URL of an embedded Toxiproxy-compatible
        fault proxy seeded with the run's seed (started on first call)."""
        url = os.environ.get("TOXIPROXY_URL")
        if url:
            return url
        with self._lock:
            if self._faultproxy is None:
                from .faultproxy import EmbeddedToxiproxy

                self._faultproxy = EmbeddedToxiproxy(seed=self.seed)
                self._faultproxy.start()
            return str(self._faultproxy.url)

    def close(self) -> None:
        import shutil

        with self._lock:
            errors = []
            for h in self._harnesses.values():
                try:
                    h.close()
                except Exception as exc:  # keep closing the rest
                    errors.append(exc)
            self._harnesses.clear()
            if self._faultproxy is not None:
                self._faultproxy.stop()
                self._faultproxy = None
            if self._shared is not None:
                self._shared.release()
                self._shared = None
            elif self.postgres is not None:
                self.postgres.close()
            self.postgres = None
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                if self._watchdog is not None:
                    self._watchdog.forget_path(self._workdir)
                self._workdir = None
            if self._watchdog is not None:
                self._watchdog.close()
                self._watchdog = None
            if errors:
                raise errors[0]


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
    """The parameter of one matrix item (``request.param`` of ``crashmatrix_case``)."""

    case: Case
    subject: str
    matrix: MatrixKey


class State:
    """The plugin's per-process state (``config.stash``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = resolve_settings(config)
        workerinput = getattr(config, "workerinput", None)
        self.services = Services(self.settings.seed, workerinput.get("testrunuid") if workerinput else None)
        #: (workload, subject) -> conversation -> the cached trace the ids came from
        self.expected: dict[tuple[str, str], dict[str, list[tuple[str, str, str, int]]]] = {}
        self.cache_files: dict[tuple[str, str], str] = {}
        self.checked_goldens: set[tuple[str, str, str]] = set()
        self._sources: dict[tuple[str, str], Any] = {}
        #: reports of matrix items, collected in the controller (or the only process)
        self.records: list[dict[str, Any]] = []
        self.prefetcher: Prefetcher | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """In a run without xdist, keep ``jobs`` cases of the coming matrix items in
        flight (:class:`Prefetcher`); xdist workers run one case at a time each."""
        jobs = self.settings.jobs or 2 * (os.cpu_count() or 1)
        if hasattr(self.config, "workerinput") or jobs <= 1 or session.config.option.collectonly:
            return
        queue = [(item.nodeid, item.callspec.params["crashmatrix_case"]) for item in session.items
                 if isinstance(getattr(item, "callspec", None) and item.callspec.params.get("crashmatrix_case"),
                               CaseParam)]
        if len(queue) > 1:
            self.prefetcher = Prefetcher(self, queue, jobs)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect each matrix item's record (in the controller: xdist workers send
        theirs with their reports)."""
        records = getattr(report, "crashmatrix", None)
        if not records or report.when != "call" or hasattr(self.config, "workerinput"):
            return
        self.records += [{**r, "pytest_outcome": report.outcome} for r in records]

    def live_golden(self, subject: str, workload: str, conversation: str) -> tuple[Any, GoldenRun]:
        """The live harness of ``subject`` on ``workload`` and its golden run of
        ``conversation`` (started and run on first use)."""
        harness = self.services.harness(subject, workload)
        return harness, harness.golden(conversation)

    def golden_mismatch(self, subject: str, workload: str, conversation: str, golden: GoldenRun) -> str | None:
        """Why this session's golden trace does not match the cached one the test ids
        were collected from (a message), or None."""
        from .goldencache import trace_mismatch

        expected = self.expected.get((workload, subject), {}).get(conversation)
        if expected is None or (workload, subject, conversation) in self.checked_goldens:
            return None
        mismatch = trace_mismatch(expected, golden.trace)
        if mismatch:
            return (f"the golden trace of {workload}/{conversation} on {subject} differs from the cached one the "
                    f"test ids were collected from ({self.cache_files.get((workload, subject))}): {mismatch}; "
                    f"delete the cache directory or make the run deterministic")
        self.checked_goldens.add((workload, subject, conversation))
        return None

    @property
    def cache_dir(self) -> Path:
        if self.settings.cache_dir:
            return Path(self.settings.cache_dir)
        return Path(self.config.rootpath) / ".crashmatrix_cache"

    def sources(self, subject: str, workload: str) -> Any:
        from .sources import subject_sources

        key = (subject, workload)
        if key not in self._sources:
            self._sources[key] = subject_sources(subject, workload)
        return self._sources[key]

    def golden_traces(self, workload: str, subject: str, conversations: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """The cached golden entries collection needs (trace, network section), from the
        cache or computed under its lock in this process's own harness (which then runs
        this process's cases)."""
        from .goldencache import cache_path, load_traces

        code_hash = self.sources(subject, workload).code_hash()

        def compute(missing: list[str]) -> dict[str, dict[str, Any]]:
            from . import registry
            from .netfaults import net_cases

            harness = self.services.harness(subject, workload)
            providers = tuple(registry.workload(workload).providers)
            out = {}
            for conv in missing:
                g = harness.golden(conv)
                out[conv] = {"trace": g.trace, "seconds": g.seconds,
                             "net_cases": [c.id for c in net_cases(workload, {conv: g}, providers)]}
            return out

        entries, _ = load_traces(self.cache_dir, workload, subject, code_hash, conversations, compute)
        self.expected.setdefault((workload, subject), {}).update({c: e["trace"] for c, e in entries.items()})
        self.cache_files[(workload, subject)] = str(cache_path(self.cache_dir, workload, subject, code_hash))
        return entries


class Prefetcher:
    """Runs the cases of the coming matrix items ahead of pytest, at most ``jobs`` in
    flight, in the order pytest will run the items (``session.items``), so a serial
    pytest run has the CLI's parallelism. An item takes its result when it runs; a
    case whose golden trace does not match the cache, or whose services cannot start,
    is left for its item to run (and fail) itself."""

    def __init__(self, state: State, queue: list[tuple[str, CaseParam]], jobs: int) -> None:
        import collections

        self._state = state
        self._queue = collections.deque(queue)
        self._futures: dict[str, Any] = {}
        self.jobs = jobs

    def _fill(self) -> None:
        while self._queue and sum(not f.done() for f in self._futures.values()) < self.jobs:
            nodeid, param = self._queue.popleft()
            case = param.case
            try:
                harness, golden = self._state.live_golden(param.subject, case.workload, case.conversation)
            except CrashmatrixError:
                continue
            if self._state.golden_mismatch(param.subject, case.workload, case.conversation, golden):
                continue
            assert harness.explorer is not None
            self._futures[nodeid] = harness.submit(harness.explorer.run_case(case, golden))

    def take(self, nodeid: str) -> CaseResult | None:
        """The result of ``nodeid``'s case (waiting for it), or None when it was not
        prefetched; launches more cases first."""
        self._fill()
        future = self._futures.pop(nodeid, None)
        if future is None:
            return None
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def cancel(self) -> None:
        """Cancel every case not taken; wait for them to unwind."""
        import concurrent.futures

        self._queue.clear()
        pending = list(self._futures.values())
        for f in pending:
            f.cancel()
        concurrent.futures.wait(pending, timeout=30)
        self._futures.clear()


_STATE_KEY = pytest.StashKey[State]()


def _state(config: pytest.Config) -> State:
    return config.stash[_STATE_KEY]


# -- the case handle ----------------------------------------------------------------------


class MatrixCase:
    """What a matrix test receives as ``crashmatrix_case``: one case, not yet run.

    ``case`` (a :class:`~.plan.Case`), ``subject``, ``id`` (the case id). :meth:`run`
    runs it once (later calls return the same :class:`~.explorer.CaseResult`);
    :meth:`check` runs it and fails the test unless every check was valid."""

    def __init__(self, param: CaseParam, state: State, item: pytest.Item) -> None:
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
        state, case = self._state, self.case
        try:
            harness, golden = state.live_golden(self.subject, case.workload, case.conversation)
        except CrashmatrixError as exc:
            pytest.fail(f"crashmatrix: {self.subject} on {case.workload}: {exc}", pytrace=False)
        mismatch = state.golden_mismatch(self.subject, case.workload, case.conversation, golden)
        if mismatch:
            pytest.fail(mismatch, pytrace=False)
        prefetched = state.prefetcher.take(self._item.nodeid) if state.prefetcher else None
        self.result = prefetched or harness.run_case(case)
        m = self.matrix
        self._record = record_case(self._item, self.result, test=m.test, kinds=m.kinds, sources=m.sources,
                                   conversations=m.conversations, shard=m.shard)
        props = self._item.user_properties
        props += [("crashmatrix_case", self.id), ("crashmatrix_subject", self.subject),
                  ("crashmatrix_outcome", self.result.outcome), ("crashmatrix_replay", self.result.replay)]
        if self._record["failed_check"]:
            props.append(("crashmatrix_failed_check", self._record["failed_check"]))
        return self.result

    def check(self) -> CaseResult:
        """Run the case (if not yet) and fail the test unless it passed: the message's
        first line names the case, the failed check and the replay command; then every
        failed check with details and a small diff, the crash point's location, and how
        each worker ended (:func:`.report.failure_text`)."""
        from .report import failure_text

        result = self.run()
        self.checked = True
        if result.outcome != "pass":
            pytest.fail(failure_text(self._record), pytrace=False)
        return result


_RECORDS_KEY = pytest.StashKey[list]()
_CASE_KEY = pytest.StashKey[MatrixCase]()


def record_case(
    item: pytest.Item, result: CaseResult, *, test: str, kinds: Sequence[str], sources: Sequence[str],
    conversations: Sequence[str] | None = None, shard: str | None = None,
) -> dict[str, Any]:
    """Keep ``result`` for the reports: a :func:`.report.case_record` (with the crash
    point's source location) plus the item's node id and the matrix it belongs to
    (``test``: the marked or property test's node id). Travels to the xdist controller
    with the item's report. Returns the record."""
    from .report import case_record
    from .sources import point_location

    state = _state(item.config)
    case = result.case
    point = case.plan.faults[0].point
    location = point_location(point.name, point.source, state.sources(result.subject, case.workload))
    record = case_record(result, location)
    record["nodeid"] = item.nodeid
    record["matrix"] = {
        "test": test, "workload": case.workload, "subject": result.subject, "kinds": list(kinds),
        "sources": list(sources), "conversations": list(conversations or (case.conversation,)), "shard": shard,
        "golden_points": {case.conversation: len(state.services.harness(result.subject, case.workload)
                                                 .golden(case.conversation).trace)},
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
    seed=7)``. Arguments are checked at collection (:func:`marker_kwargs`)."""
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
        "crashmatrix(workload, subject=, kinds=, sources=, conversations=, shard=, seed=): expand the test into "
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
        node.workerinput["crashmatrix_seed"] = _state(node.config).settings.seed


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop this process's services if the session did not (a usage error before it
    started; idempotent)."""
    state = config.stash.get(_STATE_KEY, None)
    if state is not None:
        state.services.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The seed (and how to reuse it), kinds, sources, shard and cache directory."""
    s = _state(config).settings
    lines = [f"crashmatrix: seed={s.seed} (reuse with --crashmatrix-seed={s.seed}); {s.origin.get('seed')}"]
    lines.append(f"crashmatrix: kinds={','.join(s.kinds)} sources={','.join(s.sources)}"
                 + (f" shard={s.shard}" if s.shard else "") + f" cache={_state(config).cache_dir}")
    return lines


def _collect_error(metafunc: pytest.Metafunc, message: str) -> pytest.Collector.CollectError:
    return pytest.Collector.CollectError(f"{metafunc.definition.nodeid}: crashmatrix: {message}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Expand a test marked ``crashmatrix`` into its matrix: settings resolved with
    the marker, golden traces from the cache (computed under its lock when missing),
    :func:`.explorer.enumerate_cases`, the shard; one item per case, ids from
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
    try:
        s = resolve_settings(metafunc.config, marker)
        from . import registry

        wl = registry.workload(s.workload)
        registry.subject(s.subject)
        conversations = s.conversations or tuple(wl.conversations)
        unknown = [c for c in conversations if c not in wl.conversations]
        if unknown:
            raise InvalidArgument(f"conversation(s) {', '.join(unknown)} not in {s.workload}: "
                                  f"{', '.join(wl.conversations)}")
        entries = state.golden_traces(s.workload, s.subject, conversations)
    except CrashmatrixError as exc:
        raise _collect_error(metafunc, str(exc)) from None
    from .explorer import enumerate_cases, shard

    goldens = {c: _TraceOnly(e["trace"]) for c, e in entries.items()}
    cases = enumerate_cases(s.workload, goldens, tuple(k for k in s.kinds if k != "net"), s.sources)  # type: ignore[arg-type]
    if "net" in s.kinds and "label" in s.sources:  # the network section, as enumerate_cases appends it
        cases += [Case.parse(cid) for c in sorted(entries) for cid in entries[c]["net_cases"]]
    if s.shard:
        cases = shard(cases, s.shard)
    key = MatrixKey(metafunc.definition.nodeid, s.workload, s.subject, s.kinds, s.sources, conversations, s.shard)
    metafunc.parametrize("crashmatrix_case", [CaseParam(c, s.subject, key) for c in cases],
                         ids=[case_param_id(c) for c in cases], indirect=True, scope="function")


@dataclass
class _TraceOnly:
    """What enumeration reads of a golden run at collection: its trace (the network
    section, which needs the golden evidence, comes from the cache as case ids)."""

    trace: list[Any]


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


def build_report(state: State) -> dict[str, Any]:
    """The plugin's JSON report: ``{"version": 1, "seed": int, "matrices": [matrix]}``,
    each matrix shaped as :meth:`.matrix.MatrixReport.to_dict` (workload, subject,
    kinds, sources, summary, golden, cases) plus ``test`` (the marked test's node id),
    ``conversations`` and ``shard``; each case as :meth:`.explorer.CaseResult.to_dict`
    plus ``nodeid`` and ``location``."""
    from .report import matrix_dict

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for rec in state.records:
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
        d.update(test=test, conversations=m["conversations"], shard=m["shard"])
        matrices.append(d)
    return {"version": 1, "seed": state.settings.seed, "matrices": matrices}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Cancel prefetched cases whose items never ran (``-x``, Ctrl-C); write the JSON
    and HTML reports (the controller, or the only process); stop this process's
    services. Here and not at unconfigure: an xdist worker is ended soon after it
    reports its session finished, before its unconfigure hooks would run. Last, so
    session-scoped fixtures that use the harness are torn down first."""
    config = session.config
    state = _state(config)
    try:
        if state.prefetcher is not None:
            state.prefetcher.cancel()
        if not hasattr(config, "workerinput"):
            _write_reports(state)
    finally:
        state.services.close()


def _write_reports(state: State) -> None:
    s = state.settings
    if not state.records or not (s.report or s.html):
        return
    import json

    from .html_report import write_html

    data = build_report(state)
    if s.report:
        path = Path(s.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if s.html:
        write_html(data, Path(s.html))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line: cases passed, failed, harness errors, the seed, the report paths."""
    state = config.stash.get(_STATE_KEY, None)
    if state is None or not state.records or hasattr(config, "workerinput"):
        return
    counts = {"pass": 0, "fail": 0, "harness-error": 0}
    for r in state.records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    line = (f"crashmatrix: {len(state.records)} cases: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['harness-error']} harness errors; seed {state.settings.seed}")
    for label, path in (("report", state.settings.report), ("html", state.settings.html)):
        if path:
            line += f"; {label}: {path}"
    terminalreporter.write_line(line)


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def crashmatrix_seed(pytestconfig: pytest.Config) -> int:
    """The run's seed (``--crashmatrix-seed``; shown in the pytest header)."""
    return _state(pytestconfig).settings.seed


@pytest.fixture(scope="session")
def crashmatrix_postgres(pytestconfig: pytest.Config) -> Any:
    """This process's PostgreSQL (:class:`~.services.postgres.PostgresService`;
    ``.dsn``), shared by every harness session of the process; per xdist worker."""
    return _state(pytestconfig).services.pg()


@pytest.fixture(scope="session")
def crashmatrix_faultproxy(pytestconfig: pytest.Config) -> str:
    """Base URL of a Toxiproxy-compatible fault proxy API: ``$TOXIPROXY_URL``, else
    the embedded one, seeded with the run's seed; per xdist worker."""
    return _state(pytestconfig).services.faultproxy_url()


@pytest.fixture(scope="session")
def crashmatrix_harness(pytestconfig: pytest.Config) -> Services:
    """The process's :class:`Services`: ``.harness(subject, workload)`` gives an open
    :class:`~.live.LiveHarness` (golden runs, ``run_case``) on live services."""
    return _state(pytestconfig).services


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
