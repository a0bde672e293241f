"""What a cancelled step left recorded: the crash check every cancellation style shares
(``cancel``, ``cancel-edge``, ``cancel-api``).

``cancel.step_recorded``: a step that was cancelled while it made an effect is either
recorded done with its result, or not recorded and its effect left to resolve (the next
attempt's probe, or its idempotency key); never recorded done without the effect it
made. Source: Apache Burr saves a cancelled action as completed with the state from
before it (docs/findings.md, "Apache Burr"); DBOS ``cancel_workflow`` dropping the
result of the step in flight; seed 000 ("a cancellation that lost the
recovery write").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..crashpoint import TOOL_REQUEST_BEFORE
from ..checks import Check
from ..oracle import Verdict, applied_effect

if TYPE_CHECKING:
    from ..oracle import CrashEvidence

STEP_RECORDED = Check("cancel.step_recorded", "effect resolution", "step recorded without its effect", "crash",
                      "a step cancelled while it made an effect is recorded with it, or not recorded")
NAME = STEP_RECORDED.name


def check_step_recorded(ev: CrashEvidence) -> Verdict:
    """``cancel.step_recorded`` (module docstring), at the crash state of a cancelled
    worker. An effect counts as *held* by the durable state when its provider reference
    (the charge id, the message id: the ledger row's ``ref``) appears in it (the
    transcript, the effect ledger's results); a step as *recorded* when its logical task
    has an entry in the log. Invalid when some applied effect is held by no record while
    every step of the worker that sent a request (``tool.request.before``; an adapter
    that labels no requests: every step it began, ``step.before``) is recorded done: one
    of them was recorded without the effect it made."""
    obs = ev.observation
    if obs.log is None:
        return Verdict(NAME, "crash", True, "not applicable: the adapter exposes no log")
    if obs.state is None:
        return Verdict(NAME, "crash", True, f"not applicable: the crash state cannot be rebuilt ({obs.state_error})")
    if ev.ledgers is None:
        return Verdict(NAME, "crash", True, "not applicable: the providers' ledgers were not read")
    held = json.dumps(obs.state, sort_keys=True, default=str) + json.dumps(
        [e.result for e in obs.effects or []], sort_keys=True, default=str)
    orphans = [f"{kind} {row.get('op')} {row.get('ref')}" for kind, rows in sorted(ev.ledgers.items())
               for row in rows if applied_effect(row) and row.get("ref") and str(row["ref"]) not in held]
    # the steps that may have made an effect: those that sent a request, or where the
    # adapter labels no requests, every step the worker began
    label = TOOL_REQUEST_BEFORE if any(e[1] == TOOL_REQUEST_BEFORE for e in ev.trace_full) else "step.before"
    senders = list(dict.fromkeys(e[2] for e in ev.trace_full if e[1] == label))
    recorded = {e.node_id for e in obs.log}
    unrecorded = [t for t in senders if t not in recorded]
    if orphans and senders and not unrecorded:
        return Verdict(NAME, "crash", False,
                       f"{len(orphans)} effect(s) applied at the provider that no durable record holds "
                       f"({', '.join(orphans[:4])}), while every step that {'sent a request' if label == TOOL_REQUEST_BEFORE else 'began'} is recorded done "
                       f"({', '.join(senders)}): a cancelled step was recorded without the effect it made")
    if orphans:
        why = f"not recorded: {', '.join(unrecorded)}" if unrecorded else "made by an earlier worker"
        return Verdict(NAME, "crash", True, f"{len(orphans)} effect(s) for the next attempt to resolve "
                                            f"({', '.join(orphans[:4])}); {why}")
    did = "sent a request" if label == TOOL_REQUEST_BEFORE else "began"
    if not senders:
        return Verdict(NAME, "crash", True, f"no step {did} in this worker")
    return Verdict(NAME, "crash", True, f"{len(senders)} step(s) {did}; every effect made is held by a record")
