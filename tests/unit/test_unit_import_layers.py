"""The layers of the distribution: ``scenarios`` may import ``harness``, never the reverse.

The harness reaches a workload (or a mutant) only through :mod:`crashmatrix.harness.registry`,
by name; the providers it starts for every subject are its own services
(``harness/services/providers``). ``reference_runtime`` imports one harness module,
:mod:`crashmatrix.harness.crashpoint` (the hook a subject calls), which imports nothing
else of crashmatrix: counted as a node of its own, the top-level packages form no cycle.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"harness": "harness", "reference_runtime": "reference_runtime", "scenarios": "scenarios"}
REGISTRY = ROOT / "harness" / "registry.py"
CRASHPOINT = "crashmatrix.harness.crashpoint"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["crashmatrix", *parts])


@functools.cache
def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (at any depth, relative imports resolved): (line, name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if ".venv" not in p.parts)


def _node(module: str) -> str | None:
    """The layer a crashmatrix module belongs to (crashpoint is its own)."""
    if module == CRASHPOINT or module.startswith(CRASHPOINT + "."):
        return "crashpoint"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "crashmatrix" and parts[1] in PACKAGES else None


def test_harness_imports_scenarios_only_through_the_registry() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
                 for path in _sources("harness") if path != REGISTRY
                 for line, name in _imports(path) if name == "crashmatrix.scenarios" or name.startswith("crashmatrix.scenarios.")]
    assert offenders == [], "harness reaches scenarios only by name, through harness/registry.py:\n" + "\n".join(offenders)


def test_the_top_level_packages_form_no_import_cycle() -> None:
    edges: dict[str, dict[str, str]] = {n: {} for n in (*PACKAGES, "crashpoint")}
    for package in PACKAGES:
        for path in _sources(package):
            mine = _node(_module_name(path))
            assert mine is not None
            for line, name in _imports(path):
                theirs = _node(name)
                if theirs is not None and theirs != mine and not (path == REGISTRY and theirs == "scenarios"):
                    edges[mine].setdefault(theirs, f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert edges["crashpoint"] == {}, f"the crash-point hook must import nothing else of crashmatrix: {edges['crashpoint']}"

    def cycle_from(start: str, node: str, seen: list[str]) -> list[str] | None:
        for nxt in edges[node]:
            if nxt == start:
                return [*seen, node, nxt]
            if nxt not in seen and nxt != node:
                found = cycle_from(start, nxt, [*seen, node])
                if found:
                    return found
        return None

    for start in edges:
        cycle = cycle_from(start, start, [])
        assert cycle is None, "import cycle " + " -> ".join(cycle) + ":\n" + "\n".join(
            edges[a][b] for a, b in zip(cycle, cycle[1:], strict=False))
    # the layering the docs describe, as it is: scenarios on top of harness and the runtime
    assert set(edges["scenarios"]) >= {"harness", "reference_runtime"}
    assert "scenarios" not in edges["harness"] and "scenarios" not in edges["reference_runtime"]


def test_importing_every_harness_module_loads_no_scenario() -> None:
    """At import time too (a registry lookup at module level would pass the static check)."""
    code = """
import importlib, json, pkgutil, sys
import crashmatrix.harness as h
names = [m.name for m in pkgutil.walk_packages(h.__path__, "crashmatrix.harness.")
         if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": len(names), "scenarios": sorted(m for m in sys.modules if m.startswith("crashmatrix.scenarios"))}))
"""
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["imported"] > 40
    assert result["scenarios"] == [], result


def test_the_old_place_of_the_providers_still_serves_user_code() -> None:
    """``crashmatrix.scenarios.providers`` (and ``.clients`` ...) re-export the harness's
    own objects, so a team's tools written against the old place keep working."""
    from crashmatrix.harness.services import providers
    from crashmatrix.harness.services.providers import clients, launcher, ledger, server
    from crashmatrix.scenarios import providers as old
    from crashmatrix.scenarios.providers import clients as old_clients
    from crashmatrix.scenarios.providers import launcher as old_launcher
    from crashmatrix.scenarios.providers import ledger as old_ledger
    from crashmatrix.scenarios.providers import server as old_server

    for new, was in ((clients, old_clients), (launcher, old_launcher), (ledger, old_ledger), (server, old_server)):
        assert new.__all__ and all(getattr(was, name) is getattr(new, name) for name in new.__all__), new.__name__
    assert sorted(old.__all__) == sorted(providers.__all__)
    assert old.start_providers is launcher.start_providers and old.send_mail is clients.send_mail
    assert old_clients.Resources is clients.Resources
    done = subprocess.run([sys.executable, "-P", "-m", "crashmatrix.scenarios.providers.server", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--service" in done.stdout, done.stderr
