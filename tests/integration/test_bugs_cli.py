"""``crashmatrix bugs`` as a user meets it: the list of entries and their commands, and
bad input refused in one line with exit 2 and no report written. The installs and runs
of real releases are the nightly job's (.ci/bugs-nightly; figures in docs/findings.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


SLOW_BACKEND = '''
import time


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    time.sleep(120)
    raise RuntimeError("not reached")
'''

GUARDED_BUILD = '''
import sys
from pathlib import Path
from crashmatrix.harness import bugs

with bugs.guarded():
    bugs._wheel(Path(sys.argv[1]))
'''


def _processes_naming(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_stopped_corpus_leaves_no_child_and_no_wheel_directory(tmp_path, sig):
    """The corpus's children (here ``pip wheel`` building a tree whose build backend
    sleeps) and the wheel's directory outlive a SIGKILLed ``crashmatrix bugs`` by no more
    than the watchdog's cleanup, and an interrupted one not at all: the child, in a
    session of its own, gets the Ctrl-C passed on."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "slow_backend"\n'
                                         'backend-path = ["."]\n[project]\nname = "crashmatrix"\nversion = "0"\n')
    (tree / "slow_backend.py").write_text(SLOW_BACKEND)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-c", GUARDED_BUILD, str(tree)], env=env)
    try:
        deadline = time.monotonic() + 60
        # the build is under way once pip's backend (started in the tree) runs
        while not (list(scratch.glob("crashmatrix-wheel-*")) and _processes_naming("_in_process")):
            assert proc.poll() is None and time.monotonic() < deadline, "the build never started"
            time.sleep(0.1)
        children = [pid for pid in _processes_naming(str(tree)) if pid != proc.pid]
        assert children, "pip wheel is not running"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) != 0
        deadline = time.monotonic() + 15
        while (list(scratch.glob("crashmatrix-wheel-*")) or any(_alive(pid) for pid in children)) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(scratch.glob("crashmatrix-wheel-*")), "the wheel directory outlived the corpus"
        assert not [pid for pid in children if _alive(pid)], "a child outlived the corpus"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
