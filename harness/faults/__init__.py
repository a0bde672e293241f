"""Fault kinds as modules: one registry, one module a kind (docs/architecture.md,
"Fault kinds").

The interface, its abilities and :func:`register` are :mod:`._base`'s; each kind's
module owns its worker-side action, its controller hooks, its crash-state checks and
its rank for shrinking. The generic case runner (:class:`.case.CaseRun`)
drives any plan through them. Importing this package imports every module of it whose
name does not start with ``_`` (each registers its kind), then puts the registry in
listing order (:attr:`FaultKind.listing_order`, then the name): the order of
:func:`names`, so a module's file name never decides where its kind is listed.
"""

from __future__ import annotations

import importlib
import pkgutil

from .. import fault_registry
from . import _base
from ._base import (
    KINDS, CaseSetting, Drains, FaultKind, ObservesBefore, SessionResource, Stops, UnderLock, register,
)


def _import_kinds() -> None:
    """Import every kind module of this package, then order :data:`KINDS` by
    ``(listing_order, name)``. Raises whatever a kind module raises on import (a
    duplicate name: ``ValueError`` from :func:`register`)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    ordered = sorted(KINDS.values(), key=lambda k: (k.listing_order, k.name))
    KINDS.clear()
    KINDS.update((k.name, k) for k in ordered)


_import_kinds()

__all__ = [
    "KINDS", "CaseSetting", "Drains", "FaultKind", "ObservesBefore", "SessionResource", "Stops", "UnderLock",
    "kind", "names", "register",
]


def kind(name: str) -> FaultKind:
    """The registered kind ``name``. Raises ``KeyError`` naming the known kinds."""
    return fault_registry.kind(name)


def names() -> tuple[str, ...]:
    """Every registered kind's name, in listing order (:mod:`..fault_registry`, where
    the plan grammar reads them too)."""
    return tuple(KINDS)


del _base
