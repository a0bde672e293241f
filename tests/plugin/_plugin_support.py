"""Helpers for the plugin's tests: a user's project copied to a temporary directory,
an inner pytest run or a ``crashmatrix`` command in a subprocess (as a user's CI would
run them), on real services."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class InnerRun:
    """One finished inner pytest run."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def inner_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an inner run: no crashmatrix or pytest settings leak in from
    this run; temporary files under ``tmp_path``; ``CI`` set (the CI profile)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CRASHMATRIX_", "PYTEST_", "HYPOTHESIS_")) and k != "TOXIPROXY_URL"}
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(TMPDIR=str(tmp), CI="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def user_project(tmp_path: Path, name: str) -> Path:
    """A copy of ``tests/plugin/<name>`` in ``tmp_path``."""
    dest = tmp_path / name
    shutil.copytree(HERE / name, dest)
    return dest


def run_pytest(project: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> InnerRun:
    """``python -m pytest ARGS`` in ``project`` (no cache provider, as .ci/run; without
    langsmith's pytest plugin, which the langgraph extra installs and which costs every
    pytest process about a second of imports); ``env``: added to :func:`inner_env`."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin", *args],
                          cwd=project,
                          env={**inner_env(project.parent), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    return InnerRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def crashmatrix_cli(project: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> InnerRun:
    """The ``crashmatrix`` command line of this environment, in ``project``; ``env``:
    added to :func:`inner_env`."""
    t0 = time.monotonic()
    exe = Path(sys.executable).with_name("crashmatrix")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "crashmatrix.harness.cli"]
    proc = subprocess.run([*cmd, *args], cwd=project, env={**inner_env(project.parent), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    return InnerRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


#: the test subjects' folder (tests/subjects), for ``PYTHONPATH``
SUBJECTS = HERE.parent / "subjects"


CHROMIUM = Path("/usr/bin/chromium")
# what Chromium needs on this machine kind (closed network, root): no background
# networking, no component updates, no sandbox (docs/plugin.md)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
