"""Fixtures of the plugin's tests (helpers in ``_plugin_support``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from _plugin_support import CHROMIUM, user_project

# the users' projects are run by the tests, never collected by this suite
collect_ignore = ["user_project", "user_fuzz"]


@pytest.fixture
def matrix_project(tmp_path: Path) -> Path:
    return user_project(tmp_path, "user_project")


@pytest.fixture
def fuzz_project(tmp_path: Path) -> Path:
    return user_project(tmp_path, "user_fuzz")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium, installed with apt-get when missing (CI runs as root on a
    fresh machine); a failed install fails the test that needs it."""
    if not CHROMIUM.exists():
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    assert CHROMIUM.exists(), "apt-get installed chromium but /usr/bin/chromium is missing"
    return CHROMIUM
