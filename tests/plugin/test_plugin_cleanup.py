"""A pytest run of a matrix under xdist (two workers, one shared PostgreSQL, a harness
session each) that is SIGKILLed in the middle of its cases leaves nothing behind: no
process, no data directory, no shared-PostgreSQL directory (the watchdogs clean up)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from _plugin_support import inner_env

# the integration tests' scan for tagged processes, reused by path (test folders are
# not packages)
_spec = importlib.util.spec_from_file_location(
    "_crashmatrix_cli_tests", Path(__file__).resolve().parents[1] / "integration" / "test_cli.py")
assert _spec is not None and _spec.loader is not None
_cli_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cli_tests)
tagged_processes = _cli_tests.tagged_processes


def _tagged(tag: str) -> list[str]:
    """Command lines of the live processes carrying ``CRASHMATRIX_TEST_TAG=tag``."""
    out = []
    for proc in tagged_processes(tag):
        try:
            out.append(" ".join(proc.cmdline()[:4]))
        except psutil.Error:  # it exited meanwhile
            continue
    return out


def test_sigkilled_xdist_run_leaves_nothing(matrix_project: Path) -> None:
    tag = uuid.uuid4().hex
    env = {**inner_env(matrix_project.parent), "CRASHMATRIX_TEST_TAG": tag}
    tmp = Path(env["TMPDIR"])
    out_path = matrix_project / "out.txt"
    with out_path.open("w") as out:  # a file, not a pipe: the watchdogs inherit nothing to wait on
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin",
                                 "-n", "2", "--crashmatrix-shard", "1/2"], cwd=matrix_project, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            # both workers' zygotes are up and the shared PostgreSQL runs: cases are in flight
            # the snapshot the loop judged is the one asserted on (a second read could miss a
            # worker whose shard just ended)
            running = _tagged(tag)
            while time.monotonic() < deadline and sum("crashmatrix.harness.zygote" in c for c in running) < 2:
                assert proc.poll() is None, out_path.read_text()[-3000:]
                time.sleep(0.2)
                running = _tagged(tag)
            assert sum("zygote" in c for c in running) >= 2 and any("postgres" in c for c in running), running
            assert [p.name for p in tmp.glob("crashmatrix-xdist-*")], "no shared PostgreSQL directory"
        finally:
            proc.kill()
            proc.wait(60)
    deadline = time.monotonic() + 60
    while True:
        procs, dirs = _tagged(tag), sorted(p.name for p in tmp.glob("crashmatrix*"))
        if (not procs and not dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert procs == [] and dirs == [], (procs, dirs, out_path.read_text()[-2000:])
