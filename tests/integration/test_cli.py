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
    case = data["cases"][5]
    assert set(case) >= {"id", "plan", "outcome", "failed_check", "diff", "workers", "seconds", "replay", "verdicts"}
    assert case["workers"][0]["signal"] == signal.SIGKILL
    replay = subprocess.run([*CLI, "replay", case["id"]], env=cli_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    for check in ("log.clean_prefix", "effects.ledger_equal", "provider.payment.ledger_equal", "model.calls_billed"):
        assert check in replay.stdout
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_failing_case_prints_check_and_replay_command_and_exits_1(cli_env, test_tag, tmp_path) -> None:
    case = "checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1"
    proc = subprocess.run([*CLI, "replay", case, "--subject", "defect:unkeyed-retry"],
                          env=cli_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "provider.payment.ledger_equal" in proc.stdout and "invalid" in proc.stdout
    proc = subprocess.run([*CLI, "run", "--subject", "defect:unkeyed-retry", "--conversation", "conv1", "--kinds", "kill"],
                          env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"replay: crashmatrix replay '{case}' --subject defect:unkeyed-retry" in proc.stdout
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_malformed_case_id_is_exit_2(cli_env, tmp_path) -> None:
    proc = subprocess.run([*CLI, "replay", "checkout/conv1/explode@x[y]#1"], env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "fault kind 'explode'" in proc.stderr
    proc = subprocess.run([*CLI, "replay", "checkout/conv1/kill@tool.request.before[turn-99]#1"],
                          env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "not in the golden trace" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_controller_killed_or_interrupted_leaves_nothing(cli_env, test_tag, tmp_path, sig) -> None:
    out_path = tmp_path / "out.txt"
    out_file = out_path.open("w")
    # output to a file, not a pipe: waiting for a pipe's EOF would also wait for every
    # process that inherited it (the watchdog, while it cleans up)
    # a Ctrl-C in a terminal: the default SIGINT disposition, even when this test runs
    # in a background job (where the shell sets SIGINT to "ignore" for all descendants)
    proc = subprocess.Popen([*CLI, "run", "--conversation", "conv4"], env=cli_env, cwd=tmp_path,
                            stdout=out_file, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # wait until cases are running: the zygote and at least one forked worker exist
    deadline = time.monotonic() + 120

    def forked() -> int:
        n = 0
        for p in tagged_processes(test_tag):
            try:
                n += "crashmatrix.harness.zygote" in " ".join(p.cmdline())
            except psutil.Error:  # a worker that just exited
                pass
        return n

    while time.monotonic() < deadline and forked() < 2:
        time.sleep(0.1)
    time.sleep(0.5)
    assert proc.poll() is None, out_path.read_text()
    running = []
    for p in tagged_processes(test_tag):
        try:
            running.append(" ".join(p.cmdline()[:3]))
        except psutil.Error:
            pass
    assert any("postgres" in c for c in running), running
    proc.send_signal(sig)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"no exit 90 s after signal {sig}; its output:\n{out_path.read_text()[-3000:]}")
    finally:
        out_file.close()
    if sig == signal.SIGINT:
        assert proc.returncode == 130, out_path.read_text()[-2000:]
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
