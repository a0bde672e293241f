"""Subjects and workloads by name: registered ones, and another team's by import string."""

from __future__ import annotations

import textwrap

import pytest

from crashmatrix.harness import registry
from crashmatrix.harness.errors import RegistryError


def test_a_top_level_module_is_reachable(tmp_path, monkeypatch) -> None:
    """``module:Attr`` needs no dot (a user's ``my_adapter.py`` next to their tests)."""
    (tmp_path / "cm_unit_toplevel.py").write_text(textwrap.dedent("""
        from crashmatrix.harness.adapter import Adapter, findable

        class TopLevelAdapter(Adapter):
            name = "top-level"

            async def prepare(self, env): ...
            async def start(self, ctx): ...
            async def resume(self, ctx): ...
            async def observe(self, env, run_id): ...

        class Unfinished(Adapter):
            name = "unfinished"

        class NotAnAdapter:
            pass

        WORKLOAD = object()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.subject("cm_unit_toplevel:TopLevelAdapter").name == "top-level"
    assert registry.workload("cm_unit_toplevel:WORKLOAD") is registry.load("cm_unit_toplevel:WORKLOAD")
    with pytest.raises(RegistryError, match=r"subject='cm_unit_toplevel:Unfinished': .*abstract methods observe, prepare, resume, start"):
        registry.subject("cm_unit_toplevel:Unfinished")
    with pytest.raises(RegistryError, match=r"not a subclass of crashmatrix.harness.adapter.Adapter"):
        registry.subject("cm_unit_toplevel:NotAnAdapter")


def test_a_missing_module_says_where_it_must_be() -> None:
    with pytest.raises(RegistryError, match=r"cm_unit_nowhere.*PYTHONPATH"):
        registry.workload("cm_unit_nowhere:WORKLOAD")


def test_a_module_whose_own_import_fails_names_that_import_only(tmp_path, monkeypatch) -> None:
    (tmp_path / "cm_unit_broken.py").write_text("import cm_unit_not_installed_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match="cm_unit_not_installed_dependency") as info:
        registry.subject("cm_unit_broken:Adapter")
    assert "PYTHONPATH" not in str(info.value)


def test_a_misspelt_mutant_is_not_registered_rather_than_an_import_error() -> None:
    with pytest.raises(RegistryError, match=r"subject='defect:no-such-mutant' is not registered; known: .*defect:"):
        registry.subject("defect:no-such-mutant")


def test_an_unknown_plain_name_lists_the_known_ones_and_the_import_form() -> None:
    with pytest.raises(RegistryError, match=r"workload='chekout' is not registered \(did you mean 'checkout'\?\); "
                                            r"known: .*checkout.*module:WORKLOAD"):
        registry.workload("chekout")


def test_an_unknown_subject_names_the_runtimes_and_counts_the_mutants() -> None:
    """The mutants are most of the subjects: a misspelt runtime gets the runtimes and a
    count (the whole list is one command away), a misspelt mutant gets the mutants."""
    with pytest.raises(RegistryError) as info:
        registry.subject("refrence")
    message = str(info.value)
    assert message.startswith("subject='refrence' is not registered (did you mean 'reference'?); known: absurd, ")
    assert "defect:unkeyed-retry" not in message and " mutants defect:NAME (crashmatrix list subjects)" in message
    with pytest.raises(RegistryError) as info:
        registry.subject("defect:unkeyed")
    assert "(did you mean 'defect:unkeyed-retry'?)" in str(info.value) and "langgraph" not in str(info.value)


def test_every_registered_name_points_at_an_adapter_class_or_a_workload() -> None:
    """The short names of the shipped adapters and workloads (``crashmatrix list``)
    each reach what they name: an Adapter subclass (its module imports without its
    runtime), a workload object with conversations."""
    from crashmatrix.harness.adapter import Adapter, findable

    for name, target in registry.SUBJECTS.items():
        cls = registry.load(target)
        assert isinstance(cls, type) and issubclass(cls, Adapter), (name, target)
    for name, target in registry.WORKLOADS.items():
        try:
            workload = registry.load(target)
        except RegistryError as exc:  # Prefect's and CrewAI's workloads import their runtime,
            missing = str(exc).rsplit("No module named ", 1)[-1].strip("'")  # not in the test extra
            assert "No module named" in str(exc) and not findable(missing), (name, str(exc))
            continue
        assert workload.conversations, (name, target)
