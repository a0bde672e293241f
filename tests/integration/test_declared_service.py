"""A service a team declares, run by the harness like the built-in providers: the
ticketing workload (``scenarios/ticketing``) on the reference runtime, over real
processes and sockets. Its ledger is compared (a runtime that opens a ticket twice
fails ``provider.ticketing.ledger_equal``), the ``net`` section reaches it through the
fault proxy, and a kill's quiesce waits on its in-flight count."""

from __future__ import annotations

import asyncio
from typing import Any

from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.netfaults import net_cases
from crashmatrix.harness.plan import Case
from crashmatrix.harness.session import open_session

WORKLOAD = "crashmatrix.scenarios.ticketing:WORKLOAD"
AFTER_APPLY = f"{WORKLOAD}/conv1/kill@tool.request.after[turn-2.tool-0]#1"


def _verdict(result: CaseResult, check: str) -> tuple[bool | None, str]:
    v = next(v for v in result.verdicts if v.check == check)
    return v.valid, v.details


async def _session() -> dict[str, Any]:
    facts: dict[str, Any] = {}
    async with open_session("reference", WORKLOAD) as ex:
        golden = await ex.golden("conv1")
        facts["golden_rows"] = golden.evidence.ledgers["ticketing"]
        facts["reference"] = await ex.run_case(Case.parse(AFTER_APPLY), golden)
        async with ex.for_subject("defect:unkeyed-retry") as mutant:
            mutant_golden = await mutant.golden("conv1")
            facts["mutant"] = await mutant.run_case(Case.parse(AFTER_APPLY), mutant_golden)
        section = net_cases(WORKLOAD, {"conv1": golden}, ex.workload.providers)
        facts["links"] = {c.plan.faults[0].net.link for c in section}
        ours = [c for c in section if c.plan.faults[0].net.link == "ticketing"]
        facts["net"] = await asyncio.gather(*(ex.run_case(c, golden) for c in ours))
    return facts


def test_a_declared_service_is_started_compared_and_proxied_like_a_builtin_provider() -> None:
    facts = asyncio.run(_session())
    (row,) = facts["golden_rows"]
    assert (row["op"], row["status"], row["http_status"]) == ("ticket", "created", 201)
    assert row["result"]["ticket_id"] == row["ref"] and row["ref"].startswith("TCK-")
    assert row["request"]["queue"] == "returns"
    # the reference runtime: the probe found the ticket, nothing opened twice
    ref = facts["reference"]
    assert ref.outcome == "pass", (ref.error, [(v.check, v.details) for v in ref.failed])
    assert _verdict(ref, "provider.ticketing.ledger_equal") == (True, "1 rows equal")
    # a runtime whose key changes per attempt opens the ticket again on resume
    mutant = facts["mutant"]
    assert mutant.outcome == "fail"
    valid, details = _verdict(mutant, "provider.ticketing.ledger_equal")
    assert valid is False and "applied twice" in details, details
    # the network section has a link to the service, and its cases pass
    assert facts["links"] == {"db", "model", "ticketing"}
    net = facts["net"]
    assert {r.case.plan.faults[0].net.toxic for r in net} == {"timeout", "limit_data", "latency"}
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in net if r.outcome != "pass"]
    assert not bad, bad
    for r in net:
        assert _verdict(r, "provider.ticketing.ledger_equal") == (True, "1 rows equal")
        assert r.workers[0]["healed"].startswith("at "), r.workers[0]
    # the answer never came back: the probe could not tell yet, the resume's probe found it
    timeout = next(r for r in net if r.case.plan.faults[0].net.toxic == "timeout")
    assert _verdict(timeout, "net.resumable") == (True, "status interrupted")
