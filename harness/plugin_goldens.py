"""The golden traces the pytest plugin collects from, and the check that a live
session's golden run still matches them.

Collection needs every golden trace of a marked test's matrix before any case runs:
they come from the on-disk cache (:mod:`.goldencache`, keyed by the code hash of the
subject's and workload's sources) or are computed under its file lock by this
process's own harness, which then runs this process's cases. A live session runs its
own golden runs before its first case (the oracle compares with them);
:meth:`CollectionGoldens.mismatch` says when one differs from the cached trace the
test ids were collected from (a case then fails with that message instead of running
against another matrix than the one collected).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .defaults import DEFAULT_SEED, DefaultMatrix
from .plan import Case, Resume

if TYPE_CHECKING:
    from .golden import GoldenRun
    from .plugin_services import Services
    from .sources import SourceSet

TraceEntry = tuple[str, str, str, int]


class CollectionGoldens:
    """The golden traces of this process's collection, per workload and subject.

    ``cache_dir``: the golden-trace cache's directory; ``services``: the process's
    services, whose harnesses compute missing traces."""

    def __init__(self, services: Services, cache_dir: Path) -> None:
        self.services = services
        self.cache_dir = cache_dir
        #: (workload, subject) -> conversation -> the cached trace the ids came from
        self.expected: dict[tuple[str, str], dict[str, list[TraceEntry]]] = {}
        self.cache_files: dict[tuple[str, str], str] = {}
        self._checked: set[tuple[str, str, str]] = set()
        self._sources: dict[tuple[str, str], SourceSet] = {}

    def sources(self, subject: str, workload: str) -> SourceSet:
        """The source files of ``subject`` on ``workload`` (:func:`.sources.subject_sources`;
        read once per process)."""
        from .sources import subject_sources

        key = (subject, workload)
        if key not in self._sources:
            self._sources[key] = subject_sources(subject, workload)
        return self._sources[key]

    def traces(self, workload: str, subject: str, conversations: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """The cached golden entries collection needs, per conversation: ``trace`` and
        ``net_cases`` (the network section's case ids) and ``states`` (each trace entry's
        crash state, :func:`.defaults.crash_states`), from the cache or computed under
        its lock in this process's own harness. Raises what the harness raises
        (``ServiceError``, ``HarnessError``) when a trace must be computed and cannot."""
        from .goldencache import cache_path, load_traces

        code_hash = self.sources(subject, workload).code_hash()

        def compute(missing: list[str]) -> dict[str, dict[str, Any]]:
            from . import registry
            from .defaults import crash_states
            from .netfaults import net_cases

            harness = self.services.harness(subject, workload)
            providers = tuple(registry.workload(workload).providers)
            out = {}
            for conv in missing:
                g = harness.golden(conv)
                out[conv] = {"trace": g.trace, "seconds": g.seconds, "states": crash_states(g),
                             "net_cases": [c.id for c in net_cases(workload, {conv: g}, providers)]}
            return out

        entries, _ = load_traces(self.cache_dir, workload, subject, code_hash, conversations, compute)
        self.expected.setdefault((workload, subject), {}).update({c: e["trace"] for c, e in entries.items()})
        self.cache_files[(workload, subject)] = str(cache_path(self.cache_dir, workload, subject, code_hash))
        return entries

    def mismatch(self, subject: str, workload: str, conversation: str, golden: GoldenRun) -> str | None:
        """Why this session's golden trace of ``conversation`` does not match the cached
        one the test ids were collected from (a message), or None (checked once per
        subject, workload and conversation)."""
        from .goldencache import trace_mismatch

        expected = self.expected.get((workload, subject), {}).get(conversation)
        if expected is None or (workload, subject, conversation) in self._checked:
            return None
        found = trace_mismatch(expected, golden.trace)
        if found:
            return (f"the golden trace of {workload}/{conversation} on {subject} differs from the cached one the "
                    f"test ids were collected from ({self.cache_files.get((workload, subject))}): {found}; "
                    f"delete the cache directory or make the run deterministic")
        self._checked.add((workload, subject, conversation))
        return None


def collected_cases(workload: str, entries: dict[str, dict[str, Any]], matrix: DefaultMatrix,
                    sources: tuple[str, ...], resume: Resume | None = None, seed: int = DEFAULT_SEED) -> list[Case]:
    """The matrix of a marked test from its cached golden entries (:meth:`CollectionGoldens.traces`):
    :meth:`.defaults.DefaultMatrix.cases` on the cached traces (``matrix.kinds`` at every
    point, then its samples drawn with ``seed``), with the cached network section (which
    needs the golden runs' ledgers, not cached) given as case ids and the cached crash
    states (which need their I/O marks); every case under the resume policy ``resume``
    (default: the default policy). The same entries and seed give the cases ``crashmatrix
    run`` enumerates from the same golden runs."""
    goldens = {c: _TraceOnly(e["trace"]) for c, e in entries.items()}
    net = [Case.parse(cid) for c in sorted(entries) for cid in entries[c].get("net_cases", [])]
    states = {c: e["states"] for c, e in entries.items() if len(e.get("states") or ()) == len(e["trace"])}
    cases, _ = matrix.cases(workload, goldens, sources, resume or Resume(), seed,  # type: ignore[arg-type]
                            net=net, states=states)
    return cases


class _TraceOnly:
    """What enumeration reads of a golden run at collection: its trace (no I/O marks:
    without cached states, every point is a crash state of its own)."""

    io = None

    def __init__(self, trace: list[Any]) -> None:
        self.trace = trace
