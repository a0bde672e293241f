"""``crashmatrix bugs`` as a user meets it: the list of entries and their commands, and
bad input refused in one line with exit 2 and no report written. The installs and runs
of real releases are the nightly job's (.ci/bugs-nightly; figures in docs/findings.md)."""

from __future__ import annotations

import subprocess
import sys

from crashmatrix.harness import bugs

CLI = [sys.executable, "-m", "crashmatrix.harness.cli", "bugs"]


def test_list_names_every_entry_with_its_command_or_its_need():
    p = subprocess.run([*CLI, "--list"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for e in bugs.ENTRIES:
        assert e.name in p.stdout
    runnable = next(e for e in bugs.ENTRIES if e.needs is None)
    assert f"--subject {runnable.subject}@VENV" in " ".join(p.stdout.split())
    assert "needs " in p.stdout


def test_unknown_entry_is_one_line_exit_2_and_no_report(tmp_path):
    out = tmp_path / "bugs.json"
    p = subprocess.run([*CLI, "--entry", "no-such-bug", "--out", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-bug" in lines[0] and "dbos-742" in lines[0]
    assert not out.exists() and not out.with_suffix(".md").exists()
