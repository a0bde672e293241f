"""Labelled crash points: the one harness module a subject imports.

A subject marks a boundary with ``crashpoint("effect.started.after")``. With no plan
armed the call is a global load, a ``None`` test and a return (measured cost in
docs/benchmarks.md, well under a microsecond). This module has no dependencies beyond
the standard library, so a runtime that imports it stays usable without the harness.

While a worker runs a case, the harness installs a *hook* with :func:`arm`. The hook
receives the point's name and the current logical task (see :func:`set_logical_task`)
and may record the point in the trace, fire a fault there (SIGKILL, SIGTERM, cancel
the run's scope) or do nothing.

Logical tasks: occurrences are counted per logical task (the node or tool call whose
work reached the point), never per asyncio task name or globally, so "the 2nd time node
``charge#1`` reached P" names the same place in every run (docs/design.md, "Crash points").
The subject declares its logical task by calling :func:`set_logical_task` in the task
that runs a node; the value lives in a :class:`contextvars.ContextVar`, so child tasks
inherit it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

__all__ = [
    "crashpoint", "crashpoint_for", "arm", "disarm", "set_logical_task", "reset_logical_task", "logical_task", "Hook",
    "RUN_ACCEPTED", "NODE_LAUNCH", "MODEL_CALL_BEFORE", "MODEL_CALL_AFTER", "LOG_APPEND_BEFORE", "LOG_APPEND_AFTER",
    "TOOL_REQUEST_BEFORE", "TOOL_REQUEST_AFTER", "DRAIN_BEGIN", "DB_RECONNECT", "EFFECT_STARTED_BEFORE",
    "EFFECT_UNKNOWN_BEFORE", "PROBE_BEFORE",
]

# -- the labels the harness reads, each with its contract (docs/adapters.md, "Names the
# oracle reads"; a subject emits those it has, under the logical task named) ------------

#: the subject told its caller the run is accepted: from here on the run must exist
#: after any crash (check ``run.acknowledged_durable``)
RUN_ACCEPTED = "run.accepted"
#: a step is launched, in its logical task (``term.drained``: none after :data:`DRAIN_BEGIN`)
NODE_LAUNCH = "node.launch"
#: a billed model call starts, in the logical task the model provider bills as its
#: ``node_id`` (``model.calls_billed``: one not yet past :data:`LOG_APPEND_AFTER` when the
#: fault landed may be billed once more); the network section's provider faults land here
MODEL_CALL_BEFORE = "model.call.before"
#: that model call returned
MODEL_CALL_AFTER = "model.call.after"
#: the task's output is about to be written to the store (the network section's
#: database outage lands here)
LOG_APPEND_BEFORE = "log.append.before"
#: the task's output is durable: the crash state's ``log`` must hold a ``LogEntry`` whose
#: ``node_id`` is that task (``log.acknowledged_durable``; ``model.calls_billed``)
LOG_APPEND_AFTER = "log.append.after"
#: a tool request is about to be sent (``cancel.left_unknown``; the network section's
#: provider faults land here)
TOOL_REQUEST_BEFORE = "tool.request.before"
#: that tool request's answer came back
TOOL_REQUEST_AFTER = "tool.request.after"
#: the subject's SIGTERM handler ran (``term.drained`` requires it after a ``term``)
DRAIN_BEGIN = "drain.begin"
#: an attempt to reconnect to the database, logical task ``db``: where a network fault
#: on the database link heals with ``heal: retry``
DB_RECONNECT = "db.reconnect"
#: an effect is about to be recorded ``started`` in the store (a database outage lands here)
EFFECT_STARTED_BEFORE = "effect.started.before"
#: an effect is about to be recorded ``unknown``, its outcome lost (a database outage
#: lands here)
EFFECT_UNKNOWN_BEFORE = "effect.unknown.before"
#: a probe of a provider (what became of an effect whose outcome is unknown) is about to
#: be sent: where a network fault on an effect's link heals with ``heal: retry``
PROBE_BEFORE = "probe.before"

Hook = Callable[[str, str], None]
"""``hook(point_name, logical_task) -> None``; may raise or never return (SIGKILL)."""

_hook: Hook | None = None
_logical_task: contextvars.ContextVar[str] = contextvars.ContextVar(
    "crashmatrix_logical_task", default="run"
)


def crashpoint(name: str) -> None:
    """Mark a labelled crash point named ``name`` (e.g. ``"log.append.before"``).

    A no-op unless the harness armed a hook in this process. Names are stable labels,
    never line numbers; use dotted lower-case words.
    """
    hook = _hook
    if hook is not None:
        hook(name, _logical_task.get())


def crashpoint_for(task_id: str, name: str) -> None:
    """:func:`crashpoint` ``name`` as logical task ``task_id`` (entered for the length of
    the hook's call, then left): a label of a task about to start (``node.launch``). A
    no-op unless armed, without touching the context."""
    hook = _hook
    if hook is not None:
        token = _logical_task.set(task_id)
        try:
            hook(name, task_id)
        finally:
            _logical_task.reset(token)


def set_logical_task(task_id: str) -> contextvars.Token[str]:
    """Declare that the current context works for logical task ``task_id`` (a node id).

    Returns the token for :meth:`contextvars.ContextVar.reset`.
    """
    return _logical_task.set(task_id)


def reset_logical_task(token: contextvars.Token[str]) -> None:
    """Undo the :func:`set_logical_task` call that returned ``token``."""
    _logical_task.reset(token)


def logical_task() -> str:
    """The logical task of the current context (``"run"`` outside any node)."""
    return _logical_task.get()


def arm(hook: Hook) -> None:
    """Install ``hook`` for every later :func:`crashpoint` call in this process."""
    global _hook
    _hook = hook


def disarm() -> None:
    """Remove the hook; :func:`crashpoint` is a no-op again."""
    global _hook
    _hook = None
