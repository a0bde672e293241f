"""Prefect 3 as a subject: a flow whose tasks persist their results under cache keys, on
a real Prefect API server (SQLite), resumed by running the flow again.

Needs the optional extra ``crashmatrix[prefect]`` (imported only in a worker). The
workload is :mod:`crashmatrix.scenarios.realworld.prefect_checkout` (``NAIVE`` or
``KEYED``), reached through the workload object (its ``result_storage``, ``flow``,
``run_input``, ``answer``, ``step_order``).

**The server** (:mod:`crashmatrix.harness.services.prefect`) is started by
:meth:`PrefectAdapter.prepare` in the controller, once per adapter instance, with a
watchdog of the adapter's own, and stopped by :meth:`PrefectAdapter.aclose`. Its URL
reaches the workers in ``<workdir>/prefect/server.json``; the task results live in
``<workdir>/prefect/results/`` (one JSON file per cache key).

**A worker** (start or resume: the same code, as recovery in Prefect is a new run of the
flow) runs the flow in its event loop with ``PREFECT_API_URL`` set for it
(``prefect.settings.temporary_settings``); the flow run is named after the run id.

**Faults**: ``kill``; ``term`` (Prefect's flow engine bridges SIGTERM into an exception
in the flow, ``TerminationSignal``: the run is marked crashed and the worker ends);
``cancel`` (the flow is a coroutine of the worker's loop: the ``CancelledError`` reaches
the running task). ``pause`` / ``db-restart`` do not apply (no lease; no PostgreSQL).

**Crash points**: ``step.before/after`` in each task (logical task ``model-N`` /
``tool-N.i``), the workload's ``model.call.*`` / ``tool.request.*``, and
``log.append.before/after`` around the result file's write. Await points: frames in
``prefect``.

**observe** reads the result files of the run (the log, in step order, and the
transcript) and the run's flow runs through the API (``POST /flow_runs/filter`` by
name): ``completed`` once one of them completed, ``failed`` when the latest failed, else
``interrupted`` (a killed worker's flow run stays ``Running``: the server's services,
which would mark it crashed, are off).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import aiohttp

from ..adapter import Environment, LogEntry, Observation, RunContext
from ._shared import ServerBackedAdapter, point_under, worker_hooks

_POINT_LOCK = threading.Lock()
point = point_under(_POINT_LOCK)


def results_dir(env: Environment) -> Path:
    """Where the tasks' result files are (one per cache key)."""
    return Path(env.workdir) / "prefect" / "results"


class PrefectAdapter(ServerBackedAdapter):
    """Prefect 3: a flow of cached, result-persisting tasks on a local API server."""

    name = "prefect"
    subject_packages = ("prefect",)
    server_dir = "prefect"
    requires = ("prefect.settings",)
    extra = "prefect"

    def start_server(self, base_dir: Path, watchdog: Any) -> tuple[Any, dict[str, Any]]:
        from ..services.prefect import start_prefect

        server = start_prefect(base_dir, watchdog=watchdog)
        (base_dir.parent / "results").mkdir(parents=True, exist_ok=True)
        return server, {"api_url": server.api_url}

    def api_url(self, env: Environment) -> str:
        return str(self.server_info(env)["api_url"])

    # -- worker side --------------------------------------------------------------

    async def start(self, ctx: RunContext) -> str:
        return await self._run(ctx)

    async def resume(self, ctx: RunContext) -> str:
        return await self._run(ctx)  # recovery in Prefect: run the flow again

    async def _run(self, ctx: RunContext) -> str:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        # Prefect logs every task run at INFO to the console; a worker has no reader for it
        logging.getLogger("prefect").setLevel(logging.WARNING)
        async with aiohttp.ClientSession() as session:
            hooks = worker_hooks(ctx, session, point, _POINT_LOCK)
            with temporary_settings({PREFECT_API_URL: self.api_url(ctx.env)}):
                storage = await ctx.workload.result_storage(hooks, results_dir(ctx.env))
                checkout = ctx.workload.flow(hooks, ctx.run_id, storage)
                await checkout(ctx.workload.run_input(ctx.conversation))
        return "completed"

    # -- controller side ----------------------------------------------------------

    async def observe(self, env: Environment, run_id: str) -> Observation:
        workload = self.workload_of(env)
        async with self.http().post(f"{self.api_url(env)}/flow_runs/filter",
                                   json={"flow_runs": {"name": {"any_": [run_id]}}, "sort": "EXPECTED_START_TIME_ASC"}) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"prefect /flow_runs/filter {resp.status}: {body[:300]}")
        runs = json.loads(body)
        if not runs:
            return Observation(run_id, "absent", log=[], state=None, state_error="no flow run")
        states = [(r.get("state") or {}).get("type") for r in runs]
        status = ("completed" if "COMPLETED" in states else "failed" if states[-1] in ("FAILED",)
                  else "interrupted")
        steps = []
        for path in sorted(results_dir(env).glob(f"{run_id}.*")):
            step = path.name[len(run_id) + 1:]
            try:
                record = json.loads(path.read_text())
                steps.append((step, _result(record)))
            except (OSError, ValueError, KeyError) as exc:
                return Observation(run_id, status, log=None, state=None, state_error=f"result {step}: {exc}")
        steps.sort(key=lambda s: workload.step_order(s[0]))
        conversation = runs[0].get("parameters", {}).get("run_input", {}).get("conversation")
        messages = list(workload.run_input(conversation)["messages"]) if conversation else []
        messages += [out for _, out in steps]
        log = [LogEntry(seq, name, (), name.split("-")[0], 0) for seq, (name, _) in enumerate(steps, start=1)]
        return Observation(run_id, status, log=log, effects=None, state={
            "transcript": messages, "answer": workload.answer(messages), "budget": None,
            "pending": [] if status in ("completed", "failed") else ["flow"]})


def _result(record: dict[str, Any]) -> Any:
    """The value in a persisted result record (``{"metadata", "result"}``, the result
    itself JSON-serialised by the record's serializer)."""
    result = record["result"]
    return json.loads(result) if isinstance(result, str) else result


__all__ = ["PrefectAdapter", "point"]
