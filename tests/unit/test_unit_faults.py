"""crashmatrix.harness.faults: the registry and the kinds' pure parts (their crash
checks, what depth 2 draws from them). The kinds' actions and hooks run for real in
tests/integration (test_fault_plans.py, test_kill_matrix.py, test_net_faults.py)."""

from __future__ import annotations

from crashmatrix.harness import faults, plan
from crashmatrix.harness.enumeration import double_fault_cases, double_fault_note
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.faults.pause import check_zombie_effects
from crashmatrix.harness.fuzz import order_kinds
from crashmatrix.harness.plan import Case

FIRST = Case.parse("checkout/conv1/pause@log.append.before[turn-2]#1")
RESUME = [("label", "log.append.before", "turn-3", 1), ("step", "step.after", "turn-3", 1)]


BUILT_IN = ("kill", "term", "cancel", "pause", "db-restart", "net", "freeze", "cancel-edge", "cancel-api",
            "db-outage", "restore")


def test_the_registry_is_the_plan_s_kinds_with_their_abilities() -> None:
    """The built-in kinds in their listing order and with their abilities; a kind added
    to the package is listed after them and changes nothing here."""
    assert plan.fault_kinds() == faults.names()
    assert tuple(k for k in faults.names() if k in BUILT_IN) == BUILT_IN
    assert tuple(k for k in order_kinds(faults.names()) if k in BUILT_IN) == (
        "kill", "term", "cancel", "cancel-edge", "pause", "cancel-api", "net", "db-restart", "freeze", "db-outage",
        "restore")
    ability = {name: {a.__name__ for a in (faults.UnderLock, faults.Drains, faults.ObservesBefore, faults.Stops,
                                            faults.CaseSetting) if isinstance(k, a)}
               for name, k in faults.KINDS.items() if name in BUILT_IN}
    assert ability == {"kill": {"UnderLock"}, "term": {"Drains", "ObservesBefore"}, "cancel": set(),
                       "pause": {"Stops"}, "db-restart": {"Stops", "CaseSetting"}, "net": {"CaseSetting"},
                       "freeze": {"Stops"}, "cancel-edge": set(), "cancel-api": {"Stops"},
                       "db-outage": {"Stops", "CaseSetting"}, "restore": {"Stops"}}
    assert [k for k, v in faults.KINDS.items() if not v.bare and k in BUILT_IN] == ["net"]
    assert [k for k, v in faults.KINDS.items() if v.needs_fault_proxy and k in BUILT_IN] == ["net", "db-outage"]
    assert [k for k, v in faults.KINDS.items() if v.unjudged and k in BUILT_IN] == ["net", "db-outage"]
    from crashmatrix.harness.settings import RunSettings

    assert RunSettings.of("checkout", kinds=("db-outage",)).wants_proxy
    assert not RunSettings.of("checkout", kinds=("kill", "restore")).wants_proxy


def test_every_module_of_the_package_is_a_registered_kind_in_listing_order() -> None:
    """A kind is its module: every module of ``harness/faults/`` not starting with ``_``
    registers at least one kind (imported by the package, named in no list), and the
    registry is in ``(listing_order, name)`` order whatever the modules' file names."""
    import pkgutil
    import sys

    modules = {m.name for m in pkgutil.iter_modules(faults.__path__) if not m.name.startswith("_")}
    owners = {type(k).__module__.rsplit(".", 1)[1] for k in faults.KINDS.values()
              if type(k).__module__.startswith(faults.__name__ + ".")}
    assert owners == modules and all(f"{faults.__name__}.{m}" in sys.modules for m in modules), owners ^ modules
    positions = [(k.listing_order, k.name) for k in faults.KINDS.values()]
    assert positions == sorted(positions), positions


def test_depth_2_puts_any_bare_kind_after_any_kind() -> None:
    result = CaseResult(FIRST, "reference", "pass", resume_trace=RESUME)
    doubles = double_fault_cases([result], ("kill", "pause", "db-restart", "net"), sample=None, seed=0)
    assert [c.id.split("/")[2] for c in doubles] == [
        f"pause@log.append.before[turn-2]#1+{kind}@{point}"
        for point in ("log.append.before[turn-3]#1", "step.after[turn-3]#1") for kind in ("kill", "pause", "db-restart")]
    assert double_fault_note([result], ("kill",), len(doubles)).startswith("depth 2: 6 double-fault case(s) from 1 of 1")


def test_depth_2_says_why_it_generated_nothing() -> None:
    survived = CaseResult(Case.parse("checkout/conv1/db-restart@log.append.before[turn-2]#1"), "reference", "pass")
    failed = CaseResult(Case.parse("checkout/conv1/db-restart@log.append.before[turn-3]#1"), "reference", "fail")
    assert double_fault_cases([survived, failed], ("db-restart",), sample=None, seed=0) == []
    note = double_fault_note([survived, failed], ("db-restart",), 0)
    assert note.startswith("depth 2: 0 double-fault case(s) from 0 of 2 single-fault case(s) with a resume: ")
    assert "1 passed with no resume: the subject finished the run in the worker the fault landed in" in note
    assert "1 failed or hit a harness error" in note
    only_net = double_fault_note([CaseResult(FIRST, "reference", "pass", resume_trace=RESUME)], ("net",), 0)
    assert "none of the kinds net is drawn from a point alone" in only_net


def _row(seq: int, key: str, attempts: int = 1, op: str = "charge") -> dict[str, object]:
    return {"seq": seq, "op": op, "key": key, "ref": f"ch_{seq}", "attempts": attempts}


def test_zombie_effects_fail_on_a_row_applied_after_the_wake_only() -> None:
    before = {"payment": [_row(1, "k1")], "mail": []}
    same = check_zombie_effects(before, {"payment": [_row(1, "k1")], "mail": []})
    assert same.valid is True and same.details == "no provider applied anything for the zombie"
    dedup = check_zombie_effects(before, {"payment": [_row(1, "k1", attempts=2)], "mail": []})
    assert dedup.valid is True and "1 repeated request(s) deduplicated by key" in dedup.details
    charged = check_zombie_effects(before, {"payment": [_row(1, "k1"), _row(2, "k2-fresh")], "mail": [_row(3, "m", op="message")]})
    assert charged.valid is False and charged.check == "pause.zombie_effects"
    assert charged.details.startswith("2 effect(s) applied for the zombie after its lease was taken: mail message m")
    assert "payment charge k2-fresh (ch_2)" in charged.details
    assert check_zombie_effects({}, {}).details.startswith("not applicable")
