"""The operator's restore and fork of the reference runtime (reference_runtime/restore.py),
on a real PostgreSQL: a restored run ends where it had ended with nothing sent or billed
again, a worker still running a run is fenced off by its restore, a point the log never
reached is refused, and a fork runs the rest again under its own keys, the original left."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import asyncpg
import pytest

from crashmatrix.reference_runtime import Runtime, restore
from crashmatrix.reference_runtime.db import Db

from tests.runtime.test_runtime_cancel_migrate import USER, Model, Payments, agent, status

pytestmark = pytest.mark.anyio


async def _completed(db: Db, run_id: str, model: Model, pay: Payments) -> None:
    rt = Runtime(db, agent(model, pay), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "mini", {"messages": [USER]})
    with anyio.fail_after(15):
        assert await rt.run(run_id) == "completed"


async def test_a_restored_run_replays_its_record_and_ends_where_it_had(
        db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, pay, run_id = Model("charge"), Payments(), new_run_id()
    await _completed(db, run_id, model, pay)
    log = [r["node_id"] for r in await raw.fetch("SELECT node_id FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)]
    epoch = await raw.fetchval("SELECT lease_epoch FROM cm_runs WHERE run_id = $1", run_id)
    assert await restore.restore(raw, run_id, 0, by="test") == epoch + 1  # back to before the first record
    assert await status(raw, run_id) == ("paused", "restored by test to record 0")
    assert await restore.discarded_nodes(raw, run_id) == log
    assert await raw.fetchval("SELECT count(*) FROM cm_effects WHERE run_id = $1", run_id) == 1  # the ledger kept
    with anyio.fail_after(15):
        assert await Runtime(db, agent(model, pay), worker_id="w2", handle_sigterm=False).run(run_id) == "completed"
    assert model.calls == 2 and pay.requests == 1  # answered from the records: no model call, no charge again
    again = [r["node_id"] for r in await raw.fetch("SELECT node_id FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)]
    assert again == log
    with pytest.raises(restore.RestoreRefused, match="never reached 99"):
        await restore.restore(raw, run_id, 99)
    with pytest.raises(restore.RestoreRefused, match="does not exist"):
        await restore.current_point(raw, "cm-no-such-run")


async def test_a_restore_fences_the_worker_that_still_runs_the_run(
        db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, pay, run_id = Model("charge"), Payments(), new_run_id()
    gate = pay.gate = anyio.Event()
    rt = Runtime(db, agent(model, pay), worker_id="w1", handle_sigterm=False)
    await rt.create_run(run_id, "mini", {"messages": [USER]})
    failed: list[BaseException] = []
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                try:
                    await rt.run(run_id)
                except Exception as exc:  # LeaseLost: the restore took the run
                    failed.append(exc)

            tg.start_soon(run)
            await pay.inside.wait()  # the charge applied, its record not appended yet
            await restore.restore(raw, run_id, 1, by="test")
            gate.set()
    assert [type(e).__name__ for e in failed] == ["LeaseLost"]
    assert await status(raw, run_id) == ("paused", "restored by test to record 1")
    with anyio.fail_after(15):
        assert await Runtime(db, agent(model, pay), worker_id="w2", handle_sigterm=False).run(run_id) == "completed"
    assert len(pay.applied) == 1  # the started effect resolved by its probe, never charged twice


async def test_a_fork_runs_the_rest_under_its_own_keys_and_leaves_the_original(
        db: Db, raw: asyncpg.Connection, new_run_id: Callable[[], str]) -> None:
    model, pay, run_id = Model("charge"), Payments(), new_run_id()
    await _completed(db, run_id, model, pay)
    before = await raw.fetch("SELECT seq, node_id, record FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id)
    fork_id = await restore.fork(raw, run_id, 0, f"{run_id}~fork-0", by="test")
    assert await status(raw, fork_id) == ("paused", f"forked by test from {run_id} at record 0")
    with anyio.fail_after(15):
        assert await Runtime(db, agent(model, pay), worker_id="w2", handle_sigterm=False).run(fork_id) == "completed"
    assert len(pay.applied) == 2  # a fresh attempt: the fork's charge has a key of its own
    assert (await status(raw, run_id))[0] == "completed"
    assert await raw.fetch("SELECT seq, node_id, record FROM cm_run_log WHERE run_id = $1 ORDER BY seq", run_id) == before
    with pytest.raises(restore.RestoreRefused, match="does"):
        await restore.fork(raw, run_id, 0, fork_id)  # the id is taken
