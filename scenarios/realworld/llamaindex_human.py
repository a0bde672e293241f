"""A person in the loop on LlamaIndex, by LlamaIndex's own mechanism: a step returns an
``InputRequiredEvent``, which the run writes to its event stream, and the application
answers by sending a ``HumanResponseEvent`` into the run's context
(``handler.ctx.send_event``), which a step accepts (LlamaIndex's "Human in the loop"
pattern). The LlamaIndex adapter plays the workload's scripted operator
(:mod:`crashmatrix.harness.human`): it answers each :class:`Ask` it reads on the stream.

::

    plan   (StartEvent)  model-1 -> Ask review#1
    review (Reply)       keeps the answer -> Ask review#2 | Pay
    pay    (Pay)         tool-1.0: the charge (the first answer's amount) -> Receipt
    mail   (Receipt)     tool-1.1: the receipt (the second answer's address) -> Sum
    sum    (Sum)         model-2 -> StopEvent (the answer)

Conversation ``approve``, the model script and operator answers of the DBOS approval
workload (:mod:`.human_script`, :mod:`.dbos_human`). The state and the API (2.x or
llama-index-core 0.12) are :mod:`.llamaindex_checkout`'s; each kept answer is a message
``{"role": "human", "interrupt": "review#N", "answer": ...}`` in the transcript.
"""

import json
from collections.abc import Callable
from typing import Any

from crashmatrix.harness.human import Answer, OperatorScript, record

from ..checkout.script import CUSTOMER
from .common import Clients, effect_key
from .human_script import AMOUNT, CARD
from .llamaindex_checkout import (
    Context, Event, HumanResponseEvent, InputRequiredEvent, LlamaIndexCheckout, StartEvent, StepHook, StopEvent,
    Workflow, _read, _write, snapshot_state, step,
)

SCRIPT = "crashmatrix.scenarios.realworld.human_script:respond"
SHIP_TO = "Ada Lovelace, 12 Analytical Row, London"
NODE = "review"


class Ask(InputRequiredEvent):
    """The run waits for the ``ordinal``-th answer of ``node``."""

    node: str
    ordinal: int


class Reply(HumanResponseEvent):
    """The person's answer to ``node``'s ``ordinal``-th question."""

    node: str
    ordinal: int
    answer: dict[str, Any]


class Pay(Event):
    """Both answers are in: charge the card."""


class Receipt(Event):
    """The charge is made: mail the receipt."""


class Sum(Event):
    """The receipt is sent: ask the model for the answer."""


def _ask(ordinal: int) -> Ask:
    """The question ``review#ordinal`` (``prefix``: the text 0.12's InputRequiredEvent
    requires)."""
    return Ask(node=NODE, ordinal=ordinal, prefix=f"{NODE}#{ordinal}")


class ApprovalWorkflow(Workflow):
    """The approval run (module docstring). ``finished`` gets each step's id as the step
    returns (the adapter names the snapshot that follows after it)."""

    def __init__(self, clients: Clients, hook: StepHook, flavour: str, run_id: str,
                 finished: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clients, self.hook, self.flavour, self.run_id, self.finished = clients, hook, flavour, run_id, finished

    async def _model(self, ctx: Context, step_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.hook("before", step_id)
        reply = await self.clients.model(step_id, messages)
        self.hook("after", step_id)
        return messages + [reply]

    async def _tool(self, ctx: Context, step_id: str, call: dict[str, Any]) -> dict[str, Any]:
        (messages,) = await _read(ctx, "messages")
        self.hook("before", step_id)
        out = await self.clients.tool(call, effect_key(self.flavour, self.run_id, step_id), step_id)
        self.hook("after", step_id)
        await _write(ctx, messages=list(messages) + [out], step=step_id)
        self.finished(step_id)
        return out

    @step
    async def plan(self, ctx: Context, ev: StartEvent) -> Ask:
        messages = await self._model(ctx, "model-1", list(ev.messages))
        await _write(ctx, messages=messages, answers={}, step="model-1")
        self.finished("model-1")
        return _ask(1)

    @step
    async def review(self, ctx: Context, ev: Reply) -> Ask | Pay:
        messages, answers = await _read(ctx, "messages", "answers")
        kept = record(ev.node, ev.ordinal, ev.answer)
        step_id = f"human-{ev.node}-{ev.ordinal}"
        await _write(ctx, messages=list(messages) + [{"role": "human", **kept}],
                     answers={**answers, str(ev.ordinal): ev.answer}, step=step_id)
        self.finished(step_id)
        return _ask(ev.ordinal + 1) if ev.ordinal < 2 else Pay()

    @step
    async def pay(self, ctx: Context, ev: Pay) -> Receipt:
        (answers,) = await _read(ctx, "answers")
        await self._tool(ctx, "tool-1.0", {"id": "call-charge", "name": "charge", "arguments": {
            "amount": answers["1"].get("amount", 0), "currency": "eur", "card": CARD}})
        return Receipt()

    @step
    async def mail(self, ctx: Context, ev: Receipt) -> Sum:
        messages, answers = await _read(ctx, "messages", "answers")
        charge = messages[-1]["content"]
        await self._tool(ctx, "tool-1.1", {"id": "call-receipt", "name": "send_receipt", "arguments": {
            "to": CUSTOMER, "subject": "Your order",
            "body": f"Charged {charge.get('amount')} cents ({charge.get('charge_id')}); "
                    f"shipping to {answers['2'].get('address')}."}})
        return Sum()

    @step
    async def sum(self, ctx: Context, ev: Sum) -> StopEvent:
        (messages,) = await _read(ctx, "messages")
        messages = await self._model(ctx, "model-2", list(messages))
        await _write(ctx, messages=messages, step="model-2")
        self.finished("model-2")
        return StopEvent(result=messages[-1]["content"])


class LlamaIndexApproval(LlamaIndexCheckout):
    """The LlamaIndex approval workload of one tool flavour: the checkout workload's
    readers (``snapshot_state``, ``finished``, ``answer``) on another workflow, with an
    operator script and the hooks the adapter's operator uses (:meth:`interrupt`,
    :meth:`reply`)."""

    prefix = "llamaindex-approval"
    conversations = ("approve",)
    operator_script = OperatorScript((
        Answer(NODE, 1, {"approved": True, "by": "carol", "amount": AMOUNT}, takes_s=3600),
        Answer(NODE, 2, {"address": SHIP_TO, "by": "carol"}, takes_s=5400),
    ))

    def finished(self, snapshot: dict[str, Any]) -> bool:
        """The run ended: the snapshot follows the last step (``model-2``; the plan,
        ``model-1``, is an answer-shaped message too) and is not running, or is a 0.12
        checkpoint record (``_done`` is all that is left)."""
        done = snapshot_state(snapshot).get("step") == "model-2"
        return done and ("ctx_state" in snapshot or not snapshot.get("is_running"))

    def run_input(self, conversation: str) -> dict[str, Any]:
        if conversation not in self.conversations:
            raise KeyError(f"conversation={conversation!r} is not one of {', '.join(self.conversations)}")
        return {"conversation": conversation, "messages": [{"role": "user", "content": "Buy a USB-C dock once I approve it."}]}

    def clients(self, session: Any, urls: dict[str, str], worker_id: str, conversation: str, run_id: str) -> Clients:
        return Clients(session, urls, worker_id, conversation, run_id, script=SCRIPT)

    def workflow(self, clients: Clients, hook: StepHook, run_id: str, finished: Callable[[str], None],
                 timeout: float = 60.0) -> ApprovalWorkflow:
        return ApprovalWorkflow(clients, hook, self.flavour, run_id, finished, timeout=timeout)

    @staticmethod
    def waiting(snapshot: dict[str, Any]) -> tuple[str, int] | None:
        """``(node, ordinal)`` of the question a run restored from ``snapshot`` waits on
        (the application's own record of what it asked: the last step asked it), else
        None."""
        last = snapshot_state(snapshot).get("step")
        return {"model-1": (NODE, 1), f"human-{NODE}-1": (NODE, 2)}.get(last)

    @staticmethod
    def interrupt(event: Any) -> tuple[str, int] | None:
        """``(node, ordinal)`` of a stream event that asks the person, else None."""
        return (event.node, event.ordinal) if isinstance(event, Ask) else None

    @staticmethod
    def reply(node: str, ordinal: int, value: Any) -> Reply:
        """The event that answers ``node``'s ``ordinal``-th question with ``value``."""
        # ``response``: the text 0.12's HumanResponseEvent requires (the answer as JSON)
        return Reply(node=node, ordinal=ordinal, answer=value, response=json.dumps(value, sort_keys=True))


NAIVE = LlamaIndexApproval("naive")
KEYED = LlamaIndexApproval("keyed")
