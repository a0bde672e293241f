"""Code and docs say what the code does, not its history: no reference to this project's
own tracker (``issue 17``, ``issue-5``), and no work-log ordinals (``tenth session``,
``session 13``, ``stop 27``) in the source trees and the docs. History belongs in git.

A reference to a PUBLIC upstream report is fine when it names the project it belongs
to (``LangGraph issue 8764``, ``Toxiproxy issue #603``, ``dbos-transact-py #742``):
:data:`UPSTREAM_NAMES` lists the names that make an ``issue N`` upstream, looked for in
the few words before it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCANNED = ("harness", "reference_runtime", "scenarios", "benchmarks", "docs", "README.md")
"""Directories (searched recursively) and files whose ``.py`` and ``.md`` text is checked."""

TEMPORARILY_EXCLUDED: frozenset[str] = frozenset()
"""Files left out while being edited elsewhere (none)."""
TEMPORARILY_EXCLUDED_DIRS: tuple[str, ...] = ()
"""Folders left out while being edited elsewhere (none)."""

UPSTREAM_NAMES = (
    "langgraph", "langchain", "prefect", "dbos", "airbyte", "celery", "cpython", "toxiproxy",
    "burr", "restate", "crewai", "llamaindex", "llama_index", "pydantic", "temporal", "anyio",
    "asyncpg", "psycopg", "openai", "absurd", "n8n", "mastra", "llama-agents", "llama-index",
)
"""Lower-case names of public projects; an ``issue N`` within :data:`UPSTREAM_WINDOW`
characters after one of them (or after an ``owner/repo`` name) cites that project's public
tracker."""
UPSTREAM_WINDOW = 40

ISSUE = re.compile(r"\b[Ii]ssues?[ -]#?\d+")
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
NARRATION = re.compile(
    rf"\b(?:{ORDINALS}|\d+(?:st|nd|rd|th)|previous|earlier|last|next) session\b"  # "tenth session"
    r"|\b[Ss]ession \d+\b"  # "session 13"
    r"|\b[Ss]tops? \d+\b",  # "stop 27"
    re.IGNORECASE)
OWNER_REPO = re.compile(r"[\w.-]+/[\w.-]+\s*$")


def _scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        else:
            files.extend(p for p in path.rglob("*") if p.suffix in (".py", ".md") and p.is_file())
    out = []
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        if rel in TEMPORARILY_EXCLUDED or rel.startswith(TEMPORARILY_EXCLUDED_DIRS):
            continue
        out.append(path)
    return out


def _is_upstream(text: str, start: int) -> bool:
    before = text[max(0, start - UPSTREAM_WINDOW):start]
    flat = " ".join(before.replace('"', " ").split())  # a reference may wrap across lines or strings
    return any(name in flat.lower() for name in UPSTREAM_NAMES) or bool(OWNER_REPO.search(flat))


def narration_in(text: str) -> list[str]:
    """The history references in ``text``: each match as ``"LINE: match"`` (``LINE`` 1-based),
    public upstream ``issue N`` citations left out."""
    found = []
    for m in ISSUE.finditer(text):
        if not _is_upstream(text, m.start()):
            found.append(f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    for m in NARRATION.finditer(text):
        found.append(f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return found


def test_detector_flags_project_history_and_keeps_upstream_reports() -> None:
    assert narration_in("the default (issue 17's rule)") == ["1: issue 17"]
    assert narration_in("x\nmeasured in the tenth session") == ["2: tenth session"]
    assert narration_in("## Matrices (2026-12-01, session 13)") == ["1: session 13"]
    assert narration_in("at stop 27's code") == ["1: stop 27"]
    assert narration_in("the issue-5 workloads") == ["1: issue-5"]
    assert narration_in("Source: LangGraph issue 8764, a run dropped.") == []
    assert narration_in("a toxic present at connect time (Toxiproxy\n    issue #603)") == []
    assert narration_in('source = ("... LangGraph "\n    "issues 6970, 7066")') == []
    assert narration_in("one session per subject; the same session replays it") == []


def test_no_history_narration_in_code_and_docs() -> None:
    offenders = []
    for path in _scanned_files():
        for hit in narration_in(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT).as_posix()}:{hit}")
    assert not offenders, ("references to this project's tracker or work sessions (say what the code does "
                           "and why; name the upstream project for a public report):\n  " + "\n  ".join(offenders))
