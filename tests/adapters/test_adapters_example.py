"""The worked example of docs/adapters.md runs, and the page shows its code as it is.

``scenarios/realworld/journal_example.py`` is a tiny durable runtime with its adapter;
the page quotes the adapter. Needs no extra (standard library, aiohttp, the harness).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "crashmatrix.scenarios.realworld.journal_example"


def test_the_page_quotes_the_example_verbatim() -> None:
    page = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    source = (ROOT / "scenarios" / "realworld" / "journal_example.py").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n# from scenarios/realworld/journal_example.py\n(.*?)```", page, re.S)
    assert blocks, "docs/adapters.md no longer quotes scenarios/realworld/journal_example.py"
    for block in blocks:
        assert block in source, f"docs/adapters.md quotes code that is not in journal_example.py:\n{block[:400]}"


def test_the_example_adapter_runs_a_matrix(matrix_cases: Any) -> None:
    """A kill after a step's effect and before its journal write, a cancel at an await
    point while the charge is on the wire, a kill right after the write: all pass (the
    keyed tool repeats the key; the journal replays what it holds)."""
    s = matrix_cases(f"{EXAMPLE}:JournalAdapter", f"{EXAMPLE}:WORKLOAD", [
        "kill@step.after[tool-4.0]#1",
        f"cancel@{EXAMPLE}:run_agent.<locals>.step@1[tool-4.0]#1",
        "kill@log.append.after[tool-4.0]#1",
    ], await_points=True)
    golden = s.cases[0].golden
    assert golden.evidence.observation.status == "completed"
    assert [e.seq for e in golden.evidence.observation.log] == list(range(1, 12))
    for case in s.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
    kill_after_effect = s.cases[0]
    assert kill_after_effect.extra("payment") == 0 and len(kill_after_effect.workers) == 2
