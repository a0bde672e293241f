"""``human_pause`` in process: a run waits (simulated) days for a human decision on an
approval effect with no probe; retention passes run meanwhile and never take it; the
operator approves; the run continues and is then, once finished and old, collected."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from _walls_support import ScriptedModel

from crashmatrix.reference_runtime import Agent, OutcomeUnknown, Runtime, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.handoff import pending, resolve
from crashmatrix.reference_runtime.retention import delete_finished_runs

pytestmark = pytest.mark.anyio


async def request_approval(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    raise OutcomeUnknown("approval request sent; the approver answers out of band")


async def age(raw: asyncpg.Connection, run_id: str, days: int) -> None:
    """The simulated clock: move the run's last change ``days`` into the past."""
    await raw.execute("UPDATE cm_runs SET updated_at = updated_at - make_interval(days => $2) WHERE run_id = $1", run_id, days)


async def test_a_run_waits_days_for_approval_across_retention(db: Db, raw: asyncpg.Connection, new_run_id: Any) -> None:
    script = {"turn-1": [("request_approval", {"amount": 250000})], "turn-2": "approved, proceeding"}
    agent = Agent("human_pause", ScriptedModel(script), {"request_approval": Tool("request_approval", request_approval, effect=True)})
    run_id = new_run_id()
    rt = Runtime(db, agent, worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "human_pause", {"messages": []})
    assert await rt.run(run_id) == "needs_human"
    for _day in range(3):  # three days pass; a nightly retention pass each day
        await age(raw, run_id, 1)
        report = await delete_finished_runs(raw, older_than=timedelta(hours=12), limit=100_000)
        assert run_id not in report.runs
    [effect] = await pending(raw, run_id)
    assert effect.tool == "request_approval" and effect.request == {"amount": 250000}
    await resolve(raw, run_id, effect.idem_key, applied=True, result={"approved_by": "carol"}, operator="carol")
    assert await Runtime(db, agent, worker_id="w2", handle_sigterm=False).run(run_id) == "completed"
    assert await raw.fetchval("SELECT result FROM cm_effects WHERE run_id = $1", run_id) == '{"approved_by": "carol"}'
    report = await delete_finished_runs(raw, older_than=timedelta(hours=12), limit=100_000)
    assert run_id not in report.runs  # finished, but just now
    await age(raw, run_id, 2)
    report = await delete_finished_runs(raw, older_than=timedelta(hours=12), limit=100_000)
    assert run_id in report.runs
    assert await raw.fetchval("SELECT count(*) FROM cm_effects WHERE run_id = $1", run_id) == 0
