"""``Adapter.requires`` is looked for, never imported, when an adapter is made
(``adapter.findable``): a runtime whose import starts threads must not start them in the
zygote before its probe (harness/zygote.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crashmatrix.harness.adapter import findable


def test_findable_imports_nothing_and_follows_packages_and_namespace_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cmns" / "sub").mkdir(parents=True)  # namespace packages: no __init__.py
    (tmp_path / "cmns" / "sub" / "mod.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "cmpkg").mkdir()
    (tmp_path / "cmpkg" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "cmpkg" / "leaf.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert findable("cmns.sub.mod") and findable("cmns.sub") and findable("cmpkg.leaf") and findable("cmpkg")
    assert not findable("cmns.sub.nope") and not findable("cmpkg.nope") and not findable("cmpkg.leaf.deeper")
    assert not findable("no_such_top_level_module")
    assert not {"cmns", "cmns.sub", "cmns.sub.mod", "cmpkg", "cmpkg.leaf"} & set(sys.modules)


def test_making_an_adapter_imports_none_of_its_runtime() -> None:
    """LangGraph's packages are namespace packages (``langgraph.checkpoint``)."""
    probe = ("import sys\nfrom crashmatrix.harness import registry\n"
             "registry.subject('crashmatrix.harness.adapters.langgraph:LangGraphAdapter')\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'langgraph'))\n")
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
