"""Which installed release a module comes from (harness/sources.py, read from the
installed metadata of this test environment: nothing imported, nothing mocked)."""

from __future__ import annotations

import importlib.metadata

from crashmatrix.harness.sources import distribution_of, releases, releases_line, runtime_releases


def test_a_module_named_as_its_distribution() -> None:
    assert distribution_of("asyncpg") == ("asyncpg", importlib.metadata.version("asyncpg"))


def test_a_module_whose_distribution_has_another_name() -> None:
    """``workflows`` is shipped by llama-index-workflows, ``_pytest`` by pytest: the
    module's name is not the distribution's."""
    assert distribution_of("workflows") == ("llama-index-workflows", importlib.metadata.version("llama-index-workflows"))
    assert distribution_of("_pytest.python") == ("pytest", importlib.metadata.version("pytest"))


def test_a_namespace_package_shared_by_several_distributions() -> None:
    """``langgraph`` is a directory several distributions ship into: the one whose files
    hold the module is named, not the first candidate."""
    assert distribution_of("langgraph.checkpoint.sqlite")[0] == "langgraph-checkpoint-sqlite"
    assert distribution_of("langgraph.graph")[0] == "langgraph"
    assert distribution_of("google.protobuf") == ("protobuf", importlib.metadata.version("protobuf"))


def test_a_module_no_distribution_provides() -> None:
    assert distribution_of("no_such_runtime_anywhere") is None
    assert releases(["no_such_runtime_anywhere", "asyncpg"]) == {"asyncpg": importlib.metadata.version("asyncpg")}


def test_an_adapters_runtime_release() -> None:
    class Adapter:
        subject_packages = ("dbos",)
        requires = ("dbos", "google.protobuf")

    assert runtime_releases(Adapter()) == {"dbos": importlib.metadata.version("dbos"),
                                           "protobuf": importlib.metadata.version("protobuf")}


def test_the_summary_line() -> None:
    assert releases_line({"dbos": {"dbos": "2.23.0"}}) == "runtime under test: dbos 2.23.0"
    assert releases_line({"a": {"dbos": "2.23.0"}, "b": {"dbos": "2.24.0"}}) == \
        "runtime under test: a: dbos 2.23.0; b: dbos 2.24.0"
    assert releases_line({"mine": {}}) is None
