"""Helpers for integration tests: real PostgreSQL, real processes, real signals."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

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


SUBJECTS = Path(__file__).resolve().parents[1] / "subjects"
"""Subjects that live with the tests (``tests/subjects``: module:Class names)."""


@pytest.fixture
def subjects_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``tests/subjects`` importable in this process and in every child (``PYTHONPATH``:
    the zygote imports the subject); its packages are forgotten after the test."""
    monkeypatch.syspath_prepend(str(SUBJECTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(SUBJECTS), os.environ.get("PYTHONPATH")) if p))
    yield
    packages = {p.name for p in SUBJECTS.iterdir() if (p / "__init__.py").exists()}
    for name in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[name]
