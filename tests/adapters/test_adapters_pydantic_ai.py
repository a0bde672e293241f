"""Pydantic AI durable execution (its DBOS integration) as a subject
(harness/adapters/pydantic_ai.py): what the matrix found, pinned for the installed
versions (measured on pydantic-ai-slim 2.68.0, dbos 3.4.0).

A failure whose message says "now" means Pydantic AI or DBOS changed: re-run the
matrices of docs/findings.md's "Pydantic AI durable execution" section and update it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("pydantic_ai.durable_exec.dbos",
                    reason="Pydantic AI adapter tests need the extra: pip install 'crashmatrix[pydantic-ai]'")

ADAPTER = "crashmatrix.harness.adapters.pydantic_ai"
WL = "crashmatrix.scenarios.realworld.pydantic_ai_checkout"


def test_app_is_importable_without_starting_anything() -> None:
    """Building the agent and registering the workflow must not start DBOS: workers fork
    from a parent that imported both (docs/adapters.md, lesson 2)."""
    code = (f"import threading, {WL}, {ADAPTER}; import dbos._dbos as d; "
            "assert d._dbos_global_instance is None; print(threading.active_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]


def test_messages_cross_to_the_model_provider_and_back() -> None:
    """The FunctionModel's conversions: Pydantic AI's history -> the provider's chat
    dicts, the provider's reply -> a ModelResponse with the same tool-call ids."""
    from pydantic_ai.messages import ModelRequest, ToolReturnPart, UserPromptPart

    from crashmatrix.scenarios.realworld.pydantic_ai_checkout import from_reply, response_message, to_chat

    reply = {"role": "assistant", "content": "Paying.",
             "tool_calls": [{"id": "call_1", "name": "charge", "arguments": {"amount": 5}}]}
    response = from_reply(reply)
    assert response_message(response) == reply
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "charge", "status": "ok", "content": {"charge_id": "ch_1"}}
    history = [ModelRequest(parts=[UserPromptPart("Buy.")]), response,
               ModelRequest(parts=[ToolReturnPart("charge", tool, tool_call_id="call_1")])]
    assert to_chat(history) == [{"role": "user", "content": "Buy."}, reply, tool]


def test_model_requests_are_steps_and_a_kill_inside_a_tool_step_repeats_it(matrix_cases: Any) -> None:
    """Pydantic AI records each model request as a DBOS step and the workload's tools
    are DBOS steps: the run log is DBOS's step log, one model request and one tool call
    at a time, and the kill matrix's window is DBOS's (a step that ran and was not
    recorded runs again). Naive: the charge twice; after DBOS's commit: nothing."""
    naive = matrix_cases(f"{ADAPTER}:PydanticAISqliteAdapter", f"{WL}:NAIVE",
                         ["kill@step.after[tool-8]#1", "kill@log.append.after[tool-8]#1"], goldens=2)
    first, second = naive.golden_traces["conv1"]
    assert first == second, "Pydantic AI + DBOS: two golden runs reached different points; update docs/findings.md"
    golden = naive.cases[0].golden.evidence.observation
    assert golden.status == "completed" and [e.node_id for e in golden.log] == [
        f"{'model' if i % 2 else 'tool'}-{i}" for i in range(1, 12)], [e.node_id for e in golden.log]
    unrecorded, recorded = naive.cases
    assert unrecorded.failed == {"provider.payment.ledger_equal", "effects.applied_once"} and unrecorded.extra("payment") == 1, (
        f"Pydantic AI + DBOS, naive: a kill before the charge step's output is recorded now {unrecorded.why()}")
    assert recorded.result.outcome == "pass", recorded.why()

    keyed = matrix_cases(f"{ADAPTER}:PydanticAISqliteAdapter", f"{WL}:KEYED", ["kill@step.after[tool-8]#1"])
    [case] = keyed.cases
    assert case.result.outcome == "pass" and case.extra("payment") == 0, case.why()


def test_tools_left_as_workflow_code_run_again_on_every_recovery(matrix_cases: Any) -> None:
    """A tool not decorated with ``@DBOS.step`` (which Pydantic AI's DBOS page leaves to
    the user) is workflow code: DBOS recovers by running the workflow again and returns
    only the *steps'* recorded outputs, so every tool call before the crash runs again,
    even when the model turn after it was recorded. Naive: the charge twice, and the
    recorded replies now name a charge the tools no longer return."""
    s = matrix_cases(f"{ADAPTER}:PydanticAISqliteAdapter", f"{WL}:UNWRAPPED", ["kill@log.append.after[model-5]#1"])
    [case] = s.cases
    golden = case.golden.evidence.observation
    assert [e.node_id for e in golden.log] == [f"model-{i}" for i in range(1, 7)], [e.node_id for e in golden.log]
    assert case.extra("payment") == 1 and {"provider.payment.ledger_equal", "transcript.exact"} <= case.failed, (
        f"Pydantic AI + DBOS: undecorated tools now {case.why()}; update docs/findings.md")
