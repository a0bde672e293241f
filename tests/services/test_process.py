"""The process toolkit on real processes: environment, ready lines, process groups, stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crashmatrix.harness.services import process
from crashmatrix.harness.services.process import NotReady


def _py(code: str) -> list[str]:
    return [sys.executable, "-P", "-c", code]


def test_child_env_makes_relative_pythonpath_entries_absolute_against_the_users_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "lib", "/opt/abs", ""]))
    monkeypatch.chdir(tmp_path)
    env = process.child_env({"EXTRA": "1"})
    assert env["EXTRA"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(tmp_path / "lib"), "/opt/abs", str(tmp_path)]
    # an extra PYTHONPATH is resolved the same way, against ``origin`` when given
    assert process.child_env({"PYTHONPATH": "src"}, origin="/work")["PYTHONPATH"] == "/work/src"
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in process.child_env()


def test_spawned_children_lead_their_own_group_and_their_first_lines_are_read_together(tmp_path: Path) -> None:
    registered: list[int] = []
    code = "import sys, time; time.sleep({}); print('READY', {}, flush=True); sys.stdout.write('more'); time.sleep(30)"
    procs = {name: process.spawn(_py(code.format(delay, n)), stderr_path=tmp_path / f"{name}.err",
                                 register_pgid=registered.append)
             for name, delay, n in (("a", 0.3, 1), ("b", 0.0, 2))}
    try:
        assert sorted(registered) == sorted(p.pid for p in procs.values())
        assert all(os.getpgid(p.pid) == p.pid for p in procs.values())
        assert process.first_lines(procs, 20) == {"a": "READY 1", "b": "READY 2"}
    finally:
        process.stop_process_groups(procs, 2.0)
    assert [p.returncode for p in procs.values()] == [-signal.SIGTERM] * 2


def test_not_ready_names_the_child_that_exited_or_timed_out(tmp_path: Path) -> None:
    err = tmp_path / "dead.err"
    dead = process.spawn(_py("import sys; sys.stderr.write('boom: no config\\n'); sys.stdout.write('half'); sys.exit(3)"),
                         stderr_path=err)
    slow = process.spawn(_py("import time; time.sleep(30)"), stderr_path=tmp_path / "slow.err")
    try:
        with pytest.raises(NotReady) as exited:
            process.first_lines({"slow": slow, "dead": dead}, 20)
        assert (exited.value.name, exited.value.why, exited.value.returncode) == ("dead", "exited", 3)
        assert exited.value.pending == ["dead", "slow"]
        assert process.stderr_tail(err) == "boom: no config"
        with pytest.raises(NotReady) as late:
            process.first_lines({"slow": slow}, 0.2)
        assert (late.value.name, late.value.why, late.value.returncode) == ("slow", "timeout", None)
    finally:
        process.stop_process_groups({"dead": dead, "slow": slow}, 1.0)


def _child_ignoring_sigterm_with_a_grandchild(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A spawned child that ignores SIGTERM and has a child of its own (its pid in the
    returned file once the child printed its first line)."""
    pidfile = tmp_path / "grandchild"
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n")
    child = process.spawn(_py(code), stderr_path=tmp_path / "err")
    return child, pidfile


def test_stop_sigkills_a_child_that_ignores_sigterm_and_whatever_its_group_still_holds(tmp_path: Path) -> None:
    child, pidfile = _child_ignoring_sigterm_with_a_grandchild(tmp_path)
    assert process.first_lines({"c": child}, 20) == {"c": "up"}
    grandchild = int(pidfile.read_text())
    t0 = time.monotonic()
    process.stop_process_groups([child], 0.3)
    assert child.returncode == -signal.SIGKILL and time.monotonic() - t0 >= 0.3
    assert process.wait_gone([grandchild], 5.0)  # the rest of the group went too (reaped by init)
    process.stop_process_groups([child], 0.3)  # idempotent
    assert child.stdout is not None and child.stdout.closed


def test_kill_group_stops_a_group_it_cannot_reap(tmp_path: Path) -> None:
    child = process.spawn(_py("print('up', flush=True); import time; time.sleep(60)"), stderr_path=tmp_path / "err")
    try:
        process.first_lines({"c": child}, 20)
        assert process.group_alive(child.pid) and process.pid_alive(child.pid)
        process.kill_group(child.pid, 2.0)
        assert not process.group_alive(child.pid)  # a zombie, not reaped yet, is not alive
        assert not process.pid_alive(child.pid)
    finally:
        process.stop_process_groups([child], 0.5)
    assert child.returncode == -signal.SIGTERM
    assert not process.signal_group(child.pid, signal.SIGKILL)  # reaped: no such group any more


def test_sigkill_group_kills_the_leader_and_its_group_at_once_and_skips_what_is_gone(tmp_path: Path) -> None:
    child, pidfile = _child_ignoring_sigterm_with_a_grandchild(tmp_path)
    try:
        assert process.first_lines({"c": child}, 20) == {"c": "up"}
        grandchild = int(pidfile.read_text())
        process.sigkill_group(child.pid)
        assert child.wait(5) == -signal.SIGKILL
        assert process.wait_gone([grandchild], 5.0)
        process.sigkill_group(child.pid)  # reaped, group gone: skipped, no error
    finally:
        process.stop_process_groups([child], 0.5)


def test_stderr_tail_and_run(tmp_path: Path) -> None:
    big = tmp_path / "big.err"
    big.write_text("x" * 5000 + "\nthe last line\n")
    assert process.stderr_tail(big, limit=20) == "x" * 5 + "\nthe last line"  # 20 bytes, stripped
    (tmp_path / "empty.err").write_text("")
    assert process.stderr_tail(tmp_path / "empty.err") == "(stderr empty)"
    assert process.stderr_tail(tmp_path / "missing.err").startswith("(stderr unreadable:")
    done = process.run(_py("import os, sys; print(os.environ['LC_ALL']); sys.stderr.write('e'); sys.exit(4)"),
                       timeout=20, env={"LC_ALL": "C"})
    assert (done.returncode, done.stdout) == (4, "C\ne")
    late = process.run(_py("import time; time.sleep(30)"), timeout=0.3)
    assert late.returncode == -1 and late.stderr == "timed out after 0.3 s"
    with pytest.raises(OSError):
        process.run(["/nonexistent/program"], timeout=5)
    with pytest.raises(OSError):
        process.spawn(["/nonexistent/program"])
