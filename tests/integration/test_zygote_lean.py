"""The zygote's probe of its preload, on real processes: the stage whose import starts a
thread and every later one are left to the workers; the zygote that forks has one
thread (``/proc/PID/task``), and says what it found in its ready event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SUBJECTS = str(Path(__file__).resolve().parents[1] / "subjects")


def _ready(subject: str, workload: str) -> tuple[dict, int]:
    """Start a zygote, read its ready event, count its threads, end it (EOF)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SUBJECTS, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-P", "-m", "crashmatrix.harness.zygote", subject, workload],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = json.loads(proc.stdout.readline())
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        assert ready["pid"] == proc.pid  # re-executed in place: the controller's pid still
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return ready, threads


@pytest.mark.parametrize(("subject", "workload", "thread", "stage"), [
    ("threaded.adapter:ThreadedAdapter", "checkout", "threaded-event-bus", "subject threaded.adapter:ThreadedAdapter"),
    ("reference", "threaded.workload:WORKLOAD", "threaded-workload-poller", "workload threaded.workload:WORKLOAD"),
])
def test_a_thread_started_by_an_import_makes_the_zygote_lean(subject: str, workload: str, thread: str,
                                                             stage: str) -> None:
    ready, threads = _ready(subject, workload)
    assert ready["lean"] == {"threads": [thread], "stage": stage}
    assert threads == 1


def test_a_thread_free_preload_stays_as_it_was() -> None:
    ready, threads = _ready("reference", "checkout")
    assert ready["lean"] is None and threads == 1
