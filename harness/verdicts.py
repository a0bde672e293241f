"""The compositions of checks the case flow calls: :func:`crash_verdicts` after each
faulted worker (the crash state), :func:`end_verdicts` after the last resume.

Each composes declared checks (:mod:`.checks`): the generic ones of :mod:`.oracle` and
:mod:`.invariants`, the fault kind's own (:meth:`.faults.FaultKind.crash_checks`), a
scripted operator's (:mod:`.human`) and a build pair's (:mod:`.builds`). This module
sits above every module that defines a check, so none of them imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import fault_registry, invariants, oracle
from .checks import Verdict
from .human import end_checks as human_checks
from .normalize import IdentifierModel
from .oracle import CrashEvidence, Evidence


def crash_verdicts(ev: CrashEvidence) -> list[Verdict]:
    """Every crash-state check that applies to the fault of ``ev``: the generic ones
    (:func:`.oracle.generic_crash_checks`), then the fault kind's own
    (:meth:`.faults.FaultKind.crash_checks`)."""
    return oracle.generic_crash_checks(ev) + fault_registry.kind(ev.fault.kind).crash_checks(ev)


@dataclass
class EndContext:
    """What the end checks of one case read: the golden run's evidence and the
    identifiers its pair taught (None: only the declared places), the case's final
    evidence, its model-call ``allowance`` (node -> calls in flight at a fault), its
    ``result`` (:class:`.case.CaseResult`: plan, workers, verdicts so far), the
    ``adapter`` (:class:`.adapter.Adapter`) and ``workload`` it ran, and for a build
    pair the ``upgrade`` (:class:`.builds.Upgrade`; None: one build)."""

    golden: Evidence
    final: Evidence
    allowance: dict[str, int]
    result: Any
    adapter: Any
    workload: Any
    identifiers: IdentifierModel | None = None
    upgrade: Any = None


def end_verdicts(cx: EndContext) -> list[Verdict]:
    """The end checks of a case: against the golden run (identifiers renamed as the
    golden pair taught, :func:`.oracle.end_checks`), the invariants
    (:func:`.invariants.end_invariants`), the human-in-the-loop checks of a workload
    with a scripted operator (:mod:`.human`), and for a build pair ``upgrade.migrated``
    (:mod:`.builds`)."""
    verdicts = oracle.end_checks(cx.golden, cx.final, cx.allowance, cx.identifiers)
    verdicts += invariants.end_invariants(cx.final, cx.allowance)
    script = getattr(cx.workload, "operator_script", None)
    if script is not None:
        verdicts += human_checks(script, cx.final, cx.golden, len(cx.result.case.plan.faults))
    if cx.upgrade is not None:
        from .builds import MIGRATED, check_migrated  # the build machinery, for build pairs only

        declared_statuses = tuple(getattr(cx.adapter, "cannot_migrate_statuses", ()) or ())
        upgrade, golden, final, result = cx.upgrade, cx.golden, cx.final, cx.result
        verdicts.append(MIGRATED.run(lambda: check_migrated(golden, final, result, upgrade, declared_statuses)))
    return verdicts
