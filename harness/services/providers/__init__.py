"""The external systems a workload's tools call: payment, mail, a scripted model, a
document store, and the services a workload declares (:mod:`.declared`).

The harness starts them for every subject (docs/design.md, "Processes"): each provider
runs in its own process (:mod:`.server`) with its own durable SQLite ledger
(:mod:`.ledger`); tools talk to them through :mod:`.clients` (docs/adapters.md, "The
provider client API"); :func:`start_providers` (:mod:`.launcher`) starts them.
What is workload-specific (model scripts, the demo scripts) lives in ``scenarios``;
``crashmatrix.scenarios.providers`` re-exports this package for code written against
its old place.

Exports are loaded lazily (PEP 562), so that importing this package (as the server
process does) costs nothing beyond what is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # clients
    "WORKER_HEADER": "clients",
    "ProbeResult": "clients",
    "Resources": "clients",
    "PROBE_TIMEOUT_S": "clients",
    "request_effect": "clients",
    "get_status": "clients",
    "ProviderError": "clients",
    "DefiniteProviderError": "clients",
    "ProviderUnreachableError": "clients",
    "AmbiguousProviderError": "clients",
    "charge": "clients",
    "refund": "clients",
    "send_mail": "clients",
    "complete": "clients",
    "get_charge_status": "clients",
    "get_refund_status": "clients",
    "get_mail_status": "clients",
    "create_document": "clients",
    "get_document_status": "clients",
    "set_delay": "clients",
    "read_ledger": "clients",
    "inflight": "clients",
    "health": "clients",
    "wait_inflight_zero": "clients",
    # launcher
    "KINDS": "launcher",
    "DEFAULT_KINDS": "launcher",
    "Providers": "launcher",
    "ProviderStartError": "launcher",
    "start_providers": "launcher",
    # declared services
    "ServiceSpec": "declared",
    "EffectRoute": "declared",
    "derive_service_id": "declared",
    "workload_services": "declared",
    # ledger
    "Ledger": "ledger",
    "read_ledger_file": "ledger",
    "ROW_FIELDS": "ledger",
    # server
    "build_app": "server",
    "derive_id": "server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
