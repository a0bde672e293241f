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
``charge#1`` reached P" names the same place in every run (DESIGN.md, "Crash points").
The subject declares its logical task by calling :func:`set_logical_task` in the task
that runs a node; the value lives in a :class:`contextvars.ContextVar`, so child tasks
inherit it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

__all__ = [
    "crashpoint", "arm", "disarm", "set_logical_task", "reset_logical_task", "logical_task", "Hook",
]

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
