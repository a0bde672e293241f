"""``crashmatrix init``: the files of each shape, written from the package's templates,
and never over a file that exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crashmatrix.harness import cli, scaffold

runner = CliRunner()


@pytest.mark.parametrize("shape", sorted(scaffold.SHAPES))
def test_each_shape_writes_its_files_as_python_that_parses(shape: str, tmp_path: Path) -> None:
    written = scaffold.write_project(tmp_path / "proj", shape)
    names = sorted(p.name for p in written)
    expected = ["crashmatrix_workload.py", "test_crashmatrix.py"]
    if scaffold.SHAPES[shape].subject == "crashmatrix_adapter:SubjectAdapter":
        expected = ["crashmatrix_adapter.py", *expected]
    assert names == sorted(expected)
    for path in written:
        text = path.read_text()
        ast.parse(text, filename=str(path))
        assert "$SUBJECT" not in text
    test = (tmp_path / "proj" / "test_crashmatrix.py").read_text()
    assert f'subject="{scaffold.SHAPES[shape].subject}"' in test
    assert "YOUR CODE" in "".join(p.read_text() for p in written)


def test_init_from_the_command_line_names_the_files_and_the_first_run(tmp_path: Path) -> None:
    result = runner.invoke(cli.app, ["init", str(tmp_path / "p"), "--shape", "postgres-loop"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "crashmatrix_adapter.py").exists()
    assert "PYTHONPATH=. crashmatrix run crashmatrix_workload:WORKLOAD --subject crashmatrix_adapter:SubjectAdapter" \
        in result.output


def test_init_refuses_to_overwrite_in_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "test_crashmatrix.py").write_text("# the team's own\n")
    result = runner.invoke(cli.app, ["init", str(tmp_path), "--shape", "sqlite-loop"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "test_crashmatrix.py exists" in lines[0], result.output
    assert (tmp_path / "test_crashmatrix.py").read_text() == "# the team's own\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_crashmatrix.py"]  # nothing else written


def test_an_unknown_shape_is_one_line_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(cli.app, ["init", str(tmp_path / "p"), "--shape", "temporal"])
    assert result.exit_code == 2
    assert "unknown shape 'temporal'; shapes: postgres-loop, sqlite-loop, langgraph, dbos" in result.output
    assert not (tmp_path / "p").exists()


def test_the_templates_ship_as_package_data() -> None:
    """pyproject's package-data globs cover every template file."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["crashmatrix.harness"]
    templates = [p.relative_to(root / "harness").as_posix() for p in (root / "harness" / "templates").rglob("*")
                 if p.is_file()]
    assert templates
    assert all(any(fnmatch.fnmatch(t, g) for g in globs) for t in templates), templates
