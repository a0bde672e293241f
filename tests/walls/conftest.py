"""Fixtures for the walls tests: the reference-runtime fixtures (one embedded PostgreSQL
per session, migrated once; a :class:`Db` per test; fresh run ids), reused from
tests/runtime/conftest.py by path (test folders are not packages)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_crashmatrix_runtime_conftest", Path(__file__).resolve().parents[1] / "runtime" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_runtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runtime)

anyio_backend = _runtime.anyio_backend
pg = _runtime.pg
db = _runtime.db
raw = _runtime.raw
new_run_id = _runtime.new_run_id
fresh_database = _runtime.fresh_database
dsn_for = _runtime.dsn_for
