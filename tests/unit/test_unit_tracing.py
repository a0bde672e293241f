"""The reference runtime's tracing helpers, without a database."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from crashmatrix.reference_runtime import tracing


def test_private_tracer_is_built_once_and_records_spans() -> None:
    first, second = tracing.get_tracer(), tracing.get_tracer()
    assert first is second  # no per-worker get_tracer() (and its warnings filter) after fork
    with first.start_as_current_span("step") as span:
        parent = tracing.traceparent_of(span)
    assert parent is not None and parent.startswith("00-")
    links = tracing.links_to(parent)
    assert len(links) == 1 and links[0].context.span_id == span.get_span_context().span_id


def test_an_explicit_provider_is_used() -> None:
    provider = TracerProvider()
    assert tracing.get_tracer(provider) is not tracing.get_tracer()


def test_absent_or_invalid_traceparent_links_nothing() -> None:
    assert tracing.links_to(None) == []
    assert tracing.links_to("00-zz-not-a-traceparent-01") == []
