"""Pydantic AI durable execution (its DBOS integration) as a subject.

Needs the optional extra ``crashmatrix[pydantic-ai]`` (pydantic-ai-slim with its ``dbos``
extra, on the ``dbos`` this project pins). The workload is
:mod:`crashmatrix.scenarios.realworld.pydantic_ai_checkout` (``NAIVE`` or ``KEYED``): a
Pydantic AI ``Agent`` with the ``DBOSDurability`` capability, run inside a
``@DBOS.workflow``; its model requests are Pydantic AI's DBOS steps, its tools DBOS steps
of the workload's own (Pydantic AI does not wrap function tools).

Durability is DBOS's, so the adapter is :class:`~.dbos.DBOSAdapter` (start, resume by
relaunching with the run's pinned executor id and application version, observe through
``DBOSClient``; read its docstring) on its own workload, which names what differs: its
``model_step`` (the model request is recorded as ``crashmatrix_checkout__model.request``,
whose log entries are named ``model-<step id>`` like the logical task its points counted
under) and its ``transcript``, rebuilt from the recorded ``ModelResponse`` objects
(``as_message``). This module imports nothing of Pydantic AI (the workload's does).

Crash points: the same as the DBOS adapter's (``step.*``, ``model.call.*``,
``tool.request.*`` inside the steps, ``log.append.after`` at DBOS's step-commit
trigger), and await points in ``dbos`` and ``pydantic_ai`` (the agent loop runs in the
workflow's task).

What the matrix found is in docs/findings.md ("Pydantic AI durable execution").
pydantic-graph's own state persistence (``pydantic_graph.persistence``, the
``FileStatePersistence`` of pydantic-graph 1.x) is not a second backend: pydantic-graph
2.x removed it with no replacement (Pydantic AI's V1 -> V2 migration map), and
pydantic-ai-slim 2.68 requires ``pydantic-graph==2.68.0``.
"""

from __future__ import annotations

from .dbos import DBOSAdapter


class PydanticAIAdapter(DBOSAdapter):
    """Pydantic AI agent with ``DBOSDurability``, SQLite system database."""

    name = "pydantic-ai-sqlite"
    subject_packages = ("dbos", "pydantic_ai")
    backend = "sqlite"
    requires = ("dbos", "dbos._debug_trigger", "pydantic_ai.durable_exec.dbos")
    extra = "pydantic-ai"


PydanticAISqliteAdapter = PydanticAIAdapter


class PydanticAIPostgresAdapter(PydanticAIAdapter):
    """Pydantic AI agent with ``DBOSDurability``, PostgreSQL system database."""

    name = "pydantic-ai-postgres"
    backend = "postgres"


__all__ = ["PydanticAIAdapter", "PydanticAISqliteAdapter", "PydanticAIPostgresAdapter"]
