"""Fault kinds as modules: one registry, one module a kind (docs/architecture.md,
"Fault kinds").

The interface, its abilities and :func:`register` are :mod:`._base`'s; each kind's
module owns its worker-side action, its controller hooks, its crash-state checks and
its rank for shrinking. The generic case runner (:class:`.case.CaseRun`)
drives any plan through them. Importing this package registers the kinds below, in
this order (the order of :func:`names`).
"""

from __future__ import annotations

from .. import fault_registry
from . import _base
from ._base import (
    KINDS, CaseSetting, Drains, FaultKind, ObservesBefore, SessionResource, Stops, UnderLock, register,
)
from . import kill, term, cancel, pause, db_restart, net, freeze, cancel_edge, cancel_api, db_outage, restore  # noqa: E402,F401  registration order

__all__ = [
    "KINDS", "CaseSetting", "Drains", "FaultKind", "ObservesBefore", "SessionResource", "Stops", "UnderLock",
    "kind", "names", "register",
]


def kind(name: str) -> FaultKind:
    """The registered kind ``name``. Raises ``KeyError`` naming the known kinds."""
    return fault_registry.kind(name)


def names() -> tuple[str, ...]:
    """Every registered kind's name, in registration order (:mod:`..fault_registry`,
    where the plan grammar reads them too)."""
    return tuple(KINDS)


del _base
