"""One matrix run's settings, checked before anything starts.

:class:`RunSettings` is what :func:`.matrix.run` takes: the names (:class:`.names.Names`),
the matrix's shape (:class:`.defaults.DefaultMatrix`) or the cases given, the session's
:class:`.explorer.Options` (crash-state pruning among them, :class:`.pruning.PruneOptions`),
and how the cases run (jobs, replays, depth, shard, coverage). :meth:`RunSettings.of`
builds it from keywords (what ``crashmatrix run`` and ``replay`` parse, what
:func:`.matrix.run_matrix` is called with) and refuses a bad one with one line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .defaults import DefaultMatrix, default_matrix
from .errors import InvalidArgument, PlanError
from .explorer import Options
from .names import Names, resolve
from .plan import DEFAULT_KINDS, DEFAULT_SOURCES, Case, Resume

@dataclass(frozen=True)
class RunSettings:
    """A matrix run, resolved and checked (:meth:`of`).

    ``names``: workload, subject, kinds run at every point, sources, conversations;
    ``matrix``: the shape (those kinds and the sampled ones); ``cases``: the cases
    given instead of enumerated (None: enumerate); ``jobs``: cases at once;
    ``spare_jobs``: up to that many more while the machine's cores idle
    (:class:`.runner.CaseLoop`; the default's when ``jobs`` was not given, else 0); ``dsn``:
    the user's PostgreSQL (None: an embedded one); ``options``: the session's;
    ``depth`` 2 adds double faults (``sample`` of them, drawn with ``seed``, which also
    draws the matrix's samples); ``shard``: ``"K/N"``; ``replay_failures``: replays of a
    failing case; ``require_coverage``: an unreached recovery branch fails the run;
    ``resume``: the resume policy of the enumerated cases."""

    names: Names
    matrix: DefaultMatrix
    jobs: int
    options: Options = field(default_factory=Options)
    cases: tuple[Case, ...] | None = None
    dsn: str | None = None
    depth: int = 1
    sample: int | None = None
    seed: int = 0
    shard: str | None = None
    replay_failures: int = 1
    require_coverage: bool = False
    resume: Resume = Resume()
    spare_jobs: int = 0

    @property
    def kinds_used(self) -> set[str]:
        """The fault kinds the run's cases may hold: the given cases', else the matrix's."""
        if self.cases is not None:
            return {f.kind for c in self.cases for f in c.plan.faults}
        return set(self.matrix.all_kinds)

    @property
    def wants_proxy(self) -> bool:
        """Whether a case may need the session's fault proxy (a kind of
        ``FaultKind.needs_fault_proxy``: net, db-outage)."""
        from .fault_registry import find

        return any(getattr(find(k), "needs_fault_proxy", False) for k in self.kinds_used)

    @classmethod
    def of(
        cls, workload: str | Names = "checkout", subject: str = "reference", *,
        kinds: tuple[str, ...] | None = None, sources: tuple[str, ...] = DEFAULT_SOURCES,
        conversations: tuple[str, ...] | None = None, cases: list[Case] | None = None, jobs: int | None = None,
        dsn: str | None = None, options: Options | None = None, depth: int = 1, sample: int | None = None,
        seed: int = 0, shard: str | None = None, replay_failures: int = 1, require_coverage: bool = False,
        resume: Resume = Resume(), sampled_kinds: Mapping[str, int] | None = None,
        sampled_policies: Mapping[str, int] | None = None, matrix: DefaultMatrix | None = None,
    ) -> RunSettings:
        """The settings of a run (the keywords as :func:`.matrix.run_matrix` documents
        them), checked: names by :func:`.names.resolve` (or ``workload`` the
        :class:`.names.Names` a caller resolved, the other four then at their defaults),
        the shape (``matrix``, else :func:`.defaults.default_matrix`; ``sampled_kinds``
        and ``sampled_policies`` set its samples by hand), the shard spec, the outage
        windows; ``options`` get await points traced when a source or a given case needs
        them; ``jobs`` None: twice the cores, and as many spare lanes. Raises ``PlanError``, ``InvalidArgument``
        or ``RegistryError``, one line."""
        from .faults.db_outage import check_windows

        if replay_failures < 0:
            raise PlanError(f"replay_failures={replay_failures!r} must be >= 0")
        if depth not in (1, 2):
            raise PlanError(f"depth={depth!r} must be 1 or 2")
        names = _names(workload, subject, kinds, sources, conversations, matrix)
        if matrix is None:
            named = kinds is not None or isinstance(workload, Names)
            matrix = default_matrix(names.kinds if named else None, resume=resume, dsn=dsn)
        elif matrix.kinds != names.kinds:
            raise InvalidArgument(f"run_matrix: matrix.kinds={matrix.kinds!r} differ from the kinds named, {names.kinds!r}")
        if sampled_kinds is not None or sampled_policies is not None:
            matrix = DefaultMatrix(names.kinds, tuple((sampled_kinds or {}).items()),
                                   tuple((sampled_policies or {}).items()))
        if shard:
            from .enumeration import shard as shard_cases

            shard_cases(list(range(1)), shard)  # validates K/N before anything starts
        options = options or Options()
        wants_awaits = "await" in names.sources or any(f.point.source == "await" for c in cases or []
                                                       for f in c.plan.faults)
        if wants_awaits and not options.await_points:
            options = dataclasses.replace(options, await_points=True)
        check_windows(cases, matrix.all_kinds, options.worker_timeout, options.outage_window_ms)
        # twice the cores in flight keeps a CPU-bound matrix's cores busy (checkout); a
        # workload whose cases wait (support_desk's held charges) leaves them idle, which
        # the spare lanes fill (docs/benchmarks.md)
        default = 2 * (os.cpu_count() or 1)
        return cls(names, matrix, jobs or default, options, None if cases is None else tuple(cases),
                   dsn, depth, sample, seed, shard, replay_failures, require_coverage, resume,
                   0 if jobs else default)


def _names(workload: str | Names, subject: str, kinds: tuple[str, ...] | None, sources: tuple[str, ...],
           conversations: tuple[str, ...] | None, matrix: DefaultMatrix | None) -> Names:
    """``workload`` when it is resolved :class:`.names.Names` already (the other names
    then at their defaults, else :class:`InvalidArgument`), else the names resolved;
    ``kinds`` None: the matrix's kinds at every point (default: the default kinds)."""
    if isinstance(workload, Names):
        if (subject, kinds, sources, conversations) != ("reference", None, DEFAULT_SOURCES, None):
            raise InvalidArgument("run_matrix: give the names either resolved (Names) or one by one, not both")
        return workload
    every = (matrix.kinds if matrix is not None else DEFAULT_KINDS) if kinds is None else kinds
    return resolve(workload, subject, kinds=every, sources=sources, conversations=conversations)
