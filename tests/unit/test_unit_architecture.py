"""docs/architecture.md names every harness module, and its "Layers" hold.

A module is named when the doc holds its path under ``harness/`` (``case.py``,
``services/postgres.py``, ``harness/services/postgres.py``), its dotted path
(``harness.services.postgres``), or its file name when no other harness module has that
name. ``__init__.py`` files are not counted, nor a package's private ``_x.py`` modules,
nor a fault kind's module (:func:`_counted`): the package's paragraph covers them, so the
package itself (``faults/``) must be named.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
DOC = ROOT / "docs" / "architecture.md"


def _modules() -> list[Path]:
    """Every ``.py`` file under harness/ (templates are ``.tmpl``, not counted)."""
    return sorted(p.relative_to(HARNESS) for p in HARNESS.rglob("*.py"))


def _names(rel: Path, unique_file_name: bool) -> set[str]:
    """The spellings that name module ``rel`` (a path relative to harness/)."""
    dotted = ".".join(rel.with_suffix("").parts)
    names = {rel.as_posix(), f"harness/{rel.as_posix()}", f"harness.{dotted}",
             f"crashmatrix.harness.{dotted}"}
    if len(rel.parts) > 1:
        names.add(dotted)
    if unique_file_name or len(rel.parts) == 1:
        names.add(rel.name)
    return names


def _counted(rel: Path) -> bool:
    """Whether ``rel`` needs a paragraph of its own. A fault kind's module
    (``faults/NAME.py``) does not: a kind is described where users read about kinds,
    docs/design.md's "Fault kinds, precisely" (held to the registry by
    tests/unit/test_unit_docs.py), and the ``faults/`` package's section here covers the
    modules."""
    if rel.name == "__init__.py" or (rel.parts[0] == "faults" and len(rel.parts) == 2):
        return False
    return not (len(rel.parts) > 1 and rel.name.startswith("_") and rel.name != "__main__.py")


def test_every_harness_module_is_named_in_the_architecture_doc() -> None:
    doc = DOC.read_text()
    modules = _modules()
    file_names = Counter(rel.name for rel in modules)
    missing = [rel.as_posix() for rel in modules
               if _counted(rel) and not any(n in doc for n in _names(rel, file_names[rel.name] == 1))]
    assert not missing, f"docs/architecture.md names no paragraph for: {', '.join(missing)}"


def test_every_harness_package_is_named_in_the_architecture_doc() -> None:
    doc = DOC.read_text()
    packages = sorted({rel.parts[0] for rel in _modules() if len(rel.parts) > 1})
    missing = [p for p in packages if f"{p}/" not in doc and f"harness.{p}" not in doc]
    assert not missing, f"docs/architecture.md does not name the package(s): {', '.join(missing)}"


def test_the_check_sees_a_module_the_doc_does_not_name() -> None:
    rel = Path("services") / "nonexistent_module.py"
    assert not any(n in DOC.read_text() for n in _names(rel, True))
    assert _counted(rel) and not _counted(Path("faults") / "_base.py") and _counted(Path("case.py"))
    assert not _counted(Path("faults") / "kill.py") and _counted(Path("faultproxy") / "server.py")


# The layers of docs/architecture.md ("Layers"): a top-level module or a package (one
# unit) -> its layer. A module-level import goes to the same layer or a lower one.
LAYERS = {
    1: "errors crashpoint history iostate normalize properties fault_registry determinism adapter scaffold "
       "resident zygote html_report plugin_prefetch registry coverage bugs upgrade_check services faultproxy "
       "plan checks awaitpoints",
    2: "adapters worker builds trace_check netfaults names sources defaults certify conformance pool "
       "plugin_services plugin_settings plugin_goldens",
    3: "oracle invariants human golden verdicts goldencache",
    4: "faults enumeration",
    5: "policies case pruning explorer fuzz",
    6: "runner session settings live matrix report selftest",
    7: "cli plugin",
}
LAYER_OF = {name: n for n, names in LAYERS.items() for name in names.split()}


def _module_level_imports(path: Path) -> set[str]:
    """The harness units ``path`` imports at module level (relative imports outside
    ``if TYPE_CHECKING``), as top-level module or package names."""
    rel = path.relative_to(HARNESS)
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.ImportFrom) and node.level:
                parts = list(rel.parts[:-1])[: max(len(rel.parts) - node.level, 0)]
                if node.module:
                    found.add((parts + node.module.split("."))[0])
                else:
                    found.update((parts + [a.name])[0] for a in node.names)

    visit(ast.parse(path.read_text()).body)
    return found


def test_no_module_level_import_reaches_a_higher_layer() -> None:
    units = {rel.parts[0].removesuffix(".py") for rel in _modules() if rel.name != "__init__.py" or len(rel.parts) > 1}
    unplaced = sorted(units - set(LAYER_OF))
    assert not unplaced, f"not in a layer of docs/architecture.md: {', '.join(unplaced)}"
    upward = []
    for rel in _modules():
        unit = rel.parts[0].removesuffix(".py")
        if unit not in LAYER_OF:
            continue
        for dep in _module_level_imports(HARNESS / rel) - {unit}:
            if dep in LAYER_OF and LAYER_OF[dep] > LAYER_OF[unit]:
                upward.append(f"{rel.as_posix()} imports {dep} (layer {LAYER_OF[dep]} > {LAYER_OF[unit]})")
    assert not upward, "; ".join(upward)
