"""Restate as a subject (harness/adapters/restate.py, harness/services/restate.py): what
the matrix found, pinned for the installed versions (measured on restate-sdk 1.3.0 and
restate-server 1.7.12).

The server binary comes from the npm registry at first use and is cached
(``python -m crashmatrix.harness.services.restate fetch``). A failure whose message says
"now" means Restate changed: re-run the matrices of docs/findings.md's "Restate" section.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("restate", reason="Restate adapter tests need the extra: pip install 'crashmatrix[restate]'")

ADAPTER = "crashmatrix.harness.adapters.restate:RestateAdapter"
WL = "crashmatrix.scenarios.realworld.restate_checkout"


def test_app_is_importable_without_starting_anything(imports_start_nothing: Any) -> None:
    """No thread, connection or event loop at import (docs/adapters.md, lesson 2)."""
    imports_start_nothing("crashmatrix.harness.adapters.restate", WL)


def test_journal_view_reads_run_commands_and_their_results() -> None:
    """The journal shape of restate-server 1.7 (``sys_journal.entry_json``, journal v2):
    a ``Run`` command names the action, a ``Run`` notification carries its result; an
    action without its notification (the endpoint died first) is not in the log."""
    from crashmatrix.harness.adapters.restate import journal_view

    def raw(obj: Any) -> list[int]:
        return list(json.dumps(obj).encode())

    rows = [{"entry_json": json.dumps(e)} for e in (
        {"Command": {"Input": {"payload": raw({"conversation": "conv1", "messages": [{"role": "user"}]})}}},
        {"Command": {"Run": {"completion_id": 1, "name": "model-1"}}},
        {"Notification": {"Completion": {"Run": {"completion_id": 1, "result": {"Success": raw({"role": "assistant"})}}}}},
        {"Command": {"Run": {"completion_id": 2, "name": "tool-1.0"}}},
    )]
    run_input, results = journal_view(rows)
    assert run_input == {"conversation": "conv1", "messages": [{"role": "user"}]}
    assert results == [(1, "model-1", {"role": "assistant"})]


def test_the_server_is_reaped_when_its_controller_is_sigkilled(tmp_path: Path) -> None:
    """Started like PostgreSQL and reaped like it: a controller that started the server
    with a watchdog and then died of SIGKILL leaves no server process and no data
    directory behind."""
    code = f"""
import json, os, signal, sys
from pathlib import Path
from crashmatrix.harness.services.restate import start_restate
from crashmatrix.harness.services.watchdog import Watchdog
w = Watchdog.start()
s = start_restate(Path({str(tmp_path)!r}) / "restate", watchdog=w)
print(json.dumps({{"pid": s.pid, "private_hosts": s.private_hosts}}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (_alive(info["pid"]) or (tmp_path / "restate").exists()):
        time.sleep(0.1)
    assert not _alive(info["pid"]), "restate-server outlived its SIGKILLed controller"
    assert not (tmp_path / "restate").exists(), "its data directory was left behind"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


KEYED_CASES = ["kill@step.after[tool-4.0]#1", "kill@log.append.after[tool-4.0]#1", "term@step.before[model-2]#1"]


@pytest.fixture(scope="module")
def keyed(module_cases: Any) -> Any:
    """The keyed cases, one session (one restate-server)."""
    return module_cases(ADAPTER, f"{WL}:KEYED", KEYED_CASES, goldens=2)


def test_keyed_survives_kills_and_naive_charges_twice(keyed: Any, matrix_cases: Any) -> None:
    """SIGKILL between a charge and the server's acknowledgement of its ``ctx.run``: the
    retried invocation re-runs the action (at-least-once); the keyed tool repeats its
    key (one charge), the naive one charges again. A kill after the acknowledgement
    (``log.append.after``) replays the journaled result."""
    traces = keyed.golden_traces["conv1"]
    assert traces[0] == traces[1], "the golden trace is not reproducible"
    golden = keyed.cases[0].golden.evidence.observation
    assert golden.status == "completed" and [e.node_id for e in golden.log][-1] == "model-6"
    for case in keyed.cases[:2]:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
        assert case.extra("payment") == 0
    # the kill after the acknowledgement: the resume replayed tool-4.0, it did not call
    assert keyed.cases[1].extra("model") == 0

    naive = matrix_cases(ADAPTER, f"{WL}:NAIVE", ["kill@step.after[tool-4.0]#1"])
    case = naive.cases[0]
    assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"}, case.why()
    assert case.extra("payment") == 1


def test_sigterm_runs_the_invocation_to_its_end(keyed: Any) -> None:
    """The SDK installs a SIGTERM handler on the endpoint's loop at its first request
    (``restate.server.install_shutdown_hook``) that only lets finished requests close:
    the worker does not die of SIGTERM, runs the invocation to its end (launching the
    remaining actions), and exits 0. No drain is recorded: ``term.drained`` fails on
    that alone."""
    case = keyed.cases[2]
    assert case.failed == {"term.drained"}, case.why()
    assert "never recorded the SIGTERM" in dict(case.why())["term.drained"]
    assert [(w["role"], w["returncode"], w["signal"]) for w in case.workers] == [("start", 0, None)], \
        "now the worker stops on SIGTERM?"
    assert case.evidence.observation.status == "completed"


def test_input_once_a_resume_needs_no_input(matrix_cases: Any) -> None:
    """``--resume input-once``: the run is acknowledged when the server accepted the
    submission; a resume finds the invocation on the server and submits nothing, so the
    withheld input is never asked for."""
    s = matrix_cases(ADAPTER, f"{WL}:KEYED", ["kill@step.after[tool-4.0]#1/input-once"])
    [case] = s.cases
    assert case.result.outcome == "pass", case.why()
    assert {v.check: v.valid for v in case.result.verdicts}["run.acknowledged_durable"] is True
