"""Crash-state pruning on the real thing (a slice of checkout conv1's kill matrix, real
PostgreSQL, real SIGKILLs): every member agrees with its representative, derived
verdicts equal the verdicts of running the members whole, and a planted unsound
grouping (one that groups across a write) is found by the sample, said, and escalated:
every member then runs whole, so no verdict rests on it."""

from __future__ import annotations

import asyncio
import math

from crashmatrix.harness.enumeration import enumerate_cases
from crashmatrix.harness.pruning import PruneOptions, shard_by_crash_state
from crashmatrix.harness.runner import run_loop
from crashmatrix.harness.session import open_session

TASKS = ("turn-1", "turn-1.tool-0")  # a model turn and a tool: 14 points, 4 crash states


def verdicts(results: list) -> dict[str, tuple[str, list[str]]]:
    return {r.case.id: (r.outcome, sorted(v.check for v in r.failed)) for r in results}


def test_pruned_kill_cases_agree_and_an_unsound_grouping_is_escalated() -> None:
    async def main() -> tuple:
        async with open_session("reference", "checkout") as ex:
            goldens = {"conv1": await ex.golden("conv1")}
            cases = [c for c in enumerate_cases("checkout", goldens, ("kill",)) if c.plan.faults[0].point.task in TASKS]
            shards = [shard_by_crash_state(cases, goldens, f"{k}/3") for k in (1, 2, 3)]
            whole = await run_loop(ex, cases, goldens, 4, options=PruneOptions(sample=1.0, share=False))
            derived = await run_loop(ex, cases, goldens, 4, options=PruneOptions(sample=0.0, share=False))
            # groups by the sockets opened only: across the model call's and the appends' bytes
            def opened(a, b):
                return a.opened == b.opened

            unsound = await run_loop(ex, cases, goldens, 4, options=PruneOptions(sample=1.0, share=False, same=opened))
            escalated = await run_loop(ex, cases, goldens, 4, options=PruneOptions(sample=0.3, share=False, same=opened))
        return cases, shards, whole, derived, unsound, escalated

    cases, shards, (whole, s_whole), (derived, s_derived), (unsound, s_unsound), (escalated, s_esc) = asyncio.run(main())
    assert len(cases) == 14
    # a shard keeps each crash state's cases together (every 3rd case would split them all),
    # and the shards still cover the matrix once
    assert sorted(c.id for part in shards for c in part) == sorted(c.id for c in cases)
    shard_of = {c.id: k for k, part in enumerate(shards) for c in part}
    assert all(len({shard_of[c.id] for c in g.cases}) == 1 for g in s_whole.plan.groups)
    assert [len(part) for part in shards] == [3 + 2, 2, 7]  # groups 1 and 4, group 2, group 3
    groups = [[c.plan.faults[0].point.name for c in g.cases] for g in s_whole.plan.groups]
    assert groups == [["node.launch", "step.before", "model.call.before"], ["model.call.after", "log.append.before"],
                      ["log.append.after", "step.after", "node.launch", "step.before", "tool.request.before",
                       "tool.request.after", "log.append.before"], ["log.append.after", "step.after"]]
    # every member ran whole and left its representative's crash state
    assert len(s_whole.checked) == 10 and s_whole.agree == 10, s_whole.checked
    assert all(r.outcome == "pass" for r in whole), [(r.case.id, r.error) for r in whole if r.outcome != "pass"]
    # run only the representatives: the members' derived verdicts are the ones they get whole
    assert s_derived.executed == 4 and verdicts(derived) == verdicts(whole)
    assert s_derived.lines()[0] == "kill: 14 points -> 4 crash states, all pass; no derived verdict sampled"
    # the planted grouping merges a point before an append with points after it
    # (every member sampled: each keeps its own run's verdict, the disagreeing ones say so)
    bad = [r for r in unsound if "crash-state grouping unsound" in (r.error or "")]
    assert bad and s_unsound.unsound and {m for m, _, d in s_unsound.checked if d} == {r.case.id for r in bad}
    assert verdicts(unsound) == verdicts(whole)
    assert "log" in " ".join(d for _, _, diffs in s_unsound.checked for d in diffs)
    assert any(line.startswith("crash-state grouping unsound (") for line in s_unsound.lines()), s_unsound.lines()
    # a sample of 30 % of the members finds it too; the unsampled members then run whole
    # instead of taking their representative's verdict (held until the sample was compared)
    members = [c.id for g in s_esc.plan.groups for c in g.cases[1:]]
    assert len(s_esc.checked) == math.ceil(0.3 * len(members)) < len(members) and s_esc.unsound, s_esc.checked
    # (a member whose derived verdict fails runs whole anyway: the rest are escalated)
    assert s_esc.escalated and set(s_esc.escalated) <= {m for m in members if m not in s_esc.plan.sampled}
    assert s_esc.executed == 14 and verdicts(escalated) == verdicts(whole)
    assert s_esc.to_dict()["pruned"] == {} and s_esc.to_dict()["escalated"] == s_esc.escalated


def test_sampled_kinds_join_the_matrix_and_say_so() -> None:
    """The CLI default's sampled kinds and resume policies through the
    Python API: one case of each kind and two concurrent ones, run and passed on the
    reference runtime, and notes naming how many of how many."""
    from crashmatrix.harness.matrix import run_matrix

    report = asyncio.run(run_matrix("checkout", "reference", kinds=(), conversations=("conv1",),
                                    sampled_kinds={"pause": 1, "net": 1, "cancel-edge": 1, "db-restart": 1},
                                    sampled_policies={"concurrent": 2}))
    kinds = sorted(r.case.plan.faults[0].kind + (f"/{r.case.resume.label()}" if r.case.resume.label() else "")
                   for r in report.results)
    assert kinds == ["cancel-edge", "db-restart", "kill/concurrent", "kill/concurrent", "net", "pause"], kinds
    assert all(r.outcome == "pass" for r in report.results), [(r.case.id, r.outcome, r.error) for r in report.results]
    assert report.kinds == ("pause", "net", "cancel-edge", "db-restart")
    assert any(n.startswith("sampled kinds (seed 0; ") and "pause 1 of 82" in n for n in report.notes), report.notes
    assert any(n.startswith("sampled resume policies (seed 0; ") and "concurrent 2 of " in n
               and " crash states (82 kill cases)" in n for n in report.notes), report.notes
    # two resumers ran at once in each concurrent case
    assert all(sum(1 for w in r.workers if w.get("concurrent") == 2) == 2 for r in report.results
               if r.case.resume.label() == "concurrent")
