"""Network faults on real sockets: toxics on per-case proxies of the session's embedded
fault proxy, in front of the real PostgreSQL and the real providers.

One session runs a slice of conversation 1's network section (the first case of each
default row on each link) on the reference runtime; a second shows mutant 15 caught at a
named case that a kill at the same point does not reach."""

from __future__ import annotations

import asyncio

from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.netfaults import NET_DEFAULTS, net_cases
from crashmatrix.harness.plan import Case
from crashmatrix.harness.services.watchdog import pid_alive
from crashmatrix.harness.session import open_session

# The receipt's append, the second record with an effect on the worker's connection: the
# statement is prepared by then, so the answer lost is the COMMIT's (at the charge's, the
# first, it is the answer to asyncpg's implicit prepare: nothing was executed yet).
BLIP = "checkout/conv1/net:db.reset_peer@log.append.before[turn-5.tool-0]#1~db.reconnect[db]#1"


def _slice(cases: list[Case]) -> list[Case]:
    """The first case of each (link, toxic, heal) in the section, plus the blip on the
    receipt's append (the lost COMMIT acknowledgement of an effect node)."""
    seen: set[tuple[str, str, bool]] = set()
    out = []
    for case in cases:
        net = case.plan.faults[0].net
        assert net is not None
        key = (net.link, net.toxic, net.heal is None)
        if key not in seen or case.id == BLIP:
            seen.add(key)
            out.append(case)
    return out


async def _run_slice() -> tuple[list[CaseResult], dict[str, object]]:
    facts: dict[str, object] = {}
    async with open_session("reference", "checkout") as ex:
        golden = await ex.golden("conv1")
        kill = await ex.run_case(Case.parse("checkout/conv1/kill@log.append.before[turn-4]#1"), golden)
        facts["kill"] = kill.outcome
        facts["proxy_before_net"] = ex.fault_proxy.proc  # golden and kill cases never start it
        cases = _slice(net_cases("checkout", {"conv1": golden}, ex.workload.providers))
        sem = asyncio.Semaphore(4)

        async def one(case: Case) -> CaseResult:
            async with sem:
                return await ex.run_case(case, golden)

        results = await asyncio.gather(*(one(c) for c in cases))
        client = await ex.fault_proxy.client()
        facts["proxies_left"] = await asyncio.to_thread(client.proxies)
        facts["proxy_pid"] = ex.fault_proxy.proc.pid if ex.fault_proxy.proc else None
    return list(results), facts


def test_network_section_slice_passes_on_the_reference_runtime() -> None:
    results, facts = asyncio.run(_run_slice())
    bad = [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert facts["kill"] == "pass" and facts["proxy_before_net"] is None
    by_id = {r.case.id: r for r in results}
    links = {r.case.plan.faults[0].net.link for r in results}
    assert links == {"db", "payment", "mail", "model"}
    assert {r.case.plan.faults[0].net.toxic for r in results} == {row.toxic for row in NET_DEFAULTS}
    # every case ended healed, and its proxies are gone; the embedded proxy process too
    assert facts["proxies_left"] == {}
    assert isinstance(facts["proxy_pid"], int) and not pid_alive(facts["proxy_pid"])
    for r in results:
        assert r.workers[0]["healed"].startswith("at "), (r.case.id, r.workers[0])

    def verdict(r: CaseResult, check: str) -> str:
        return next(v.details for v in r.verdicts if v.check == check)

    # a blip on the receipt's append: the worker reconnected, learned from the log that the
    # COMMIT had landed and finished the run itself (no resume); the receipt sent once
    blip = by_id[BLIP]
    assert blip.workers[0]["healed"] == "at db.reconnect[db]#1" and blip.workers[0]["returncode"] == 0
    assert [w["role"] for w in blip.workers] == ["start"] and verdict(blip, "net.resumable") == "status completed"
    assert verdict(blip, "provider.mail.ledger_equal") == "1 rows equal"
    # an outage: the worker could not reconnect, failed loudly, the run stayed resumable
    outage = next(r for r in results if r.case.plan.faults[0].net.link == "db" and r.case.plan.faults[0].net.heal is None)
    assert outage.workers[0]["returncode"] == 1 and [w["role"] for w in outage.workers] == ["start", "resume"]
    assert verdict(outage, "net.resumable") == "status running"
    # the charge's answer never came and the probe met the same broken link: "cannot tell
    # yet", the run left interrupted (not handed to a human), resolved by the resume's probe
    timeout = next(r for r in results if r.case.plan.faults[0].net.link == "payment"
                   and r.case.plan.faults[0].net.toxic == "timeout")
    assert verdict(timeout, "net.resumable") == "status interrupted"
    assert verdict(timeout, "provider.payment.ledger_equal") == "1 rows equal"
    # a cut or late model answer: called again at the heal point, the extra call allowed
    cut = next(r for r in results if r.case.plan.faults[0].net.link == "model"
               and r.case.plan.faults[0].net.toxic == "limit_data")
    assert cut.workers[0]["healed"] == f"at model.call.before[{cut.case.plan.faults[0].point.task}]#2"
    assert "in flight at faults 1" in verdict(cut, "model.calls_billed")


def test_lost_ack_reapply_mutant_is_caught_by_the_network_section() -> None:
    kill = "checkout/conv1/kill@log.append.before[turn-4.tool-0]#1"
    report = asyncio.run(run_matrix("checkout", "defect:lost-ack-reapply", cases=[Case.parse(BLIP), Case.parse(kill)]))
    by_id = {r.case.id: r for r in report.results}
    assert by_id[kill].outcome == "pass"  # a dead worker re-applies nothing
    caught = by_id[BLIP]
    assert caught.outcome == "fail", caught.error
    failed = {v.check for v in caught.failed}
    assert {"provider.mail.ledger_equal", "net.resumable", "run.status"} <= failed
    assert "message applied twice" in next(v.details for v in caught.failed if v.check == "provider.mail.ledger_equal")
