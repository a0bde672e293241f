"""The ``trace.continues`` check (docs/design.md, oracle: "the trace continues: each resumed
invocation carries a span link to the one it continues").

Evidence: :attr:`~.adapter.Observation.invocations`, the run's invocations as the
subject recorded them durably (epoch, worker, W3C traceparent, the traceparent its span
links to). Durable rows rather than exported spans, because a SIGKILLed worker never
exports its span; the reference runtime's tests check the spans themselves with an
in-memory exporter.

Valid when, in epoch order:

- every traceparent is well formed (``00-<32 hex>-<16 hex>-<2 hex>``, ids not zero);
- the first invocation links to nothing;
- every later one links to exactly the traceparent of the invocation before it (the one
  it continues; an invocation killed before it recorded itself is invisible to both the
  check and the next resume, which links to the last recorded one);
- every invocation has its own trace id: a resume *links* to the stored context, it does
  not adopt it as its parent (which would graft a span onto a trace that ended long ago);
- a run with records has at least one invocation.

Not applicable (valid, says so) when the adapter records no invocations (``None``).
"""

from __future__ import annotations

import re

from .adapter import Observation
from .checks import Check, Verdict

CONTINUES = Check("trace.continues", "trace continuity", "broken trace link", "end",
                  "each resumed invocation's span links to the invocation it continues")
CHECK = CONTINUES.name
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def check_trace_continues(obs: Observation, phase: str = "end") -> Verdict:
    """``trace.continues`` on one observation (see the module docstring)."""
    if obs.invocations is None:
        return Verdict(CHECK, phase, True, "not applicable: the adapter records no invocations")
    invocations = sorted(obs.invocations, key=lambda i: i.epoch)
    problems: list[str] = []
    if not invocations:
        if obs.log:
            problems.append(f"{len(obs.log)} record(s) but no recorded invocation")
        return Verdict(CHECK, phase, not problems, "; ".join(problems) or "no invocation recorded (run never started)")
    trace_ids: dict[str, int] = {}
    previous = None
    for inv in invocations:
        m = _TRACEPARENT.match(inv.traceparent or "")
        if m is None or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
            problems.append(f"epoch {inv.epoch}: traceparent {inv.traceparent!r} is not a valid W3C traceparent")
        else:
            trace_id = m.group(1)
            if trace_id in trace_ids:
                problems.append(
                    f"epoch {inv.epoch}: shares trace id {trace_id[:8]}... with epoch {trace_ids[trace_id]} "
                    f"(a resume must link to the stored context, not use it as parent)"
                )
            trace_ids.setdefault(trace_id, inv.epoch)
        if previous is None:
            if inv.link is not None:
                problems.append(f"epoch {inv.epoch}: the first invocation links to {inv.link!r}; it continues nothing")
        elif inv.link is None:
            problems.append(f"epoch {inv.epoch}: a resume without a link (it continues epoch {previous.epoch})")
        elif inv.link != previous.traceparent:
            problems.append(
                f"epoch {inv.epoch}: links to {inv.link!r}, not to the invocation it continues "
                f"(epoch {previous.epoch}, {previous.traceparent!r})"
            )
        previous = inv
    if problems:
        return Verdict(CHECK, phase, False, f"{len(problems)} problem(s) in {len(invocations)} invocation(s)", problems[:24])
    return Verdict(CHECK, phase, True, f"{len(invocations)} invocation(s), each resume links to the one before")
