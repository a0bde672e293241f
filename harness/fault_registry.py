"""The fault-kind registry: kind name -> kind instance, in listing order.

A leaf (it imports no other part of the harness at import time), so that the plan
grammar (:mod:`.plan`, which validates a fault's kind) and the kinds' modules
(:mod:`.faults`, which use the plan's types and register themselves here with
:func:`.faults.register`) do not import each other. The built-in kinds register when
the :mod:`.faults` package is imported; :func:`names` imports it by name on first use,
as a plugin registry loads its entries.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Protocol

BUILTIN_KINDS = "crashmatrix.harness.faults"
"""The package whose import registers the built-in kinds."""

class Acting(Protocol):
    """What a worker needs of a kind when its fault fires (:class:`.faults.FaultKind`):
    whether it acts under the recorder's lock, and the act."""

    @property
    def fires_under_lock(self) -> bool: ...

    def act(self, recorder: Any, fault: Any) -> None: ...


KINDS: dict[str, Any] = {}
"""Name -> :class:`.faults.FaultKind` instance, in listing order (:mod:`.faults`)."""


def names() -> tuple[str, ...]:
    """Every registered kind's name, in listing order (the built-in ones first: their
    package is imported if it was not). Computed at each call, so a kind
    registered later counts."""
    if BUILTIN_KINDS not in sys.modules:
        importlib.import_module(BUILTIN_KINDS)
    return tuple(KINDS)


def find(name: str) -> Any:
    """The registered kind ``name`` (a :class:`.faults.FaultKind`), or None when no kind
    has that name (the built-in ones registered first, as :func:`names`)."""
    names()
    return KINDS.get(name)


def kind(name: str) -> Any:
    """The registered kind ``name`` (a :class:`.faults.FaultKind`). Raises ``KeyError``
    naming the known kinds."""
    known = names()
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"fault kind {name!r} is not registered; known: {', '.join(known)}") from None
