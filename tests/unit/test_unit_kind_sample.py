"""The CLI default's sampled kinds: a seeded, order-keeping sample per kind."""

from __future__ import annotations

import pytest

from crashmatrix.harness.matrix import sample_by_kind
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan


def _cases(kind: str, n: int) -> list[Case]:
    return [Case("checkout", "conv1", FaultPlan((Fault(kind, CrashPoint("label", "log.append.after", f"turn-{i}", 1)),)))
            for i in range(1, n + 1)]


def test_each_kind_keeps_its_count_in_enumeration_order_and_the_seed_decides() -> None:
    cases = _cases("pause", 40) + _cases("cancel-edge", 3) + _cases("kill", 5)
    picked, note = sample_by_kind(cases, {"pause": 6, "cancel-edge": 10, "db-restart": 4}, seed=7)
    kinds = [c.plan.faults[0].kind for c in picked]
    assert kinds.count("pause") == 6 and kinds.count("cancel-edge") == 3 and "kill" not in kinds
    assert [cases.index(c) for c in picked] == sorted(cases.index(c) for c in picked)
    assert note == "sampled kinds (seed 7; --kinds runs a kind at every point): pause 6 of 40, cancel-edge 3 of 3, db-restart 0 of 0"
    assert sample_by_kind(cases, {"pause": 6}, seed=7)[0] == [c for c in picked if c.plan.faults[0].kind == "pause"]
    other = sample_by_kind(cases, {"pause": 6}, seed=8)[0]
    assert other != [c for c in picked if c.plan.faults[0].kind == "pause"]


def test_a_sampled_policy_is_kill_cases_resumed_that_way_seeded_and_in_order() -> None:
    from crashmatrix.harness.adapter import Observation
    from crashmatrix.harness.golden import GoldenRun
    from crashmatrix.harness.matrix import sample_by_policy
    from crashmatrix.harness.oracle import Evidence

    trace = [("label", "log.append.after", f"turn-{i}", 1) for i in range(1, 31)]
    goldens = {"conv1": GoldenRun("conv1", "cm-run-g", trace, Evidence(Observation("cm-run-g", "completed"), {}, {}), 0.1)}
    picked, note = sample_by_policy("checkout", goldens, {"concurrent": 5}, ("label",), seed=3)
    assert len(picked) == 5 and {c.plan.faults[0].kind for c in picked} == {"kill"}
    assert {c.resume.label() for c in picked} == {"concurrent"} and all(c.id.endswith("/concurrent") for c in picked)
    points = [c.plan.faults[0].point.task for c in picked]
    assert points == sorted(points, key=lambda t: int(t.split("-")[1]))  # enumeration order
    assert note == ("sampled resume policies (seed 3; --resume runs a policy at every point): "
                    "concurrent 5 of 30 crash states (30 kill cases)")  # no I/O marks: a state per point
    assert sample_by_policy("checkout", goldens, {"concurrent": 5}, ("label",), seed=3)[0] == picked
    assert sample_by_policy("checkout", goldens, {"concurrent": 5}, ("label",), seed=4)[0] != picked


def test_a_crash_state_more_changes_at_most_one_pick_of_a_policy_sample() -> None:
    """Sessions of a workload with concurrent tool calls may cut its golden trace into a
    crash state more or fewer (the twin runs' reads land by timing): the policy sample
    keeps every other pick."""
    from crashmatrix.harness.adapter import Observation
    from crashmatrix.harness.golden import GoldenRun
    from crashmatrix.harness.matrix import sample_by_policy
    from crashmatrix.harness.oracle import Evidence

    trace = [("label", "log.append.after", f"turn-{i}", 1) for i in range(1, 61)]
    goldens = {"conv1": GoldenRun("conv1", "cm-run-g", trace, Evidence(Observation("cm-run-g", "completed"), {}, {}), 0.1)}
    merged = [i // 2 for i in range(60)]  # two points a crash state: 30 states

    def ids(states: list[int]) -> set[str]:
        picked, _ = sample_by_policy("checkout", goldens, {"concurrent": 10}, ("label",), seed=0,
                                     states={"conv1": states})
        return {c.id for c in picked}

    before = ids(merged)
    assert len(before) == 10
    for pair in range(30):  # split one state in two, wherever it lies
        split = [s * 2 + (1 if s == pair and i % 2 else 0) for i, s in enumerate(merged)]
        after = ids(split)
        assert len(after) == 10 and len(before - after) <= 1, (pair, sorted(before ^ after))


def test_same_worker_samples_cancel_cases_the_fault_its_worker_outlives() -> None:
    from crashmatrix.harness.adapter import Observation
    from crashmatrix.harness.golden import GoldenRun
    from crashmatrix.harness.matrix import sample_by_policy
    from crashmatrix.harness.oracle import Evidence

    trace = [("label", "log.append.after", f"turn-{i}", 1) for i in range(1, 11)]
    goldens = {"conv1": GoldenRun("conv1", "cm-run-g", trace, Evidence(Observation("cm-run-g", "completed"), {}, {}), 0.1)}
    picked, note = sample_by_policy("checkout", goldens, {"same-worker": 4, "warm-worker": 2}, ("label",), seed=3)
    kinds = {c.resume.label(): {x.plan.faults[0].kind for x in picked if x.resume == c.resume} for c in picked}
    assert kinds == {"same-worker": {"cancel"}, "warm-worker": {"kill"}}
    assert note.endswith("same-worker 4 of 10 cancel cases, across 1 crash point names, "
                         "warm-worker 2 of 10 crash states (10 kill cases)")


def test_a_sample_across_point_names_gives_each_name_its_share() -> None:
    """Cancel cases are spread over crash point names: 7 over names of 1, 5 and 10 cases
    take 1, 3 and 3 (the short name's spare goes to the others), seeded per name."""
    from crashmatrix.harness.matrix import _across_point_names
    from crashmatrix.harness.plan import Case

    found = [Case.parse(f"checkout/conv1/cancel@{name}[turn-{i}]#1")
             for name, count in (("run.accepted", 1), ("log.append.before", 5), ("model.call.before", 10))
             for i in range(1, count + 1)]
    chosen, names = _across_point_names(found, 7, "0:resume:same-worker")
    assert names == 3 and chosen == sorted(chosen)
    picked = [found[i].plan.faults[0].point.name for i in chosen]
    assert (picked.count("run.accepted"), picked.count("log.append.before"), picked.count("model.call.before")) == (1, 3, 3)
    assert _across_point_names(found, 7, "0:resume:same-worker") == (chosen, 3)
    assert _across_point_names(found, 99, "s")[0] == list(range(16))


def test_the_default_matrix_is_defined_once_with_the_dsn_and_resume_rules(monkeypatch) -> None:
    """:func:`.defaults.default_matrix`: kill, term, cancel at every point and 24 cases of
    each sampled kind and policy; db-restart left out on a user's PostgreSQL (argument or
    environment); no policy sample under another resume policy; kinds named run whole."""
    from crashmatrix.harness.defaults import DefaultMatrix, default_matrix
    from crashmatrix.harness.errors import PlanError
    from crashmatrix.harness.plan import Resume

    monkeypatch.delenv("CRASHMATRIX_PG_DSN", raising=False)
    m = default_matrix()
    assert m == DefaultMatrix(("kill", "term", "cancel"),
                              (("pause", 24), ("db-restart", 24), ("net", 24), ("cancel-edge", 24), ("cancel-api", 24)),
                              (("concurrent", 24), ("warm-worker", 24), ("same-worker", 24)))
    assert m.all_kinds == ("kill", "term", "cancel", "pause", "db-restart", "net", "cancel-edge", "cancel-api")
    on_dsn = default_matrix(dsn="postgresql://u@h/db")
    assert [k for k, _ in on_dsn.sampled_kinds] == ["pause", "net", "cancel-edge", "cancel-api"]
    monkeypatch.setenv("CRASHMATRIX_PG_DSN", "postgresql://u@h/db")
    assert default_matrix() == on_dsn
    monkeypatch.delenv("CRASHMATRIX_PG_DSN")
    assert default_matrix(resume=Resume("recurring")).sampled_policies == ()
    assert default_matrix(kind_sample=3).sampled_policies[0] == ("concurrent", 3)
    assert default_matrix(kind_sample=0) == default_matrix(("kill", "term", "cancel")) == DefaultMatrix()
    assert default_matrix(("pause",)) == DefaultMatrix(("pause",))
    with pytest.raises(PlanError, match="kind_sample=-1 must be an integer >= 0"):
        default_matrix(kind_sample=-1)


def test_cached_crash_states_draw_the_policy_sample_the_golden_runs_draw(monkeypatch) -> None:
    """What the plugin collects from a cached trace with its crash states and network
    section is what :func:`.matrix.run_matrix` enumerates from the golden run itself."""
    from crashmatrix.harness.defaults import crash_states, default_matrix
    from crashmatrix.harness.plugin_goldens import collected_cases
    from crashmatrix.harness.pruning import PointGroup

    golden = _golden(40)
    # two points a crash state: what the I/O marks would say (pruning.crash_state_groups)
    groups = [PointGroup(golden.trace[i:i + 2], None) for i in range(0, 40, 2)]
    import crashmatrix.harness.pruning as pruning

    real = pruning.crash_state_groups
    monkeypatch.setattr(pruning, "crash_state_groups",
                        lambda g, same=None: (groups, None) if g is golden else real(g, same))
    states = crash_states(golden)
    assert states == [i // 2 for i in range(40)]
    m = default_matrix(kind_sample=5)
    live, notes = m.cases("checkout", {"conv1": golden}, ("label",), seed=11, net=[])
    entries = {"conv1": {"trace": golden.trace, "net_cases": [], "states": states}}
    assert collected_cases("checkout", entries, m, ("label",), seed=11) == live
    assert len(live) == 40 * 3 + 5 * 4 + 5 * 3  # net: no network section in this trace
    assert "concurrent 5 of 20 crash states (40 kill cases)" in notes[1]
    # without cached states every point is its own state: another draw
    assert collected_cases("checkout", {"conv1": {**entries["conv1"], "states": []}}, m, ("label",), seed=11) != live


def _golden(n: int):
    from crashmatrix.harness.adapter import Observation
    from crashmatrix.harness.golden import GoldenRun
    from crashmatrix.harness.oracle import Evidence

    trace = [("label", "log.append.after", f"turn-{i}", 1) for i in range(1, n + 1)]
    return GoldenRun("conv1", "cm-run-g", trace, Evidence(Observation("cm-run-g", "completed"), {}, {}), 0.1)
