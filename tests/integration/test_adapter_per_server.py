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


def test_an_observe_that_reads_another_server_is_stopped_before_any_case() -> None:
    """A pool shared by every instance of the process reads the main server for the
    db-restart server's runs: the check before any case stops the matrix (exit 2 at
    the command line) naming the method."""
    from crashmatrix.harness.errors import AdapterContractError

    cases = [Case.parse("checkout/conv1/db-restart@model.call.before[turn-2]#1")]
    with pytest.raises(AdapterContractError) as caught:
        asyncio.run(run_matrix("checkout", "firstpool.adapter:ProcessPoolAdapter", cases=cases))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("ProcessPoolAdapter.observe read run cm-run-")
    assert "as 'absent' on the db-restart PostgreSQL, where a worker just left it 'completed'" in message
