"""Every harness module imports without any optional runtime, and an adapter whose extra
is missing says which extra to install (harness/adapter.py, ``Adapter.requires``).

The runtimes are hidden from a fresh interpreter by a meta-path finder, so the test
holds whether or not this venv has them (the heavy ones, Prefect and CrewAI, are not in
``test``): importing any ``crashmatrix.harness`` module must not import one, and making
each adapter of ``harness/adapters`` must raise ``RegistryError`` naming its
``crashmatrix[...]`` extra, one that ``pyproject.toml`` declares.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the top-level modules the optional extras bring (pyproject.toml), hidden below
RUNTIMES = ("langgraph", "dbos", "burr", "restate", "hypercorn", "absurd_sdk", "absurdctl", "psycopg", "prefect",
            "crewai", "pydantic_ai", "agents", "dbos_openai_agents", "workflows", "llama_index", "uvicorn",
            "starlette")

HIDE = """
import json, sys
HIDDEN = set(json.loads(sys.argv[1]))

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, Hide())
"""
"""A fresh interpreter's preamble: the modules of ``sys.argv[1]`` (JSON) cannot be imported."""

CODE = HIDE + """
import importlib, inspect, pkgutil
import crashmatrix.harness as h
from crashmatrix.harness.adapter import Adapter
from crashmatrix.harness.errors import RegistryError

names = sorted(m.name for m in pkgutil.walk_packages(h.__path__, "crashmatrix.harness.") if not m.name.endswith("__main__"))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
made = {}
for name in names:
    if not name.startswith("crashmatrix.harness.adapters.") or name in failed:
        continue
    for attr, cls in vars(sys.modules[name]).items():
        if (inspect.isclass(cls) and issubclass(cls, Adapter) and cls.__module__ == name
                and not inspect.isabstract(cls) and cls.requires):
            try:
                cls()
                made[f"{name}:{attr}"] = "made"
            except RegistryError as exc:
                made[f"{name}:{attr}"] = str(exc)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
print(json.dumps({"imported": len(names), "failed": failed, "made": made, "loaded": loaded}))
"""


def _run() -> dict:
    done = subprocess.run([sys.executable, "-P", "-c", CODE, json.dumps(RUNTIMES)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_harness_module_imports_without_the_optional_runtimes() -> None:
    result = _run()
    assert result["imported"] > 40
    assert result["failed"] == {}, result["failed"]
    assert result["loaded"] == []
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    # every adapter with a runtime (the reference adapter has none) refuses to be made,
    # naming an extra the package declares
    made = result["made"]
    assert {m.split(":")[0].rsplit(".", 1)[1] for m in made} >= {
        "absurd", "burr", "crewai", "dbos", "langgraph", "llamaindex", "openai_agents", "prefect", "pydantic_ai",
        "restate"}, sorted(made)
    for adapter, message in made.items():
        assert "needs its runtime, which is not installed here" in message, (adapter, message)
        assert "pip install the release your project runs (" in message and "pip install 'crashmatrix[" in message, \
            (adapter, message)
        extra = message.split("crashmatrix[", 1)[1].split("]", 1)[0]
        assert extra in extras, (adapter, extra)


WORKLOADS_CODE = HIDE + """
from crashmatrix.scenarios.realworld import crewai_checkout, llamaindex_checkout, llamaindex_human
out = {"crewai_input": len(crewai_checkout.KEYED.inputs("r1", "conv1")["messages"]), "llamaindex_api": llamaindex_checkout.API,
       "human_script": len(llamaindex_human.KEYED.operator_script.answers)}
msgs = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "done"}])
core = {"ctx_state": {"globals": {"messages": msgs}, "is_running": True}}
new = {"state": {"state_type": "DictState", "state_data": {"_data": {"messages": msgs}}}, "is_running": False}
out["finished"] = [llamaindex_checkout.KEYED.finished(core), llamaindex_checkout.KEYED.finished(new)]
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
print(json.dumps(out))
"""


def test_workloads_read_runs_in_a_controller_without_their_runtimes() -> None:
    """The controller imports a workload's module to read its runs while the subject runs
    in an environment of its own (``--subject ...@VENV``): CrewAI's and LlamaIndex's
    workloads import without their runtime, and LlamaIndex's reads a snapshot of either
    API (0.12's checkpoint record, 2.x's context) by its format."""
    done = subprocess.run([sys.executable, "-P", "-c", WORKLOADS_CODE, json.dumps(RUNTIMES)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"crewai_input": 1, "llamaindex_api": "", "human_script": 2, "finished": [True, True], "loaded": []}, out
