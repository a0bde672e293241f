"""The watchdog process, with real processes and a real embedded PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.services.postgres import DSN_ENV
from crashmatrix.harness.services.watchdog import Watchdog


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def eventually(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


CONTROLLER = """
import json, os, sys, time
from pathlib import Path
from crashmatrix.harness.services.watchdog import Watchdog
from crashmatrix.harness.services.postgres import start_postgres
wd = Watchdog.start()
pg = start_postgres(Path(sys.argv[1]), watchdog=wd)
print(json.dumps({"base": str(pg.base_dir), "processes": pg.processes,
                  "watchdog": wd.pid, "pid": os.getpid()}), flush=True)
time.sleep(60)
"""


def test_sigkilled_controller_leaves_nothing(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp_path)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert controller.stdout is not None
        info = json.loads(controller.stdout.readline())
        base = Path(info["base"])
        assert base.is_dir() and len(info["processes"]) > 1
        # the postmaster lives; a child listed may be a backend that was just ending (the
        # start's own connections), so not every listed child need still be alive
        assert pid_alive(info["processes"][0]) and any(pid_alive(p) for p in info["processes"][1:])
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        assert eventually(lambda: not any(pid_alive(p) for p in info["processes"]), 10)
        assert eventually(lambda: not base.exists(), 10)
        assert eventually(lambda: not pid_alive(info["watchdog"]), 10)
    finally:
        controller.kill()
        controller.wait()
        controller.stdout.close()


def test_pgid_cleanup_on_close() -> None:
    sleeper = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        with Watchdog.start() as wd:
            wd.watch_pgid(sleeper.pid)
        assert wd.closed
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()


def test_pgid_sigkill_after_grace() -> None:
    # a group member that ignores SIGTERM is SIGKILLed after the 2 s grace
    stubborn = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"], start_new_session=True)
    try:
        wd = Watchdog.start()
        wd.watch_pgid(stubborn.pid)
        t0 = time.monotonic()
        assert wd.close() == 0
        assert 1.9 < time.monotonic() - t0 < 5
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()


def test_paths_forget_and_junk(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    kept, removed_file, removed_dir = tmp_path / "kept", tmp_path / "f", tmp_path / "d"
    kept.write_text("x")
    removed_file.write_text("x")
    (removed_dir / "sub").mkdir(parents=True)
    (removed_dir / "sub" / "g").write_text("x")
    sleeper = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        wd = Watchdog.start()
        wd.watch_path(kept)
        wd.watch_path(removed_file)
        wd.watch_path(removed_dir)
        wd.watch_path(tmp_path / "never-existed")
        wd.watch_pgid(sleeper.pid)
        assert wd._process.stdin is not None
        wd._process.stdin.write(b'not json\n{"op": "nope"}\n[1]\n{"op": "pgid", "pgid": 1}\n')
        wd.forget_path(kept)
        wd.forget_pgid(sleeper.pid)
        assert wd.close() == 0
    finally:
        alive = sleeper.poll() is None
        sleeper.kill()
        sleeper.wait()
    assert alive  # forgotten group left alone
    assert kept.exists() and not removed_file.exists() and not removed_dir.exists()
    err = capfd.readouterr().err
    assert err.count("ignoring line") == 4
    assert "unknown op 'nope'" in err


def test_signals(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    wd = Watchdog.start()
    wd.watch_path(target)
    os.kill(wd.pid, signal.SIGINT)  # Ctrl-C does not kill it
    time.sleep(0.2)
    assert wd._process.poll() is None and target.exists()
    os.kill(wd.pid, signal.SIGTERM)  # SIGTERM: clean up, exit
    assert wd._process.wait(timeout=5) == 0
    assert not target.exists()
    wd.close()


def test_parent_death_while_pipe_still_open(tmp_path: Path) -> None:
    # The controller forks a child that inherits the pipe's write end, then dies:
    # no EOF, yet the watchdog sees its parent change and cleans up.
    target = tmp_path / "t"
    target.mkdir()
    script = (
        "import os, sys, time\n"
        "from crashmatrix.harness.services.watchdog import Watchdog\n"
        "wd = Watchdog.start()\n"
        "wd.watch_path(sys.argv[1])\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(30); os._exit(0)\n"
        "print(wd.pid, child, flush=True)\n"
        "time.sleep(60)\n"
    )
    controller = subprocess.Popen([sys.executable, "-c", script, str(target)],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert controller.stdout is not None
        watchdog_pid, child = map(int, controller.stdout.readline().split())
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
        assert eventually(lambda: not target.exists(), 5)
        assert eventually(lambda: not pid_alive(watchdog_pid), 5)
        assert pid_alive(child)
    finally:
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
        controller.stdout.close()


def test_argument_checks() -> None:
    with Watchdog.start() as wd:
        with pytest.raises(InvalidArgument, match="pgid"):
            wd.watch_pgid(0)
    with pytest.raises(InvalidArgument, match="must be open"):
        wd.watch_path("/nonexistent")
