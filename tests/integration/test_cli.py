"""The command line as a user meets it: exit codes, one-line errors, replay, reports,
and no process, port or data directory left behind, pass, fail, Ctrl-C or SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def tagged_processes(tag: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("CRASHMATRIX_TEST_TAG") == tag:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _leftovers(tag: str, tmp_path: Path, timeout: float = 15.0) -> tuple[list[str], list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        procs = []
        for p in tagged_processes(tag):
            try:
                procs.append(" ".join(p.cmdline()[:4]))
            except psutil.Error:
                pass
        dirs = [str(p) for p in tmp_path.glob("crashmatrix-*")]  # out.txt is ours
        if (not procs and not dirs) or time.monotonic() > deadline:
            return procs, dirs
        time.sleep(0.2)


def test_unknown_workload_is_one_line_and_exit_2(cli_env, test_tag, tmp_path) -> None:
    proc = subprocess.run([*CLI, "run", "nosuch"], env=cli_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "workload='nosuch' is not registered" in lines[0], proc.stderr
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_unreachable_dsn_is_one_line_and_exit_2(cli_env, test_tag, tmp_path) -> None:
    dsn = "postgresql://alice:s3cret@127.0.0.1:1/nowhere"
    proc = subprocess.run([*CLI, "run", "--dsn", dsn], env=cli_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = [l for l in proc.stderr.strip().splitlines() if l.startswith("crashmatrix: error")]
    assert len(err) == 1 and "cannot reach PostgreSQL" in err[0], proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout
    assert proc.stdout.splitlines() == ["crashmatrix: starting services for checkout on reference ..."], proc.stdout
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_run_writes_report_and_replay_reproduces_a_case(cli_env, test_tag, tmp_path) -> None:
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [*CLI, "run", "checkout", "--conversation", "conv1", "--kinds", "kill", "--sources", "step", "--report", str(report)],
        env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cases/s" in proc.stdout and "passed" in proc.stdout
    data = json.loads(report.read_text())
    assert data["summary"]["fail"] == 0 and data["summary"]["cases"] == len(data["cases"]) >= 22
    # the step boundaries pruned by crash state: the claim is printed and the groups reported
    pruning = data["pruning"]
    assert f"kill: {len(data['cases'])} points -> {pruning['crash_states']} crash states, all pass" in proc.stdout
    assert pruning["crash_states"] < len(data["cases"]) and pruning["pruned"]
    case = next(c for c in data["cases"][5:] if c["workers"])  # a representative: it ran
    assert set(case) >= {"id", "plan", "outcome", "failed_check", "diff", "workers", "seconds", "replay", "verdicts"}
    assert case["workers"][0]["signal"] == signal.SIGKILL
    replay = subprocess.run([*CLI, "replay", case["id"]], env=cli_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    for check in ("log.clean_prefix", "effects.ledger_equal", "provider.payment.ledger_equal", "model.calls_billed"):
        assert check in replay.stdout
    # the same point resumed by two resumers at once: each worker line says so
    replay = subprocess.run([*CLI, "replay", case["id"] + "/concurrent"], env=cli_env, capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.count("; one of 2 resumers at once") == 2, replay.stdout
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_failing_case_prints_check_and_replay_command_and_exits_1(cli_env, test_tag, tmp_path) -> None:
    case = "checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1"
    proc = subprocess.run([*CLI, "replay", case, "--subject", "defect:unkeyed-retry"],
                          env=cli_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "provider.payment.ledger_equal" in proc.stdout and "invalid" in proc.stdout
    proc = subprocess.run([*CLI, "run", "--subject", "defect:unkeyed-retry", "--conversation", "conv1", "--kinds", "kill",
                           "--report", "r.json"], env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"replay: crashmatrix replay '{case}' --subject defect:unkeyed-retry" in proc.stdout
    # a deterministic defect: every failing case was replayed once (the default) and
    # failed again, so none is flaky and each says it was reproduced
    data = json.loads((tmp_path / "r.json").read_text())
    # failed again, so none is flaky and each says it was reproduced; a case pruned into
    # its representative's crash state (``representative``) is judged, not run, so not
    # replayed either
    failing = [c for c in data["cases"] if c["outcome"] != "pass"]
    ran = [c for c in failing if "representative" not in c]
    assert ran and data["summary"]["flaky"] == 0 and data["replay_failures"] == 1
    assert all(c["outcome"] == "fail" and c["outcomes"] == ["fail", "fail"] for c in ran), [
        (c["id"], c["outcomes"]) for c in ran]
    assert all(c["outcome"] == "fail" and c["outcomes"] == ["fail"] for c in failing if c not in ran)
    assert all(c["replays"][0]["failed_check"] and c["replays"][0]["run_id"] != c["run_id"] for c in ran)
    assert all(c["outcomes"] == ["pass"] and c["replays"] == [] for c in data["cases"] if c["outcome"] == "pass")
    assert "reproduced: failed on the first run and on 1 replay(s)" in proc.stdout and "FLAKY" not in proc.stdout
    kept = [c for c in data["cases"] if c.get("artifacts")]
    assert kept and f"plans of {len(kept)} case(s) that did not pass: r-failed/" in proc.stdout  # the folder named
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_a_bad_progress_interval_is_one_line_and_exit_2(cli_env, tmp_path) -> None:
    proc = subprocess.run([*CLI, "run", "--conversation", "conv1"], env=dict(cli_env, CRASHMATRIX_PROGRESS_S="soon"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = [l for l in proc.stderr.strip().splitlines() if l.startswith("crashmatrix: error")]
    assert len(err) == 1 and "CRASHMATRIX_PROGRESS_S='soon'" in err[0], proc.stderr
    assert "starting services" not in proc.stdout


def test_a_bad_plan_file_is_named_in_its_one_line(cli_env, tmp_path) -> None:
    (tmp_path / "plan.json").write_text('{"faults": [')
    proc = subprocess.run([*CLI, "run", "--plan", "plan.json", "--conversation", "conv1"], env=cli_env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "crashmatrix: error: --plan plan.json: plan is not valid JSON: Expecting value: line 1 column 13 (char 12)"]


def test_malformed_case_id_is_exit_2(cli_env, tmp_path) -> None:
    proc = subprocess.run([*CLI, "replay", "checkout/conv1/explode@x[y]#1"], env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "fault kind 'explode'" in proc.stderr
    proc = subprocess.run([*CLI, "replay", "checkout/conv1/kill@tool.request.before[turn-99]#1"],
                          env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "not in the golden trace" in proc.stderr


_CASES_SEEN: set[Path] = set()


def _cases_started(tmp_path: Path) -> int:
    """Case directories (``workers/cm-run-*``) of the session under ``tmp_path`` seen so
    far by any call: one per case that ran workers. A case's directory exists from its
    start to its end (a passing one is removed then), so the count is cumulative; a
    worker's event file, by contrast, holds ``"fired"`` only from the fault to the case's
    end, which a pruned case that takes a shared resume passes through in milliseconds."""
    # os.walk, not Path.glob: glob raises when a directory it is scanning is removed
    # under it (a case ending); walk skips what vanished
    for root, dirs, _files in os.walk(tmp_path):
        if Path(root).name == "workers":
            _CASES_SEEN.update(Path(root, d) for d in dirs if d.startswith("cm-run-"))
    return sum(1 for p in _CASES_SEEN if p.is_relative_to(tmp_path))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_controller_killed_or_interrupted_leaves_nothing(cli_env, test_tag, tmp_path, sig) -> None:
    """SIGKILL: the watchdog cleans up. SIGINT (Ctrl-C) and SIGTERM: the controller
    cancels the cases in flight, reaps every child, stops its services, writes the
    cases that finished to --report and --html marked incomplete, and exits 128 + the
    signal."""
    out_path = tmp_path / "out.txt"
    out_file = out_path.open("w")
    # output to a file, not a pipe: waiting for a pipe's EOF would also wait for every
    # process that inherited it (the watchdog, while it cleans up)
    # a Ctrl-C in a terminal: the default SIGINT disposition, even when this test runs
    # in a background job (where the shell sets SIGINT to "ignore" for all descendants)
    # one case at a time: once a second case has started, the first case has finished
    proc = subprocess.Popen([*CLI, "run", "--conversation", "conv4", "--jobs", "1", "--report", "partial.json",
                             "--html", "partial.html"], env=cli_env, cwd=tmp_path,
                            stdout=out_file, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and _cases_started(tmp_path) < 2 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, out_path.read_text()
    assert _cases_started(tmp_path) >= 2, out_path.read_text()[-2000:]
    running = []
    for p in tagged_processes(test_tag):
        try:
            running.append(" ".join(p.cmdline()[:4]))
        except psutil.Error:
            pass
    assert any("postgres" in c for c in running), running
    assert any("crashmatrix.harness.zygote" in c for c in running), running
    proc.send_signal(sig)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"no exit 90 s after signal {sig}; its output:\n{out_path.read_text()[-3000:]}")
    finally:
        out_file.close()
    output = out_path.read_text()
    if sig != signal.SIGKILL:
        assert proc.returncode == 128 + sig, output[-2000:]
        name = "SIGINT" if sig == signal.SIGINT else "SIGTERM"
        data = json.loads((tmp_path / "partial.json").read_text())
        assert data["complete"] is False and name in data["reason"], data.get("reason")
        assert data["summary"]["setup_seconds"] > 0, data["summary"]  # services and golden runs took time
        cases = data["cases"]
        assert 1 <= len(cases) < data["planned"] and data["summary"]["cases"] == len(cases), (len(cases), data["planned"])
        # each case ran workers, or was pruned into a representative that did
        assert all(c["outcome"] == "pass" and (c["workers"] or c.get("representative")) for c in cases), [
            (c["id"], c["outcome"]) for c in cases]
        page = (tmp_path / "partial.html").read_text()
        assert f"incomplete: {data['reason']}; {len(cases)} of {data['planned']} case(s) ran" in page
        assert f"incomplete: {data['reason']}" in output and "services stopped" in output
    procs, dirs = _leftovers(test_tag, tmp_path, timeout=40)
    assert procs == [] and dirs == [], (procs, dirs)


def test_unreachable_fault_proxy_is_one_line_and_exit_2(cli_env, test_tag, tmp_path) -> None:
    env = dict(cli_env, TOXIPROXY_URL="http://127.0.0.1:1")
    proc = subprocess.run([*CLI, "run", "--kinds", "net", "--conversation", "conv1"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = [l for l in proc.stderr.strip().splitlines() if l.startswith("crashmatrix: error")]
    assert len(err) == 1 and "fault proxy" in err[0] and "127.0.0.1:1" in err[0], proc.stderr
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_the_default_runs_checkout_then_support_desk_each_with_its_report(cli_env, tmp_path) -> None:
    """No workload named: checkout, then support_desk, one summary and one report
    each (``r.json``, ``r-support_desk.json``); a shard keeps it cheap."""
    proc = subprocess.run([*CLI, "run", "--kinds", "kill", "--shard", "1/60", "--report", "r.json"],
                          env=dict(cli_env, CRASHMATRIX_PROGRESS_S="0"),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # not a terminal: progress as lines (every CRASHMATRIX_PROGRESS_S seconds; 0: each case)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("crashmatrix: checkout: ")]
    assert lines and all(" cases, 0 failed, " in l for l in lines), proc.stdout[-2000:]
    assert "starting services for checkout" in proc.stdout and "starting services for support_desk" in proc.stdout
    first, second = (json.loads((tmp_path / name).read_text()) for name in ("r.json", "r-support_desk.json"))
    assert first["workload"] == "checkout" and second["workload"] == "support_desk"
    assert first["summary"]["cases"] >= 1 and second["summary"]["cases"] >= 1
    assert {c["id"].split("/")[0] for c in second["cases"]} == {"support_desk"}
    n1, n2 = first["summary"]["cases"], second["summary"]["cases"]
    assert proc.stdout.strip().splitlines()[-1] == (f"crashmatrix: checkout passed ({n1} cases, {n1} passed); "
                                                    f"support_desk passed ({n2} cases, {n2} passed): exit 0"), proc.stdout[-500:]


def test_db_restart_cases_print_no_traceback(cli_env, tmp_path) -> None:
    """A restarted PostgreSQL is the fault, not an error: nothing on stderr looks like a
    crash of the harness (asyncpg's pools used to log "Failed to restore the pool
    connection floor" with a traceback for every restart)."""
    proc = subprocess.run([*CLI, "run", "--conversation", "conv1", "--kinds", "db-restart", "--shard", "1/9"],
                          env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "db-restart" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr[-3000:]
