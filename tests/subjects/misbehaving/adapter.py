"""Adapters of the reference runtime that misbehave in one way each (package docstring)."""

from __future__ import annotations

import signal
import time
from typing import Any

from crashmatrix.harness.adapter import Adapter, Environment, Observation, RunContext
from crashmatrix.harness.adapters.reference import ReferenceAdapter


class IgnoresCancel(ReferenceAdapter):
    """Its cancel API returns at once, as if the run were cancelled, and changes nothing:
    the woken worker finishes the run as if no cancel had come (``cancel.honoured``)."""

    name = "misbehaving-ignores-cancel"

    async def cancel_run(self, env: Environment, run_id: str) -> None:
        return None  # "accepted"

    async def resume_cancelled(self, env: Environment, run_id: str) -> None:
        return None


def _hang(signum: int, frame: Any) -> None:
    """A SIGTERM handler that never returns: the main thread blocks in it, the worker
    neither passes a crash point nor exits (``worker.stuck``)."""
    while True:
        time.sleep(3600)


class HangsOnTerm(ReferenceAdapter):
    """Replaces the runtime's drain with a SIGTERM handler that blocks forever."""

    name = "misbehaving-hangs-on-term"

    def make_runtime(self, db: Any, agent: Any, ctx: RunContext) -> Any:
        runtime = super().make_runtime(db, agent, ctx)
        signal.signal(signal.SIGTERM, _hang)
        return runtime


class NoRecovery(ReferenceAdapter):
    """Declares no recovery of its own (``recover`` is the base's): resume policy
    ``discovery`` is not applicable to it."""

    name = "misbehaving-no-recovery"
    recover = Adapter.recover


class HangsOnCancel(ReferenceAdapter):
    """When its run is cancelled, the worker blocks forever instead of unwinding (a
    cleanup that waits on a lock nobody releases): no crash point, no exit."""

    name = "misbehaving-hangs-on-cancel"
    long_lived_workers = True  # its cancelled workers run in long-lived processes

    async def start(self, ctx: RunContext) -> str:
        import asyncio

        try:
            return await super().start(ctx)
        except asyncio.CancelledError:
            while True:
                time.sleep(3600)


class ObserveRaises(ReferenceAdapter):
    """Its ``observe`` raises (a query against a column its schema does not have): the
    contract is broken before any case can be judged."""

    name = "misbehaving-observe-raises"

    async def observe(self, env: Environment, run_id: str) -> Observation:
        raise RuntimeError("column cm_runs.status2 does not exist")


class NoRestore(ReferenceAdapter):
    """Declares no restore API (no ``restore_effects`` promise): fault kind ``restore``
    is not applicable to it."""

    name = "misbehaving-no-restore"
    restore_effects = None
