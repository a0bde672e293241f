"""crashmatrix.reference_runtime: a complete durable agent runtime, the harness's first
subject and the model other teams compare their runtime against.

Modules, one wall each (docs/architecture.md has the structure): :mod:`.executor`
(scheduling, cancellation), :mod:`.drain` (the worker's SIGTERM drain), :mod:`.logstore` (append-only run log),
:mod:`.effects` (effects ledger), :mod:`.leases` (fencing), :mod:`.attempts` (the
attempt limit of a crash loop), :mod:`.sweep` (finding abandoned runs), :mod:`.graph` (rehydrate),
:mod:`.codec` (durable payloads), :mod:`.migrations` (schema), :mod:`.state_codec`
(state schema, transient fields, upgraders), :mod:`.blobs` (blob pointers),
:mod:`.tracing` (trace links across resumes), :mod:`.budgets` (usage and limits),
:mod:`.snapshots` (the delta-and-snapshot store strategy), :mod:`.retention`,
:mod:`.handoff` (operator resolution of undecidable effects), :mod:`.subagents` (a node
that runs a sub-graph); docs/runtime.md is the
map. The only harness module it imports is :mod:`crashmatrix.harness.crashpoint`.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names below are imported on first use (PEP 562), so that importing one module of
# the package (a workload's tools import :mod:`.agent`'s plain types) does not import
# the store, the codec and their protobuf and OpenTelemetry: a worker of another
# runtime, in that runtime's environment, runs a workload without them.
_EXPORTS = {
    "Agent": "agent", "ModelReply": "agent", "OutcomeUnknown": "agent", "ProbeOutcome": "agent", "Tool": "agent",
    "ToolCall": "agent", "ToolContext": "agent", "ToolOutcome": "agent", "TransientFailure": "agent",
    "Db": "db", "connect": "db", "WorkerDrain": "drain", "EffectLedger": "effects", "idempotency_key": "effects",
    "NeedsHuman": "executor", "RunInterrupted": "executor", "Runtime": "executor", "RunGraph": "graph",
    "Lease": "leases", "LeaseLost": "leases", "AppendOnlyLog": "logstore", "RunStore": "logstore",
    "migrate": "migrations", "SubAgent": "subagents",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Agent", "AppendOnlyLog", "Db", "EffectLedger", "Lease", "LeaseLost", "ModelReply",
    "NeedsHuman", "OutcomeUnknown", "ProbeOutcome", "RunGraph", "RunInterrupted", "RunStore", "Runtime", "SubAgent",
    "Tool", "ToolCall", "ToolContext", "ToolOutcome", "TransientFailure", "WorkerDrain", "connect", "idempotency_key", "migrate",
]
