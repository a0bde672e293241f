"""An adapter instance is handed one PostgreSQL server: db-restart cases, which run on
a second server, are observed through an instance of their own, prepared on it, so an
adapter that keeps a pool made from the first DSN it saw reads the right server
(docs/adapters.md, "One instance, one PostgreSQL")."""

from __future__ import annotations

import asyncio

import pytest

from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case

pytestmark = pytest.mark.usefixtures("subjects_on_path")


def test_a_pool_made_from_the_first_dsn_reads_the_db_restart_server() -> None:
    cases = [Case.parse(f"checkout/conv1/{p}") for p in
             ("db-restart@model.call.before[turn-2]#1", "db-restart@tool.request.before[turn-4.tool-0]#1",
              "kill@tool.request.after[turn-4.tool-0]#1")]
    report = asyncio.run(run_matrix("checkout", "firstpool.adapter:FirstDsnPoolAdapter", cases=cases,
                                    replay_failures=0))
    failed = [(r.case.id, [(v.check, v.details[:200]) for v in r.failed], r.error)
              for r in report.results if r.outcome != "pass"]
    assert failed == [] and len(report.results) == 3, failed
