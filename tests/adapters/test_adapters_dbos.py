"""DBOS Transact as a subject: its recovery rules and the behaviour the kill matrix
found (docs/findings.md), pinned for the installed version (measured on dbos 3.4.0).

A failure whose message says "now" means DBOS changed: re-run the findings script
(``python -m crashmatrix.scenarios.realworld.findings --only dbos``) and update
docs/findings.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dbos", reason="DBOS adapter tests need the extra: pip install 'crashmatrix[dbos]'")

DB = "crashmatrix.harness.adapters.dbos"
WL = "crashmatrix.scenarios.realworld.dbos_checkout"

# -- DBOS's recovery rules, on a bare DBOS app in subprocesses -----------------------------------

APP = textwrap.dedent('''
    import json, os, sys, time
    from dbos import DBOS, SetWorkflowID

    url, executor, version, mode, gate = sys.argv[1:6]
    wid = sys.argv[6] if len(sys.argv) > 6 else "wf-1"

    @DBOS.step()
    def wait_for_gate() -> str:
        print("IN_STEP", flush=True)
        while not os.path.exists(gate):
            time.sleep(0.02)
        return "stepped"

    @DBOS.workflow()
    def wf() -> str:
        return wait_for_gate()

    def status() -> dict:
        s = DBOS.get_workflow_status(wid)
        return {"status": s.status, "executor": s.executor_id}

    DBOS(config={"name": "facts", "system_database_url": url, "executor_id": executor,
                 "application_version": version, "log_level": "ERROR"})
    if mode == "reenqueue":
        # this process must not serve the queue itself before it leaves (its poller's
        # first look comes ~1 s after launch; on a loaded machine that raced the exit)
        from dbos._dbos import _get_or_create_dbos_registry
        _get_or_create_dbos_registry().get_internal_queue()._polling_interval_sec = 600
    DBOS.launch()
    if mode == "start":
        with SetWorkflowID(wid):
            DBOS.start_workflow(wf)
        time.sleep(60)  # SIGKILLed by the test while inside the step
    elif mode == "idle":
        time.sleep(2.5)  # launch-time recovery (and the internal queue, polled every 1 s) had its chance
        print(json.dumps(status()), flush=True)
    elif mode == "start_again":
        with SetWorkflowID(wid):
            DBOS.start_workflow(wf)
        time.sleep(2.5)
        print(json.dumps(status()), flush=True)
    elif mode == "recover":
        result = DBOS.retrieve_workflow(wid).get_result(polling_interval_sec=0.05)
        print(json.dumps({**status(), "result": result}), flush=True)
    elif mode == "reenqueue":  # launch recovered it onto the internal queue; leave at once
        while status()["status"] == "PENDING":
            time.sleep(0.005)
        print(json.dumps(status()), flush=True)
    elif mode == "serve":  # another process of the same application and version
        print("SERVING", flush=True)
        deadline = time.time() + 8
        while status()["status"] != "SUCCESS" and time.time() < deadline:
            time.sleep(0.05)
        print(json.dumps(status()), flush=True)
    os._exit(0)
''')


def _run(app: Path, url: str, executor: str, version: str, mode: str, gate: Path, wid: str = "wf-1",
         timeout: float = 30) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(app), url, executor, version, mode, str(gate), wid],
                         capture_output=True, text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, f"{mode} under {executor}/{version} failed: {out.stderr[-2000:]}"
    return json.loads(lines[-1])


def _start_and_kill(app: Path, url: str, gate: Path, wid: str) -> None:
    """Start workflow ``wid`` under executor ``exec-a``/``v1``; SIGKILL it inside its step."""
    proc = subprocess.Popen([sys.executable, str(app), url, "exec-a", "v1", "start", str(gate), wid],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while proc.stdout.readline().strip() != "IN_STEP":
            assert time.monotonic() < deadline and proc.poll() is None, "the workflow never reached its step"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    gate.touch()  # from now on the step finishes as soon as anybody runs it


def test_recovery_needs_the_same_executor_id_and_version_and_a_restart_only_attaches(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    url = f"sqlite:///{tmp_path / 'sys.sqlite'}"
    gate = tmp_path / "gate"
    _start_and_kill(app, url, gate, "wf-1")

    other_executor = _run(app, url, "exec-b", "v1", "idle", gate)
    assert other_executor == {"status": "PENDING", "executor": "exec-a"}, (
        f"DBOS now recovers another executor's workflow on launch: {other_executor}; update docs/findings.md")
    other_version = _run(app, url, "exec-a", "v2", "idle", gate)
    assert other_version["status"] == "PENDING", (
        f"DBOS now recovers a workflow of another application version on launch: {other_version}")
    attached = _run(app, url, "exec-b", "v1", "start_again", gate)
    assert attached == {"status": "PENDING", "executor": "exec-a"}, (
        f"DBOS: starting a PENDING workflow again with its id under a new executor now runs it: {attached}; "
        "the adapter's resume could start it instead of relaunching the old executor id; update docs/findings.md")
    recovered = _run(app, url, "exec-a", "v1", "recover", gate)
    assert recovered["status"] == "SUCCESS" and recovered["result"] == "stepped", recovered


# -- the adapter's kill matrix, chosen cases ------------------------------------------------------


def run_cases(subject: str, workload: str, ids: list[str]) -> list[tuple[Any, Any, Any]]:
    from crashmatrix.harness.plan import Case
    from crashmatrix.harness.session import open_session

    async def main() -> list[tuple[Any, Any, Any]]:
        async with open_session(f"{DB}:{subject}", f"{WL}:{workload}") as explorer:
            golden = await explorer.golden("conv1")
            out = []
            for case_id in ids:
                result = await explorer.run_case(Case.parse(f"{WL}:{workload}/conv1/{case_id}"), golden)
                assert result.outcome != "harness-error", f"{case_id}: {result.error}"
                out.append((result, await explorer.evidence(result.run_id), golden))
            return out

    return asyncio.run(main())


def _extra(evidence: Any, golden: Any, kind: str) -> int:
    return len(evidence.ledgers[kind]) - len(golden.evidence.ledgers[kind])


def test_sqlite_naive_kill_inside_the_charging_step_charges_twice() -> None:
    out = run_cases("DBOSSqliteAdapter", "NAIVE", ["kill@tool.request.after[tool-8]#1", "kill@log.append.after[tool-8]#1"])
    (inside, ev1, golden), (recorded, ev2, _) = out
    assert {v.check for v in inside.failed} == {"provider.payment.ledger_equal"} and _extra(ev1, golden, "payment") == 1, (
        "DBOS + naive tool: a kill inside the charging step no longer charges twice: "
        f"{[(v.check, v.details) for v in inside.failed]}; update docs/findings.md")
    assert recorded.outcome == "pass", [(v.check, v.details) for v in recorded.failed]
    # the step log (operation_outputs) is a clean prefix and the golden run completed
    obs = golden.evidence.observation
    assert obs.status == "completed" and [e.seq for e in obs.log] == list(range(1, 12))


def test_sqlite_keyed_kill_inside_the_charging_step_charges_once() -> None:
    [(result, evidence, golden)] = run_cases("DBOSSqliteAdapter", "KEYED", ["kill@step.after[tool-8]#1"])
    assert result.outcome == "pass" and _extra(evidence, golden, "payment") == 0, (
        [(v.check, v.details) for v in result.failed])


def test_postgres_naive_kill_inside_the_charging_step_charges_twice() -> None:
    [(result, evidence, golden)] = run_cases("DBOSPostgresAdapter", "NAIVE", ["kill@step.after[tool-8]#1"])
    assert "provider.payment.ledger_equal" in {v.check for v in result.failed} and _extra(evidence, golden, "payment") == 1, (
        f"DBOS PostgreSQL + naive: no duplicate charge now: {[(v.check, v.details) for v in result.failed]}")


def test_app_is_importable_without_starting_anything() -> None:
    """Importing the workload registers the workflow; it must not start DBOS (the
    worker zygote forks after importing it and needs one thread, no connection)."""
    code = ("import threading, crashmatrix.scenarios.realworld.dbos_checkout as m, crashmatrix.harness.adapters.dbos as a;"
            "import dbos._dbos as d; assert d._dbos_global_instance is None; print(threading.active_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONHASHSEED": "0"})
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]


def test_a_recovered_workflow_runs_wherever_the_internal_queue_is_served(tmp_path: Path) -> None:
    """Launch-time recovery re-enqueues the dead executor's workflow on DBOS's internal
    queue; any live process of the same application name and version may dequeue and run
    it (and becomes its executor). This is why the adapter pins one version per run."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    url = f"sqlite:///{tmp_path / 'sys.sqlite'}"
    gate = tmp_path / "gate"
    _start_and_kill(app, url, gate, "wf-2")
    server = subprocess.Popen([sys.executable, str(app), url, "exec-b", "v1", "serve", str(gate), "wf-2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "SERVING"
        handed_off = _run(app, url, "exec-a", "v1", "reenqueue", gate, "wf-2")
        assert handed_off == {"status": "ENQUEUED", "executor": "exec-a"}, handed_off
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    ran = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert ran == {"status": "SUCCESS", "executor": "exec-b"}, (
        f"DBOS: a recovered workflow was not taken over by another process of its version ({ran}); the "
        "adapter's per-run application version may be unnecessary now; update docs/findings.md")
