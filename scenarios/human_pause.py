"""The ``human_pause`` workload: a run that waits days for a person's approval, across
retention passes that must not delete it.

Flow: turn 1 mails an approval request to the approver (mail provider, an effect);
turn 2 calls ``await_approval``, an effect whose outcome only a person can give (no
probe: the request went out of band), so the runtime stops the run in ``needs_human``
with the effect named (:mod:`crashmatrix.reference_runtime.handoff`). Then the workload's
:func:`operator` (the human in the loop; the reference adapter calls it whenever a run
stops ``needs_human``) lets :data:`WAIT_DAYS` days pass on the simulated clock
(:class:`SimulatedClock`), with a retention pass at the end of each day
(``retention.delete_finished_runs``, finished runs older than :data:`RETENTION`), and
raises :class:`RetentionDeletedWaitingRun` if a pass took the waiting run; then the
approver, who checks that exactly one request mail reached the mail provider, approves
(``handoff.resolve`` applied, with the decision as the effect's result). The run resumes,
charges the card (payment provider) and answers.

What the matrix proves: a crash anywhere (before the wait, while the run waits, during a
retention pass, after the approval) ends with one request mail, one approval, one charge,
and a run retention never touched while it waited.

Run it: ``crashmatrix run human_pause``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg

from crashmatrix.reference_runtime import handoff
from crashmatrix.reference_runtime.agent import Agent, OutcomeUnknown, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.retention import delete_finished_runs

from ._workload import ScriptedWorkload
from .checkout import ScriptedModel
from .checkout.script import CARDS, _call, _tool_results
from .checkout.tools import charge, probe_charge, probe_mail, send_receipt

NAME = "human_pause"
APPROVER = "carol@example.test"
AMOUNT = 250_000  # minor units: 2,500.00 eur
WAIT_DAYS = 3
RETENTION = timedelta(hours=12)
SCRIPT = "crashmatrix.scenarios.human_pause:respond"


class RetentionDeletedWaitingRun(RuntimeError):
    """A retention pass deleted a run that was waiting for a person."""


class SimulatedClock:
    """Days pass for one waiting run: its timestamps (what retention reads) move back by
    that much, exactly as if the database's clock had moved forward for it."""

    async def advance(self, conn: asyncpg.Connection, run_id: str, *, days: int) -> None:
        await conn.execute(
            "UPDATE cm_runs SET updated_at = updated_at - make_interval(days => $2), "
            "created_at = created_at - make_interval(days => $2) WHERE run_id = $1",
            run_id, days,
        )


CLOCK = SimulatedClock()


async def await_approval(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """The approval comes out of band: this call can never know it (no probe either)."""
    raise OutcomeUnknown(f"approval request {args['request_id']} is with {APPROVER}; only a person can answer")


Operator = Callable[[asyncpg.Connection, str, Any], Awaitable[bool]]
"""``operator(conn, run_id, resources) -> bool``: what the reference adapter calls when a
run stops ``needs_human`` (True: it decided something, run again)."""


def approver(workload: str, person: str, *, days: int, retention: timedelta = RETENTION) -> Operator:
    """The human in the loop of a workload whose run waits on ``await_approval``: let
    ``days`` simulated days pass with a retention pass of ``workload``'s runs at the end
    of each, check that the approval request reached the mail provider exactly once,
    then approve as ``person``. Shared by ``human_pause`` and ``support_desk``."""

    async def operator(conn: asyncpg.Connection, run_id: str, resources: Any) -> bool:
        """Returns False when the run waits on nothing this operator decides (nothing
        done). Raises :class:`RetentionDeletedWaitingRun`, or RuntimeError when the
        approval request did not reach the mail provider exactly once."""
        from crashmatrix.harness.services.providers import clients

        waiting = [p for p in await handoff.pending(conn, run_id) if p.tool == "await_approval"]
        if not waiting:
            return False
        [effect] = waiting
        for _day in range(days):
            await CLOCK.advance(conn, run_id, days=1)
            report = await delete_finished_runs(conn, older_than=retention, workload=workload)
            if run_id in report.runs:
                raise RetentionDeletedWaitingRun(f"retention deleted run {run_id} while it waited for {person}")
        request_id = effect.request["request_id"]
        mails = [r for r in await clients.read_ledger(resources.session, resources.urls["mail"], run_id)
                 if r["ref"] == request_id]
        if len(mails) != 1:
            raise RuntimeError(f"run {run_id}: approval request {request_id} reached the mail provider {len(mails)} time(s)")
        decision = {"approved": True, "by": person, "request_id": request_id, "waited_days": days}
        await handoff.resolve(conn, run_id, effect.idem_key, applied=True, result=decision, operator=person)
        return True

    return operator


operator = approver(NAME, APPROVER, days=WAIT_DAYS)
"""The human in the loop of ``human_pause``: three days, then Carol approves."""


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The purchasing agent (runs in the model provider)."""
    requests = _tool_results(messages, "send_approval_request")
    if not requests:
        return {"content": "This purchase needs approval.", "tool_calls": [_call(
            "send_approval_request", to=APPROVER, subject="Approval request: 10 USB-C docks",
            body=f"Please approve {AMOUNT} cents for 10 USB-C docks.")]}
    approvals = _tool_results(messages, "await_approval")
    if not approvals:
        return {"content": "Waiting for the approval.", "tool_calls": [_call(
            "await_approval", request_id=requests[0]["content"]["message_id"], amount=AMOUNT)]}
    decision = approvals[0]["content"]
    charges = _tool_results(messages, "charge")
    if not charges:
        return {"content": f"Approved by {decision['by']}; paying.", "tool_calls": [_call(
            "charge", amount=AMOUNT, currency="eur", card=CARDS[1])]}
    return {"content": f"Approved by {decision['by']} after {decision['waited_days']} days; charged "
                       f"{charges[0]['content']['charge_id']}.", "tool_calls": []}


class HumanPauseWorkload(ScriptedWorkload):
    """See the module docstring. ``operator`` is the human in the loop."""

    name = NAME
    conversations = ("approve",)
    providers = ("payment", "mail", "model")
    request = "Buy ten USB-C docks for the team."
    operator = staticmethod(operator)

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        return Agent(self.name, ScriptedModel(resources, SCRIPT), {
            "send_approval_request": Tool("send_approval_request", send_receipt, effect=True, probe=probe_mail),
            "await_approval": Tool("await_approval", await_approval, effect=True),
            "charge": Tool("charge", charge, effect=True, probe=probe_charge),
        }, resources=resources)


WORKLOAD = HumanPauseWorkload()
