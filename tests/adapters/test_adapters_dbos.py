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

from crashmatrix.harness.golden import trace_difference  # noqa: E402

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


# -- the adapter's matrices, chosen cases --------------------------------------------------------

SUBJECT = f"{DB}:DBOSSqliteAdapter"
RECORD_AWAIT = "dbos._outcome:Pending._wrap@4"  # the step returned; DBOS records its output
BODY_AWAIT = "dbos._outcome:Pending._wrap@3"    # the step's body is running


def test_sqlite_naive_kill_cancel_term_around_the_charging_step(matrix_cases: Any) -> None:
    s = matrix_cases(SUBJECT, f"{WL}:NAIVE", [
        "kill@tool.request.after[tool-8]#1",
        "kill@log.append.after[tool-8]#1",
        f"kill@{RECORD_AWAIT}[tool-8]#1",
        f"cancel@{BODY_AWAIT}[tool-8]#1",
        "cancel@log.append.after[tool-8]#1",  # fired on DBOS's recording thread
        "term@step.after[tool-8]#1",
        "conv3/kill@step.after[tool-12]#1",
    ], await_points=True, goldens=2)
    inside, recorded, recording, cancel, cancel_in_thread, term, refund = s.cases
    assert inside.failed == {"provider.payment.ledger_equal", "effects.applied_once"} and inside.extra("payment") == 1, (
        "DBOS + naive tool: a kill inside the charging step no longer charges twice: "
        f"{inside.why()}; update docs/findings.md")
    assert recorded.result.outcome == "pass", recorded.why()
    assert recording.extra("payment") == 1, (
        f"DBOS: a kill while the charge step's output is being recorded no longer re-runs the step: {recording.why()}")
    # the step log (operation_outputs) is a clean prefix and the golden run completed
    obs = inside.golden.evidence.observation
    assert obs.status == "completed" and [e.seq for e in obs.log] == list(range(1, 12))
    first, second = s.golden_traces["conv1"]
    # per task and stream: the commit label fires on DBOS's recording thread, beside
    # the workflow's awaits (crashmatrix.harness.golden.Stream)
    assert trace_difference(first, second) is None and (RECORD_AWAIT, "tool-8") in {(e[1], e[2]) for e in first if e[0] == "await"}, (
        "DBOS: the await points of two golden runs now differ or moved; update docs/findings.md")
    # DBOS shields the workflow task from its caller: the cancel ends only the wait, the
    # workflow finishes in the same worker, and no resume is needed
    for c in (cancel, cancel_in_thread):
        assert c.result.outcome == "pass" and [w["role"] for w in c.workers] == ["start"], (
            f"DBOS: a cancelled caller now stops its workflow ({c.result.case.id}: {c.why()}, workers {c.workers}); "
            "update docs/findings.md")
    # no SIGTERM handler: the worker dies as from a kill, in the step, which runs again
    assert term.workers[0]["signal"] == 15 and "term.drained" in term.failed and term.extra("payment") == 1, (
        f"DBOS: SIGTERM no longer ends the worker like a kill: {term.why()}, workers {term.workers}")
    # conv3: the re-run refund step has a fresh key; the provider refuses it and DBOS
    # records the step's error: the workflow ends failed
    assert refund.evidence.observation.status == "failed" and "run.status" in refund.failed, (
        f"DBOS + naive: a repeated refund no longer fails the workflow: {refund.why()}; update docs/findings.md")


def test_sqlite_keyed_kill_inside_the_charging_step_charges_once(matrix_cases: Any) -> None:
    s = matrix_cases(SUBJECT, f"{WL}:KEYED", ["kill@step.after[tool-8]#1", "conv3/kill@step.after[tool-12]#1"])
    for case in s.cases:
        assert case.result.outcome == "pass" and case.extra("payment") == 0, (case.result.case.id, case.why())


def test_postgres_naive_kill_inside_the_charging_step_charges_twice(matrix_cases: Any) -> None:
    [case] = matrix_cases(f"{DB}:DBOSPostgresAdapter", f"{WL}:NAIVE", ["kill@step.after[tool-8]#1"]).cases
    assert "provider.payment.ledger_equal" in case.failed and case.extra("payment") == 1, (
        f"DBOS PostgreSQL + naive: no duplicate charge now: {case.why()}")


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
        # re-enqueued by exec-a's launch; exec-b may have dequeued and finished it before
        # exec-a's next look (seen in CI under load): either way exec-a did not run it
        assert handed_off in ({"status": "ENQUEUED", "executor": "exec-a"},
                              {"status": "SUCCESS", "executor": "exec-b"}), handed_off
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    ran = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert ran == {"status": "SUCCESS", "executor": "exec-b"}, (
        f"DBOS: a recovered workflow was not taken over by another process of its version ({ran}); the "
        "adapter's per-run application version may be unnecessary now; update docs/findings.md")


def test_cancel_workflow_then_resume_workflow_runs_the_step_in_flight_again(matrix_cases: Any) -> None:
    """DBOS's own cancel (``cancel_workflow``, while the charging step's request has been
    answered) and resume (``resume_workflow``): the cancel clears the workflow's owner, so
    the woken worker's write of the step's output is refused (``_check_owner_txn``, dbos
    3.4.0) and the resumed workflow runs the step again; the naive tool charges twice.
    On PostgreSQL: with SQLite the cancel cannot commit while a DBOS background thread of
    the stopped worker (its queue threads poll the store every second) holds the store's
    one lock; the case is then not applicable (the SQLite test below), which under load
    happens at any point."""
    s = matrix_cases(f"{DB}:DBOSPostgresAdapter", f"{WL}:NAIVE", ["cancel-api@tool.request.after[tool-8]#1"])
    [case] = s.cases
    assert case.result.outcome == "fail", (case.result.outcome, case.result.error)
    assert case.extra("payment") == 1 and "provider.payment.ledger_equal" in case.failed, (
        f"now: {case.why()}; DBOS keeps the result of the step in flight when a workflow is cancelled?")
    assert {v.check: v.valid for v in case.result.verdicts}["cancel.step_recorded"] is True  # left to resolve
    assert case.evidence.observation.status == "completed"


def test_a_person_answers_through_set_event_recv_and_send_across_a_crash(matrix_cases: Any) -> None:
    """DBOS's own human-in-the-loop mechanism (scenarios/realworld/dbos_human.py): the
    workflow publishes what it waits for and receives the answer with ``recv``; killed while the
    person considers the second question, the recovered workflow keeps the first answer
    it received and waits for the second (each answer consumed once, by its wait)."""
    s = matrix_cases(SUBJECT, "crashmatrix.scenarios.realworld.dbos_human:KEYED",
                     ["approve/kill@human.wait[human-review-2]#1", "approve/kill@human.answer.after[human-review-1]#1"])
    for case in s.cases:
        assert case.result.outcome == "pass", (case.result.case.id, case.why())
        assert {v.check: v.valid for v in case.result.verdicts}["interrupt.answers"] is True
    golden = s.cases[0].golden.evidence.observation
    assert [m["interrupt"] for m in golden.state["transcript"] if m.get("role") == "human"] == ["review#1", "review#2"]


# -- what a production DBOS deployment declares and does ------------------------------------------


def test_recurring_crash_loop_ends_dead_lettered(matrix_cases: Any) -> None:
    """``--resume recurring``: the same kill in every worker. The checkout workflow
    declares ``max_recovery_attempts=5``; DBOS dead-letters it
    (``MAX_RECOVERY_ATTEMPTS_EXCEEDED``, reported ``needs_human``, the adapter's
    ``crash_loop_status``) after the 6th recovery, well inside the harness's own bound;
    a kill after the step's output was committed is not reached again."""
    from crashmatrix.harness.adapters.dbos import DBOSAdapter, default_max_recovery_attempts, max_recovery_attempts
    from crashmatrix.scenarios.realworld.dbos_checkout import MAX_RECOVERY_ATTEMPTS, checkout

    assert DBOSAdapter.crash_loop_status == "needs_human"
    assert max_recovery_attempts(checkout) == MAX_RECOVERY_ATTEMPTS == 5
    assert default_max_recovery_attempts() == 100, "DBOS's default max_recovery_attempts changed: update docs/findings.md"
    s = matrix_cases(SUBJECT, f"{WL}:KEYED", ["kill@step.after[tool-4]#1/recurring",
                                              "kill@log.append.after[tool-4]#1/recurring"])
    looped, committed = s.cases
    for case in s.cases:
        assert case.result.outcome == "pass", case.why()
    bounded = {v.check: v.details for v in looped.result.verdicts}["recurring.bounded"]
    assert "gave up after 7 worker(s): needs_human" in bounded, bounded
    assert looped.evidence.observation.status == "needs_human"
    assert "point was not reached again" in {v.check: v.details for v in committed.result.verdicts}["recurring.bounded"]


def test_queued_checkout_recovers_through_its_queue(matrix_cases: Any) -> None:
    """The checkout enqueued on a DBOS queue (``QUEUED_KEYED``, PostgreSQL): killed with
    the workflow dequeued and running, launch-time recovery puts it back on its queue
    and the next worker of the run's version dequeues it; it ends as the golden run."""
    s = matrix_cases(f"{DB}:DBOSPostgresAdapter", f"{WL}:QUEUED_KEYED",
                     ["kill@step.after[tool-4]#1", "kill@model.call.before[model-1]#1"])
    for case in s.cases:
        assert case.result.outcome == "pass", case.why()
        assert case.evidence.observation.status == "completed"


def test_a_build_with_other_workflow_code_leaves_the_run_pending(tmp_path: Path) -> None:
    """The application version follows the build (DBOS's hash of the workflow source):
    a run killed under build A and resumed under a build B whose workflow code differs
    stays ``PENDING`` (DBOS recovers a workflow only in a process of its version), and
    ``upgrade.migrated`` says so; the same code in both builds finishes it."""
    import shutil

    import crashmatrix.harness

    src = Path(crashmatrix.harness.__file__).parent.parent  # the package's source tree
    tree = tmp_path / "buildB" / "crashmatrix"
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns(".venv", ".git", "tests", "benchmarks", "docs",
                                                             "*.egg-info", "__pycache__"))
    wl = tree / "scenarios" / "realworld" / "dbos_checkout.py"
    code = wl.read_text()
    marker = '    messages = list(run_input["messages"])\n'
    assert marker in code
    wl.write_text(code.replace(marker, marker.rstrip("\n") + "  # build B\n", 1))
    case = f"{WL}:KEYED/conv1/kill@step.after[tool-4]#1/upgrade:A>B"
    a = f"A={DB}:DBOSPostgresAdapter"
    cli = [sys.executable, "-m", "crashmatrix.harness.cli", "replay", case, "--subject", a]
    changed = subprocess.run([*cli, "--resume-with", f"B={DB}:DBOSPostgresAdapter@{tree.parent}"],
                             capture_output=True, text=True, timeout=300)
    assert changed.returncode == 1, changed.stdout[-3000:] + changed.stderr[-3000:]
    assert "ended 'pending' under B" in changed.stdout, changed.stdout[-3000:]
    same = subprocess.run([*cli, "--resume-with", f"B={DB}:DBOSPostgresAdapter"], capture_output=True, text=True,
                          timeout=300)
    assert same.returncode == 0 and "finished under B: completed" in same.stdout, same.stdout[-3000:]


def test_input_once_the_workflow_row_holds_the_input(matrix_cases: Any) -> None:
    """The run is acknowledged once ``start_workflow_async`` returned (the workflow row
    and its input are committed); a resume reads the status first and needs the input
    only when there is no row (``--resume input-once``)."""
    s = matrix_cases(SUBJECT, f"{WL}:KEYED", ["kill@step.after[tool-4]#1/input-once",
                                              "kill@run.accepted[run]#1/input-once"])
    for case in s.cases:
        assert case.result.outcome == "pass", case.why()
        assert {v.check: v.valid for v in case.result.verdicts}["run.acknowledged_durable"] is True


def test_the_build_version_is_the_same_before_and_after_dbos_is_made(tmp_path: Path) -> None:
    """The application version goes into ``DBOS(config)``, so it must not change once
    DBOS is made: dbos 2.x registers internal workflows then, and its own
    ``compute_app_version`` changes with them; :func:`build_version` hashes the
    application's workflows only."""
    code = textwrap.dedent(f'''
        import crashmatrix.scenarios.realworld.dbos_checkout
        from crashmatrix.harness.adapters.dbos import APP_NAME, build_version
        from dbos import DBOS
        before = build_version()
        DBOS(config={{"name": APP_NAME, "system_database_url": "sqlite:///{tmp_path / 'sys.sqlite'}",
                      "log_level": "ERROR"}})
        print(before == build_version(), len(before))
        DBOS.destroy()
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["True", "12"], out.stdout + out.stderr[-2000:]


def test_another_executor_recovers_the_dead_one_s_runs_and_recoverers_meet_inside_the_sweep(matrix_cases: Any) -> None:
    """``--resume other-executor``: a live DBOS process with another executor id runs
    ``_recover_pending_workflows([the dead executor])`` and the run ends there, direct or
    queued. ``--resume concurrent``: both recoverers passed the recovery point (DBOS's
    pending list read) and met there before either acted on it."""
    s = matrix_cases(SUBJECT, f"{WL}:QUEUED_KEYED", ["kill@step.after[model-1]#1/other-executor",
                                                     "kill@step.after[model-1]#1/concurrent"])
    other, concurrent = s.cases
    assert other.result.outcome == "pass", other.why()
    assert [w["role"] for w in other.result.workers] == ["start", "recover-other"]
    assert {v.check: v.valid for v in other.result.verdicts}["other_executor.recovered"] is True
    met = [w.get("met_at") for w in concurrent.result.workers if w["role"] == "resume"]
    assert met == ["recovery.listed[recovery]"] * 2, concurrent.result.workers
    assert concurrent.result.outcome == "pass", concurrent.why()


def test_a_db_outage_at_the_recovery_point_is_ridden_out(matrix_cases: Any) -> None:
    """A db-outage placed at the recovery point of the resuming worker (PostgreSQL):
    the outage begins between DBOS's pending list and the re-enqueue; this release
    retries both, the adapter's own reads ride the outage, and the run ends as the
    golden run."""
    s = matrix_cases(f"{DB}:DBOSPostgresAdapter", f"{WL}:QUEUED_KEYED",
                     ["kill@step.after[model-1]#1+db-outage(1500ms)@recovery.listed[recovery]#1"])
    [case] = s.cases
    assert case.result.outcome == "pass", case.why()
    assert "healed" in case.result.workers[1].get("outage", ""), case.result.workers


def test_dbos_launched_on_the_loop_runs_a_workflow_under_a_timeout_and_children(matrix_cases: Any) -> None:
    """``DBOSSqliteLoopAdapter`` launches and destroys DBOS on the worker's event loop
    (DBOS adopts it): the timed checkout (``SetWorkflowTimeout``) and the checkout with
    child workflows both survive a kill and end as their golden runs."""
    timed = matrix_cases(f"{DB}:DBOSSqliteLoopAdapter", f"{WL}:TIMED_KEYED", ["kill@step.after[tool-2]#1"])
    children = matrix_cases(SUBJECT, f"{WL}:CHILD_KEYED", ["kill@tool.request.after[child_tool-2.1]#1",
                                                           "kill@step.before[model-4]#1"])
    for case in [*timed.cases, *children.cases]:
        assert case.result.outcome == "pass", case.why()
        assert case.evidence.observation.status == "completed"
    nodes = [e.node_id for e in children.cases[1].evidence.observation.log]
    assert nodes[:4] == ["model-1", "crashmatrix_tool_child-2", "child_tool-2.1", "DBOS.getResult-3"], nodes


def test_a_cancel_the_stopped_worker_s_sqlite_lock_blocks_is_not_applicable(matrix_cases: Any) -> None:
    """cancel-api stopped inside the write of a step's output (the await point DBOS's
    ``Pending._wrap`` passes there): the worker holds SQLite's one lock, so neither the
    status read nor the cancel can go through; the case is not applicable, saying so,
    and nothing is left stopped."""
    s = matrix_cases(SUBJECT, f"{WL}:KEYED", ["cancel-api@dbos._outcome:Pending._wrap@4[tool-8]#1"], await_points=True)
    [case] = s.cases
    # whether the stopped worker holds the lock at that await point depends on where its
    # thread is when it stops: held, the case is not applicable, naming the lock; not
    # held, the cancel lands and the case is judged. Never a harness error, never a hang.
    assert case.result.outcome in ("not-applicable", "pass"), (case.result.outcome, case.result.error)
    if case.result.outcome == "not-applicable":
        assert "one write lock" in (case.result.error or ""), case.result.error
