"""Import circles inside the harness, measured over its import statements: at
type-check time (module level and ``if TYPE_CHECKING:`` blocks: what a type checker
follows) and with the imports inside functions too (what runs).

The plan grammar, the checks' declarations, the property table, the fault-kind
registry and the modules that define the generic checks are shared by nearly every
module, so each must be in no circle at all; the circle around the explorer (its case
flow, the fault kinds that call back into it, the worker pool) may not grow.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = "crashmatrix.harness"
EXPLORER_CIRCLE_AT_TYPE_CHECK = 3
"""Modules outside the fault kinds' package in the explorer's circle at type-check time
(the kinds annotate with the case flow's types, which import the kinds: every kind's
module is on the circle, so a new kind does not count)."""


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["crashmatrix", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _statements(body: list[ast.stmt], lazy: bool):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if lazy:
                yield from _statements(node.body, lazy)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []) or []:
                    yield from _statements(child.body if isinstance(child, ast.ExceptHandler) else [child], lazy)


@functools.cache
def graph(lazy: bool) -> dict[str, set[str]]:
    """Harness module -> the harness modules it imports (``lazy``: inside functions too)."""
    paths = {_name(p): p for p in (ROOT / "harness").rglob("*.py")}
    out: dict[str, set[str]] = {}
    for me, path in paths.items():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        deps = set()
        for node in _statements(ast.parse(path.read_text()).body, lazy):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                module = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                targets = [module, *(f"{module}.{a.name}" for a in node.names)]
            deps |= {t for t in targets if t in paths and t != me}
        out[me] = deps
    return out


def circle(of: str, lazy: bool) -> set[str]:
    """The modules on some import circle through ``of`` (its strongly connected
    component; just ``{of}`` when it is on none)."""
    g = graph(lazy)

    def reach(start: str, edges: dict[str, set[str]]) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    back: dict[str, set[str]] = {m: set() for m in g}
    for m, deps in g.items():
        for d in deps:
            back[d].add(m)
    return reach(of, g) & reach(of, back)


def test_the_shared_modules_are_on_no_circle() -> None:
    for module in ("plan", "checks", "properties", "fault_registry", "oracle", "invariants", "human", "trace_check"):
        assert circle(f"{HARNESS}.{module}", lazy=True) == {f"{HARNESS}.{module}"}, module


def test_the_explorer_circle_does_not_grow() -> None:
    members = circle(f"{HARNESS}.explorer", lazy=False)
    assert f"{HARNESS}.faults" in members  # the measure sees the circle it is meant to see
    others = sorted(m for m in members if not m.startswith(f"{HARNESS}.faults"))
    assert len(others) <= EXPLORER_CIRCLE_AT_TYPE_CHECK, others
