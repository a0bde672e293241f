"""Documentation hygiene, in the style of Hypothesis's own check: every public name of
the user-facing modules carries a docstring."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

# -- documentation (in the style of Hypothesis's own "every public name documented") ---

DOCUMENTED_HARNESS_MODULES = ("plan", "oracle", "adapter", "explorer", "matrix", "errors", "crashpoint", "selftest",
                              "plugin", "plugin_settings", "plugin_services", "plugin_goldens", "plugin_prefetch", "fuzz",
                              "html_report", "goldencache", "sources", "live", "report", "conformance",
                              "services.sharedpg", "services.matrixpg", "services.containers", "enumeration", "golden", "names")


def _undocumented(obj: object) -> bool:
    doc = obj.__doc__
    if not doc or not doc.strip():
        return True
    # a dataclass without a docstring gets ``Name(field: type, ...)`` generated for it
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        try:
            generated = obj.__name__ + str(inspect.signature(obj)).replace(" -> None", "")
        except (TypeError, ValueError):
            return False
        return doc == generated
    return False


def test_public_names_have_docstrings() -> None:
    missing = []
    import crashmatrix.reference_runtime as rr

    for name in rr.__all__:
        obj = getattr(rr, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and _undocumented(obj):
            missing.append(f"crashmatrix.reference_runtime.{name}")
    for short in DOCUMENTED_HARNESS_MODULES:
        mod = importlib.import_module(f"crashmatrix.harness.{short}")
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != mod.__name__:
                continue  # imported, documented (or not) where it is defined
            if _undocumented(obj):
                missing.append(f"{mod.__name__}.{name}")
    assert not missing, f"{len(missing)} public name(s) without a docstring: {', '.join(missing)}"


def test_nothing_refers_to_files_outside_the_project() -> None:
    """The design lives in docs/design.md: no source file or doc points at a file a user
    of the package never gets (the seed's DESIGN.md, the shared folder beside the repo)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    pattern = re.compile(r"(?<![\w/])DESIGN\.md|\.\./shared|\bcases/checkout\.md|\bnotes/embedded-postgres\.md")
    offenders = []
    for top in ("harness", "reference_runtime", "scenarios", "docs", "benchmarks", "ci", "README.md"):
        path = root / top
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in (".py", ".md", ".yml", ".yaml")]
        for f in files:
            for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{f.relative_to(root)}:{n}: {line.strip()[:80]}")
    assert not offenders, "references outside the project:\n" + "\n".join(offenders)
    assert (root / "docs" / "design.md").is_file()


def test_no_merge_conflict_markers() -> None:
    """A merge left unresolved (``<<<<<<<`` / ``=======`` / ``>>>>>>>`` at a line start)
    reached main once in README.md and docs/; every source and doc file is free of them."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    marker = re.compile(r"^(<{7} |={7}$|>{7} )")
    offenders = []
    for top in ("harness", "reference_runtime", "scenarios", "docs", "benchmarks", "ci", "tests", "tests_subjects",
                "proto", "README.md", "pyproject.toml"):
        path = root / top
        if not path.exists():
            continue
        files = [path] if path.is_file() else [p for p in path.rglob("*")
                                              if p.suffix in (".py", ".md", ".yml", ".yaml", ".toml", ".proto")]
        for f in files:
            for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if marker.match(line):
                    offenders.append(f"{f.relative_to(root)}:{n}")
    assert not offenders, "merge conflict markers:\n" + "\n".join(offenders)


# -- the docs' lists of kinds and policies follow the registries --------------------------


def _read(path: str) -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[2] / path).read_text()


def test_every_fault_kind_is_described_where_users_look() -> None:
    """A kind registered in ``harness/faults/`` and missing from docs/design.md's "Fault
    kinds, precisely" is a kind nobody can understand; a described or README-named kind
    no longer registered is a stale doc. README's usage line and the plan schema in
    ``plan.py`` list no kinds: they point at ``crashmatrix list kinds``."""
    import re

    from crashmatrix.harness import plan

    kinds = set(plan.fault_kinds())
    readme = _read("README.md")
    assert "[--kinds KIND,...] [--kind-sample N]  # KIND: crashmatrix list kinds" in readme
    named = {k for arg in re.findall(r"--kinds ([a-z][a-z,\-]*)", readme) for k in arg.split(",")}
    assert named <= kinds, named - kinds
    assert "`crashmatrix list kinds`" in plan.__doc__.split('"kind":', 1)[1].split('"point"', 1)[0]
    design = _read("docs/design.md").split("## Fault kinds, precisely", 1)[1].split("\n## ", 1)[0]
    described = set(re.findall(r"^- `([a-z\-]+)`", design, flags=re.M))
    assert described == kinds, described ^ kinds


def test_every_resume_policy_has_a_row_in_the_adapters_guide() -> None:
    """docs/adapters.md's policy table names every policy of ``plan.RESUME_POLICIES``
    (the default as its first row) and nothing else."""
    import re

    from crashmatrix.harness import plan

    table = _read("docs/adapters.md").split("## Resume policies", 1)[1].split("\n\n`crashmatrix run`", 1)[0]
    rows = set(re.findall(r"^\| `([a-z\-]+)`", table, flags=re.M)) | ({"default"} if "| (default) |" in table else set())
    assert rows == set(plan.RESUME_POLICIES), rows ^ set(plan.RESUME_POLICIES)
