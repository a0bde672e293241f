"""Trace links across resumes (OpenTelemetry, W3C trace context).

Failure this wall prevents (docs/design.md, "Trace context"; seed 000, wall 4): a run that
crashed and was resumed by another worker shows up in tracing as two unrelated traces
(or, with a naive "parent = stored context", as one trace whose parent span ended hours
before its child started, which breaks trace views and sampling). Here:

- each invocation of a run (:meth:`~.executor.Runtime.run`: the first start and every
  resume) is one span, ``run <workload>``;
- when it starts, the invocation writes its W3C ``traceparent`` to ``cm_runs.traceparent``
  and a row to ``cm_run_invocations`` (epoch, worker, traceparent, link), fenced by
  the lease epoch it just took;
- a resume reads the stored traceparent of the invocation it continues and starts its
  span with a **link** to it (not a parent): a new trace, causally tied to the old one.

The ``cm_run_invocations`` rows are what the harness's trace check reads (the spans of a
SIGKILLed worker are never exported, so the durable chain, not an exporter, is the
evidence); tests also check the spans themselves with an in-memory exporter.

When the process has not configured OpenTelemetry (the API's default provider makes
non-recording spans without ids), the runtime uses a private SDK ``TracerProvider``
without exporters, so that ids exist and the chain is recorded anyway.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import Link, SpanContext, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .db import Db
from .leases import Lease, LeaseLost

TRACER_NAME = "crashmatrix.reference_runtime"
_PROPAGATOR = TraceContextTextMapPropagator()
_private_tracer: Tracer | None = None


def _private() -> Tracer:
    """The private SDK provider's tracer, built on this process's first call and kept
    (one ``get_tracer`` a process: the SDK's installs a warnings filter every call).

    Built where it is used, not at import: an SDK ``TracerProvider`` registers an
    after-fork hook that detects the process's resource again, and in a preloaded parent
    every forked worker ran it (measured: ~1.7 ms of CPU and ~300 page faults a fork).
    Its resource is empty, so no detection runs at all (it exports nothing, so nothing
    reads the resource); it ends with the process (no atexit shutdown)."""
    global _private_tracer
    if _private_tracer is None:
        provider = SdkTracerProvider(resource=Resource.get_empty(), shutdown_on_exit=False)
        _private_tracer = provider.get_tracer(TRACER_NAME)
    return _private_tracer


def get_tracer(provider: TracerProvider | None = None) -> Tracer:
    """A tracer from ``provider``, else the global one if configured, else a private SDK
    provider's (ids without export; one a process: :func:`_private`)."""
    if provider is None:
        provider = trace.get_tracer_provider()
        if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
            return _private()
    return provider.get_tracer(TRACER_NAME)


def traceparent_of(span: trace.Span) -> str | None:
    """The W3C ``traceparent`` header of ``span`` (None for a non-recording, invalid span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def context_of(traceparent: str | None) -> SpanContext | None:
    """The span context a stored ``traceparent`` names, or None when absent or invalid."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def links_to(traceparent: str | None) -> list[Link]:
    """The span links a resume starts with: one to the invocation it continues."""
    span_context = context_of(traceparent)
    return [Link(span_context, {"crashmatrix.link": "resumes"})] if span_context is not None else []


async def record_invocation(db: Db, lease: Lease, traceparent: str | None, link: str | None) -> None:
    """Store this invocation's traceparent on the run and in ``cm_run_invocations``,
    fenced by ``lease``. Raises :class:`LeaseLost` when the epoch is stale."""
    ok = await db.fetchval(
        """
        WITH upd AS (
            UPDATE cm_runs SET traceparent = $3, updated_at = now()
             WHERE run_id = $1 AND lease_epoch = $2 RETURNING 1)
        , ins AS (
            INSERT INTO cm_run_invocations (run_id, lease_epoch, worker, traceparent, link)
            SELECT $1, $2, $4, $3, $5 FROM upd
            ON CONFLICT DO NOTHING RETURNING 1)
        SELECT count(*) FROM upd
        """,
        lease.run_id,
        lease.epoch,
        traceparent,
        lease.owner,
        link,
    )
    if not ok:
        raise LeaseLost(f"run {lease.run_id}: invocation record refused, lease epoch {lease.epoch} is stale")


async def invocations(db: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's recorded invocations in epoch order: ``{"epoch", "worker",
    "traceparent", "link"}`` (``db``: a :class:`Db` or an asyncpg connection)."""
    rows = await db.fetch(
        "SELECT lease_epoch, worker, traceparent, link FROM cm_run_invocations WHERE run_id = $1 ORDER BY lease_epoch",
        run_id,
    )
    return [{"epoch": r["lease_epoch"], "worker": r["worker"], "traceparent": r["traceparent"], "link": r["link"]} for r in rows]
