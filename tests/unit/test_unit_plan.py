"""crashmatrix.harness.plan: crash points, faults, plans and case ids."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crashmatrix.harness import faults
from crashmatrix.harness.errors import CrashmatrixError, InvalidArgument, PlanError
from crashmatrix.harness.plan import OUTAGE_WINDOW_MS
from crashmatrix.harness.plan import (
    PLAN_VERSION,
    Case,
    CrashPoint,
    Fault,
    FaultPlan,
    NetToxic,
    source_of,
)

SIMPLE_KINDS = tuple(k for k in faults.names() if k != "net")  # net needs its toxic: tests/unit/test_unit_netfaults.py

STEP = CrashPoint("step", "step.before", "turn-1", 1)
LABEL = CrashPoint("label", "effect.started.after", "turn-4.tool-0", 2)
AWAIT = CrashPoint("await", "pkg.mod:Cls.meth@2", "turn-3.tool-1", 3)


def plan_dict(**point_overrides: object) -> dict:
    point = {"source": "label", "name": "log.append.before", "task": "turn-2", "occurrence": 1}
    point.update(point_overrides)
    return {"version": PLAN_VERSION, "faults": [{"kind": "kill", "point": point}]}


# -- round trips ------------------------------------------------------------------------


def test_plan_json_round_trip_keeps_order_and_every_field() -> None:
    plan = FaultPlan((Fault("term", LABEL), Fault("kill", STEP), Fault("cancel", AWAIT)))
    text = plan.to_json()
    assert json.loads(text)["version"] == PLAN_VERSION
    back = FaultPlan.from_json(text)
    assert back == plan
    assert [f.kind for f in back.faults] == ["term", "kill", "cancel"]
    assert back.faults[2].point == AWAIT


def test_empty_plan_is_golden_and_round_trips() -> None:
    assert FaultPlan.from_json(FaultPlan().to_json()) == FaultPlan()
    case = Case("checkout", "conv1", FaultPlan())
    assert case.id == "checkout/conv1/golden"
    assert Case.parse(case.id) == case


def test_occurrence_defaults_to_one_when_absent() -> None:
    data = plan_dict()
    del data["faults"][0]["point"]["occurrence"]
    assert FaultPlan.from_dict(data).faults[0].point.occurrence == 1


@pytest.mark.parametrize("point", [STEP, LABEL, AWAIT], ids=["step", "label", "await"])
@pytest.mark.parametrize("kind", SIMPLE_KINDS)
def test_case_id_round_trip_each_source(point: CrashPoint, kind: str) -> None:
    case = Case("checkout", "conv3", FaultPlan((Fault(kind, point),)))
    shown = f"{kind}({OUTAGE_WINDOW_MS}ms)" if kind == "db-outage" else kind  # the window is part of the id
    assert case.id == f"checkout/conv3/{shown}@{point.name}[{point.task}]#{point.occurrence}"
    parsed = Case.parse(case.id)
    assert parsed == case
    assert parsed.plan.faults[0].point.source == point.source


def test_await_name_with_colon_and_at_parses() -> None:
    case = Case.parse("checkout/conv3/kill@reference_runtime.effects:EffectLedger.mark@2[turn-4.tool-0]#1")
    point = case.plan.faults[0].point
    assert point == CrashPoint("await", "reference_runtime.effects:EffectLedger.mark@2", "turn-4.tool-0", 1)


def test_multi_fault_case_id_round_trip() -> None:
    case = Case("w", "c", FaultPlan((Fault("kill", STEP), Fault("cancel", AWAIT), Fault("term", LABEL))))
    assert case.id.count("+") == 2
    assert Case.parse(case.id) == case


def test_source_of() -> None:
    assert source_of("step.after") == "step"
    assert source_of("a.b:C.d@1") == "await"
    assert source_of("effect.started") == "label"
    assert source_of("a:b") == "label"  # needs both ':' and '@'


# hypothesis: realistic names for each source, consistent with source_of()
_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_dotted = st.lists(_word, min_size=1, max_size=4).map(".".join)
_label_names = _dotted.filter(lambda n: not n.startswith("step."))
_step_names = _dotted.map(lambda n: "step." + n)
_await_names = st.builds(
    lambda mod, qual, n: f"{mod}:{qual}@{n}",
    _dotted,
    st.lists(st.one_of(_word, st.just("<locals>")), min_size=1, max_size=3).map(".".join),
    st.integers(0, 30),
)
_tasks = st.one_of(
    st.just("run"),
    st.builds(lambda t: f"turn-{t}", st.integers(1, 200)),
    st.builds(lambda t, i: f"turn-{t}.tool-{i}", st.integers(1, 200), st.integers(0, 20)),
    st.text(alphabet="abcxyz0123456789-._:@<>", min_size=1, max_size=12),
)
_points = st.one_of(
    st.builds(CrashPoint, st.just("step"), _step_names, _tasks, st.integers(1, 10_000)),
    st.builds(CrashPoint, st.just("label"), _label_names, _tasks, st.integers(1, 10_000)),
    st.builds(CrashPoint, st.just("await"), _await_names, _tasks, st.integers(1, 10_000)),
)
_toxics = st.sampled_from(sorted(__import__("crashmatrix.harness.plan", fromlist=["x"]).TOXIC_ATTRIBUTES.items()))
_nets = st.builds(
    lambda toxic, values, link, stream, heal: NetToxic(
        link, toxic[0], tuple(zip(toxic[1], values)), stream, heal),
    _toxics, st.lists(st.integers(-5, 10**9), min_size=3, max_size=3),
    st.sampled_from(["db", "payment", "model", "mail-2"]), st.sampled_from(["downstream", "upstream"]),
    st.one_of(st.none(), st.builds(CrashPoint, st.just("label"), st.just("db.reconnect"), st.just("db"), st.integers(1, 9))),
)
_faults = st.one_of(
    st.builds(Fault, st.sampled_from(SIMPLE_KINDS), _points),
    st.builds(lambda p, n: Fault("net", p, n), _points, _nets),
)
_plans = st.lists(_faults, max_size=4).map(lambda fs: FaultPlan(tuple(fs)))
_ident = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=10).filter(
    lambda s: s != "golden"
)


@given(_plans, _ident, _ident)
def test_property_plan_and_case_round_trip(plan: FaultPlan, workload: str, conv: str) -> None:
    assert FaultPlan.from_json(plan.to_json()) == plan
    assert FaultPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    case = Case(workload, conv, plan)
    assert Case.parse(case.id) == case
    # the id is also stable: parsing and re-rendering gives the same text
    assert Case.parse(case.id).id == case.id


# -- ids the format cannot carry must be refused at construction ----------------------


@pytest.mark.parametrize("name", ["effect\tstarted", "effect\nstarted", "effect\u00a0started"])
def test_whitespace_in_name_refused_not_only_space(name: str) -> None:
    """The case-id grammar excludes all whitespace (regex ``\\s``), so a point whose name
    holds a tab or newline gets an id that Case.parse rejects; the constructor must
    refuse it (it only refuses the space character today)."""
    with pytest.raises(PlanError, match="point.name"):
        CrashPoint("label", name, "turn-1", 1)


def test_label_source_must_be_recoverable_from_its_name() -> None:
    """A case id does not carry the source; it is implied by the name. A label named
    like a step (``step.x``) gets an id that parses back as a *step* point, so either
    the constructor refuses the inconsistent pair or the round trip must hold."""
    bad = [("label", "step.custom"), ("label", "retry.wait:x@1"), ("step", "effect.started")]
    not_round_tripping = []
    for source, name in bad:
        try:
            point = CrashPoint(source, name, "turn-1", 1)
        except PlanError:
            continue
        case = Case("w", "c", FaultPlan((Fault("kill", point),)))
        try:
            parsed = Case.parse(case.id)
        except PlanError as exc:
            parsed = exc
        if parsed != case:
            not_round_tripping.append((source, name, case.id))
    assert not not_round_tripping, f"accepted but not round-tripping: {not_round_tripping}"


def test_case_refuses_workload_or_conversation_the_id_cannot_carry() -> None:
    """``Case("a/b", ...)`` renders ``a/b/c/golden``, which parses as workload ``a``."""
    bad = []
    for workload, conv in [("a/b", "c"), ("a", "c/d"), ("", "c")]:
        try:
            case = Case(workload, conv, FaultPlan())
        except PlanError:
            continue
        try:
            parsed = Case.parse(case.id)
        except PlanError as exc:
            parsed = exc
        if parsed != case:
            bad.append(f"Case({workload!r}, {conv!r}) -> id {case.id!r} -> {parsed!r}")
    assert not bad, "accepted but the id does not round-trip: " + "; ".join(bad)


# -- malformed input: PlanError (a ValueError) naming the field ------------------------


def test_plan_error_hierarchy() -> None:
    assert issubclass(PlanError, ValueError)
    assert issubclass(PlanError, InvalidArgument)
    assert issubclass(PlanError, CrashmatrixError)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"version": 2, "faults": []}', "plan.version=2"),
        ('{"faults": []}', "plan.version=None"),
        ('{"version": 1, "faults": [], "extra": 1}', "unknown field(s) extra"),
        ('{"version": 1, "faults": {}}', "plan.faults must be a list"),
        ('{"version": 1, "faults": [3]}', "plan.faults[0] must be an object"),
        ('{"version": 1, "faults": [{"kind": "kill", "point": {"source": "label", "name": "a", "task": "t"}, "when": 1}]}',
         "plan.faults[0] has unknown field(s) when"),
        ('{"version": 1, "faults": [{"point": {"source": "label", "name": "a", "task": "t"}}]}', "plan.faults[0].kind is missing"),
        ('{"version": 1, "faults": [{"kind": "explode", "point": {"source": "label", "name": "a", "task": "t"}}]}',
         "plan.faults[0].kind='explode'"),
        ('{"version": 1, "faults": [{"kind": "kill"}]}', "plan.faults[0].point must be an object"),
    ],
)
def test_from_json_malformed(text: str, needle: str) -> None:
    with pytest.raises(PlanError) as info:
        FaultPlan.from_json(text)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("missing", ["source", "name", "task"])
def test_missing_point_field(missing: str) -> None:
    data = plan_dict()
    del data["faults"][0]["point"][missing]
    with pytest.raises(PlanError, match=rf"plan\.faults\[0\]\.point\.{missing} is missing"):
        FaultPlan.from_dict(data)


def test_unknown_point_field() -> None:
    with pytest.raises(PlanError, match=r"plan\.faults\[0\]\.point has unknown field\(s\) line"):
        FaultPlan.from_dict(plan_dict(line=12))


@pytest.mark.parametrize("occ", [0, -1, True, False, "1", 1.0, None])
def test_bad_occurrence(occ: object) -> None:
    with pytest.raises(PlanError, match="point.occurrence"):
        FaultPlan.from_dict(plan_dict(occurrence=occ))
    with pytest.raises(PlanError, match="point.occurrence"):
        CrashPoint("label", "a", "t", occ)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["name", "task"])
@pytest.mark.parametrize("value", ["a b", "a[b", "a]b", "a#b", "a/b", "a+b", "", 7])
def test_bad_name_or_task(field: str, value: object) -> None:
    with pytest.raises(PlanError, match=f"point.{field}"):
        FaultPlan.from_dict(plan_dict(**{field: value}))


def test_bad_source() -> None:
    with pytest.raises(PlanError, match="point.source='line'"):
        FaultPlan.from_dict(plan_dict(source="line"))


def test_fault_constructor_refuses_unknown_kind() -> None:
    with pytest.raises(PlanError, match="fault.kind='flood'"):
        Fault("flood", LABEL)
    with pytest.raises(PlanError, match="fault.net is required with kind 'net'"):
        Fault("net", LABEL)  # a net fault names its link and toxic


@pytest.mark.parametrize(
    "case_id, needle",
    [
        ("checkout", "must look like WORKLOAD/CONVERSATION"),
        ("checkout/conv1", "must look like WORKLOAD/CONVERSATION"),
        ("checkout//kill@a[t]#1", "must look like WORKLOAD/CONVERSATION"),
        ("/conv1/kill@a[t]#1", "must look like WORKLOAD/CONVERSATION"),
        ("checkout/conv1/", "must look like WORKLOAD/CONVERSATION"),
        ("checkout/conv1/kill@a", "fault 'kill@a'"),
        ("checkout/conv1/kill@a[t]", "fault 'kill@a[t]'"),
        ("checkout/conv1/kill@a[t]#0", "fault 'kill@a[t]#0'"),
        ("checkout/conv1/kill@a[t]#-1", "fault 'kill@a[t]#-1'"),
        ("checkout/conv1/kill@a[t]#x", "fault 'kill@a[t]#x'"),
        ("checkout/conv1/kill@a b[t]#1", "fault 'kill@a b[t]#1'"),
        ("checkout/conv1/kill@a[t]#1+", "fault ''"),
        ("checkout/conv1/boom@a[t]#1", "fault kind 'boom'"),
        ("checkout/conv1/net@a[t]#1", "fault.net is required"),
        ("checkout/conv1/net:db@a[t]#1", "must look like net:LINK.TOXIC"),
        ("checkout/conv1/net:db.reset_peer(timeout=x)@a[t]#1", "timeout='x' must be an integer"),
        ("checkout/conv1/net:db.flood@a[t]#1", "net.toxic='flood'"),
        ("checkout/conv1/net:db.latency(bytes=3)@a[t]#1", "net.attributes.bytes is not an attribute of latency"),
        ("checkout/conv1/net:db.latency(stream=sideways)@a[t]#1", "net.stream='sideways'"),
        ("checkout/conv1/net:db.latency@a[t]#2~a[t]#2", "must come after the fault's point"),
    ],
)
def test_case_parse_malformed(case_id: str, needle: str) -> None:
    with pytest.raises(PlanError) as info:
        Case.parse(case_id)
    assert needle in str(info.value)


def test_point_key_and_label() -> None:
    assert AWAIT.key == ("pkg.mod:Cls.meth@2", "turn-3.tool-1", 3)
    assert AWAIT.label() == "pkg.mod:Cls.meth@2[turn-3.tool-1]#3"
    assert Fault("cancel", AWAIT).label() == "cancel@pkg.mod:Cls.meth@2[turn-3.tool-1]#3"


def test_db_outage_window_in_ids_and_plans() -> None:
    bare = Case.parse("checkout/conv1/db-outage@log.append.before[turn-4]#1")
    assert bare.plan.faults[0].window_ms == OUTAGE_WINDOW_MS
    assert bare.id == f"checkout/conv1/db-outage({OUTAGE_WINDOW_MS}ms)@log.append.before[turn-4]#1"
    two = Case.parse("checkout/conv1/kill@log.append.after[turn-3]#1+db-outage(2500ms)@log.append.before[turn-5]#1")
    assert two.plan.faults[1].window_ms == 2500 and Case.parse(two.id) == two
    assert FaultPlan.from_json(two.plan.to_json()) == two.plan
    for bad, says in (("kill(100ms)@step.after[turn-1]#1", "only for kind 'db-outage'"),
                      ("db-outage(0ms)@step.after[turn-1]#1", "window_ms=0"),
                      ("db-outage(999999999ms)@step.after[turn-1]#1", "window_ms=999999999")):
        with pytest.raises(PlanError, match=re.escape(says)):
            Case.parse(f"checkout/conv1/{bad}")
