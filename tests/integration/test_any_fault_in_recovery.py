"""Any fault kind at any point of recovery: pause and db-restart as a second
fault, a zombie's effect at a provider, a failing case's directory kept, and depth 2
saying why it made nothing. A few focused cases on live services."""

from __future__ import annotations

import asyncio
from pathlib import Path

from crashmatrix.harness.explorer import Options
from crashmatrix.harness.history import WorkerReport
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case


def _bad(report) -> list:
    return [(r.case.id, r.error, [(v.check, v.details) for v in r.failed]) for r in report.results if r.outcome != "pass"]


def test_pause_and_db_restart_compose_before_and_after_other_faults() -> None:
    ids = ("checkout/conv1/kill@log.append.before[turn-2]#1+db-restart@log.append.before[turn-3]#1",
           "checkout/conv1/kill@log.append.before[turn-2]#1+pause@log.append.before[turn-3]#1",
           "checkout/conv1/pause@log.append.before[turn-2]#1+kill@log.append.before[turn-3]#1",
           "checkout/conv1/freeze@log.append.before[turn-4]#1")
    report = asyncio.run(run_matrix("checkout", "reference", cases=[Case.parse(c) for c in ids], jobs=4))
    assert not _bad(report), _bad(report)
    by_id = {r.case.id: r for r in report.results}
    restart, late_pause, early_pause, frozen = (by_id[c] for c in ids)
    # both faults fired and were judged: the crash checks ran once per faulted worker
    assert all(sum(v.check == "log.clean_prefix" for v in r.verdicts) == len(r.case.plan.faults) for r in report.results)
    # a kind added as one module (faults/freeze.py): taken over while stopped, then killed
    assert [w["role"] for w in frozen.workers] == ["frozen", "resume"] and frozen.workers[0]["signal"] == 9
    assert [w["role"] for w in restart.workers][:2] == ["start", "resume"] and restart.workers[0]["signal"] == 9
    # a pause in recovery: the resume it was armed in sleeps while the next takes over
    assert [w["role"] for w in late_pause.workers] == ["start", "zombie", "resume"]
    assert any(v.check == "pause.zombie_fenced" and v.valid for v in late_pause.verdicts)
    # a kill in the takeover of a paused run: the zombie wakes after the run ended anyway
    assert [w["role"] for w in early_pause.workers] == ["zombie", "resume", "resume"]
    assert early_pause.workers[1]["signal"] == 9
    assert all(r.artifacts is None for r in report.results)  # passing cases keep nothing


def test_a_zombie_s_charge_fails_its_own_check_and_the_case_directory_is_kept(tmp_path: Path) -> None:
    case = Case.parse("checkout/conv1/pause@tool.request.before[turn-4.tool-0]#1")
    mutant = asyncio.run(run_matrix("checkout", "defect:zombie-charges", cases=[case],
                                    options=Options(keep_failed=tmp_path / "kept")))
    (r,) = mutant.results
    verdicts = {v.check: v for v in r.verdicts}
    assert r.outcome == "fail" and verdicts["pause.zombie_effects"].valid is False, r.to_dict()
    assert "payment charge" in verdicts["pause.zombie_effects"].details
    assert verdicts["pause.zombie_fenced"].valid is True  # its writes were refused: only the ledger shows it
    kept = Path(r.artifacts or "")
    assert kept.parent == tmp_path / "kept" and kept.name.startswith("conv1--pause@tool.request.before_turn-4.tool-0_1--")
    assert r.to_dict()["artifacts"] == str(kept)
    assert (kept / "plan.json").read_text().strip() == case.plan.to_json()
    assert r.replay in (kept / "case.txt").read_text()
    reports = [WorkerReport.from_file(str(p)) for p in sorted(kept.glob("cmw-*.jsonl"))]
    assert len(reports) == 2 and sum(rep.fired is not None for rep in reports) == 1
    assert len(list(kept.glob("cmw-*.log"))) == 2
    clean = asyncio.run(run_matrix("checkout", "reference", cases=[case], options=Options(keep_failed=tmp_path / "k2")))
    assert not _bad(clean), _bad(clean)
    assert clean.results[0].artifacts is None and not (tmp_path / "k2").exists()


def test_depth_2_after_db_restarts_the_runtime_survives_says_why_it_made_nothing() -> None:
    report = asyncio.run(run_matrix("checkout", "reference", kinds=("db-restart",), conversations=("conv1",),
                                    shard_spec="1/45", depth=2))
    singles = report.results
    assert singles and all(r.outcome == "pass" and not r.resume_trace for r in singles), _bad(report)
    note = next(n for n in report.notes if n.startswith("depth 2"))  # beside pruning's and coverage's lines
    assert note.startswith(f"depth 2: 0 double-fault case(s) from 0 of {len(singles)} single-fault case(s) with a resume: "
                           f"{len(singles)} passed with no resume"), note
    assert note in report.to_dict()["notes"]
