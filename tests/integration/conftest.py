"""Helpers for integration tests: real PostgreSQL, real processes, real signals."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest


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
