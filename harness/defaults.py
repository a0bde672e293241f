"""The default matrix, defined once: what a matrix runs when no fault kinds are named.

``crashmatrix run WORKLOAD``, :func:`.matrix.run_matrix` with no ``kinds``, and a
``@pytest.mark.crashmatrix`` test with no kinds set (:mod:`.plugin`) all take their cases
from one :class:`DefaultMatrix`, built by :func:`default_matrix`:

- :data:`.plan.DEFAULT_KINDS` (kill, term, cancel) at every crash point;
- each of :data:`.plan.SAMPLED_KINDS` (pause, db-restart, net, cancel-edge, cancel-api) as a seeded
  sample of ``kind_sample`` cases (:func:`.matrix.sample_by_kind`); db-restart is left
  out on a user's PostgreSQL (``--dsn`` or ``$CRASHMATRIX_PG_DSN``): it crashes and
  restarts the server, which only the embedded one may be;
- each of :data:`.plan.SAMPLED_POLICIES` (concurrent, warm-worker, same-worker) as
  ``kind_sample`` cases resumed that way (:func:`.matrix.sample_by_policy`), when the
  run's resume policy is the default one.

Kinds named (``--kinds``, ``kinds=``) run whole at every point and nothing is sampled.
:meth:`DefaultMatrix.cases` enumerates the cases from golden runs or from the plugin's
cached traces, so every path gives the same ids for the same traces and seed. Imports
nothing heavy (the plugin reads it at collection).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .plan import DEFAULT_KIND_SAMPLE, DEFAULT_KINDS, SAMPLED_KINDS, SAMPLED_POLICIES, Case, Resume

if TYPE_CHECKING:
    from .golden import GoldenRun

DEFAULT_SEED = 0
"""The seed samples are drawn with when a run names none (``crashmatrix run``'s
``--seed`` default; the plugin's, when its seed is drawn for the run: collected ids
must not change from run to run or between CI jobs)."""


@dataclass(frozen=True)
class DefaultMatrix:
    """The shape of a matrix: ``kinds`` at every crash point; ``sampled_kinds`` and
    ``sampled_policies``, ``(name, n)`` pairs in the order they are drawn: n cases of
    that fault kind, n cases resumed under that policy (a :meth:`.plan.Resume.parse`
    spec). Frozen: one value, shared by every path that builds a matrix."""

    kinds: tuple[str, ...] = DEFAULT_KINDS
    sampled_kinds: tuple[tuple[str, int], ...] = ()
    sampled_policies: tuple[tuple[str, int], ...] = ()

    @property
    def all_kinds(self) -> tuple[str, ...]:
        """Every fault kind the matrix can hold: ``kinds``, then the sampled ones not
        among them (a report's ``kinds``)."""
        return self.kinds + tuple(k for k, _ in self.sampled_kinds if k not in self.kinds)

    def cases(self, workload: str, goldens: Mapping[str, GoldenRun], sources: tuple[str, ...],
              resume: Resume = Resume(), seed: int = DEFAULT_SEED, *, net: list[Case] | None = None,
              states: Mapping[str, Sequence[int]] | None = None) -> tuple[list[Case], list[str]]:
        """The matrix's cases of ``goldens`` (conversation -> a golden run, or anything
        with its ``trace``) and a note per sample (:func:`.matrix.sample_by_kind`'s,
        :func:`.matrix.sample_by_policy`'s): ``kinds`` at every point of ``sources``
        (:func:`.enumeration.enumerate_cases`) under ``resume``, then the sampled kinds,
        then the sampled policies (with ``resume`` the default policy only), drawn with
        ``seed``. ``net``: the network section as cases when the golden runs' ledgers
        are not at hand (the plugin's cache); ``states``: conversation -> the crash
        state of each trace entry (:func:`crash_states`) when the golden runs' I/O marks
        are not at hand. Deterministic: the same traces, states and seed give the same
        list. Raises ``PlanError`` for a bad policy spec."""
        from .enumeration import enumerate_cases
        from .matrix import sample_by_kind, sample_by_policy

        given = dict(goldens)
        cases = enumerate_cases(workload, given, self.kinds, sources, resume, net=net)  # type: ignore[arg-type]
        notes: list[str] = []
        if self.sampled_kinds:
            per_kind = dict(self.sampled_kinds)
            extra = enumerate_cases(workload, given, tuple(per_kind), sources, resume, net=net)  # type: ignore[arg-type]
            picked, line = sample_by_kind(extra, per_kind, seed)
            cases += picked
            notes.append(line)
        if self.sampled_policies and resume.policy == "default":
            picked, line = sample_by_policy(workload, given, dict(self.sampled_policies), sources, seed,
                                            states=states)
            cases += picked
            notes.append(line)
        return cases, notes


def user_dsn(dsn: str | None = None) -> bool:
    """Whether the run's PostgreSQL is a user's: ``dsn`` given, or ``$CRASHMATRIX_PG_DSN``
    (:data:`.services.postgres.DSN_ENV`) set."""
    from .services.postgres import DSN_ENV

    return bool(dsn or os.environ.get(DSN_ENV))


def default_matrix(kinds: Sequence[str] | None = None, *, kind_sample: int = DEFAULT_KIND_SAMPLE,
                   resume: Resume = Resume(), dsn: str | None = None) -> DefaultMatrix:
    """The matrix a run gets. ``kinds`` None: the default (module docstring):
    :data:`.plan.DEFAULT_KINDS` at every point, ``kind_sample`` cases of each of
    :data:`.plan.SAMPLED_KINDS` (not db-restart on a user's PostgreSQL: ``dsn`` or
    ``$CRASHMATRIX_PG_DSN``, :func:`user_dsn`) and, with ``resume`` the default policy,
    ``kind_sample`` cases of each of :data:`.plan.SAMPLED_POLICIES`; ``kind_sample`` 0:
    nothing sampled. ``kinds`` given (names already checked, :func:`.names.resolve`):
    those kinds at every point, nothing sampled. Raises ``PlanError`` for a negative
    ``kind_sample``."""
    if kinds is not None:
        return DefaultMatrix(tuple(kinds))
    if not isinstance(kind_sample, int) or isinstance(kind_sample, bool) or kind_sample < 0:
        from .errors import PlanError

        raise PlanError(f"kind_sample={kind_sample!r} must be an integer >= 0")
    if kind_sample == 0:
        return DefaultMatrix(DEFAULT_KINDS)
    sampled = tuple((k, kind_sample) for k in SAMPLED_KINDS if not (k == "db-restart" and user_dsn(dsn)))
    policies = tuple((p, kind_sample) for p in SAMPLED_POLICIES) if sampled and resume.policy == "default" else ()
    return DefaultMatrix(DEFAULT_KINDS, sampled, policies)


def crash_states(golden: Any) -> list[int]:
    """The crash state of each entry of ``golden.trace`` (the index of its group in
    :func:`.pruning.crash_state_groups`; every entry its own when the golden run carries
    no I/O marks): what :func:`.matrix.sample_by_policy` draws one case per, kept with
    the plugin's cached traces so collection draws what ``crashmatrix run`` does."""
    from .pruning import crash_state_groups

    groups, _ = crash_state_groups(golden)
    at = {tuple(e[1:]): i for i, g in enumerate(groups) for e in g.entries}
    return [at.get(tuple(e[1:]), -1 - n) for n, e in enumerate(golden.trace)]
