"""A worked example for docs/adapters.md: a tiny durable runtime and its adapter.

**The runtime** (``Journal`` + ``run_agent``, standing in for yours): an agent loop whose
steps (model turns, tool calls) are journaled in one SQLite file per run. A step whose
output is in the journal returns it on replay; any other step runs, then its output is
recorded. It offers two hooks, as most runtimes do: ``on_step(phase, step_id)`` around
each step and ``on_record(phase, step_id)`` around each journal write.

**The adapter** (``JournalAdapter``): about sixty lines; everything the harness needs.

Run its matrix (the checkout agent of ``scenarios/realworld/common.py``, conv1)::

    crashmatrix run crashmatrix.scenarios.realworld.journal_example:WORKLOAD \\
        --subject crashmatrix.scenarios.realworld.journal_example:JournalAdapter \\
        --kinds kill,cancel --sources step,label,await --conversation conv1
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from crashmatrix.harness.adapter import Adapter, Environment, LogEntry, Observation, RunContext
from crashmatrix.harness.crashpoint import MODEL_CALL_BEFORE, crashpoint, set_logical_task
from crashmatrix.scenarios.realworld.common import (
    CONVERSATIONS, PROVIDERS, Clients, effect_key, final_answer, run_input,
)

# -- the runtime (yours would be a library) -----------------------------------------------


class Journal:
    """Runs and their step outputs, in one SQLite file (``path``)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.executescript(
            "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, input TEXT, status TEXT);"
            "CREATE TABLE IF NOT EXISTS steps (run_id TEXT, seq INTEGER, step_id TEXT, output TEXT,"
            " PRIMARY KEY (run_id, seq), UNIQUE (run_id, step_id));")

    def create(self, run_id: str, run_input_: dict[str, Any]) -> None:
        self.db.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, 'running')", (run_id, json.dumps(run_input_)))

    def run(self, run_id: str) -> tuple[dict[str, Any], str] | None:
        row = self.db.execute("SELECT input, status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return (json.loads(row[0]), row[1]) if row else None

    def steps(self, run_id: str) -> list[tuple[int, str, Any]]:
        rows = self.db.execute("SELECT seq, step_id, output FROM steps WHERE run_id = ? ORDER BY seq", (run_id,))
        return [(seq, step_id, json.loads(out)) for seq, step_id, out in rows]

    def record(self, run_id: str, step_id: str, output: Any) -> None:
        self.db.execute("INSERT INTO steps SELECT ?, coalesce(max(seq), 0) + 1, ?, ? FROM steps WHERE run_id = ?",
                        (run_id, step_id, json.dumps(output), run_id))

    def finish(self, run_id: str) -> None:
        self.db.execute("UPDATE runs SET status = 'completed' WHERE run_id = ?", (run_id,))


Hook = Callable[[str, str], None]


async def run_agent(journal: Journal, run_id: str, clients: Clients, *, on_step: Hook, on_record: Hook,
                    flavour: str = "keyed") -> str:
    """Run (or replay, then continue) run ``run_id``; returns ``"completed"``."""
    done = {step_id: out for _, step_id, out in journal.steps(run_id)}
    input_, _ = journal.run(run_id)  # type: ignore[misc]

    async def step(step_id: str, body: Callable[[], Awaitable[Any]]) -> Any:
        if step_id in done:
            return done[step_id]
        on_step("before", step_id)
        out = await body()
        on_step("after", step_id)
        on_record("before", step_id)
        journal.record(run_id, step_id, out)
        on_record("after", step_id)
        return out

    messages = list(input_["messages"])
    for turn in range(1, 21):
        reply = await step(f"model-{turn}", lambda: clients.model(f"model-{turn}", messages))
        messages.append(reply)
        if not reply.get("tool_calls"):
            journal.finish(run_id)
            return "completed"
        for i, call in enumerate(reply["tool_calls"]):
            sid = f"tool-{turn}.{i}"
            key = effect_key(flavour, run_id, sid)  # stable: the same on every attempt
            messages.append(await step(sid, lambda: clients.tool(call, key, sid)))
    raise RuntimeError("no answer after 20 turns")


# -- the workload and the adapter -------------------------------------------------------


class JournalWorkload:
    """The checkout agent for the journal runtime (keyed tools)."""

    name = "journal-checkout"
    conversations = CONVERSATIONS
    providers = PROVIDERS

    def run_input(self, conversation: str) -> dict[str, Any]:
        return run_input(conversation)


WORKLOAD = JournalWorkload()


class JournalAdapter(Adapter):
    """The journal runtime (example), one SQLite file per run."""

    name = "journal"
    subject_packages = ("crashmatrix.scenarios.realworld.journal_example",)
    flavour = "keyed"  # the tools' idempotency keys (NaiveJournalAdapter: "naive")

    @staticmethod
    def path(env: Environment, run_id: str) -> Path:
        return Path(env.workdir) / "journal" / f"{run_id}.sqlite"

    async def prepare(self, env: Environment) -> None:
        (Path(env.workdir) / "journal").mkdir(parents=True, exist_ok=True)

    async def start(self, ctx: RunContext) -> str:
        return await self.resume(ctx)  # creating the run is idempotent, so both are one

    async def resume(self, ctx: RunContext) -> str:
        journal = Journal(self.path(ctx.env, ctx.run_id))
        journal.create(ctx.run_id, ctx.workload.run_input(ctx.conversation))

        def on_step(phase: str, step_id: str) -> None:
            if phase == "before":
                set_logical_task(step_id)  # count this step's points on their own
                if step_id.startswith("model-"):
                    crashpoint(MODEL_CALL_BEFORE)  # "model.call.before": read by model.calls_billed
            ctx.on_step(phase, step_id)

        def on_record(phase: str, step_id: str) -> None:
            crashpoint(f"log.append.{phase}")  # after: the step's output is durable

        async with aiohttp.ClientSession() as session:
            clients = Clients(session, ctx.env.providers, ctx.worker_id, ctx.conversation, ctx.run_id)
            try:
                return await run_agent(journal, ctx.run_id, clients, on_step=on_step, on_record=on_record,
                                       flavour=self.flavour)
            finally:
                journal.db.close()

    async def observe(self, env: Environment, run_id: str) -> Observation:
        path = self.path(env, run_id)
        if not path.exists():
            return Observation(run_id, "absent", log=[], state=None, state_error="no journal file")
        journal = Journal(path)
        try:
            run, steps = journal.run(run_id), journal.steps(run_id)
        finally:
            journal.db.close()
        if run is None:
            return Observation(run_id, "absent", log=[], state=None, state_error="no run row")
        input_, status = run
        messages = list(input_["messages"]) + [out for _, _, out in steps]
        return Observation(
            run_id, status if status == "completed" else "interrupted",
            log=[LogEntry(seq, step_id, (), step_id.split("-")[0], 0) for seq, step_id, _ in steps],
            effects=None,  # no effects ledger: the providers' own ledgers are checked
            state={"transcript": messages, "answer": final_answer(messages), "budget": None,
                   "pending": [] if status == "completed" else ["run"]})


class NaiveJournalAdapter(JournalAdapter):
    """The same runtime with naive tools (a fresh key per attempt): a kill between a
    charge and its journal write charges twice, which ``provider.payment.ledger_equal``
    reports."""

    name = "journal-naive"
    flavour = "naive"
