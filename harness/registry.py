"""Subjects, workloads and mutants, found by importable name.

A worker, ``crashmatrix replay`` and the test suite all reach a subject the same way:
by a registry name that maps to ``"package.module:attribute"``. Nothing crosses a process
boundary but the name. Mutants (``scenarios/defects``) register as subjects named
``defect:<name>``.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from .errors import RegistryError

SUBJECTS: dict[str, str] = {
    "reference": "crashmatrix.harness.adapters.reference:ReferenceAdapter",
    "reference-delta": "crashmatrix.harness.adapters.reference:ReferenceDeltaAdapter",
}
WORKLOADS: dict[str, str] = {
    "checkout": "crashmatrix.scenarios.checkout:WORKLOAD",
    "drift": "crashmatrix.scenarios.drift:WORKLOAD",
    "research": "crashmatrix.scenarios.research:WORKLOAD",
    "long_run": "crashmatrix.scenarios.long_run:WORKLOAD",
    "human_pause": "crashmatrix.scenarios.human_pause:WORKLOAD",
    "report": "crashmatrix.scenarios.report:WORKLOAD",
}


def load(target: str) -> Any:
    """Import ``"package.module:attribute"``; raises :class:`RegistryError`."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        obj: Any = module
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"cannot import {target!r}: {exc}") from None


def _all_subjects() -> dict[str, str]:
    from crashmatrix.scenarios.defects import MUTANTS

    return {**SUBJECTS, **{f"defect:{k}": v for k, v in MUTANTS.items()}}


def subject_names() -> list[str]:
    return sorted(_all_subjects())


def _importable(name: str) -> bool:
    module, sep, attr = name.partition(":")
    return bool(sep and attr and "." in module)


@cache
def subject(name: str) -> Any:
    """A fresh adapter instance for the subject ``name`` (cached per process): a
    registered name, or an importable ``"package.module:AdapterClass"`` (how another
    team's adapter is reached without registering it here)."""
    table = _all_subjects()
    if name in table:
        return load(table[name])()
    if _importable(name):
        return load(name)()
    raise RegistryError(f"subject={name!r} is not registered; known: {', '.join(sorted(table))} (or give package.module:AdapterClass)")


def workload_names() -> list[str]:
    return sorted(WORKLOADS)


@cache
def workload(name: str) -> Any:
    """The workload object registered as ``name``, or an importable
    ``"package.module:WORKLOAD"``."""
    if name in WORKLOADS:
        return load(WORKLOADS[name])
    if _importable(name):
        return load(name)
    raise RegistryError(f"workload={name!r} is not registered; known: {', '.join(sorted(WORKLOADS))}")
