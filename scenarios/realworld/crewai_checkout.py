"""The checkout agent as a CrewAI Flow with ``@persist``: a state machine whose state is
saved after every method (CrewAI's ``SQLiteFlowPersistence``, one file per run).

::

    @start begin --> @router route --"go_model"--> @listen model_turn --+
                       ^      \\--"go_tool"--> @listen tool_call --------+
                       +----------------------------------------------------+
    route --"finished"--> (no listener: the flow ends)

``model_turn`` makes one billed model turn (step ``model-N``) and keeps its tool calls as
``pending``; ``tool_call`` runs the next pending call (step ``tool-N.i``); ``route`` picks
the next method from the state. ``@persist`` at class level saves the whole state after
each method. ``kickoff(inputs={"id": run_id})`` reloads the latest saved state and runs
the flow *from its start method again* (CrewAI: "when ``_completed_methods`` is empty
(e.g. a pure state-reload via kickoff(inputs={"id": ...})), the flow executes from
scratch"), so the resume is only as good as the methods' reading of the state: here
``route`` sends it to the step the state says is next. A method that was running when
the process died has no saved state and runs again: at-least-once.

**Tool flavours**: ``keyed`` sends ``sha256(state id:step id)`` (the flow state's id is the
run id, step ids are derived from the saved state), ``naive`` a fresh key per attempt.

CrewAI's telemetry and tracing are switched off before it is imported
(``CREWAI_DISABLE_TELEMETRY``, ``CREWAI_TRACING_ENABLED``): nothing may leave this
machine. The flow class is built per worker (:func:`build_flow`), and CrewAI is imported
only then: the controller imports this module to read runs (conversations, answers), and
its environment need not hold CrewAI when the subject runs in an environment of its own
(``--subject ...@VENV``).
"""

from __future__ import annotations

import os
from crashmatrix.harness.crashpoint import (
    LOG_APPEND_AFTER, LOG_APPEND_BEFORE, MODEL_CALL_AFTER, MODEL_CALL_BEFORE, TOOL_REQUEST_AFTER,
    TOOL_REQUEST_BEFORE,
)
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from pydantic import BaseModel, Field  # noqa: E402

from .common import MAX_TURNS, FlavouredCheckout, StepHooks, effect_key  # noqa: E402

STEP_METHODS = ("model_turn", "tool_call")


class CheckoutState(BaseModel):
    """The flow's state (saved whole after every method)."""

    id: str = ""
    conversation: str = ""
    flavour: str = "naive"
    messages: list[dict[str, Any]] = Field(default_factory=list)
    turn: int = 0
    pending: list[dict[str, Any]] = Field(default_factory=list)
    call_index: int = 0
    answer: str | None = None
    step: str | None = None


_POINT: list[Any] = [lambda name: None]
_PERSISTENCE: list[type] = []


def persistence_class() -> type:
    """``CrashpointPersistence``: CrewAI's ``SQLiteFlowPersistence`` with
    ``log.append.before`` / ``.after`` around the save that follows a step method (after:
    committed); ``point`` is set per worker. Made on first use (it imports CrewAI)."""
    if not _PERSISTENCE:
        from crewai.flow.persistence import SQLiteFlowPersistence

        class CrashpointPersistence(SQLiteFlowPersistence):
            def save_state(self, flow_uuid: str, method_name: str, state_data: Any) -> None:
                labelled = method_name in STEP_METHODS
                if labelled:
                    _POINT[0](LOG_APPEND_BEFORE)
                super().save_state(flow_uuid, method_name, state_data)
                if labelled:
                    _POINT[0](LOG_APPEND_AFTER)

        _PERSISTENCE.append(CrashpointPersistence)
    return _PERSISTENCE[0]


def build_flow(hooks: StepHooks, persistence: Any) -> type:
    """The checkout flow class for one worker (its hooks bound, saved by ``persistence``,
    a CrewAI ``FlowPersistence``)."""
    from crewai.flow.flow import Flow, listen, or_, router, start
    from crewai.flow.persistence import persist

    _POINT[0] = hooks.point

    @persist(persistence)
    class CheckoutFlow(Flow[CheckoutState]):
        @start()
        def begin(self) -> None:
            return None

        @router(or_("begin", "model_turn", "tool_call"))
        def route(self) -> str:
            if self.state.answer is not None:
                return "finished"
            if self.state.pending:
                return "go_tool"
            if self.state.turn >= MAX_TURNS:
                raise RuntimeError(f"checkout did not end within {MAX_TURNS} model turns")
            return "go_model"

        @listen("go_model")
        async def model_turn(self) -> None:
            turn = self.state.turn + 1
            step = f"model-{turn}"
            clients = hooks.clients(self.state.conversation, self.state.id)
            hooks.set_task(step)
            hooks.step("before", step)
            hooks.point(MODEL_CALL_BEFORE)
            message = await clients.model(step, list(self.state.messages))
            hooks.point(MODEL_CALL_AFTER)
            hooks.step("after", step)
            calls = list(message.get("tool_calls") or [])
            self.state.messages = [*self.state.messages, message]
            self.state.turn, self.state.pending, self.state.call_index, self.state.step = turn, calls, 0, step
            if not calls:
                self.state.answer = str(message["content"])

        @listen("go_tool")
        async def tool_call(self) -> None:
            step = f"tool-{self.state.turn}.{self.state.call_index}"
            call = self.state.pending[0]
            clients = hooks.clients(self.state.conversation, self.state.id)
            hooks.set_task(step)
            hooks.step("before", step)
            hooks.point(TOOL_REQUEST_BEFORE)
            out = await clients.tool(call, effect_key(self.state.flavour, self.state.id, step), step)
            hooks.point(TOOL_REQUEST_AFTER)
            hooks.step("after", step)
            self.state.messages = [*self.state.messages, out]
            self.state.pending, self.state.call_index, self.state.step = \
                self.state.pending[1:], self.state.call_index + 1, step

    return CheckoutFlow


class CrewAICheckout(FlavouredCheckout):
    """A CrewAI checkout workload of one tool flavour (``naive`` or ``keyed``)."""

    prefix = "crewai-checkout"
    step_methods = STEP_METHODS

    @staticmethod
    def persistence(path: str) -> Any:
        """The run's persistence: CrewAI's SQLite file at ``path``, labelled
        (:func:`persistence_class`)."""
        return persistence_class()(path)

    @staticmethod
    def flow(hooks: StepHooks, persistence: Any) -> type:
        """:func:`build_flow`: the flow class for one worker."""
        return build_flow(hooks, persistence)

    def inputs(self, run_id: str, conversation: str) -> dict[str, Any]:
        """The first kickoff's inputs (the state's initial fields)."""
        return {"id": run_id, "conversation": conversation, "flavour": self.flavour,
                "messages": list(self.run_input(conversation)["messages"])}


NAIVE = CrewAICheckout("naive")
KEYED = CrewAICheckout("keyed")
