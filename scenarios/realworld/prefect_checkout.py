"""The checkout agent as a Prefect 3 flow: each model turn and each tool call is a task
whose result is persisted under a cache key, so a re-run of the flow skips it.

::

    @flow "checkout" (flow run name = the run id)
        loop: @task step("model-N") -> (tool calls?) -> @task step("tool-N.i") per call -> ...

Prefect does not resume a flow run whose process died: the run stays ``Running`` and
recovery is running the flow again. What makes that a resume is Prefect 3's result
persistence and transactions: each task has a cache key (``<run id>.<step id>``), runs
inside a transaction on that key, and on success its result is written to the result
storage (one file per key, JSON) when the transaction commits; a later run whose task
finds a committed record for its key returns the stored result without running (the
docs' "idempotent pipelines" pattern). A task that was running when the process died
has no record and runs again: at-least-once.

**Tool flavours**: ``keyed`` sends ``sha256(run id:step id)`` (the same ids as the cache
key), ``naive`` a fresh key per attempt.

:class:`CrashpointFileSystem` is Prefect's ``LocalFileSystem`` with the harness's labels
``log.append.before`` / ``.after`` around each result write (after: the file is
written). The storage (:func:`result_storage`, saved as a block document: Prefect 3 refuses an
unsaved one), the flow and its tasks are made per worker (:func:`build_flow`): nothing
runs at import time (importing Prefect starts no thread).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from crashmatrix.harness.crashpoint import LOG_APPEND_AFTER, LOG_APPEND_BEFORE
from pathlib import Path
from typing import Any, ClassVar

from prefect import flow, task
from prefect.filesystems import LocalFileSystem

from .common import FlavouredCheckout, StepHooks, checkout_loop

FLOW_NAME = "crashmatrix-checkout"


def cache_key(run_id: str, step: str) -> str:
    """The cache key (and result file name) of a step of a run."""
    return f"{run_id}.{step}"


class CrashpointFileSystem(LocalFileSystem):
    """Prefect's local result storage with ``log.append.before`` / ``.after`` around each
    write (labels reported through :attr:`point`, set per worker)."""

    _block_type_slug = "crashmatrix-crashpoint-fs"
    point: ClassVar[Callable[[str], None]] = staticmethod(lambda name: None)

    async def awrite_path(self, path: str, content: bytes) -> str:
        type(self).point(LOG_APPEND_BEFORE)
        out = await super().awrite_path(path, content)
        type(self).point(LOG_APPEND_AFTER)
        return out


async def result_storage(hooks: StepHooks, results: Path) -> CrashpointFileSystem:
    """The result storage of one worker's tasks (files under ``results``), saved as a
    block document on the API server (Prefect 3 takes only saved storage blocks)."""
    CrashpointFileSystem.point = staticmethod(hooks.point)  # type: ignore[assignment]
    storage = CrashpointFileSystem(basepath=str(results))
    await storage.save("crashmatrix-results", overwrite=True)
    return storage


def build_flow(hooks: StepHooks, flavour: str, run_id: str, storage: CrashpointFileSystem) -> Any:
    """The checkout flow for one worker; its tasks persist results in ``storage``."""

    @task(name="step", persist_result=True, result_storage=storage, result_serializer="json",
          cache_key_fn=lambda _ctx, params: cache_key(run_id, params["step"]), retries=0)
    async def step_task(step: str, label: str, action: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        hooks.step("before", step)
        hooks.point(f"{label}.before")
        out = await action()
        hooks.point(f"{label}.after")
        hooks.step("after", step)
        return out

    @flow(name=FLOW_NAME, flow_run_name=run_id, persist_result=False, retries=0, validate_parameters=False)
    async def checkout(run_input: dict[str, Any]) -> dict[str, Any]:
        clients = hooks.clients(run_input["conversation"], run_id)

        async def durable(step: str, label: str, action: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
            hooks.set_task(step)  # the task runs (and writes its result) in this context
            return await step_task(step, label, action)

        return await checkout_loop(run_input, clients, flavour, run_id, durable)

    return checkout


class PrefectCheckout(FlavouredCheckout):
    """A Prefect checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "prefect-checkout"

    @staticmethod
    async def result_storage(hooks: StepHooks, results: Path) -> CrashpointFileSystem:
        """:func:`result_storage`: one worker's result storage, saved as a block."""
        return await result_storage(hooks, results)

    def flow(self, hooks: StepHooks, run_id: str, storage: CrashpointFileSystem) -> Any:
        """:func:`build_flow` of this flavour for one worker."""
        return build_flow(hooks, self.flavour, run_id, storage)


NAIVE = PrefectCheckout("naive")
KEYED = PrefectCheckout("keyed")
