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

from .agent import (
    Agent, ModelReply, OutcomeUnknown, ProbeOutcome, Tool, ToolCall, ToolContext, ToolOutcome, TransientFailure,
)
from .db import Db, connect
from .drain import WorkerDrain
from .effects import EffectLedger, idempotency_key
from .executor import NeedsHuman, RunInterrupted, Runtime
from .graph import RunGraph
from .leases import Lease, LeaseLost
from .logstore import AppendOnlyLog, RunStore
from .migrations import migrate
from .subagents import SubAgent

__all__ = [
    "Agent", "AppendOnlyLog", "Db", "EffectLedger", "Lease", "LeaseLost", "ModelReply",
    "NeedsHuman", "OutcomeUnknown", "ProbeOutcome", "RunGraph", "RunInterrupted", "RunStore", "Runtime", "SubAgent",
    "Tool", "ToolCall", "ToolContext", "ToolOutcome", "TransientFailure", "WorkerDrain", "connect", "idempotency_key", "migrate",
]
