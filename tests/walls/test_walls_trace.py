"""Trace links (reference_runtime/tracing.py): each invocation is a span; a resume's span
links to (is not a child of) the invocation it continues; the chain is stored."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest
from _walls_support import ScriptedModel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crashmatrix.harness.adapter import InvocationEntry, Observation
from crashmatrix.harness.trace_check import check_trace_continues
from crashmatrix.reference_runtime import Agent, Runtime, Tool, ToolContext, ToolOutcome, tracing
from crashmatrix.reference_runtime.db import Db

pytestmark = pytest.mark.anyio


def hexid(n: int, width: int) -> str:
    return format(n, f"0{width}x")


async def test_each_resume_links_to_the_invocation_it_continues(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attempts = {"n": 0}
    entered = anyio.Event()

    async def slow(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        attempts["n"] += 1
        if attempts["n"] <= 2:  # the first two invocations are cancelled here
            entered.set()
            await anyio.sleep_forever()
        return ToolOutcome("succeeded", {"ok": True})

    agent = Agent(name="traced", model=ScriptedModel({"turn-1": [("slow", {})], "turn-2": "done"}), tools={"slow": Tool("slow", slow)})
    run_id = new_run_id()
    await Runtime(db, agent, worker_id="w0", handle_sigterm=False, tracer_provider=provider).create_run(
        run_id, "traced", {"messages": []})
    for worker in ("w1", "w2"):
        entered = anyio.Event()
        rt = Runtime(db, agent, worker_id=worker, handle_sigterm=False, tracer_provider=provider)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                async def cancel_when_blocked(ev: anyio.Event = entered) -> None:
                    await ev.wait()
                    scope.cancel()
                tg.start_soon(cancel_when_blocked)
                await rt.run(run_id)
    assert await Runtime(db, agent, worker_id="w3", handle_sigterm=False, tracer_provider=provider).run(run_id) == "completed"

    spans = [s for s in exporter.get_finished_spans() if s.name == "run traced"]
    assert len(spans) == 3
    first, second, third = spans
    assert first.links == () or len(first.links) == 0
    for earlier, later in ((first, second), (second, third)):
        assert later.parent is None  # a link, not a parent
        assert [(l.context.trace_id, l.context.span_id) for l in later.links] == [(earlier.context.trace_id, earlier.context.span_id)]
        assert later.context.trace_id != earlier.context.trace_id
    assert third.attributes["crashmatrix.status"] == "completed"
    assert [s.attributes["crashmatrix.resumed"] for s in spans] == [False, True, True]

    stored = await tracing.invocations(raw, run_id)
    assert [i["worker"] for i in stored] == ["w1", "w2", "w3"]
    assert [i["traceparent"] for i in stored] == [tracing.traceparent_of(_as_span(s)) for s in spans]
    assert [i["link"] for i in stored] == [None, stored[0]["traceparent"], stored[1]["traceparent"]]
    assert await raw.fetchval("SELECT traceparent FROM cm_runs WHERE run_id = $1", run_id) == stored[-1]["traceparent"]

    obs = Observation(run_id, "completed", log=[], invocations=[
        InvocationEntry(i["epoch"], i["worker"], i["traceparent"], i["link"]) for i in stored])
    assert check_trace_continues(obs).valid is True


def _as_span(readable: Any) -> Any:
    from opentelemetry.trace import NonRecordingSpan

    return NonRecordingSpan(readable.context)


async def test_without_configured_otel_the_chain_is_still_recorded(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    agent = Agent(name="plain", model=ScriptedModel({"turn-1": "hi"}), tools={})
    run_id = new_run_id()
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "plain", {"messages": []})
    assert await rt.run(run_id) == "completed"
    [inv] = await tracing.invocations(raw, run_id)
    assert inv["link"] is None and tracing.context_of(inv["traceparent"]) is not None


async def test_reference_adapter_observation_carries_the_chain(db: Db, pg: Any, new_run_id: Any, tmp_path: Any) -> None:
    """``ReferenceAdapter.observe`` fills ``Observation.invocations`` (what the oracle's
    trace check reads) from cm_run_invocations, in epoch order."""
    from crashmatrix.harness.adapter import Environment
    from crashmatrix.harness.adapters.reference import ReferenceAdapter

    agent = Agent(name="plain", model=ScriptedModel({"turn-1": "hi"}), tools={})
    run_id = new_run_id()
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "plain", {"messages": []})
    await rt.run(run_id)
    await db.execute("UPDATE cm_runs SET status = 'paused' WHERE run_id = $1", run_id)
    await Runtime(db, agent, worker_id="w2", handle_sigterm=False).run(run_id)
    adapter = ReferenceAdapter()
    try:
        obs = await adapter.observe(Environment(pg.dsn, {}, str(tmp_path)), run_id)
    finally:
        await adapter.aclose()
    assert obs.invocations is not None and [i.worker for i in obs.invocations] == ["w1", "w2"]
    assert obs.invocations[1].link == obs.invocations[0].traceparent
    assert check_trace_continues(obs).valid is True
