"""The resume properties each oracle check protects, and the named anomaly each failure
is (docs/checks.md: a paragraph and a minimal example of each).

A check's name is stable (selftest rows, findings and users' CI filters use it); the
property groups checks the way a reader of a conformance table asks ("does this runtime
apply every effect exactly once?"), and the anomaly names what a failure *is* (a
duplicated effect, a lost record), in the manner of Elle's anomaly reports.

Each check declares its property and anomaly where it is defined (:class:`.checks.Check`,
which refuses a property not in :data:`PROPERTIES`); :func:`.checks.property_of` and
:func:`.checks.anomaly_of` read the declarations. A check nobody declared is an error
(:class:`.checks.CheckDeclarationError`), never filed under a catch-all. This module
imports nothing.
"""

from __future__ import annotations

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
    "restore": "a run moved back to an earlier point (restored, forked) resumes into a state the world agrees "
               "with: effects made since are not applied again unless the runtime promises a fresh attempt, "
               "answers given since are asked again, a fork leaves the original as it was",
}
"""Property name -> what it promises."""
