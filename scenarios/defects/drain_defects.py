"""Mutants of the drain: what a runtime's SIGTERM handling gets wrong."""

from __future__ import annotations

from typing import Any

import anyio

from crashmatrix.reference_runtime.executor import Execution

from ._base import MutantAdapter


class DrainCancelsInFlightExecution(Execution):
    """Defect: on SIGTERM the runtime stops launching nodes, as it should, and also
    cancels the nodes in flight, "to exit sooner": the run is left ``paused`` and the
    worker exits 0, so nothing new launched after the signal; but the work in flight is
    lost, and a resume redoes it (a model turn paid again, an effect sent to its probe).

    Class: seed 002's drain promise ("lets the in-flight ones finish and append their
    records"), which ``term.drained`` alone does not check (a drain that cancels its
    in-flight nodes, leaves the run paused and exits 0 passes it, and is re-billed on
    resume under the allowance for nodes in flight). Caught at the crash state by
    ``term.in_flight_recorded``.
    """

    async def run_node(self, spec: Any) -> None:
        scopes: set[anyio.CancelScope] = self.__dict__.setdefault("_node_scopes", set())
        with anyio.CancelScope() as scope:
            scopes.add(scope)
            try:
                if self.rt.drain_requested():
                    scope.cancel()
                await super().run_node(spec)
            finally:
                scopes.discard(scope)

    def may_launch(self) -> bool:
        if self.rt.drain_requested():  # the scheduler woke for the drain: cut the nodes short
            for scope in list(self.__dict__.get("_node_scopes", ())):
                scope.cancel()
        return super().may_launch()


class DrainCancelsInFlightAdapter(MutantAdapter):
    """The reference runtime whose drain cancels its in-flight nodes (:class:`DrainCancelsInFlightExecution`)."""

    execution = DrainCancelsInFlightExecution
    defect = "SIGTERM cancels the nodes in flight instead of letting them finish and record"
    source = "seed 002's drain promise (a drain that cancels in-flight work passes term.drained)"
    caught_by = ("term.in_flight_recorded",)
    fault_kinds = ("term",)
