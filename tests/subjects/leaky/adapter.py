"""The reference runtime's adapter, with a resume that leaves something in the process
after it returned: what a long-lived worker (``crashmatrix.harness.resident``) keeps (a
descriptor, a thread, an idle pooled connection: a production process keeps them too) or
ends, as a forked worker's exit would, before it runs another job (a task, a timer). Each
subject's ``resume`` does the reference adapter's resume, then its one deed; ``start`` is
the reference's.

Lives with the tests (``tests/subjects`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.crashpoint import set_logical_task
from crashmatrix.harness.adapters.reference import ReferenceAdapter

KEPT: list[object] = []
"""What the misdeeds keep alive (a module's global, as a leaking runtime's cache is)."""


class LeavesDescriptor(ReferenceAdapter):
    """Opens a file on every resume and keeps it open."""

    async def resume(self, ctx: RunContext) -> str:
        status = await super().resume(ctx)
        KEPT.append(open(os.devnull, "rb"))  # noqa: SIM115 - the leak is the point
        return status


class LeavesThread(ReferenceAdapter):
    """Starts a thread on every resume that outlives it by seconds."""

    async def resume(self, ctx: RunContext) -> str:
        status = await super().resume(ctx)
        threading.Thread(target=time.sleep, args=(3.0,), name="leaky-heartbeat", daemon=True).start()
        return status


class KeepsConnection(ReferenceAdapter):
    """Keeps a database connection of every resume open and idle (a pool, as a
    production worker's), named after the worker that opened it."""

    async def resume(self, ctx: RunContext) -> str:
        import asyncpg

        status = await super().resume(ctx)
        KEPT.append(await asyncpg.connect(ctx.env.dsn, server_settings={"application_name": ctx.worker_id}))
        return status


class LeavesTimer(ReferenceAdapter):
    """Schedules a callback on every resume that would write ``<workdir>/timer-<worker>``
    a second later (a heartbeat nobody stops)."""

    async def resume(self, ctx: RunContext) -> str:
        status = await super().resume(ctx)
        marker = Path(ctx.env.workdir) / f"timer-{ctx.worker_id}"
        asyncio.get_running_loop().call_later(1.0, marker.touch)
        return status


class LeavesTask(ReferenceAdapter):
    """Starts a task on every resume that would write ``<workdir>/late-<worker>`` a second
    later (and writes ``<workdir>/cancelled-<worker>`` when it is cancelled instead)."""

    async def resume(self, ctx: RunContext) -> str:
        status = await super().resume(ctx)
        workdir = Path(ctx.env.workdir)

        async def late() -> None:
            try:
                await asyncio.sleep(1.0)
                (workdir / f"late-{ctx.worker_id}").touch()
            except asyncio.CancelledError:
                (workdir / f"cancelled-{ctx.worker_id}").touch()
                raise

        KEPT.append(asyncio.get_running_loop().create_task(late()))
        return status


class ExitsInResume(ReferenceAdapter):
    """Ends its process with exit code 3 in every resume (a runtime's ``os._exit``)."""

    async def resume(self, ctx: RunContext) -> str:
        os._exit(3)


class HangsInResume(ReferenceAdapter):
    """Never returns from a resume."""

    async def resume(self, ctx: RunContext) -> str:
        await asyncio.Event().wait()
        return "never"


# -- process-wide state one run leaves for the next (resume policy warm-worker) ----------

from typing import Any  # noqa: E402

from crashmatrix.reference_runtime.agent import ToolContext, ToolOutcome  # noqa: E402
from crashmatrix.reference_runtime.executor import Execution  # noqa: E402
from crashmatrix.scenarios.defects._base import MutantAdapter  # noqa: E402

EFFECTS_DONE: dict[str, ToolOutcome] = {}
"""Effect outcomes by node id, for the process's life (not by run)."""


class MemoByNodeExecution(Execution):
    """Remembers each effect's outcome by node id, "so a retry in this worker never
    charges twice": keyed by the node id alone, so the next run of the same shape in the
    process takes the last run's outcome and charges nothing."""

    async def run_effect(self, tool: Any, ctx: ToolContext, call: dict[str, Any]) -> ToolOutcome:
        if ctx.node_id in EFFECTS_DONE:
            return EFFECTS_DONE[ctx.node_id]
        outcome = await super().run_effect(tool, ctx, call)
        EFFECTS_DONE[ctx.node_id] = outcome
        return outcome


class MemoizesEffectsByNode(MutantAdapter):
    """The reference runtime on :class:`MemoByNodeExecution`: correct in a fresh worker
    (its memo is empty there, and a run's own retry finds its key in the ledger first),
    wrong in a worker that ran another run of the same conversation (the charge of the
    second run is never made)."""

    name = "memo-by-node"
    execution = MemoByNodeExecution
    defect = "effect outcomes memoised per process by node id, not by run"
    source = "tests: process-wide state one run leaves for the next (warm-worker)"


# -- what a runtime keeps of a run in memory after a cancellation (resume policy same-worker)

from crashmatrix.harness.adapters.reference import blob_store  # noqa: E402
from crashmatrix.reference_runtime import Runtime  # noqa: E402
from crashmatrix.reference_runtime.graph import RunGraph  # noqa: E402

GRAPHS_KEPT: dict[str, RunGraph] = {}
"""Run id -> the graph of an attempt that ended without completing, for the process's life."""


class KeptGraph(RunGraph):
    """Rehydrates from the graph this process kept of the run, when it has one."""

    @classmethod
    def rehydrate(cls, run_id: str, run_input: dict[str, Any], stored: Any, *, blobs: Any = None) -> RunGraph:
        kept = GRAPHS_KEPT.pop(run_id, None)
        return kept if kept is not None else super().rehydrate(run_id, run_input, stored, blobs=blobs)


class KeepsGraphRuntime(Runtime):
    graph_class = KeptGraph

    async def run(self, run_id: str) -> str:
        status = "raised"
        try:
            status = await super().run(run_id)
            return status
        finally:
            if status != "completed" and self._execution is not None:
                GRAPHS_KEPT[run_id] = self._execution.graph


class KeepsGraphAfterCancel(ReferenceAdapter):
    """"Warm restart": an attempt that ends without completing (a cancellation) leaves
    the run's graph in the process, and the next attempt at the run there takes it
    instead of rehydrating from the log. Right in a fresh worker (nothing kept); in the
    process a cancellation struck, the graph is behind the log by what the cancelled
    attempt appended after it was built, and the resume appends at a taken seq."""

    def make_runtime(self, db: Any, agent: Any, ctx: RunContext) -> Runtime:
        return KeepsGraphRuntime(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=blob_store(ctx.env))


class LeavesLogicalTask(ReferenceAdapter):
    """Enters a logical task of its own after each run and never leaves it, as a runtime
    that sets the task per step without resetting it does (a context variable of the
    job, not a leak of the process): a long-lived worker runs each job in a fresh copy of
    its context, so the next job's first crash points are not filed under this task."""

    async def start(self, ctx: RunContext) -> str:
        status = await super().start(ctx)
        set_logical_task("leftover")
        return status

    async def resume(self, ctx: RunContext) -> str:
        status = await super().resume(ctx)
        set_logical_task("leftover")
        return status
