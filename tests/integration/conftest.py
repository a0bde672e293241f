"""Helpers for integration tests: real PostgreSQL, real processes, real signals."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psutil
import pytest


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries CRASHMATRIX_TEST_TAG=tag (every child
    of a controller started with that variable inherits it, PostgreSQL included)."""
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("CRASHMATRIX_TEST_TAG") == tag:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.fixture
def test_tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A unique tag put in this test's environment; children inherit it."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("CRASHMATRIX_TEST_TAG", tag)
    yield tag


@pytest.fixture
def cli_env(test_tag: str, tmp_path) -> dict[str, str]:
    """Environment for a `crashmatrix` subprocess: tagged, temp dir under tmp_path."""
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp_path)
    env.pop("CRASHMATRIX_PG_DSN", None)
    return env
