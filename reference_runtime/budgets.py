"""Budgets and limits: what a run has used, and where it must stop.

Failures this wall prevents (seed 002):

- **A runaway run** (a model that keeps calling tools, a loop that burns tokens) that
  nothing stops, or that a restart silently resets: usage is recorded per node in its
  log record (``Budget``: tokens, model and tool calls, wall ms) and summed on
  rehydrate, so a resumed run counts what earlier attempts spent.
- **A limit that cuts a turn in half**: a limit is checked only at a node boundary,
  before the scheduler launches a node; nodes already running finish and append; no node
  is launched afterwards. The run then ends with the terminal status
  ``limit_exceeded`` and a detail naming the limit, its value and the usage
  (``max_tokens: 1210 used, limit 1000``), never ``failed`` mid-turn.

Limits (``Agent.max_turns``, ``Agent.max_tokens``, ``Agent.max_wall_ms``; ``None`` = no
limit): a turn is a model node, so ``max_turns=N`` lets turns 1..N run and stops before
turn N + 1; ``max_tokens`` and ``max_wall_ms`` stop once the recorded total has reached
the limit. Wall ms is the sum of the recorded nodes' durations (concurrent nodes each
count), which is what survives a crash; it is never compared by the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LIMIT_STATUS = "limit_exceeded"


@dataclass(frozen=True)
class Usage:
    """What a run's records say it used."""

    turns: int
    tokens: int
    wall_ms: int


def usage(graph: Any) -> Usage:
    """The summed usage of every recorded node of ``graph`` (a :class:`~.graph.RunGraph`,
    which keeps running totals as records are added: O(1) per launch)."""
    return Usage(graph.turns_used, graph.tokens_used, graph.wall_ms_used)


def exceeded(agent: Any, graph: Any, launching: list[Any]) -> str | None:
    """The detail of the first limit that forbids launching ``launching`` (node specs),
    or None. Checked by the scheduler before each launch (a node boundary)."""
    # the graph's running totals read directly (no Usage object: this runs before every launch)
    max_turns = getattr(agent, "max_turns", None)
    if max_turns is not None and graph.turns_used >= max_turns:
        for spec in launching:
            if spec.kind == "model":
                return f"max_turns: {graph.turns_used} turns done, limit {max_turns} (not launching {spec.node_id})"
    max_tokens = getattr(agent, "max_tokens", None)
    if max_tokens is not None and graph.tokens_used >= max_tokens:
        return f"max_tokens: {graph.tokens_used} used, limit {max_tokens}"
    max_wall_ms = getattr(agent, "max_wall_ms", None)
    if max_wall_ms is not None and graph.wall_ms_used >= max_wall_ms:
        return f"max_wall_ms: {graph.wall_ms_used} used, limit {max_wall_ms}"
    return None
