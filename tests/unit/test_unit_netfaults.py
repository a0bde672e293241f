"""Network faults, pure logic: the ``net`` fault in plans and case ids, its validation,
the network section's enumeration from a golden trace, DSN rewriting, and the model-call
allowance after repeated calls."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from crashmatrix.harness import oracle
from crashmatrix.harness.adapter import EffectEntry, Observation
from crashmatrix.harness.errors import HarnessError, PlanError
from crashmatrix.harness.enumeration import double_fault_cases, enumerate_cases
from crashmatrix.harness.golden import GoldenRun
from crashmatrix.harness.netfaults import NET_DEFAULTS, upstream_of, with_port, check_links, net_cases
from crashmatrix.harness.plan import PLAN_VERSION, TOXIC_ATTRIBUTES, Case, CrashPoint, Fault, FaultPlan, NetToxic

POINT = {"source": "label", "name": "log.append.before", "task": "turn-4", "occurrence": 1}
NET = {"link": "db", "toxic": "reset_peer", "attributes": {"timeout": 0}, "stream": "downstream",
       "heal": {"source": "label", "name": "db.reconnect", "task": "db", "occurrence": 1}}


def net_plan(**net_overrides: object) -> dict:
    net = {**NET, **net_overrides}
    return {"version": PLAN_VERSION, "faults": [{"kind": "net", "point": dict(POINT), "net": net}]}


def test_net_plan_json_and_case_id_round_trip() -> None:
    plan = FaultPlan.from_dict(net_plan())
    fault = plan.faults[0]
    assert fault.net == NetToxic("db", "reset_peer", (), "downstream", CrashPoint("label", "db.reconnect", "db", 1))
    case = Case("checkout", "conv1", plan)
    assert case.id == "checkout/conv1/net:db.reset_peer@log.append.before[turn-4]#1~db.reconnect[db]#1"
    assert Case.parse(case.id) == case
    assert FaultPlan.from_json(plan.to_json()) == plan
    # non-zero attributes and a non-default stream are in the id; a heal-less fault heals at the worker's end
    odd = FaultPlan.from_dict(net_plan(link="payment", toxic="latency", attributes={"jitter": 50, "latency": 4000},
                                       stream="upstream", heal=None))
    odd_id = Case("checkout", "conv1", odd).id
    assert odd_id == "checkout/conv1/net:payment.latency(latency=4000,jitter=50,stream=upstream)@log.append.before[turn-4]#1"
    assert Case.parse(odd_id).plan == odd and odd.faults[0].net.heal is None
    # a net fault followed by a kill in the resume
    both = Case.parse(odd_id + "+kill@step.after[turn-5]#1")
    assert [f.kind for f in both.plan.faults] == ["net", "kill"] and Case.parse(both.id) == both


def test_version_1_plans_without_net_read_unchanged() -> None:
    text = json.dumps({"version": 1, "faults": [{"kind": "kill", "point": POINT}]})
    plan = FaultPlan.from_json(text)
    assert plan.faults[0].net is None and "net" not in plan.to_dict()["faults"][0]
    assert json.loads(plan.to_json()) == json.loads(text)


@pytest.mark.parametrize("overrides, needle", [
    ({"link": "DB"}, "plan.faults[0].net.link='DB'"),
    ({"toxic": "flood"}, "plan.faults[0].net.toxic='flood' must be one of"),
    ({"stream": "both"}, "plan.faults[0].net.stream='both'"),
    ({"attributes": {"timeout": "1s"}}, "plan.faults[0].net.attributes.timeout='1s' must be an integer"),
    ({"attributes": {"timeout": True}}, "plan.faults[0].net.attributes.timeout=True must be an integer"),
    ({"attributes": {"latency": 5}}, "plan.faults[0].net.attributes.latency is not an attribute of reset_peer"),
    ({"attributes": [1, 2]}, "plan.faults[0].net.attributes must be an object"),
    ({"heal": {"source": "label", "name": "db.reconnect"}}, "plan.faults[0].net.heal.task is missing"),
    ({"heal": dict(POINT)}, "must come after the fault's point"),
    ({"colour": "red"}, "plan.faults[0].net has unknown field(s) colour"),
])
def test_bad_net_fields_are_named(overrides: dict, needle: str) -> None:
    with pytest.raises(PlanError) as info:
        FaultPlan.from_dict(net_plan(**overrides))
    assert needle in str(info.value)


def test_net_options_only_with_kind_net() -> None:
    data = net_plan()
    data["faults"][0]["kind"] = "kill"
    with pytest.raises(PlanError, match=r"plan.faults\[0\].net is only for kind 'net', not 'kill'"):
        FaultPlan.from_dict(data)
    del data["faults"][0]["net"]
    data["faults"][0]["kind"] = "net"
    with pytest.raises(PlanError, match=r"plan.faults\[0\].net is required with kind 'net'"):
        FaultPlan.from_dict(data)
    missing = net_plan()
    del missing["faults"][0]["net"]["toxic"]
    with pytest.raises(PlanError, match=r"plan.faults\[0\].net.toxic is missing"):
        FaultPlan.from_dict(missing)


def test_toxic_table_matches_the_fault_proxy_registry() -> None:
    from crashmatrix.harness.faultproxy import TOXIC_TYPES

    registry = {name: tuple(f.name for f in dataclasses.fields(cls)) for name, cls in TOXIC_TYPES.items()}
    assert registry == TOXIC_ATTRIBUTES


# -- the network section --------------------------------------------------------------


def _golden() -> GoldenRun:
    """conv1's shape: model turns, a read-only tool, a charge (payment) and a receipt (mail)."""
    trace: list[tuple[str, str, str, int]] = []

    def node(task: str, *labels: str) -> None:
        trace.append(("label", "node.launch", task, 1))
        trace.append(("step", "step.before", task, 1))
        trace.extend(("label", name, task, 1) for name in labels)
        trace.append(("step", "step.after", task, 1))

    model = ("model.call.before", "model.call.after", "log.append.before", "log.append.after")
    effect = ("effect.started.before", "effect.started.after", "tool.request.before", "tool.request.after",
              "log.append.before", "log.append.after")
    node("turn-1", *model)
    node("turn-1.tool-0", "tool.request.before", "tool.request.after", "log.append.before", "log.append.after")
    node("turn-2", *model)
    node("turn-2.tool-0", *effect)
    node("turn-3", *model)
    node("turn-3.tool-0", *effect)
    node("turn-4", *model)
    obs = Observation("run-g", "completed", effects=[
        EffectEntry("k-charge", "turn-2.tool-0", "charge", "succeeded", {}, 1),
        EffectEntry("k-mail", "turn-3.tool-0", "send_receipt", "succeeded", {}, 1),
    ])
    ledgers = {"payment": [{"key": "k-charge", "op": "charge"}], "mail": [{"key": "k-mail", "op": "message"}]}
    return GoldenRun("conv1", "run-g", trace, oracle.Evidence(obs, ledgers, {}), 0.1)


def test_network_section_follows_the_links_in_use() -> None:
    goldens = {"conv1": _golden()}
    cases = net_cases("checkout", goldens, ("payment", "mail", "model"))
    assert cases == net_cases("checkout", goldens, ("payment", "mail", "model"))  # deterministic
    faults = [c.plan.faults[0] for c in cases]
    by = Counter((f.net.link, f.net.toxic, f.point.name) for f in faults)
    # db: every log.append.* and effect.* label (blip), the .before ones again (outage)
    assert by[("db", "reset_peer", "log.append.before")] == 7 * 2
    assert by[("db", "reset_peer", "log.append.after")] == 7
    assert by[("db", "reset_peer", "effect.started.before")] == 2 * 2
    assert by[("db", "reset_peer", "effect.started.after")] == 2
    # the model link at each model call: cut and late
    assert by[("model", "limit_data", "model.call.before")] == 4 and by[("model", "latency", "model.call.before")] == 4
    # each effect's own provider at its request: timeout, cut, late; never the read-only tool
    for link in ("payment", "mail"):
        assert {t for (lk, t, p) in by if lk == link} == {"timeout", "limit_data", "latency"}
        assert all(p == "tool.request.before" for (lk, _, p) in by if lk == link)
    assert not [f for f in faults if f.point.task == "turn-1.tool-0" and f.net.link != "db"]
    assert len(cases) == 7 * 3 + 2 * 3 + 4 * 2 + 2 * 3
    # heals: the runtime's first retry on that link, or the worker's end
    heals = {(f.net.link, f.net.toxic, f.net.heal.label() if f.net.heal else None) for f in faults
             if f.point.task in ("turn-2", "turn-2.tool-0", "db")}
    assert ("model", "limit_data", "model.call.before[turn-2]#2") in heals
    assert ("payment", "latency", "probe.before[turn-2.tool-0]#1") in heals
    assert ("payment", "timeout", None) in heals
    assert ("db", "reset_peer", "db.reconnect[db]#1") in heals and ("db", "reset_peer", None) in heals
    # every id parses back to its case
    assert all(Case.parse(c.id) == c for c in cases)
    assert len({c.id for c in cases}) == len(cases)


def test_enumerate_cases_adds_the_network_section_for_kind_net() -> None:
    goldens = {"conv1": _golden()}
    with_net = enumerate_cases("checkout", goldens, ("kill", "net"))
    kills = enumerate_cases("checkout", goldens, ("kill",))
    assert with_net[:len(kills)] == kills
    assert with_net[len(kills):] == net_cases("checkout", goldens, ("payment", "mail", "model"))
    assert enumerate_cases("checkout", goldens, ("net",), ("step",)) == []  # the section is labels only


def test_double_faults_never_draw_a_second_net() -> None:
    from crashmatrix.harness.case import CaseResult

    first = net_cases("checkout", {"conv1": _golden()}, ("payment", "mail", "model"))[0]
    result = CaseResult(first, "reference", "pass", resume_trace=[("label", "log.append.before", "turn-2", 1)])
    doubles = double_fault_cases([result], ("kill", "net"), sample=None, seed=0)
    assert [[f.kind for f in c.plan.faults] for c in doubles] == [["net", "kill"]]


def test_links_must_be_the_workloads() -> None:
    case = Case.parse("checkout/conv1/net:smtp.timeout@tool.request.before[turn-5.tool-0]#1")
    with pytest.raises(PlanError, match=r"net.link='smtp' must be 'db' or one of the workload's providers"):
        check_links(case, ("payment", "mail", "model"))
    check_links(Case.parse("checkout/conv1/net:mail.timeout@tool.request.before[turn-5.tool-0]#1"), ("mail",))


def test_every_default_names_a_known_toxic_and_heal() -> None:
    for row in NET_DEFAULTS:
        NetToxic("db", row.toxic, row.attributes, row.stream)  # validates the attributes
        assert row.heal in ("retry", "worker-end") and row.links in ("db", "model", "effect", "provider")


# -- plumbing -----------------------------------------------------------------------------


def test_dsn_and_url_rewriting_keeps_everything_but_the_port() -> None:
    dsn = "postgresql://postgres@127.0.0.1:48547/crashmatrix?sslmode=disable"
    assert upstream_of(dsn, "db") == "127.0.0.1:48547"
    assert with_port(dsn, 9) == "postgresql://postgres@127.0.0.1:9/crashmatrix?sslmode=disable"
    assert with_port("http://127.0.0.1:41234", 7) == "http://127.0.0.1:7"
    for bad in ("host=/tmp/pg dbname=x", "postgresql:///x?host=/run/pg", "postgresql://u:secret@h:5/x"):
        with pytest.raises(HarnessError, match="cannot go through the fault proxy"):
            upstream_of(bad, "db")


def test_model_calls_repeated_after_a_lost_answer_are_allowed() -> None:
    trace = [("label", "model.call.before", "turn-2", 1), ("label", "model.call.before", "turn-2", 2),
             ("label", "model.call.after", "turn-2", 1), ("label", "log.append.after", "turn-2", 1),
             ("label", "model.call.before", "turn-3", 1)]
    # turn-2: two calls, one recorded; turn-3: one call in flight when the worker ended
    assert oracle.in_flight_model_calls(trace) == {"turn-2": 1, "turn-3": 1}
    assert oracle.in_flight_model_calls(trace[2:4]) == {}
