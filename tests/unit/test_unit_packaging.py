"""Packaging: every package folder is listed in pyproject.toml, and nothing else is."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _folder_packages() -> set[str]:
    """``crashmatrix.<dotted>`` for every folder with an ``__init__.py`` under the mapped
    top-level folders (via ``[tool.setuptools.package-dir]``)."""
    package_dir: dict[str, str] = _pyproject()["tool"]["setuptools"]["package-dir"]
    found = set()
    for pkg, folder in package_dir.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if any(part.startswith((".", "__")) for part in rel.parts):
                continue
            found.add(".".join([pkg, *rel.parts]))
    return found


def test_package_dir_maps_the_three_folders() -> None:
    package_dir = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert package_dir == {
        "crashmatrix.harness": "harness",
        "crashmatrix.reference_runtime": "reference_runtime",
        "crashmatrix.scenarios": "scenarios",
    }


def test_every_package_folder_is_listed_and_vice_versa() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = _folder_packages()
    assert on_disk, "found no package folders"
    missing = sorted(on_disk - listed)
    stale = sorted(listed - on_disk)
    assert not missing and not stale, (
        f"folders with __init__.py not in [tool.setuptools] packages: {missing}; "
        f"listed packages without a folder/__init__.py: {stale}"
    )


def test_listed_packages_import() -> None:
    for pkg in sorted(_pyproject()["tool"]["setuptools"]["packages"]):
        importlib.import_module(pkg)


def test_plugin_users_extra_is_the_plugin_alone_and_test_builds_on_it() -> None:
    """``crashmatrix[pytest]`` (docs/plugin.md) brings pytest, xdist and Hypothesis, not the
    adapters' frameworks or a browser driver; ``test``, the project's own, includes it."""
    from packaging.requirements import Requirement

    extras = _pyproject()["project"]["optional-dependencies"]
    assert {Requirement(r).name for r in extras["pytest"]} == {"pytest", "pytest-xdist", "hypothesis"}
    test = [Requirement(r) for r in extras["test"]]
    assert any(r.name == "crashmatrix" and {"pytest", "langgraph", "dbos", "burr"} <= r.extras for r in test)
    # not listed twice: the plugin's requirements come from its extra
    assert not {r.name for r in test} & {"pytest", "pytest-xdist", "hypothesis"} and "playwright" in {r.name for r in test}
