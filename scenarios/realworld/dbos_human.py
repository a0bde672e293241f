"""A person in the loop on DBOS, by DBOS's own mechanism: the workflow publishes what it
waits for (``DBOS.set_event``) and waits for a message (``DBOS.recv``); the person
answers with ``DBOS.send`` (DBOS's human-in-the-loop pattern). The DBOS adapter plays
the workload's scripted operator (:mod:`crashmatrix.harness.human`) beside the workflow.

::

    @DBOS.workflow  approval(flavour, run_input)
        plan (model step) -> wait review#1 -> wait review#2 -> charge -> receipt -> answer

Each wait is ``set_event("waiting", {"node": "review", "ordinal": n})`` then
``recv(topic="review#n")``; DBOS records both as operations of the workflow, so a
recovered workflow does not wait again for an answer it received. The message the
operator sends is the interrupt's record (``{"interrupt": "review#n", "answer": ...}``),
with an idempotency key per interrupt (a resent answer is one message), and is what the
workflow keeps; the charge uses the first answer's amount and the receipt the second's
address. Conversation ``approve``; the same script as LangGraph's sequential workload
(:mod:`.human_script`).
"""

from __future__ import annotations

from typing import Any

from dbos import DBOS

from crashmatrix.harness.human import Answer, OperatorScript

from ..checkout.script import CUSTOMER
from .common import final_answer
from .dbos_checkout import DBOSCheckout, run_model, run_tool
from .human_script import AMOUNT, CARD

SCRIPT = "crashmatrix.scenarios.realworld.human_script:respond"
WORKFLOW_NAME = "crashmatrix_approval"
WAITING = "waiting"
"""The event the workflow publishes what it waits for in (the operator reads it)."""
RECV_TIMEOUT_S = 300.0
"""How long one wait lasts before the workflow gives up (DBOS's own clock, not the
simulated one: the operator answers within the worker's deadline)."""
SHIP_TO = "Ada Lovelace, 12 Analytical Row, London"


@DBOS.step(name="approval_model")  # step names are global in DBOS: not dbos_checkout's
async def model_step(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return await run_model("approval_model", conversation, messages, SCRIPT)


@DBOS.step(name="approval_tool")
async def tool_step(flavour: str, conversation: str, call: dict[str, Any]) -> dict[str, Any]:
    return await run_tool("approval_tool", flavour, conversation, call, SCRIPT)


@DBOS.workflow(name=WORKFLOW_NAME)
async def approval(flavour: str, run_input: dict[str, Any]) -> dict[str, Any]:
    conversation = run_input["conversation"]
    messages = list(run_input["messages"])
    messages.append(await model_step(conversation, messages))
    answers = {}
    for ordinal in (1, 2):
        await DBOS.set_event_async(WAITING, {"node": "review", "ordinal": ordinal})
        kept = await DBOS.recv_async(topic=f"review#{ordinal}", timeout_seconds=RECV_TIMEOUT_S)
        if kept is None:
            raise TimeoutError(f"no answer for review#{ordinal} within {RECV_TIMEOUT_S} s")
        messages.append({"role": "human", **kept})
        answers[ordinal] = kept["answer"]
    await DBOS.set_event_async(WAITING, None)
    charge = await tool_step(flavour, conversation, {"name": "charge", "arguments": {
        "amount": answers[1].get("amount", 0), "currency": "eur", "card": CARD}})
    messages.append(charge)
    content = charge["content"]
    messages.append(await tool_step(flavour, conversation, {"name": "send_receipt", "arguments": {
        "to": CUSTOMER, "subject": "Your order",
        "body": f"Charged {content.get('amount')} cents ({content.get('charge_id')}); "
                f"shipping to {answers[2].get('address')}."}}))
    message = await model_step(conversation, messages)
    return {"answer": message["content"]}


class DBOSApproval(DBOSCheckout):
    """The DBOS approval workload of one tool flavour (module docstring): the checkout
    workload's readers (``worker``, ``transcript``, ``model_step``) on another workflow."""

    prefix = "dbos-approval"
    conversations = ("approve",)
    operator_script = OperatorScript((
        Answer("review", 1, {"approved": True, "by": "carol", "amount": AMOUNT}, takes_s=3600),
        Answer("review", 2, {"address": SHIP_TO, "by": "carol"}, takes_s=5400),
    ))

    def run_input(self, conversation: str) -> dict[str, Any]:
        if conversation not in self.conversations:
            raise KeyError(f"conversation={conversation!r} is not one of {', '.join(self.conversations)}")
        return {"conversation": conversation, "messages": [{"role": "user", "content": "Buy a USB-C dock once I approve it."}]}

    @staticmethod
    def registered_workflow() -> Any:
        return approval

    @staticmethod
    def answer(messages: list[dict[str, Any]]) -> str | None:
        return final_answer(messages)


NAIVE = DBOSApproval("naive")
KEYED = DBOSApproval("keyed")
