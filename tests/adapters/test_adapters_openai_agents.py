"""The OpenAI Agents SDK with its DBOS integration as a subject
(harness/adapters/openai_agents.py): what the matrix found, pinned for the installed
versions (measured on openai-agents 0.24.0, dbos-openai-agents 0.3.0, dbos 3.4.0).

A failure whose message says "now" means the SDK or its integration changed: re-run the
matrices of docs/findings.md's "OpenAI Agents SDK" section and update it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("dbos_openai_agents",
                    reason="OpenAI Agents adapter tests need the extra: pip install 'crashmatrix[openai-agents]'")

ADAPTER = "crashmatrix.harness.adapters.openai_agents"
WL = "crashmatrix.scenarios.realworld.openai_agents_checkout"


def test_app_is_importable_without_starting_anything() -> None:
    """Building the agent and registering the workflow must not start DBOS, nor the
    SDK's trace exporter thread (docs/adapters.md, lesson 2)."""
    code = (f"import threading, {WL}, {ADAPTER}; import dbos._dbos as d; "
            "assert d._dbos_global_instance is None; print(threading.active_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]


def test_items_cross_to_the_model_provider_and_back() -> None:
    """The scripted model's conversions: the SDK's Responses-format items -> the
    provider's chat dicts, the provider's reply -> output items with the same call ids."""
    import json

    from crashmatrix.scenarios.realworld.openai_agents_checkout import from_reply, to_chat

    reply = {"role": "assistant", "content": "Paying.",
             "tool_calls": [{"id": "call_1", "name": "charge", "arguments": {"amount": 5}}]}
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "charge", "status": "ok", "content": {"charge_id": "ch_1"}}
    items = [{"role": "user", "content": "Buy."}, *from_reply(reply),
             {"type": "function_call_output", "call_id": "call_1", "output": json.dumps(tool)}]
    assert to_chat(items) == [{"role": "user", "content": "Buy."}, reply, tool]
    with pytest.raises(TypeError, match="reasoning"):
        to_chat([{"type": "reasoning", "summary": []}])


def test_a_kill_inside_a_tool_step_repeats_it_and_the_keyed_tool_makes_it_harmless(matrix_cases: Any) -> None:
    """``DBOSRunner`` makes each model call a DBOS step; the tools are DBOS steps: the
    kill window is DBOS's. Naive: the charge twice; keyed: once."""
    naive = matrix_cases(f"{ADAPTER}:OpenAIAgentsSqliteAdapter", f"{WL}:NAIVE",
                         ["kill@step.after[tool-8]#1", "kill@log.append.after[model-7]#1"], goldens=2)
    first, second = naive.golden_traces["conv1"]
    assert first == second, "OpenAI Agents + DBOS: two golden runs reached different points; update docs/findings.md"
    golden = naive.cases[0].golden.evidence.observation
    assert golden.status == "completed" and [e.node_id for e in golden.log][-1] == "model-11"
    unrecorded, recorded = naive.cases
    assert unrecorded.failed == {"provider.payment.ledger_equal", "effects.applied_once"} and unrecorded.extra("payment") == 1, (
        f"OpenAI Agents + DBOS, naive: a kill before the charge step's output is recorded now {unrecorded.why()}")
    assert recorded.result.outcome == "pass" and recorded.extra("model") == 0, recorded.why()

    keyed = matrix_cases(f"{ADAPTER}:OpenAIAgentsSqliteAdapter", f"{WL}:KEYED", ["kill@step.after[tool-8]#1"])
    [case] = keyed.cases
    assert case.result.outcome == "pass" and case.extra("payment") == 0, case.why()
