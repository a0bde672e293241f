"""The OpenAI Agents SDK with its DBOS integration (``dbos-openai-agents``) as a subject.

Needs the optional extra ``crashmatrix[openai-agents]``. The workload is
:mod:`crashmatrix.scenarios.realworld.openai_agents_checkout` (``NAIVE`` or ``KEYED``):
``DBOSRunner.run`` inside a ``@DBOS.workflow``, every model call one DBOS step
(``_model_call_step``), every tool call a DBOS step of the workload's own.

The SDK itself is not durable (its ``Session`` keeps conversation history, not a run in
flight); durability is DBOS's, so the adapter is :class:`~.dbos.DBOSAdapter` (read its
docstring) on its own workload, whose ``model_step`` names the SDK's model step (logged
as ``model-<step id>``) and whose ``transcript`` reads the recorded ``ModelResponse``
objects. The worker turns the SDK's tracing off before DBOS launches: its default
exporter sends every trace to OpenAI's servers.

Crash points: those of the DBOS adapter, and await points in ``dbos``, ``agents`` and
``dbos_openai_agents``. What the matrix found: docs/findings.md ("OpenAI Agents SDK").
"""

from __future__ import annotations

from ..adapter import RunContext
from .dbos import DBOSAdapter


class OpenAIAgentsAdapter(DBOSAdapter):
    """OpenAI Agents SDK agent run by ``DBOSRunner``, SQLite system database."""

    name = "openai-agents-sqlite"
    subject_packages = ("dbos", "agents", "dbos_openai_agents")
    backend = "sqlite"
    requires = ("dbos", "dbos._debug_trigger", "agents", "dbos_openai_agents")
    extra = "openai-agents"

    def _launch(self, ctx: RunContext, executor: str | None = None) -> None:
        import agents

        agents.set_tracing_disabled(True)
        super()._launch(ctx, executor)


OpenAIAgentsSqliteAdapter = OpenAIAgentsAdapter


class OpenAIAgentsPostgresAdapter(OpenAIAgentsAdapter):
    """OpenAI Agents SDK agent run by ``DBOSRunner``, PostgreSQL system database."""

    name = "openai-agents-postgres"
    backend = "postgres"


__all__ = ["OpenAIAgentsAdapter", "OpenAIAgentsSqliteAdapter", "OpenAIAgentsPostgresAdapter"]
