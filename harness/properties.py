"""The resume properties each oracle check protects, and the named anomaly each failure
is (docs/checks.md: a paragraph and a minimal example of each).

A check's name is stable (selftest rows, findings and users' CI filters use it); the
property groups checks the way a reader of a conformance table asks ("does this runtime
apply every effect exactly once?"), and the anomaly names what a failure *is* (a
duplicated effect, a lost record), in the manner of Elle's anomaly reports.

:func:`property_of` and :func:`anomaly_of` never raise: an unknown check belongs to the
property ``other`` (a check added without its row here is visible as such).
"""

from __future__ import annotations

from typing import Any

PROPERTIES: dict[str, str] = {
    "effect exactly-once": "every effect the run makes is applied once at its provider: none twice, none lost",
    "effect resolution": "no effect is left started or unknown: each is known applied or not, and recorded with its node",
    "prefix continuation": "a resumed run continues from its durable prefix: no message, answer or bill duplicated or lost",
    "checkpoint validity": "the durable record is a clean prefix of the run, and every acknowledged write is in it",
    "acknowledged runs are durable": "a run the subject accepted exists after any crash",
    "drain": "after SIGTERM no step starts, the steps in flight finish and are recorded, the worker exits 0",
    "fencing": "a worker that lost its lease (a paused zombie) changes nothing durable and applies no effect",
    "resumability": "a run left by a fault resumes to an end within a bounded number of workers",
    "trace continuity": "each resumed invocation's span links to the one it continues",
    "migration": "a run that crashed under one build is finished by the next, or parked by it with a reason",
    "human answers": "each answer a person gave is consumed once, by the interrupt it was given for, and the "
                     "work done beside the interrupt is not done again",
    "cancellation": "a run whose cancel the runtime's own API acknowledged does not run on to the end it would "
                    "have had",
}
"""Property name -> what it promises."""

_CHECKS: dict[str, tuple[str, str]] = {
    "effects.ledger_equal": ("effect exactly-once", "effect ledger differs"),
    "effects.applied_once": ("effect exactly-once", "duplicated effect"),
    "pause.zombie_effects": ("fencing", "zombie effect"),
    "effects.resolved": ("effect resolution", "effect left started/unknown"),
    "cancel.left_unknown": ("effect resolution", "effect left started"),
    "effects.commit_with_record": ("effect resolution", "effect without its record"),
    "transcript.exact": ("prefix continuation", "duplicated or lost message"),
    "state.equal": ("prefix continuation", "diverged state"),
    "run.status": ("prefix continuation", "diverged status"),
    "model.calls_billed": ("prefix continuation", "re-paid model call"),
    "model.answers_recorded": ("prefix continuation", "lost answer"),
    "log.clean_prefix": ("checkpoint validity", "torn log"),
    "log.clean_final": ("checkpoint validity", "torn log"),
    "log.acknowledged_durable": ("checkpoint validity", "lost acknowledged record"),
    "run.acknowledged_durable": ("acknowledged runs are durable", "run lost"),
    "term.drained": ("drain", "failed drain"),
    "term.in_flight_recorded": ("drain", "in-flight work dropped"),
    "pause.zombie_fenced": ("fencing", "zombie write"),
    "run.ends": ("resumability", "stuck run"),
    "resume.runs": ("resumability", "resume crashed"),
    "net.resumable": ("resumability", "run lost to a network fault"),
    "db-outage.resumable": ("resumability", "run given up for a brief outage"),
    "trace.continues": ("trace continuity", "broken trace link"),
    "cancel.step_recorded": ("effect resolution", "step recorded without its effect"),
    "upgrade.migrated": ("migration", "run stranded by a deploy"),
    "interrupt.answers": ("human answers", "answer given to the wrong interrupt"),
    "interrupt.siblings_kept": ("human answers", "completed call run again"),
    "concurrent.one_terminal_status": ("fencing", "two owners disagree"),
    "concurrent.loser_fenced": ("fencing", "two owners ran steps"),
    "concurrent.log_intact": ("checkpoint validity", "interleaved writes"),
    "concurrent.effects_once": ("effect exactly-once", "duplicated effect"),
    "recurring.effects_once": ("effect exactly-once", "duplicated effect"),
    "recurring.bounded": ("resumability", "crash loop"),
    "discovery.found": ("resumability", "abandoned run never recovered"),
    "warm.worker": ("resumability", "state one run left in the process"),
    "same.worker": ("resumability", "a run resumed from what the process kept of it"),
    "worker.warm_path": ("resumability", "state one run left in the process"),
    "worker.stuck": ("resumability", "worker hung after its fault"),
    "cancel.honoured": ("cancellation", "cancel acknowledged and ignored"),
    "cancel.clean_stop": ("cancellation", "cancel raised out of the worker"),
    "cancel.final": ("cancellation", "final cancel left the run open"),
}


def property_of(check: str) -> str:
    """The property ``check`` protects (``provider.<kind>.ledger_equal``: effect
    exactly-once); ``other`` for a check this table does not know."""
    if check.startswith("provider.") and check.endswith(".ledger_equal"):
        return "effect exactly-once"
    return _CHECKS.get(check, ("other", ""))[0]


def anomaly_of(check: str, details: str = "") -> str:
    """The anomaly a failure of ``check`` is, refined by its ``details`` where one check
    finds several (a provider ledger with a row too many is a duplicated effect, one
    too few a lost effect)."""
    if check.startswith("provider.") and check.endswith(".ledger_equal"):
        if "more row" in details or "applied twice" in details or "times where" in details:
            return "duplicated effect"
        if "fewer row" in details:
            return "lost effect"
        return "effect differs"
    if check == "effects.applied_once" and "not recorded" in details:
        return "effect without its record"
    if check == "transcript.exact":
        if "duplicated" in details:
            return "duplicated message"
        if "missing" in details:
            return "lost message"
        return "reordered messages"
    if check == "term.drained" and "launched after" in details:
        return "launch after drain"
    return _CHECKS.get(check, ("other", "failure"))[1] or "failure"


def annotate(verdict: dict[str, Any]) -> dict[str, Any]:
    """A verdict's JSON record with its ``property`` (and, if it failed, ``anomaly``)."""
    out = dict(verdict, property=property_of(verdict["check"]))
    if verdict.get("verdict") != "valid":
        out["anomaly"] = anomaly_of(verdict["check"], verdict.get("details", ""))
    return out
