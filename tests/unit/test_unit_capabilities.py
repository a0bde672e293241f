"""A runtime's capabilities are declared once, on its adapter class
(``Adapter.capabilities``): the conformance table's kinds and notes and the findings'
rows read them; no hand list of runtimes by capability comes back, and the docs'
tables (docs/adapters.md, docs/conformance.json) agree with the declarations."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from crashmatrix.harness.adapter import Adapter
from crashmatrix.harness.conformance import CAPABILITY_KINDS, RUNTIMES, adapter_class, kinds_and_note
from crashmatrix.scenarios.realworld import findings

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_table_ran_the_kinds_the_adapters_declare() -> None:
    rows = {r["runtime"]["name"]: tuple(r["runtime"]["kinds"]) for r in
            json.loads((ROOT / "docs" / "conformance.json").read_text())["rows"]}
    for rt in RUNTIMES:
        assert rows[rt.name] == kinds_and_note(rt.subject)[0], rt.name


def test_capability_kinds() -> None:
    kinds = {rt.name: rt.kinds for rt in RUNTIMES}
    assert kinds["reference"] == ("kill", "term", "cancel", "cancel-edge", "cancel-api", "pause", "db-restart",
                                  "restore")
    assert kinds["langgraph"] == ("kill", "term", "restore")  # invoke in a thread: no cancel reaches it
    assert kinds["absurd"] == ("kill", "term", "cancel", "cancel-edge", "pause", "db-restart")  # its cancel is final
    assert kinds["dbos"] == ("kill", "term", "cancel", "cancel-edge", "cancel-api", "restore")
    assert "final" in {rt.name: rt.note for rt in RUNTIMES}["absurd"]


def test_docs_capability_table_is_the_one_the_code_reads() -> None:
    text = (ROOT / "docs" / "adapters.md").read_text()
    text = text[text.index("| capability | declared by | fault kinds it adds |"):]
    text = text[:text.index("\n\n")]
    table = re.findall(r"^\s*\| (`[a-z-]+`|\(every adapter\)) \| .*? \| (.+?) \|$", text, re.M)
    documented = {cap.strip("`") if cap.startswith("`") else None: tuple(re.findall(r"`([a-z-]+)`", kinds))
                  for cap, kinds in table}
    assert documented == dict(CAPABILITY_KINDS)


def test_every_adapter_declaration_is_documented() -> None:
    text = (ROOT / "docs" / "adapters.md").read_text()
    declared = [name for name in Adapter.__annotations__ if not name.startswith("_")]
    assert "harness_db_leases" in declared
    assert [name for name in declared if not re.search(rf"\b{name}\b", text)] == []


def _module_level_names(path: Path) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and getattr(node, "value", None) is not None:
                out[t.id] = node.value  # type: ignore[union-attr]
    return out


def test_no_hand_list_of_runtimes_by_capability() -> None:
    """No module keeps a collection of runtime names (a ``LEASED = ("absurd",)``), and the
    conformance table names no kinds by hand."""
    runtimes = {rt.name for rt in RUNTIMES}
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "scenarios").rglob("*.py")]:
        for name, value in _module_level_names(path).items():
            if isinstance(value, (ast.Tuple, ast.List, ast.Set)) and value.elts and all(
                    isinstance(e, ast.Constant) and e.value in runtimes for e in value.elts):
                if name != "RUNTIMES" or path.name != "findings.py":  # the findings' row order, not a capability
                    pytest.fail(f"{path.relative_to(ROOT)}: {name} lists runtimes by hand: declare it on the adapters")
        listed = re.search(r"\b(%s)(, (%s)){2,}" % ("|".join(map(re.escape, runtimes)), "|".join(map(re.escape, runtimes))),
                           path.read_text())
        if listed:
            pytest.fail(f"{path.relative_to(ROOT)}: {listed.group(0)!r} lists runtimes by hand: read them from RUNTIMES")
    conformance = ast.parse((ROOT / "harness" / "conformance.py").read_text())
    calls = [n for n in ast.walk(conformance) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Runtime"]
    positional = [c for c in calls if c.args]  # Runtime(**row) reads a written table back
    assert positional and all(len(c.args) >= 5 and isinstance(c.args[4], ast.Name) for c in positional), \
        "Runtime(...) with kinds written by hand: read them from the adapter (kinds_and_note)"


def test_findings_read_the_declarations() -> None:
    pause = {r.runtime for r in findings.rows(suites=("pause",))}
    assert pause == {"absurd"}  # of the findings' runtimes, only Absurd declares harness_db_leases
    cancel = {(r.runtime, r.durability) for r in findings.rows(suites=("cancel",))}
    assert ("langgraph", "sync") not in cancel and ("langgraph-aio", "sync") in cancel


def test_capabilities_do_not_import_the_runtime() -> None:
    subjects = [rt.subject for rt in RUNTIMES]
    code = (
        "import sys\n"
        "from crashmatrix.harness.conformance import adapter_class\n"
        f"for s in {subjects!r}:\n"
        "    cls = adapter_class(s); cls.capabilities()\n"
        "    top = [m.split('.')[0] for m in cls.requires if m.split('.')[0] != 'psycopg']\n"
        "    loaded = [m for m in top if m in sys.modules]\n"
        "    assert not loaded, (s, loaded)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
    assert adapter_class("reference").capabilities() == {"cancel", "cancel-api", "leases", "restore"}
