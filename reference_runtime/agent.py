"""What a workload gives the runtime: a model, tools (with probes) and the first node.

The runtime knows two node kinds. A ``model`` node sends the transcript of its
ancestors to the model and records the reply; each tool call in the reply spawns a
``tool`` node, and the next model turn is spawned with those tool nodes as parents (a
join), so independent tool calls run concurrently. A reply without tool calls ends the
run: its content is the final answer.

Node ids are stable across attempts (``turn-3``, ``turn-3.tool-1``): they come from the
graph's shape, never from the model's tool-call ids, which are fresh on every call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from .state_codec import StateSchema
    from .subagents import SubAgent


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a model reply; ``id`` is the model's (fresh per call)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ModelReply:
    """A model's answer: text, the tool calls it asks for (ids fresh per call) and the
    tokens billed."""

    content: str
    tool_calls: list[ToolCall]
    tokens: int


@dataclass(frozen=True)
class ToolOutcome:
    """A tool's answer: ``succeeded`` or a definite ``failed`` (e.g. a declined card)."""

    status: Literal["succeeded", "failed"]
    result: dict[str, Any]


@dataclass(frozen=True)
class ProbeOutcome:
    """A probe's answer: the effect was ``applied`` (``tool_outcome`` then holds what the
    original call would have returned: the result, not just "applied"), was
    ``not_applied``, or the probe ``cannot_tell`` (final: the provider answered and the
    answer does not decide; the run goes to a human), or ``cannot_tell_yet``
    (transient: the probe could not reach the provider: a broken link, a timeout, a
    5xx; the runtime asks again, then leaves the run ``interrupted`` to be resumed,
    never to a human)."""

    outcome: Literal["applied", "not_applied", "cannot_tell", "cannot_tell_yet"]
    tool_outcome: ToolOutcome | None = None


class OutcomeUnknown(Exception):
    """Raised by a tool when its call's outcome is ambiguous (connection reset, timeout,
    5xx): the effect may or may not have happened. The runtime records ``unknown`` and
    asks the probe."""


class TransientFailure(Exception):
    """Raised by a model client when the call failed in a way a repeat may fix (the
    connection broke, the answer timed out or came back cut, a 5xx). A model call
    changes nothing but the bill, so the runtime calls again (a new call, billed), and
    leaves the run ``interrupted`` if the model stays unreachable."""


@dataclass
class ToolContext:
    """What a tool call receives: the run, the node, and (for effects) the idempotency key."""

    run_id: str
    node_id: str
    idem_key: str | None
    resources: Any  # the workload's own clients (HTTP session, provider URLs)
    state: dict[str, Any] = field(default_factory=dict)
    """The run's state (durable fields + rebuilt transients); a tool may set fields on
    it. What it sets is encoded by ``Agent.state_schema`` with the node's record."""


ToolFn = Callable[[ToolContext, dict[str, Any]], Awaitable[ToolOutcome]]
ProbeFn = Callable[[ToolContext], Awaitable[ProbeOutcome]]


@dataclass(frozen=True)
class Tool:
    """A tool. ``effect=True`` means it changes another system: it gets an idempotency
    key and a ledger row, and ``probe`` must answer whether a key was applied."""

    name: str
    fn: ToolFn
    effect: bool = False
    probe: ProbeFn | None = None


class Model(Protocol):
    async def complete(self, run_id: str, node_id: str, messages: list[dict[str, Any]]) -> ModelReply:
        """Call the model with ``messages``; raise on failure."""


@dataclass
class Agent:
    """A workload as the runtime sees it."""

    name: str
    model: Model
    tools: dict[str, Tool | SubAgent]
    """Tools by name; a :class:`~.subagents.SubAgent` is a tool that is an agent."""
    resources: Any = None
    max_turns: int | None = 50
    max_tokens: int | None = None
    max_wall_ms: int | None = None
    """Limits (:mod:`.budgets`): checked before each launch; the run ends ``limit_exceeded``."""
    extra: dict[str, Any] = field(default_factory=dict)
    state_schema: StateSchema | None = None
    """What tools may keep on the run's state (:mod:`.state_codec`); None: nothing."""
