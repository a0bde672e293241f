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


def test_the_naive_example_charges_twice_where_the_page_says(matrix_cases: Any) -> None:
    """docs/adapters.md's "see the oracle catch something": ``NaiveJournalAdapter`` at
    ``kill@step.after[tool-4.0]`` fails the payment ledger check, and only that ledger."""
    s = matrix_cases(f"{EXAMPLE}:NaiveJournalAdapter", f"{EXAMPLE}:WORKLOAD", ["kill@step.after[tool-4.0]#1"])
    case = s.cases[0]
    assert case.result.outcome == "fail", case.why()
    failed = {v.check for v in case.result.verdicts if v.valid is False}
    assert failed == {"provider.payment.ledger_equal", "effects.applied_once"}, failed
    assert case.extra("payment") == 1


def test_a_users_top_level_module_on_pythonpath_runs_through_the_cli(tmp_path: Path) -> None:
    """How another team reaches its adapter (docs/adapters.md): ``my_journal.py`` in a
    directory on PYTHONPATH, named ``my_journal:...`` (no package, nothing registered).
    The workers start with ``python -P``, so PYTHONPATH is what gets it to them."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_journal.py").write_text(f"from {EXAMPLE} import JournalAdapter, WORKLOAD  # noqa: F401\n")
    cmd = [sys.executable, "-m", "crashmatrix.harness.cli", "run", "my_journal:WORKLOAD",
           "--subject", "my_journal:JournalAdapter", "--conversation", "conv1",
           "--kinds", "kill", "--sources", "step", "--shard", "1/6"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(r"(\d+) cases: \1 passed", proc.stdout), proc.stdout[-2000:]

    missing = subprocess.run(cmd, cwd=ROOT.parent, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2, missing.stdout[-1000:] + missing.stderr[-1000:]
    assert "No module named 'my_journal'" in missing.stderr and "PYTHONPATH" in missing.stderr, missing.stderr[-1000:]
