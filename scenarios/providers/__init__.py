"""The providers' former import path, kept working: a re-export of :mod:`crashmatrix.harness.services.providers`.

The provider servers, their ledger, clients and launcher are harness services (the
harness starts them for every subject), so they live in
``crashmatrix.harness.services.providers``. Code that imports
``crashmatrix.scenarios.providers`` or ``crashmatrix.scenarios.providers.clients``
keeps working: the names here are the harness's own objects. What is workload-specific
stays here: :mod:`.demo_script`, the tiny model scripts of the model provider's tests.
"""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.services import providers as _providers

__all__ = list(_providers.__all__)


def __getattr__(name: str) -> Any:
    return getattr(_providers, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
