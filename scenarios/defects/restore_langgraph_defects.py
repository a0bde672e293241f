"""A mutant of a restore on LangGraph: the person's answers given after the point put
back into the restored thread, so the approvals are spent again without being asked.

Its own module: it needs the optional extra ``crashmatrix[langgraph]``. It is not in
the catalogue (``MUTANTS``), whose baselines must pass the cases that catch their
mutants: its baseline, LangGraph's time travel on this workload, charges again in every
case whose point is before the payment (the fresh attempt LangGraph documents, under a
key that names the superstep, which the copy renumbers; docs/findings.md), so
``tests/adapters/test_adapters_langgraph_restore.py`` runs it by its path and compares
the two on ``restore.approval_respent`` alone. Its metadata follows the convention
(:mod:`._base`) all the same.
"""

from __future__ import annotations

import asyncio

from crashmatrix.harness.adapter import Environment
from crashmatrix.scenarios.realworld.langgraph_human import SequentialAdapter

_H = "crashmatrix.scenarios.realworld.langgraph_human"


class RestoreReplaysApprovalAdapter(SequentialAdapter):  # type: ignore[misc, valid-type]
    """Defect: the restore copies the checkpoint it goes back to, then writes the
    answers the person gave after it into the thread as the ``review`` node's output
    (``update_state(..., as_node="review")``), so the resumed run pays and mails on
    approvals nobody gave again: an approval re-spent. Class: a restored checkpoint
    resumes into a state that never existed together with the person's decisions.
    Caught by ``restore.approval_respent``."""

    name = "restore-replays-approval"
    workload = f"{_H}:SEQUENTIAL_KEYED"
    baseline = f"{_H}:SequentialAdapter"
    conversations = ("approve",)
    defect = "a restore puts the person's later answers back into the thread: approvals spent without being asked"
    source = ("LangGraph time travel: interrupts after the checkpoint fire again (its docs); an operator restore "
              "that replays recorded answers instead spends an approval twice")
    caught_by = ("restore.approval_respent",)
    fault_kinds = ("restore",)
    point_sources = ("label",)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        from crashmatrix.harness.human import _records

        before = await self.observe(env, run_id)
        answers = [m for m in (before.state or {}).get("transcript") or [] if list(_records(m))]
        await super().restore_run(env, run_id, point)

        def put_back() -> None:
            with self._graph_on(env, run_id, "crashmatrix-restore") as graph:
                config = self.thread_config(run_id)
                held = graph.get_state(config).values.get("messages", [])
                if answers and not any(list(_records(m)) for m in held):
                    graph.update_state(config, {"messages": answers}, as_node="review")

        await asyncio.to_thread(put_back)
        return run_id

