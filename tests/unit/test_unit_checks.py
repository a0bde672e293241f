"""The checks' declarations (harness/checks.py): every check the harness reports is
declared where it is defined, with a property of the table; docs/checks.md names each
one under its property's section, and no other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from crashmatrix.harness import checks
from crashmatrix.harness.checks import Check, CheckDeclarationError, anomaly_of, compose, lookup, property_of
from crashmatrix.harness.properties import PROPERTIES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "checks.md"
CHECK_NAME = re.compile(r"^[a-z-]+(\.[a-z<>_-]+)+$")


def documented() -> dict[str, str]:
    """Check name -> the property section of docs/checks.md it is described in."""
    out: dict[str, str] = {}
    section = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            title = line[3:].strip().lower()
            section = title if title in PROPERTIES else None
            continue
        if section is None:
            continue
        for name in re.findall(r"\*\*`([^`]+)`\*\*", line):
            assert name not in out or out[name] == section, f"{name} documented under two properties"
            out.setdefault(name, section)
    return out


def test_docs_name_every_declared_check_under_its_property() -> None:
    declared = {name: c.property for name, c in checks.declared().items()}
    assert documented() == declared


def test_docs_property_table_is_the_declared_table() -> None:
    rows = dict(re.findall(r"^\| ([a-z][^|]*?) \| ([^|]+?) \|$", DOC.read_text(), re.M))
    rows.pop("property", None)
    assert rows == PROPERTIES


def _literal_check_names() -> set[tuple[str, str]]:
    """(file, name) of every check name written as a literal where a verdict is made: the
    first argument of ``Verdict(...)``, ``run_check(...)``, ``_verdict(...)``, and a
    ``name = "..."`` inside a function (the checks' own idiom)."""
    found = set()
    for path in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                arg = node.args[0]
                if fn in ("Verdict", "run_check", "_verdict") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add((str(path.relative_to(ROOT)), arg.value))
            if (isinstance(node, ast.FunctionDef) or isinstance(node, ast.AsyncFunctionDef)):
                for stmt in ast.walk(node):
                    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                            and stmt.targets[0].id == "name" and isinstance(stmt.value, ast.Constant)
                            and isinstance(stmt.value.value, str) and CHECK_NAME.match(stmt.value.value)):
                        found.add((str(path.relative_to(ROOT)), stmt.value.value))
    return found


def test_every_verdict_written_in_the_code_carries_its_declared_phase() -> None:
    """A ``Verdict("name", "phase", ...)`` or ``run_check("name", "phase", ...)`` with both
    literal carries the phase the check declares (an invariant's verdicts: ``end``); the
    case flow's ``_verdict`` writes ``resume``."""
    checks.declared()
    wrong = []
    for path in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn == "_verdict":
                phase = "resume"
            elif fn in ("Verdict", "run_check") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                phase = node.args[1].value
            else:
                continue
            if lookup(node.args[0].value).verdict_phase != phase:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.args[0].value} {phase}")
    assert not wrong


def test_every_check_named_in_the_code_is_declared() -> None:
    names = _literal_check_names()
    assert len(names) > 20  # the scan sees the verdicts it is meant to see
    checks.declared()
    undeclared = []
    for path, name in sorted(names):
        try:
            lookup(name)
        except CheckDeclarationError:
            undeclared.append(f"{path}: {name}")
    assert not undeclared


def test_family_members_and_refined_anomalies() -> None:
    assert property_of("provider.payment.ledger_equal") == "effect exactly-once"
    assert anomaly_of("provider.mail.ledger_equal", "1 more row(s) than golden") == "duplicated effect"
    assert anomaly_of("provider.mail.ledger_equal", "1 fewer row(s) than golden") == "lost effect"
    assert anomaly_of("transcript.exact", "2 missing message(s)") == "lost message"
    assert anomaly_of("run.status") == "diverged status"


def test_an_undeclared_check_is_an_error_not_other() -> None:
    with pytest.raises(CheckDeclarationError, match="not.declared"):
        property_of("made.up_check")
    with pytest.raises(CheckDeclarationError, match="not.declared"):
        lookup("provider.payment.ledger_equal.extra")


def test_a_declaration_needs_a_known_property_and_phase_and_one_meaning() -> None:
    with pytest.raises(CheckDeclarationError, match="declares property 'made up'"):
        Check("test.unknown_property", "made up", "x", "end", "x")
    with pytest.raises(CheckDeclarationError, match="declares phase"):
        Check("test.unknown_phase", "drain", "x", "later", "x")
    with pytest.raises(CheckDeclarationError, match="declared twice"):
        Check("run.status", "drain", "diverged status", "end", "the same terminal status")


def test_compose_runs_in_order_and_a_raising_check_is_unknown() -> None:
    a = lookup("run.status")
    b = lookup("state.equal")

    def boom() -> checks.Verdict:
        raise RuntimeError("no state")

    out = compose([(a, lambda: a.verdict(True, "status completed")), (b, boom)])
    assert [(v.check, v.phase, v.valid) for v in out] == [("run.status", "end", True), ("state.equal", "end", None)]
    assert out[1].details == "check raised RuntimeError: no state"
    assert out[1].to_dict()["anomaly"] == "diverged state"


def test_declared_leaves_out_a_module_whose_optional_dependency_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = checks.importlib.import_module

    def without_pytest(name: str) -> object:
        if name == "crashmatrix.harness.plugin":
            raise ModuleNotFoundError("No module named 'pytest'", name="pytest")
        if name == "crashmatrix.harness.fuzz" and broken:
            raise ModuleNotFoundError("No module named 'crashmatrix.harness.gone'", name="crashmatrix.harness.gone")
        return real(name)

    broken = False
    monkeypatch.setattr(checks.importlib, "import_module", without_pytest)
    assert "run.status" in checks.declared()
    broken = True  # a module of the harness itself missing is a bug, not an optional extra
    with pytest.raises(ModuleNotFoundError, match="crashmatrix.harness.gone"):
        checks.declared()


def test_every_mutant_is_caught_by_declared_checks() -> None:
    """The selftest counts a mutant caught when it fails one of its ``caught_by`` checks:
    a name nobody declared there would never count."""
    from crashmatrix.harness.selftest import catalogue

    specs = catalogue()
    assert len(specs) > 20
    undeclared = []
    for spec in specs:
        for name in spec.caught_by:
            try:
                lookup(name)
            except CheckDeclarationError:
                undeclared.append(f"{spec.subject}: {name}")
    assert not undeclared
