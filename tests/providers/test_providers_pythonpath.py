"""``PYTHONPATH=.`` reaches every child: a model script in the user's own
package, importable only through a relative ``PYTHONPATH`` entry, runs inside the model
provider, whose process works in another directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

MODEL = '''
def respond(conversation, messages):
    """Ask for the order once, then answer."""
    if not any(m.get("role") == "tool" for m in messages):
        return {"content": "Looking it up.", "tool_calls": [{"name": "lookup", "arguments": {"order": "1042"}}]}
    return {"content": "Order 1042 ships tomorrow.", "tool_calls": []}
'''

WORKLOAD = '''
import anyio
from crashmatrix.reference_runtime.agent import Agent, Tool, ToolOutcome
from crashmatrix.scenarios._workload import ScriptedWorkload
from crashmatrix.scenarios.checkout import ScriptedModel


async def lookup(ctx, args):
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"order": args["order"], "ships": "tomorrow"})


class SupportBot(ScriptedWorkload):
    name = "supportbot"
    conversations = ("c1",)
    providers = ("model",)
    request = "Where is my order 1042?"

    def build_agent(self, conversation, resources):
        return Agent(name=self.name, model=ScriptedModel(resources, "supportbot.model:respond"),
                     tools={"lookup": Tool("lookup", lookup)}, resources=resources)


WORKLOAD = SupportBot()
'''


def _project(root: Path) -> Path:
    package = root / "supportbot"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(MODEL)
    (package / "workload.py").write_text(WORKLOAD)
    return root


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CRASHMATRIX_PG_DSN"}
    env["PYTHONPATH"] = "."
    env["TMPDIR"] = str(root)
    return env


def test_the_model_provider_imports_a_script_found_through_a_relative_pythonpath(tmp_path: Path) -> None:
    root = _project(tmp_path / "project")
    code = textwrap.dedent(f"""
        import asyncio, json, aiohttp
        from crashmatrix.harness.services.providers import clients, start_providers

        async def ask(url):
            async with aiohttp.ClientSession() as s:
                return await clients.complete(s, url, script="supportbot.model:respond", conversation="c1",
                                              node_id="turn-1", messages=[], run_id="r1")

        with start_providers({str(tmp_path / 'ledgers')!r}, kinds=("model",)) as p:  # another directory
            print(json.dumps(asyncio.run(ask(p.urls["model"]))))
    """)
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=root, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["content"] == "Looking it up." and answer["tool_calls"][0]["name"] == "lookup"


def test_crashmatrix_run_on_a_users_package_with_pythonpath_dot(tmp_path: Path) -> None:
    root = _project(tmp_path / "project")
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-P", "-m", "crashmatrix.harness.cli", "run", "supportbot.workload:WORKLOAD",
                           "--subject", "reference", "--kinds", "kill", "--sources", "step", "--report", str(report)],
                          cwd=root, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    body = json.loads(report.read_text())
    assert body["summary"]["pass"] == body["summary"]["cases"] == len(body["cases"]) == 6, body["summary"]  # 3 steps x before, after
