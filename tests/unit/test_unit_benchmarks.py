"""The benchmark scripts still import: a rename in the harness (``_run_cases`` became
``run_cases`` in one merge) must fail here, not when someone next measures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("bench_*.py"))


def test_there_are_benchmark_scripts() -> None:
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"_cm_bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # runs the imports; main() only runs under __main__
    finally:
        sys.modules.pop(spec.name, None)
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"


def _compare(tmp_path: Path, a: dict, b: dict, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    import json

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import compare_verdicts
    finally:
        sys.path.remove(str(BENCHMARKS))
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    code = compare_verdicts.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    return code, capsys.readouterr().out


def test_compare_verdicts_finds_a_changed_verdict_and_a_missing_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def case(cid: str, outcome: str, failed: tuple[str, ...] = ()) -> dict:
        return {"id": cid, "outcome": outcome, "verdicts": [{"check": c, "verdict": "invalid"} for c in failed]
                + [{"check": "log.clean_prefix", "verdict": "valid"}]}

    before = {"cases": [case("w/c/kill@a[t]#1", "pass"), case("w/c/kill@b[t]#1", "fail", ("x",))]}
    assert _compare(tmp_path, before, before, capsys)[0] == 0
    after = {"cases": [case("w/c/kill@a[t]#1", "fail", ("pause.zombie_effects",)), case("w/c/kill@c[t]#1", "pass")]}
    code, out = _compare(tmp_path, before, after, capsys)
    assert code == 1
    assert "1 case(s) only in BEFORE:\n  w/c/kill@b[t]#1" in out and "1 case(s) only in AFTER:\n  w/c/kill@c[t]#1" in out
    assert "before: pass -\n    after:  fail pause.zombie_effects" in out
    assert out.rstrip().endswith("same case ids: 1; only before: 1; only after: 1; different verdicts: 1")


def test_sample_agreement_fails_on_a_disagreeing_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import sample_agreement
    finally:
        sys.path.remove(str(BENCHMARKS))

    def report(agree: bool) -> dict:
        groups = [{"representative": "w/c/kill@a[t]#1", "members": ["w/c/kill@b[t]#1"]},
                  {"representative": "w/c/kill@c[t]#1", "members": []}]
        sample = [{"case": "w/c/kill@b[t]#1", "representative": "w/c/kill@a[t]#1", "agree": agree,
                   "differences": [] if agree else ["state.log: 2 rows, representative 1"]}]
        cases = [{"id": i, "outcome": "pass"} for i in ("w/c/kill@a[t]#1", "w/c/kill@b[t]#1", "w/c/kill@c[t]#1")]
        return {"workload": "w", "subject": "s", "cases": cases,
                "pruning": {"points": 3, "crash_states": 2, "groups": groups, "sample": sample,
                            "share_sample": [], "shared_resumes": 0}}

    (tmp_path / "good.json").write_text(json.dumps(report(True)))
    (tmp_path / "bad.json").write_text(json.dumps(report(False)))
    (tmp_path / "plain.json").write_text(json.dumps({"cases": []}))
    assert sample_agreement.main([str(tmp_path / "good.json")]) == 0
    out = capsys.readouterr().out
    assert "kill 3 points -> 2 crash states, 1 groups with members, 1 members; sample 1/1 agree" in out
    assert sample_agreement.main([str(tmp_path / "good.json"), str(tmp_path / "bad.json")]) == 1
    out = capsys.readouterr().out
    assert "sample 0/1 agree" in out and "DISAGREES: w/c/kill@b[t]#1 vs w/c/kill@a[t]#1" in out
    assert sample_agreement.main([str(tmp_path / "plain.json")]) == 2
