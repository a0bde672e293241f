"""``crashmatrix init``: write a starting adapter, workload and pytest test into a project.

A shape is the kind of runtime a team has (:data:`SHAPES`). A loop shape writes three
files: ``crashmatrix_adapter.py`` (a stand-in runtime and its adapter, with ``YOUR CODE``
marking where the team's runtime goes), ``crashmatrix_workload.py`` (the workload object)
and ``test_crashmatrix.py`` (the pytest plugin's matrix test). A framework shape with a
shipped adapter writes only the workload and the test, the test naming the shipped
adapter. The files come from ``templates/<shape>/`` and ``templates/common/`` (package
data, ``*.tmpl``), written as they are but for ``$SUBJECT`` and ``$KINDS_LINE``
(:func:`render`).

Written as is, the loop shapes' files pass the default matrix of conv1 (``crashmatrix
run`` and ``pytest``; ``tests/integration/test_init_project.py`` runs its kill slice). A
framework shape whose runtime has known findings (LangGraph owns no run: its pause and
concurrent-resume cases fail) defaults to the kinds it passes (``Shape.kinds``) and says
why. Nothing is overwritten: a
file that exists stops the command before anything is written (exit 2).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer


@dataclass(frozen=True)
class Shape:
    """One runtime shape: ``files`` (name written -> template path under ``templates/``),
    ``subject`` (the ``--subject`` the test and the run line name) and ``extra`` (the
    crashmatrix extra it needs, ``""``: none)."""

    help: str
    files: tuple[tuple[str, str], ...]
    subject: str
    extra: str = ""
    #: the fault kinds its first run and its test default to ("": the default matrix), for
    #: a runtime whose known findings fail the rest (``why``)
    kinds: str = ""
    why: str = ""


_LOCAL = "crashmatrix_adapter:SubjectAdapter"
_WORKLOAD = ("crashmatrix_workload.py", "common/crashmatrix_workload.py.tmpl")
_TEST = ("test_crashmatrix.py", "common/test_crashmatrix.py.tmpl")

SHAPES: dict[str, Shape] = {
    "postgres-loop": Shape("an agent loop that checkpoints each step to PostgreSQL (asyncpg)",
                           (("crashmatrix_adapter.py", "postgres-loop/crashmatrix_adapter.py.tmpl"), _WORKLOAD, _TEST),
                           _LOCAL),
    "sqlite-loop": Shape("an agent loop that checkpoints each step to SQLite",
                         (("crashmatrix_adapter.py", "sqlite-loop/crashmatrix_adapter.py.tmpl"), _WORKLOAD, _TEST),
                         _LOCAL),
    "langgraph": Shape("a LangGraph StateGraph on the shipped LangGraph adapter (SqliteSaver)",
                       (("crashmatrix_workload.py", "langgraph/crashmatrix_workload.py.tmpl"), _TEST),
                       "crashmatrix.harness.adapters.langgraph:LangGraphAioSqliteSyncDrainAdapter", "langgraph",
                       "kill,term,cancel",
                       "LangGraph does not own a run (no lease, no fencing): the default matrix's pause and "
                       "concurrent-resume cases bill model calls twice (docs/findings.md)"),
    "dbos": Shape("a DBOS workflow on the shipped DBOS adapter (SQLite system database)",
                  (("crashmatrix_workload.py", "dbos/crashmatrix_workload.py.tmpl"), _TEST),
                  "crashmatrix.harness.adapters.dbos:DBOSSqliteAdapter", "dbos", "kill,cancel",
                  "DBOS has no SIGTERM drain, so the default matrix's term cases find the worker killed "
                  "mid-step, and a step that raises on a cut answer (net) is recorded as raised "
                  "(docs/findings.md)"),
}
"""Shape name -> :class:`Shape`."""


class InitError(Exception):
    """Bad input to :func:`write_project` (an unknown shape, a file that exists)."""


def template(path: str) -> str:
    """The text of template ``path`` (relative to ``templates/``)."""
    return resources.files("crashmatrix.harness").joinpath("templates", path).read_text(encoding="utf-8")


def render(text: str, spec: Shape) -> str:
    """``text`` with ``$SUBJECT`` and ``$KINDS_LINE`` (the test's default kinds, or
    nothing) filled in from ``spec``."""
    kinds_line = ""
    if spec.kinds:
        why = textwrap.fill(f"{spec.why}: these kinds by default (--crashmatrix-kinds overrides).", 88,
                            initial_indent="# ", subsequent_indent="# ")
        kinds_line = f'{why}\nos.environ.setdefault("CRASHMATRIX_KINDS", "{spec.kinds}")\n'
    return text.replace("$SUBJECT", spec.subject).replace("$KINDS_LINE\n", kinds_line)


def write_project(directory: Path, shape: str) -> list[Path]:
    """Write ``shape``'s files into ``directory`` (made if missing); returns the paths
    written. Raises :class:`InitError` for an unknown shape, or naming the first file
    that already exists (then nothing is written)."""
    if shape not in SHAPES:
        raise InitError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    spec = SHAPES[shape]
    targets = [(directory / name, source) for name, source in spec.files]
    existing = [str(path) for path, _ in targets if path.exists()]
    if existing:
        raise InitError(f"{existing[0]} exists; crashmatrix init writes no file over another "
                        f"(move it, or init into another folder)")
    directory.mkdir(parents=True, exist_ok=True)
    for path, source in targets:
        path.write_text(render(template(source), spec), encoding="utf-8")
    return [path for path, _ in targets]


def run_line(shape: str) -> str:
    """The ``crashmatrix run`` line of ``shape``'s files, run in their folder."""
    spec = SHAPES[shape]
    return (f"PYTHONPATH=. crashmatrix run crashmatrix_workload:WORKLOAD --subject {spec.subject} "
            "--conversation conv1" + (f" --kinds {spec.kinds}" if spec.kinds else ""))


def init(
    directory: Annotated[Optional[Path], typer.Argument(help="The folder to write into (default: the current one).")] = None,
    shape: Annotated[str, typer.Option(help="The runtime's shape: " + "; ".join(
        f"{name}: {s.help}" for name, s in SHAPES.items()) + ".")] = "sqlite-loop",
) -> None:
    """Write a starting adapter, workload and pytest test for your runtime: they pass the
    matrix as written (a framework shape: the kinds its runtime passes, saying why), and
    YOUR CODE comments mark where your runtime goes. Refuses to write over a file."""
    target = directory or Path(".")
    try:
        written = write_project(target, shape)
    except (InitError, OSError) as exc:
        typer.echo(f"crashmatrix: error: {exc}", err=True)
        raise typer.Exit(2) from None
    spec = SHAPES[shape]
    for path in written:
        typer.echo(f"wrote {path}")
    if spec.extra:
        typer.echo(f"needs: pip install 'crashmatrix[{spec.extra},pytest]'")
    if spec.why:
        typer.echo(f"note: {spec.why}; the first run below leaves them out (--kinds {spec.kinds})")
    where = f"cd {target} && " if directory is not None else ""
    typer.echo(f"first run: {where}{run_line(shape)}")
    typer.echo(f"as a test: {where}python -m pytest test_crashmatrix.py --crashmatrix-kinds kill")
