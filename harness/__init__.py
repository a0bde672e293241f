"""crashmatrix.harness: fault injector, crash-point explorer, oracle and command line.

This package's ``__init__`` stays import-light on purpose: subjects import
:mod:`crashmatrix.harness.crashpoint` and must not pay for asyncpg, rich or typer.
The public API is re-exported lazily (PEP 562 ``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "crashpoint": "crashmatrix.harness.crashpoint",
    "CrashmatrixError": "crashmatrix.harness.errors",
    "InvalidArgument": "crashmatrix.harness.errors",
    "PlanError": "crashmatrix.harness.errors",
    "HarnessError": "crashmatrix.harness.errors",
    "ServiceError": "crashmatrix.harness.errors",
    "Fault": "crashmatrix.harness.plan",
    "FaultPlan": "crashmatrix.harness.plan",
    "CrashPoint": "crashmatrix.harness.plan",
    "NetToxic": "crashmatrix.harness.plan",
    "Adapter": "crashmatrix.harness.adapter",
    "registry": "crashmatrix.harness.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crashmatrix.harness' has no attribute {name!r}")
    mod = importlib.import_module(module)
    return mod if name == "registry" else getattr(mod, name)
