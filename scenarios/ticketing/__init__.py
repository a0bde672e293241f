"""The ticketing workload: a support agent whose tools call a service its team declared.

Not the harness's payment or mail fakes: a help desk's ticketing API, declared as a
:class:`~crashmatrix.harness.services.providers.declared.ServiceSpec`
(:data:`.tools.TICKETS`) and run by the harness like the built-in providers: a process
of its own with a durable ledger the oracle compares (``provider.ticketing.ledger_equal``),
per-worker in-flight counting, a link of the ``net`` section, a sandbox for
``crashmatrix certify-probe`` (``scenarios/probes_examples.py``: ``ticket_truth``).
On the reference runtime (docs/adapters.md, "Services a workload declares")::

    crashmatrix run crashmatrix.scenarios.ticketing:WORKLOAD --conversation conv1
    crashmatrix run crashmatrix.scenarios.ticketing:WORKLOAD --kinds net --conversation conv1
    crashmatrix certify-probe crashmatrix.scenarios.ticketing.tools:OPEN_TICKET \\
        --truth crashmatrix.scenarios.probes_examples:ticket_truth
"""

from __future__ import annotations

from crashmatrix.harness.services.providers.clients import Resources
from crashmatrix.reference_runtime.agent import Agent

from .._workload import ScriptedWorkload
from ..checkout import ScriptedModel
from .tools import TICKETS, TOOLS

SCRIPT = "crashmatrix.scenarios.ticketing.script:respond"


class TicketingWorkload(ScriptedWorkload):
    """Two conversations (one ticket; two at once) against the model provider and the
    declared ticketing service."""

    name = "ticketing"
    conversations = ("conv1", "conv2")
    providers = ("model", TICKETS.name)   # what the harness starts, reads and proxies
    services = (TICKETS,)                 # how it runs the ones it does not know
    request = "My USB-C dock (order 1042) arrived broken. Please open a ticket."

    def build_agent(self, conversation: str, resources: Resources) -> Agent:
        return Agent(name=self.name, model=ScriptedModel(resources, SCRIPT), tools=dict(TOOLS), resources=resources)


WORKLOAD = TicketingWorkload()
