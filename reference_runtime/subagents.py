"""Sub-agents: a node that runs a sub-graph of its own, and waits for it.

Failures this wall prevents (docs/design.md, "a sub-agent is a node that runs its own
sub-graph"):

- **A crash inside the child re-runs the whole child**: the naive sub-agent is a tool
  whose body calls ``child_runtime.run()`` in memory; a crash anywhere in it loses every
  turn the child made, so the resume pays the child's model calls again and repeats its
  effects under fresh tool-call ids (new idempotency keys: a second mail, a second
  charge). Here the child's nodes are ordinary nodes of the same run log, **scoped** by
  the parent node's id: the child of node ``turn-1.tool-3`` has nodes
  ``turn-1.tool-3:turn-1``, ``turn-1.tool-3:turn-1.tool-0``, ``turn-1.tool-3:turn-2``...
  Each is recorded when it completes, like any node, so a resume after a crash anywhere in
  the child re-runs only the child node that was in flight (its crash points are counted
  per logical task, i.e. per scoped node id, as everywhere else).
- **A parent that finishes before its child, or takes a half-done child as done**: the
  sub-agent node itself (kind ``subagent``) becomes ready only when its scope holds no
  pending node, i.e. once the child's *completion record* (its model node that called no
  tool) is in the log; its own record then carries the child's final answer as the tool
  result the parent's next turn reads. A crash between the child's completion record and
  the parent's record leaves a ready sub-agent node: the resume appends it without
  running anything of the child again.
- **The child's conversation leaking into the parent's (or the other way round)**: a
  model node's transcript is its scope's opening message (the task the parent gave)
  plus the outputs of its ancestors *in the same scope*; the parent's transcript holds
  the sub-agent's answer, never the child's turns.

Shape: the parent's model calls a tool declared as :class:`SubAgent` with arguments
``{"task": str}``. The model node's record spawns two specs: the sub-agent node
``<node>.tool-<i>`` (kind ``subagent``, parent: the model node) and the child's root
``<node>.tool-<i>:turn-1`` (kind ``model``, parent: the model node; it is ready at once,
so the child runs concurrently with the parent's other tool calls). The scheduler is the
run's one scheduler: child nodes are launched, drained, cancelled, fenced, limited
(the run's ``max_turns``/``max_tokens``/``max_wall_ms`` count the child's usage too)
and appended exactly like the parent's. Sub-agents nest (``a:turn-1.tool-0:turn-1``).
The child's tools see the run's state (one state per run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import Agent

SCOPE_SEPARATOR = ":"
SUBAGENT_KIND = "subagent"
CHILD_ROOT = "turn-1"


@dataclass(frozen=True)
class SubAgent:
    """A tool that is an agent: the parent's model calls it by ``name`` with
    ``{"task": str}``; ``agent`` (its model and tools; its limits are the run's) answers.
    Put it in the parent's ``Agent.tools`` next to ordinary tools."""

    name: str
    agent: Agent


class SubAgentError(RuntimeError):
    """A sub-agent call or scope is malformed (no ``task``, an unknown sub-agent)."""


def scope_of(node_id: str) -> str:
    """The scope a node belongs to: ``""`` for the run's own nodes, else the id of the
    sub-agent node whose child it is (``"turn-1.tool-3:turn-2"`` -> ``"turn-1.tool-3"``)."""
    head, sep, _ = node_id.rpartition(SCOPE_SEPARATOR)
    return head if sep else ""


def scoped(scope: str, local_id: str) -> str:
    """The node id of ``local_id`` (``"turn-2"``) inside ``scope``."""
    return f"{scope}{SCOPE_SEPARATOR}{local_id}" if scope else local_id


def child_root(subagent_node_id: str) -> str:
    """The id of the first node of a sub-agent node's child."""
    return scoped(subagent_node_id, CHILD_ROOT)


def child_messages(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The child's opening conversation: the task the parent's model gave it."""
    task = call.get("arguments", {}).get("task")
    if not isinstance(task, str) or not task:
        raise SubAgentError(f"sub-agent call {call.get('name')!r} needs a non-empty string argument 'task', got {task!r}")
    return [{"role": "user", "content": task}]


def agent_for(root: Agent, specs: dict[str, Any], node_id: str) -> Agent:
    """The agent whose model and tools serve ``node_id``: the run's own for scope ``""``,
    else the :class:`SubAgent` the owning node called (resolved through nested scopes).
    ``specs``: node id -> ``NodeSpec`` (the graph's). Raises :class:`SubAgentError`."""
    scope = scope_of(node_id)
    if not scope:
        return root
    from . import codec

    owner = specs.get(scope)
    if owner is None or owner.kind != SUBAGENT_KIND:
        raise SubAgentError(f"node {node_id!r}: its scope {scope!r} is not a sub-agent node of this run")
    parent = agent_for(root, specs, scope)
    name = codec.decode(owner.input)["call"]["name"]
    declared = parent.tools.get(name)
    if not isinstance(declared, SubAgent):
        raise SubAgentError(f"node {node_id!r}: {name!r} is not a sub-agent of agent {parent.name!r}")
    return declared.agent
