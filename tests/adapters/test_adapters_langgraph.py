"""LangGraph as a subject: the resume protocol, the crash points, and the behaviour the
kill matrix found (docs/findings.md), pinned for the installed versions.

Measured on langgraph 1.2.24, langgraph-checkpoint 4.3.2, langgraph-checkpoint-sqlite
3.1.2, langgraph-checkpoint-postgres 3.2.0. A failure here with a message saying "now"
means LangGraph changed: re-run the findings script and update docs/findings.md.

The first group runs in-process (no services, a fake model and tools); the second runs
chosen cases of the kill matrix on real services (embedded PostgreSQL, providers,
forked workers): one session per subject, a few cases each.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="LangGraph adapter tests need the extra: pip install 'crashmatrix[langgraph]'")
pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs langgraph-checkpoint-sqlite (crashmatrix[langgraph])")

from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.errors import EmptyInputError  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import interrupt  # noqa: E402

from crashmatrix.harness import crashpoint as cp  # noqa: E402
from crashmatrix.harness.adapters.langgraph import (  # noqa: E402
    AsyncCrashpointSaver, CrashpointSaver, NodeHooks, adrive, drive, judge,
)
from crashmatrix.scenarios.checkout.script import respond  # noqa: E402
from crashmatrix.scenarios.realworld.langgraph_checkout import KEYED, NAIVE  # noqa: E402

LG = "crashmatrix.harness.adapters.langgraph"
WL = "crashmatrix.scenarios.realworld.langgraph_checkout"


# -- in-process: protocol and points ---------------------------------------------------------


class FakeClients:
    """The scripted model and canned tools, in-process; records what ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def model(self, node_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        self.ran.append(node_id)
        reply = respond("conv1", messages)
        message: dict[str, Any] = {"role": "assistant", "content": reply["content"]}
        if reply["tool_calls"]:
            message["tool_calls"] = [{"id": "call_" + uuid.uuid4().hex[:12], **c} for c in reply["tool_calls"]]
        return message

    async def tool(self, call: dict[str, Any], key: str, node_id: str) -> dict[str, Any]:
        self.ran.append(node_id)
        content = {"search": {"results": [{"sku": "dock-1"}]}, "quote": {"total": 12900},
                   "charge": {"charge_id": "ch_" + key[:16], "status": "succeeded"}}.get(call["name"], {"ok": True})
        return {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "status": "succeeded", "content": content}


class LostCheckpoint(Exception):
    pass


class LosingSaver(SqliteSaver):
    """Saves writes, but "loses" the checkpoint of one superstep (raises in ``put``):
    the durable state a kill between a node's writes and its checkpoint leaves."""

    lose_step: int | None = None

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if metadata.get("step") == self.lose_step:
            raise LostCheckpoint(f"checkpoint of step {self.lose_step} not saved")
        return super().put(config, checkpoint, metadata, new_versions)


def _answer(values: Any) -> str | None:
    return NAIVE.answer(NAIVE.messages(values))


async def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def test_invoke_none_on_a_thread_without_checkpoint_raises() -> None:
    async def main() -> None:
        hooks = NodeHooks(asyncio.get_running_loop(), FakeClients(), None)
        graph = NAIVE.compile("graph", hooks, SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False)))
        config = {"configurable": {"thread_id": "t"}}
        snapshot = graph.get_state(config)
        assert snapshot.next == () and judge(snapshot, _answer).status == "absent", (
            "LangGraph: get_state of an unknown thread no longer looks like an empty, finished run")
        try:
            await _in_thread(graph.invoke, None, config, durability="sync")
        except EmptyInputError:
            return
        pytest.fail("LangGraph: invoke(None) on a thread with no checkpoint now succeeds instead of raising "
                    "EmptyInputError; the resume protocol's restart-from-input branch may be unneeded: update "
                    "docs/findings.md")

    asyncio.run(main())


def test_empty_next_is_not_completion_and_resume_reuses_saved_writes() -> None:
    """A node's writes saved, its checkpoint not: ``next == ()`` with work left."""

    async def main() -> None:
        fake = FakeClients()
        saver = LosingSaver(sqlite3.connect(":memory:", check_same_thread=False))
        saver.lose_step = 2  # the checkpoint after tools-2
        graph = NAIVE.compile("graph", NodeHooks(asyncio.get_running_loop(), fake, None), saver)
        config = {"configurable": {"thread_id": "t"}}
        with pytest.raises(LostCheckpoint):
            await _in_thread(graph.invoke, NAIVE.run_input("conv1"), config, durability="sync")
        snapshot = graph.get_state(config)
        assert snapshot.next == (), f"LangGraph: next is now {snapshot.next} when a task's writes are saved " \
            "without its checkpoint (was ()); update the resume protocol notes in docs/findings.md"
        assert [t.name for t in snapshot.tasks] == ["tools"] and snapshot.tasks[0].result is not None
        verdict = judge(snapshot, _answer)
        assert verdict.status == "paused", verdict
        assert fake.ran == ["agent-1", "tools-2"]
        saver.lose_step = None
        status, action = await _in_thread(drive, graph, config, NAIVE.run_input("conv1"), "sync", "resume", _answer)
        assert (status, action) == ("completed", "invoke(None)")
        assert fake.ran.count("tools-2") == 1, "LangGraph now re-runs a task whose writes were saved"
        assert fake.ran[-1] == "agent-11"

    asyncio.run(main())


def test_pending_interrupt_is_needs_human() -> None:

    from typing import TypedDict

    class State(TypedDict):
        x: int

    def ask(state: State) -> dict[str, int]:
        return {"x": interrupt("approve?")}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False)))
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({"x": 0}, config, durability="sync")
    verdict = judge(graph.get_state(config), lambda v: None)
    assert verdict.status == "needs_human", verdict
    # the adapter's default: invoke(None) first, as LangGraph documents recovery; the
    # interrupt is raised again and the thread still waits
    assert drive(graph, config, {"x": 0}, "sync", "resume", lambda v: None) == (
        "needs_human", "invoke(None): recovery of a thread waiting on an interrupt")
    assert drive(graph, config, {"x": 0}, "sync", "resume", lambda v: None, none_recovery=False) == (
        "needs_human", "nothing to do: 1 pending interrupt(s)")


def test_resume_reads_the_thread_before_the_input() -> None:
    """A resumer of a thread with a checkpoint never asks for the input (input-once
    withholds it); one of a thread without a checkpoint does, and only then."""
    from crashmatrix.harness.adapter import InputWithheld

    def withheld() -> dict[str, Any]:
        raise InputWithheld("not handed the input")

    saver = LosingSaver(sqlite3.connect(":memory:", check_same_thread=False))
    saver.lose_step = 2  # the run stops with the model turn of step 1 saved, work left
    hooks = NodeHooks(None, None, None)
    graph = KEYED.compile("graph", hooks, saver)
    config = {"configurable": {"thread_id": "t"}}
    found: list[bool] = []

    async def main() -> None:
        hooks.loop = asyncio.get_running_loop()
        hooks.clients = FakeClients()
        with pytest.raises(InputWithheld):  # no checkpoint: the input is needed
            await _in_thread(drive, graph, config, withheld, "sync", "resume", _answer)
        with pytest.raises(LostCheckpoint):
            await _in_thread(drive, graph, config, KEYED.run_input("conv1"), "sync", "start", _answer)
        saver.lose_step = None
        status, action = await _in_thread(drive, graph, config, withheld, "sync", "resume", _answer,
                                          found=lambda: found.append(True))
        assert (status, action) == ("completed", "invoke(None)")

    asyncio.run(main())
    assert found == [True]  # the adapter acknowledges the run there (ctx.accepted)


API = pytest.mark.parametrize("aio", [False, True], ids=["invoke", "ainvoke"])


def _trace(durability: str, api: str = "graph", aio: bool = False,
           on_step: Any = None) -> list[tuple[str, str]]:
    """conv1 in-process on an in-memory SQLite saver (``aio``: ``ainvoke`` with
    ``AsyncSqliteSaver``); returns the ``(point, logical task)`` sequence."""
    seen: list[tuple[str, str]] = []

    def step(phase: str, task: str) -> None:
        seen.append((f"step.{phase}", task))
        if on_step is not None:
            on_step(phase, task)

    async def main() -> None:
        hooks = NodeHooks(asyncio.get_running_loop(), FakeClients(), step)
        config = {"configurable": {"thread_id": "t"}}
        if aio:
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with aiosqlite.connect(":memory:") as conn:
                saver = AsyncSqliteSaver(conn)
                graph = KEYED.compile(api, hooks, AsyncCrashpointSaver(saver, hooks), aio=True)
                status, _ = await adrive(graph, config, KEYED.run_input("conv1"), durability, "start", _answer)
        else:
            saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
            graph = KEYED.compile(api, hooks, CrashpointSaver(saver, hooks))
            status, _ = await _in_thread(drive, graph, config, KEYED.run_input("conv1"), durability, "start", _answer)
        assert status == "completed"

    cp.arm(lambda name, task: seen.append((name, task)))
    try:
        asyncio.run(main())
    finally:
        cp.disarm()
    return seen


def _of(trace: list[tuple[str, str]], task: str) -> list[str]:
    return [name for name, t in trace if t == task]


@API
def test_points_per_task_under_sync(aio: bool) -> None:
    trace = _trace("sync", aio=aio)
    assert _of(trace, "tools-8") == ["step.before", "tool.request.before", "tool.request.after", "step.after",
                                     "log.append.before", "log.append.after"]
    assert _of(trace, "agent-9") == ["step.before", "model.call.before", "model.call.after", "step.after",
                                     "log.append.before", "log.append.after"]
    puts = sorted({t for n, t in trace if n == "checkpoint.put.before"}, key=lambda t: int(t.rsplit("s", 1)[1]))
    assert puts == [f"checkpoint-s{i}" for i in range(-1, 12)], (
        f"LangGraph sync durability now saves checkpoints {puts} for conv1 (was one per superstep, -1..11)")


@API
def test_exit_durability_saves_once_at_the_end(aio: bool) -> None:
    trace = _trace("exit", aio=aio)
    saves = [(n, t) for n, t in trace if n.startswith(("checkpoint.", "log.append"))]
    assert saves == [("checkpoint.put.before", "checkpoint-s11"), ("checkpoint.put.after", "checkpoint-s11")], (
        "LangGraph `exit` durability now saves before the run ends "
        f"({saves[:4]}...): a kill before the end may keep progress; update docs/findings.md")


@API
def test_functional_api_points(aio: bool) -> None:
    trace = _trace("sync", api="functional", aio=aio)
    assert _of(trace, "tool-4.0") == ["step.before", "tool.request.before", "tool.request.after", "step.after",
                                      "log.append.before", "log.append.after"]
    assert ("log.append.after", "entrypoint") in trace


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_run_control_drain_stops_at_the_next_superstep_and_keeps_progress(durability: str) -> None:
    """LangGraph's own drain (``RunControl.request_drain()``, what the ``-drain``
    adapters wire to SIGTERM): the node that is running finishes, no node starts after
    it, the checkpoint is saved (under ``exit`` durability too), and ``ainvoke(None)``
    continues from there."""
    fake = FakeClients()

    async def main() -> list[tuple[str, str]]:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.runtime import RunControl

        control = RunControl()

        def on_step(phase: str, task: str) -> None:
            if (phase, task) == ("before", "tools-8"):  # SIGTERM while the charge runs
                control.request_drain("SIGTERM")

        hooks = NodeHooks(asyncio.get_running_loop(), fake, on_step)
        config = {"configurable": {"thread_id": "t"}}
        async with aiosqlite.connect(":memory:") as conn:
            saver = AsyncSqliteSaver(conn)
            graph = KEYED.compile("graph", hooks, AsyncCrashpointSaver(saver, hooks), aio=True)
            first = await adrive(graph, config, KEYED.run_input("conv1"), durability, "start", _answer, control)
            ran_before = list(fake.ran)
            second = await adrive(graph, config, KEYED.run_input("conv1"), durability, "resume", _answer)
        return [first, second, ran_before]  # type: ignore[list-item]

    first, second, ran_before = asyncio.run(main())
    assert first == ("paused", "ainvoke(input); drained (SIGTERM)"), (
        f"LangGraph RunControl drain under `{durability}` durability now ends {first}; update docs/findings.md")
    assert ran_before[-1] == "tools-8", f"LangGraph's drain now stops elsewhere: ran {ran_before}"
    assert second == ("completed", "ainvoke(None)")
    assert fake.ran.count("tools-8") == 1 and fake.ran[-1] == "agent-11", (
        f"LangGraph `{durability}`: a drained run no longer keeps its progress: {fake.ran}; update docs/findings.md")


# -- on services: chosen cases of the matrices -------------------------------------------------


def test_sqlite_sync_naive_charges_twice_between_effect_and_saved_writes(matrix_cases: Any) -> None:
    s = matrix_cases(f"{LG}:LangGraphSqliteSyncAdapter", f"{WL}:NAIVE", [
        "kill@step.after[tools-8]#1",        # charge done, writes not saved
        "kill@log.append.after[tools-8]#1",  # writes saved
        "kill@step.before[agent-9]#1",       # checkpoint of step 8 saved (sync waits for it)
        "conv3/kill@step.after[tools-12]#1",  # the refund done, writes not saved
    ])
    effect_done, writes_saved, next_step, refund = s.cases
    assert effect_done.failed == {"provider.payment.ledger_equal", "effects.applied_once"} and effect_done.extra("payment") == 1, (
        "LangGraph sync + naive tool: a kill after the charge and before its writes no longer charges twice: "
        f"{effect_done.why()}; update docs/findings.md")
    assert writes_saved.result.outcome == "pass", writes_saved.why()
    assert next_step.result.outcome == "pass", (
        f"LangGraph sync: a kill at the next node's start now loses the previous step: {next_step.why()}")
    assert effect_done.golden.evidence.observation.status == "completed"
    # conv3: the re-run refund carries a fresh key; the provider refuses it (nothing left
    # to refund), the node raises, and the run cannot finish
    assert {"resume.runs", "run.status"} <= refund.failed and refund.evidence.observation.status == "paused", (
        f"LangGraph sync + naive: a repeated refund no longer stops the run: {refund.why()}; update docs/findings.md")
    assert "exceeds the refundable" in dict(refund.why())["resume.runs"]


def test_sqlite_sync_keyed_passes_the_effect_checks(matrix_cases: Any) -> None:
    s = matrix_cases(f"{LG}:LangGraphSqliteSyncAdapter", f"{WL}:KEYED",
                     ["kill@step.after[tools-8]#1", "kill@tool.request.after[tools-10]#1",
                      "conv3/kill@step.after[tools-12]#1"])
    for case in s.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
        assert case.extra("payment") == 0 and case.extra("mail") == 0


def test_sqlite_exit_restarts_from_input_and_repeats_every_effect(matrix_cases: Any) -> None:
    [case] = matrix_cases(f"{LG}:LangGraphSqliteExitAdapter", f"{WL}:NAIVE", ["kill@step.before[agent-11]#1"]).cases
    assert {"provider.payment.ledger_equal", "provider.mail.ledger_equal"} <= case.failed, (
        "LangGraph `exit` durability: a kill before the run ends now preserves progress: "
        f"{case.why()}; update docs/findings.md")
    assert (case.extra("payment"), case.extra("mail"), case.extra("model")) == (1, 1, 5)
    # the oracle counts every model call before the kill as in flight (no write was ever
    # saved), so re-billing them all is within its allowance: the figure above is the finding
    assert "model.calls_billed" not in case.failed


def test_sqlite_async_saved_state_lags(matrix_cases: Any) -> None:
    """Under ``async`` the checkpoint of a step is saved while the next runs: a kill at the
    start of the node after the charge often finds the charge's step unsaved. Racy by
    design (LangGraph's background saver thread): pinned as "at least once in three"."""
    s = matrix_cases(f"{LG}:LangGraphSqliteAsyncAdapter", f"{WL}:NAIVE", ["kill@step.before[agent-9]#1"] * 3)
    lagged = [c for c in s.cases if c.extra("payment") > 0]
    assert lagged, ("LangGraph async durability: three kills at the start of agent-9 found the charge's step "
                    "saved every time (measured before: most runs lost it); update docs/findings.md")


def test_postgres_sync_naive_charges_twice(matrix_cases: Any) -> None:
    [case] = matrix_cases(f"{LG}:LangGraphPostgresSyncAdapter", f"{WL}:NAIVE", ["kill@tool.request.after[tools-8]#1"]).cases
    assert "provider.payment.ledger_equal" in case.failed and case.extra("payment") == 1, (
        f"LangGraph PostgresSaver sync + naive: no duplicate charge now: {case.why()}")


SAVE_AWAIT = "langgraph.checkpoint.sqlite.aio:AsyncSqliteSaver.aput_writes@3"


def test_aio_await_points_cancel_and_term(matrix_cases: Any) -> None:
    """``ainvoke`` with ``AsyncSqliteSaver`` (``sync`` durability), naive tool, await
    points traced: the await points are reproducible; a cancel reaches LangGraph (its
    node tasks are cancelled, the run ends interrupted) and one after the charge, before
    the node's writes were handed to the saver, charges twice; SIGTERM kills the worker
    (LangGraph installs no handler; its drain is opt-in, ``RunControl``)."""
    s = matrix_cases(f"{LG}:LangGraphAioSqliteSyncAdapter", f"{WL}:NAIVE", [
        "cancel@step.after[tools-8]#1",
        "cancel@log.append.after[tools-8]#1",
        f"kill@{SAVE_AWAIT}[agent-9]#1",
        "term@step.after[tools-8]#1",
    ], await_points=True, goldens=2)
    first, second = s.golden_traces["conv1"]
    awaits = [e for e in first if e[0] == "await"]
    assert len(awaits) > 50 and first == second, (
        f"LangGraph ainvoke: the await points of two golden runs now differ ({len(first)} vs {len(second)} points) "
        "or are missing; the await matrix needs reproducible points: update docs/findings.md")
    assert (SAVE_AWAIT, "tools-8") in {(e[1], e[2]) for e in awaits}
    cancel_after, cancel_saved, kill_in_save, term = s.cases
    assert cancel_after.workers[0]["returncode"] == 0 and cancel_after.extra("payment") == 1, (
        "LangGraph ainvoke + naive: a cancel after the charge and before its writes no longer charges twice "
        f"({cancel_after.why()}, workers {cancel_after.workers}); update docs/findings.md")
    assert cancel_saved.result.outcome == "pass", cancel_saved.why()
    assert kill_in_save.result.outcome == "pass", (
        f"LangGraph ainvoke: a kill while agent-9's writes are saved now loses more than agent-9: {kill_in_save.why()}")
    assert term.workers[0]["signal"] == 15 and "term.drained" in term.failed and term.extra("payment") == 1, (
        "LangGraph: SIGTERM no longer ends the worker as a kill does (does LangGraph install a handler now?): "
        f"{term.why()}, workers {term.workers}; update docs/findings.md")


def test_sqlite_sync_keyed_input_once_and_discovery_pass(matrix_cases: Any) -> None:
    """The production resume policies on a correct graph: the input handed to the first
    worker only (the resumer reads the thread), and recovery that is given no run id
    (the threads filed under the case's scope)."""
    s = matrix_cases(f"{LG}:LangGraphSqliteSyncAdapter", f"{WL}:KEYED", [
        "kill@run.accepted[checkpoint-s-1]#1/input-once",  # acknowledged, nothing run yet
        "kill@step.after[tools-8]#1/input-once",           # the charge done, its writes not saved
        "kill@step.after[tools-8]#1/discovery",
        "kill@checkpoint.put.after[checkpoint-s3]#1/discovery",
    ])
    for case in s.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
    for case in s.cases[:2]:
        checks = {v.check: v.valid for v in case.result.verdicts}
        assert checks.get("run.acknowledged_durable") is True, case.result.verdicts
    for case in s.cases[2:]:
        found = [v for v in case.result.verdicts if v.check == "discovery.found"]
        assert found and found[0].valid and "recovered 1 thread(s)" in found[0].details, found
